#!/usr/bin/env bash
# Daemon CPU per acquire: utime + stime of the sidecar (from /proc/PID/stat)
# over a ratekeeper-loadgen run, divided by the acquires it answered, at
# 1, 8, 32, 64 and 256 connections (one acquire in flight each), on a
# private Redis. Prints a Markdown table; see bench/PROFILE.md.
#
# Usage: [THREADS="1 2"] bench/cpu.sh [SECONDS_PER_STEP] [BIN...]
# With several BINs (daemon builds, e.g. before and after a change) or
# several THREADS (the sidecar's [server] threads; default 1) each step runs
# every combination in turn under the same load generator, so the columns
# compare within one sitting.
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
THREADS=(${THREADS:-1})
for bin in "${BINS[@]}"; do
    for threads in "${THREADS[@]}"; do
        header+=" $(basename "$bin") ×$threads: acquires/s | µs CPU/acquire |"
        rule+=" ---: | ---: |"
    done
done
echo "$header"
echo "$rule"
index=0
for connections in "${CONNECTIONS[@]}"; do
    row="| $connections |"
    for column in $(for b in "${!BINS[@]}"; do for t in "${THREADS[@]}"; do echo "$b:$t"; done; done); do
        bin="${BINS[${column%%:*}]}"
        index=$((index + 1))
        SIDECAR_THREADS="${column##*:}" start_sidecar "rk$index" "$bin"
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
