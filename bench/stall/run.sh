#!/usr/bin/env bash
# How late acquires are answered while Redis stalls: 16 connections
# acquiring (10 tokens, max_wait 500 ms, the default redis.timeout_ms of
# 250), and a burst of 1,000 pipelined acquires sent during the stall, through
# a 2 s `CLIENT PAUSE ... ALL` and a 2 s `DEBUG SLEEP`. Prints a Markdown
# table of the answer times (ms, from each acquire's send) per build; see
# bench/stall/README.md.
#
# Usage: bench/stall/run.sh
# BEFORE_BIN=path adds rows for another daemon build (e.g. an older one), in
# the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
REDIS_EXTRA="--enable-debug-command yes"
build_release

# One stall: the load runs 4 s, the stall starts 1 s in, the burst 0.3 s later.
stall_row() {
    local build="$1" stall="$2"
    "$LOADGEN" bench --socket "$SOCKET" --connections 16 --tokens 10 --max-wait 500 \
        --seconds 4 >"$WORK/threads.json" &
    local threads=$!
    sleep 1
    case "$stall" in
        pause) redis-cli -p "$PORT" CLIENT PAUSE 2000 ALL >/dev/null ;;
        sleep) redis-cli -p "$PORT" DEBUG SLEEP 2 >/dev/null & ;;
    esac
    sleep 0.3
    "$LOADGEN" bench --socket "$SOCKET" --connections 1 --concurrency 1000 --tokens 10 \
        --max-wait 500 --seconds 0.2 >"$WORK/burst.json"
    wait "$threads"
    python3 - "$build" "$stall" "$WORK/threads.json" "$WORK/burst.json" <<'PY'
import json, sys
build, stall, threads, burst = sys.argv[1:]
t, b = (json.load(open(path)) for path in (threads, burst))
ms = lambda us: f"{us / 1000:.0f}"
print(f"| {build} | {stall} | {ms(t['latency_p99_us'])} | {ms(t['latency_max_us'])} "
      f"| {b['acquires']} | {ms(b['latency_p99_us'])} | {ms(b['latency_max_us'])} |")
PY
    # Let Redis wake and the daemon settle its cancels before the next stall.
    sleep 2.5
}

echo "| build | stall | 16 connections p99 | max | burst acquires | p99 | max |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
builds=("this:$BIN")
[ -n "${BEFORE_BIN:-}" ] && builds=("before:$BEFORE_BIN" "${builds[@]}")
for entry in "${builds[@]}"; do
    # A Redis and a sidecar (its own socket) per build.
    start_redis
    start_sidecar "rk-${entry%%:*}" "${entry#*:}"
    for stall in pause sleep; do
        stall_row "${entry%%:*}" "$stall"
    done
done
