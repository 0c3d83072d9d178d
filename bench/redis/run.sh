#!/usr/bin/env bash
# Acquires per second and latency through the sidecar, next to the floor:
# redis-benchmark running EVALSHA of the same acquire script on the same
# Redis, in the same run. Prints a Markdown table; see bench/redis/README.md.
#
# Usage: bench/redis/run.sh [SECONDS_PER_STEP]   (default 10)
# CLIENTS="1 8 64 256" (the default) sets the steps: connections for the
# sidecar's load generator, clients for redis-benchmark.
# RATEKEEPER_BIN=path runs another daemon build (e.g. an older one) under the
# same load generator, for before/after ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-10}"
# shellcheck disable=SC2206  # a list of numbers, split on purpose
CLIENTS=(${CLIENTS:-1 8 64 256})

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
start_redis_and_sidecar "$BIN"

SHA="$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat lua/bucket.lua lua/batch.lua)")"
# One sidecar acquire of 1 token as its own call: the call's record (a fresh
# id each time, as the sidecar sends), a sidecar id, and the same two buckets (capacity,
# rate, largest cost and keep-until (0: none) of each, then the acquire), in the units the sidecar
# sends (60000 a token for a rate per minute).
FLOOR_ARGS=(EVALSHA "$SHA" 3 "floor:{b}:call:__rand_int__" "floor:{b}:tokens" "floor:{b}:requests"
    "" 10000 1 floor 600000000000000 1000000000 600000000000000 0 600000000000000 1000000000 600000000000000 0
    a 0 2 2 60000 0 3 60000 0)

echo "| clients | sidecar acquires/s | p50 µs | p99 µs | redis-benchmark EVALSHA/s | p50 µs | p99 µs | sidecar / floor |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for clients in "${CLIENTS[@]}"; do
    sidecar="$("$LOADGEN" bench --socket "$SOCKET" --connections "$clients" \
        --seconds "$SECONDS_PER_STEP")"
    read -r s_rate s_p50 s_p99 < <(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(round(r["acquires_per_second"]), r["latency_p50_us"], r["latency_p99_us"])' "$sidecar")
    # As many requests as the sidecar managed in the same time, at least 20k.
    requests=$(( s_rate * SECONDS_PER_STEP > 20000 ? s_rate * SECONDS_PER_STEP : 20000 ))
    floor="$(redis-benchmark -p "$PORT" -c "$clients" -n "$requests" -r 1000000000 --csv "${FLOOR_ARGS[@]}" | tail -1)"
    read -r f_rate f_p50 f_p99 < <(python3 -c '
import csv, sys
row = next(csv.reader([sys.argv[1]]))
print(round(float(row[1])), round(float(row[4]) * 1000), round(float(row[6]) * 1000))' "$floor")
    ratio="$(python3 -c "print(f'{$s_rate / $f_rate:.2f}')")"
    echo "| $clients | $s_rate | $s_p50 | $s_p99 | $f_rate | $f_p50 | $f_p99 | $ratio |"
done
