#!/usr/bin/env bash
# Node acquires through the sidecar (clients/node) next to ioredis calling the
# same Lua script from every process, in one run: throughput, latency, the CPU
# time of the workers, the daemon and Redis per acquire, and Redis's script
# calls and commands per acquire; prints a Markdown table. See
# bench/node/README.md.
#
# Usage: bench/node/run.sh [SECONDS_PER_MEASUREMENT] [SHAPE...]   (default 3; 1x1 1x8 1x64 4x16)
#   SHAPE is processes x concurrent in-flight acquires per process: 4x16 is
#   4 processes with 16 acquires in flight in each.
#   MODES="sidecar,ioredis" runs only those modes (comma-separated; default:
#   sidecar, ioredis and ioredis auto-pipelined).
#   RATEKEEPER_BIN=path runs that daemon build (default: a release build of
#   this tree, built with cargo).
#   LUA_DIR=dir: where the direct modes read bucket.lua and batch.lua (default:
#   lua/ of this tree); the bench warns when the daemon's script differs.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-3}"
shift || true
SHAPES=("${@:-1x1 1x8 1x64 4x16}")
read -r -a SHAPES <<< "${SHAPES[*]}"

command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
command -v node >/dev/null || { echo "needs node (>= 20) and npm" >&2; exit 1; }
if [ -z "${RATEKEEPER_BIN:-}" ]; then
    cargo build --release --quiet
fi
BIN="${RATEKEEPER_BIN:-$PWD/target/release/ratekeeper}"
# The client under test, built from this tree if it has no build yet.
if [ ! -f clients/node/dist/esm/index.js ]; then
    (cd clients/node && npm ci --no-audit --no-fund && npm run build) >&2
fi
# ioredis for the bench only, at the version pinned in bench/node/package-lock.json.
if [ ! -d bench/node/node_modules/ioredis ]; then
    (cd bench/node && npm ci --no-audit --no-fund) >&2
fi

MODE_ARGS=()
[ -n "${MODES:-}" ] && MODE_ARGS=(--modes "$MODES")

# shellcheck source=bench/lib.sh
. bench/lib.sh
start_redis_and_sidecar "$BIN"
REDIS_PID="${PIDS[0]}" DAEMON_PID="${PIDS[1]}"  # in lib.sh's start order

IOREDIS="$(node -p 'require("./bench/node/node_modules/ioredis/package.json").version')"
echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); node $(node --version); ioredis $IOREDIS"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
node bench/node/bench.mjs --socket "$SOCKET" --redis "redis://127.0.0.1:$PORT/0" \
    --daemon-pid "$DAEMON_PID" --redis-pid "$REDIS_PID" --clock-ticks "$(getconf CLK_TCK)" \
    --seconds "$SECONDS_PER_STEP" --shapes "${SHAPES[*]}" "${MODE_ARGS[@]}"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
