#!/usr/bin/env bash
# What metrics cost on the hot path: acquires per second, and the daemon's
# CPU time per acquire, through two sidecars of the same build on the same
# Redis, in the same run, one with `[metrics] listen` (scraped once a second,
# as Prometheus would, only more often) and one without. Steps alternate
# between the two, in both orders, so that drift on a shared machine falls
# on both. Prints a Markdown table; see bench/metrics/README.md.
#
# Usage: bench/metrics/run.sh [SECONDS_PER_STEP] [ROUNDS]   (default 3 and 9)
# RATEKEEPER_BIN=path measures another daemon build.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-3}"
ROUNDS="${2:-9}"
CLIENTS=(1 8 64)

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
start_redis
start_sidecar off "$BIN"
OFF="$SOCKET" OFF_PID="${PIDS[-1]}"
METRICS_PORT="$(free_port)"
start_sidecar on "$BIN" "[metrics]
listen = \"127.0.0.1:$METRICS_PORT\"
tenants = [\"acme\"]"
ON="$SOCKET" ON_PID="${PIDS[-1]}"

# Prometheus's part: one scrape a second of the metered sidecar, all along.
(
    while true; do
        curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" >/dev/null || true
        sleep 1
    done
) &
PIDS+=($!)

# CPU time (user + system, in clock ticks) a process has used so far.
cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat"
}

# One step against a sidecar: "acquires/s daemon-CPU-µs-per-acquire".
step() {
    local socket="$1" pid="$2" clients="$3" before after
    before="$(cpu_ticks "$pid")"
    report="$("$LOADGEN" bench --socket "$socket" --connections "$clients" --seconds "$SECONDS_PER_STEP")"
    after="$(cpu_ticks "$pid")"
    python3 -c '
import json, os, sys
r = json.loads(sys.argv[1])
ticks = int(sys.argv[3]) - int(sys.argv[2])
print(round(r["acquires_per_second"]), round(ticks / os.sysconf("SC_CLK_TCK") * 1e6 / r["acquires"], 1))' \
        "$report" "$before" "$after"
}

echo "| clients | acquires/s without / with metrics (medians) | throughput with / without (median of the rounds' ratios, range) | daemon CPU µs per acquire without / with (medians) | CPU with / without (median, range) |"
echo "| ---: | ---: | ---: | ---: | ---: |"
for clients in "${CLIENTS[@]}"; do
    offs=() ons=()
    for round in $(seq "$ROUNDS"); do
        # Each round measures both, in alternating order, back to back.
        if (( round % 2 )); then
            offs+=("$(step "$OFF" "$OFF_PID" "$clients")")
            ons+=("$(step "$ON" "$ON_PID" "$clients")")
        else
            ons+=("$(step "$ON" "$ON_PID" "$clients")")
            offs+=("$(step "$OFF" "$OFF_PID" "$clients")")
        fi
    done
    python3 - "$clients" "${offs[*]}" "${ons[*]}" <<'PY'
import statistics, sys
clients = sys.argv[1]
off = list(map(float, sys.argv[2].split()))
on = list(map(float, sys.argv[3].split()))
rates = (off[0::2], on[0::2])
cpus = (off[1::2], on[1::2])
def ratios(pair):
    return [b / a for a, b in zip(*pair)]
r, c = ratios(rates), ratios(cpus)
med = statistics.median
print(f"| {clients} | {med(rates[0]):.0f} / {med(rates[1]):.0f} | {med(r):.3f} ({min(r):.2f}–{max(r):.2f}) | "
      f"{med(cpus[0]):.1f} / {med(cpus[1]):.1f} | {med(c):.3f} ({min(c):.2f}–{max(c):.2f}) |")
PY
done
# The scrapes did happen, and counted what the load generator did.
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" |
    grep -E '^ratekeeper_acquires_total\{limit="bench"' >&2
