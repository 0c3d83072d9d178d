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

WORK="$(mktemp -d)"
cleanup() {
    [ -n "${DAEMON_PID:-}" ] && kill "$DAEMON_PID" 2>/dev/null || true
    [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
    --logfile "$WORK/redis.log" &
REDIS_PID=$!
until redis-cli -p "$PORT" PING >/dev/null 2>&1; do sleep 0.05; done

# Buckets far larger than the run can drain: every acquire is a grant.
cat > "$WORK/bench.toml" <<TOML
[server]
socket = "$WORK/rk.sock"

[redis]
url = "redis://127.0.0.1:$PORT/0"

[[limits]]
name = "bench"
tokens_per_minute = 1000000000
burst_tokens = 10000000000
requests_per_minute = 1000000000
burst_requests = 10000000000
TOML
"$BIN" serve --config "$WORK/bench.toml" --log-level warn 2>"$WORK/daemon.log" &
DAEMON_PID=$!
until [ -S "$WORK/rk.sock" ]; do sleep 0.05; done

echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$VENV/bin/python" --version)"
"$VENV/bin/python" bench/python/bench.py --socket "$WORK/rk.sock" \
    --redis "redis://127.0.0.1:$PORT/0" --seconds "$SECONDS_PER_STEP"
