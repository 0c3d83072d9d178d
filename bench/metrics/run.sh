#!/usr/bin/env bash
# What metrics cost on the hot path: acquires per second through two
# sidecars of the same build on the same Redis, in the same run, one with
# `[metrics] listen` (scraped once a second, as Prometheus would, only more
# often) and one without. Steps alternate between the two, in both orders,
# so that drift on a shared machine falls on both. Prints a Markdown table;
# see bench/metrics/README.md.
#
# Usage: bench/metrics/run.sh [SECONDS_PER_STEP] [ROUNDS]   (default 5 and 3)
# RATEKEEPER_BIN=path measures another daemon build.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-5}"
ROUNDS="${2:-3}"
CLIENTS=(1 8 64)

command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
cargo build --release --quiet
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
BIN="${RATEKEEPER_BIN:-$TARGET/release/ratekeeper}"
LOADGEN="$TARGET/release/ratekeeper-loadgen"

# shellcheck source=bench/lib.sh
. bench/lib.sh
start_redis
start_sidecar off "$BIN"
OFF="$SOCKET"
METRICS_PORT="$(free_port)"
start_sidecar on "$BIN" "[metrics]
listen = \"127.0.0.1:$METRICS_PORT\"
tenants = [\"acme\"]"
ON="$SOCKET"

# Prometheus's part: one scrape a second of the metered sidecar, all along.
(
    while true; do
        curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" >/dev/null || true
        sleep 1
    done
) &
PIDS+=($!)

rate() {
    "$LOADGEN" bench --socket "$1" --connections "$2" --seconds "$SECONDS_PER_STEP" |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["acquires_per_second"]))'
}

echo "| clients | without metrics, acquires/s | with metrics, acquires/s | with / without |"
echo "| ---: | ---: | ---: | ---: |"
for clients in "${CLIENTS[@]}"; do
    off=0 on=0
    for round in $(seq "$ROUNDS"); do
        if (( round % 2 )); then
            off=$(( off + $(rate "$OFF" "$clients") ))
            on=$(( on + $(rate "$ON" "$clients") ))
        else
            on=$(( on + $(rate "$ON" "$clients") ))
            off=$(( off + $(rate "$OFF" "$clients") ))
        fi
    done
    ratio="$(python3 -c "print(f'{$on / $off:.3f}')")"
    echo "| $clients | $(( off / ROUNDS )) | $(( on / ROUNDS )) | $ratio |"
done
# The scrapes did happen, and counted what the load generator did.
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" |
    grep -E '^ratekeeper_acquires_total\{limit="bench"' >&2
