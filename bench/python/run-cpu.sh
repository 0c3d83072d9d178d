#!/usr/bin/env bash
# CPU time of the Python client alone per acquire (one thread, one round trip
# at a time), this tree's client against a baseline revision's and the bare
# socket floor, alternating in fresh processes against one release daemon on
# Redis. See bench/python/README.md ("Single-threaded client CPU").
#
# Usage: BASELINE=<git revision> RATEKEEPER_BIN=... bench/python/run-cpu.sh [cpu.py options...]
#   e.g. bench/python/run-cpu.sh --rounds 8 -n 10000 --settle report
#        bench/python/run-cpu.sh --profile 5000          (cProfile of this tree's sync client)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
if [ -z "${RATEKEEPER_BIN:-}" ]; then
    cargo build --release --quiet
fi
BIN="${RATEKEEPER_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/ratekeeper}"

CLIENTS=("after=$PWD/clients/python/src")
if [ -n "${BASELINE:-}" ]; then
    BASELINE_DIR="$(mktemp -d)"
    git archive "$BASELINE" clients/python/src | tar -x -C "$BASELINE_DIR"
    CLIENTS+=("before=$BASELINE_DIR/clients/python/src")
fi
CLIENTS+=("floor=floor")

# shellcheck source=bench/lib.sh
. bench/lib.sh
start_redis_and_sidecar "$BIN"

echo "$(nproc) cores; $(python3 --version); load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)${BASELINE:+; baseline client: $BASELINE}"
python3 bench/python/cpu.py --socket "$SOCKET" --clients "${CLIENTS[@]}" "$@"
