#!/usr/bin/env bash
# Daemon CPU per acquire: utime + stime of the sidecar (from /proc/PID/stat)
# over a ratekeeper-loadgen run, divided by the acquires it answered, at
# 1, 8, 32, 64 and 256 connections (one acquire in flight each), on a
# private Redis. Prints a Markdown table; see bench/PROFILE.md.
#
# Usage: bench/cpu.sh [SECONDS_PER_STEP] [BIN...]
# With several BINs (daemon builds, e.g. before and after a change) each
# step runs every build in turn under the same load generator, so the
# columns compare within one sitting.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_STEP="${1:-5}"
shift || true
CONNECTIONS=(${CONNECTIONS:-1 8 32 64 256})

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=("$BIN")
start_redis

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

header="| connections |"
rule="| ---: |"
for bin in "${BINS[@]}"; do
    header+=" $(basename "$bin"): acquires/s | µs CPU/acquire |"
    rule+=" ---: | ---: |"
done
echo "$header"
echo "$rule"
index=0
for connections in "${CONNECTIONS[@]}"; do
    row="| $connections |"
    for bin in "${BINS[@]}"; do
        index=$((index + 1))
        start_sidecar "rk$index" "$bin"
        pid="${PIDS[-1]}"
        "$LOADGEN" bench --socket "$SOCKET" --connections "$connections" --seconds 1 >/dev/null
        before=$(cpu_ticks "$pid")
        report="$("$LOADGEN" bench --socket "$SOCKET" --connections "$connections" \
            --seconds "$SECONDS_PER_STEP")"
        after=$(cpu_ticks "$pid")
        kill "$pid"
        row+="$(python3 -c '
import json, sys
r = json.loads(sys.argv[1]); ticks = int(sys.argv[2]); tick_us = int(sys.argv[3])
rate, per = r.get("acquires_per_second"), ticks * tick_us / max(r.get("acquires"), 1)
print(f" {rate:.0f} | {per:.1f} |")' \
            "$report" "$((after - before))" "$TICK_US")"
    done
    echo "$row"
done
