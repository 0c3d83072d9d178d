#!/usr/bin/env bash
# Python acquire round trips through the sidecar next to redis-py calling the
# same Lua script from every worker, in one run; prints a Markdown table.
# See bench/python/README.md.
#
# Usage: bench/python/run.sh [SECONDS_PER_MEASUREMENT]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-3}"

command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
if [ -z "${RATEKEEPER_BIN:-}" ]; then
    cargo build --release --quiet
fi
BIN="${RATEKEEPER_BIN:-$PWD/target/release/ratekeeper}"
VENV="$PWD/target/python-bench-venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ./clients/python redis

# shellcheck source=bench/lib.sh
. bench/lib.sh
start_redis_and_sidecar "$BIN"

echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$VENV/bin/python" --version)"
"$VENV/bin/python" bench/python/bench.py --socket "$SOCKET" \
    --redis "redis://127.0.0.1:$PORT/0" --seconds "$SECONDS_PER_STEP"
