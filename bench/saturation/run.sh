#!/usr/bin/env bash
# Issue 13's Redis goals on a private redis-server and one release sidecar:
# script calls and Redis commands per admitted acquire with ample capacity
# (1, 8, 32, 64 connections), then wait lateness at saturation (32
# connections on a limit whose token bucket binds), measured from the
# bucket's own first use. Prints Markdown tables; see bench/saturation/README.md.
#
# Usage: bench/saturation/run.sh [AMPLE_SECONDS] [SATURATION_SECONDS]   (default 5 10)
#   RATE=3000   the saturated limit's refill, tokens (= 1-token acquires) a second
#   BURST=30    its token bucket's burst (no headroom taken off it)
#   KEEP=DIR    keeps the grant log and results.json in DIR
#   RATEKEEPER_BIN=path runs another daemon build.
set -euo pipefail
cd "$(dirname "$0")/../.."
AMPLE_SECONDS="${1:-5}"
SATURATION_SECONDS="${2:-10}"
RATE="${RATE:-3000}"
BURST="${BURST:-30}"

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
start_redis
# The saturated limit: tokens bind (RATE a second, a burst of BURST with no
# headroom held back, so the bucket's capacity is exactly BURST); the
# requests bucket holds 60 million and never binds. lib.sh adds "bench",
# which no run can drain, for the ample steps.
start_sidecar rk "$BIN" "[[limits]]
name = \"saturated\"
tokens_per_minute = $((RATE * 60))
burst_tokens = $BURST
burst_headroom_ms = 0
requests_per_minute = 60000000
burst_requests = 60000000"

echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$BIN" --version)"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 bench/saturation/saturation.py --port "$PORT" --socket "$SOCKET" \
    --ratekeeper "$BIN" --loadgen "$LOADGEN" \
    --ample-seconds "$AMPLE_SECONDS" --seconds "$SATURATION_SECONDS" \
    ${KEEP:+--keep "$KEEP"}
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
