#!/usr/bin/env bash
# Python acquires through the sidecar next to redis-py calling the same Lua
# script from every worker, in one run: throughput, latency, the CPU time of
# the workers, the daemon and Redis per acquire, and Redis's script calls and
# commands per acquire; prints a Markdown table. See bench/python/README.md.
#
# Usage: bench/python/run.sh [SECONDS_PER_MEASUREMENT] [SHAPE...]   (default 3; 1x1 1x8 4x8)
#   SHAPE is processes x threads (sync) or x tasks (asyncio) per process:
#   8x1 is 8 single-threaded processes.
#   BASELINE=<git revision> also runs that revision's Python client ("baseline" rows).
#   MODES="sidecar sync,redis-py sync" runs only those modes (comma-separated;
#   default: all). Example: MODES="sidecar sync,redis-py sync,tutorial sync" bench/python/run.sh 3 8x1
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-3}"
shift || true
SHAPES=("${@:-1x1 1x8 4x8}")
read -r -a SHAPES <<< "${SHAPES[*]}"

command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
if [ -z "${RATEKEEPER_BIN:-}" ]; then
    cargo build --release --quiet
fi
BIN="${RATEKEEPER_BIN:-$PWD/target/release/ratekeeper}"
VENV="$PWD/target/python-bench-venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ./clients/python redis

MODE_ARGS=()
if [ -n "${MODES:-}" ]; then
    IFS=, read -r -a MODE_LIST <<< "$MODES"
    MODE_ARGS=(--modes "${MODE_LIST[@]}")
fi

BASELINE_ARGS=()
if [ -n "${BASELINE:-}" ]; then
    BASELINE_DIR="$PWD/target/python-bench-baseline"
    rm -rf "$BASELINE_DIR" && mkdir -p "$BASELINE_DIR"
    git archive "$BASELINE" clients/python/src | tar -x -C "$BASELINE_DIR"
    BASELINE_ARGS=(--baseline-client "$BASELINE_DIR/clients/python/src")
fi

# shellcheck source=bench/lib.sh
. bench/lib.sh
start_redis_and_sidecar "$BIN"
REDIS_PID="${PIDS[0]}" DAEMON_PID="${PIDS[1]}"  # in lib.sh's start order

echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$VENV/bin/python" --version)"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)${BASELINE:+; baseline client: $BASELINE}"
"$VENV/bin/python" bench/python/bench.py --socket "$SOCKET" \
    --redis "redis://127.0.0.1:$PORT/0" --daemon-pid "$DAEMON_PID" --redis-pid "$REDIS_PID" \
    --seconds "$SECONDS_PER_STEP" --shapes "${SHAPES[@]}" "${MODE_ARGS[@]}" "${BASELINE_ARGS[@]}"
