#!/usr/bin/env bash
# Issue 30: what spend budgets add to an acquire. One sidecar on a private
# Redis with two limits that differ only in their budgets: "plain" (a token
# and a request bucket, a price) and "budgeted" (the same, plus a calendar
# day and a rolling hour budget on the limit and a day budget for each
# tenant: three more buckets an acquire draws from, and on its report two
# `:spent` counters, one per calendar budget). Every acquire names the
# tenant "acme". Steps alternate between the two limits, both orders, so
# that drift on a shared machine falls on both; each step measures
# throughput, the daemon's CPU per acquire (/proc/PID/stat), and Redis's
# time in EVALSHA (INFO commandstats: script time) per acquire and per call.
# Prints Markdown tables of budgeted / plain ratios; see bench/budgets/README.md.
#
# Usage: bench/budgets/run.sh [SECONDS_PER_STEP] [ROUNDS]   (default 4 and 5)
# CLIENTS="8 64" (the default) sets the load generator's connections;
# MODES="report acquire" (the default): each acquire followed by a report
# of half its tokens on the same connection, or acquires alone.
# RATEKEEPER_BIN=path measures another daemon build.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-4}"
ROUNDS="${2:-5}"
# shellcheck disable=SC2206  # lists, split on purpose
CLIENTS=(${CLIENTS:-8 64})
# shellcheck disable=SC2206
MODES=(${MODES:-report acquire})

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
start_redis
REDIS_PID="${PIDS[-1]}"

# Rates far above any run's (every acquire a grant on the script's full
# path, as in lib.sh). $5,000 a million input tokens: an acquire of 2
# tokens reserves 10,000 micro-units ($0.01) and its report of 1 token
# gives half back, so that the rolling hour, which refills 13.9 micro-units
# a ms, is drawn faster than it refills and its key stays (at $1 a million
# it would stay full, and its key expire at once, as the rate buckets' do).
# A run's million or so acquires spend about $5,000 of budgets of a
# million (the days) and 50,000 (the rolling hour: the most a rolling
# budget may hold), so that no budget denies.
RATES='tokens_per_minute = 1000000000
burst_tokens = 10000000000
requests_per_minute = 1000000000
burst_requests = 10000000000
price = { input = "5000", output = "10000" }'
start_sidecar rk "$BIN" "[[limits]]
name = \"plain\"
$RATES

[[limits]]
name = \"budgeted\"
$RATES
budget = { day = \"1000000\", rolling_hour = \"50000\" }
tenant_budget = { day = \"1000000\" }
"
SIDECAR_PID="${PIDS[-1]}"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# "calls usec" of EVALSHA so far.
evalsha() {
    redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
        sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p'
}

# One step: the load generator against one limit; appends one line to ROWS:
# mode clients limit acquires seconds daemon-ticks redis-ticks calls usec.
ROWS="$WORK/rows"
step() {
    local mode="$1" clients="$2" limit="$3" report_args=() d0 r0 e0 d1 r1 e1 report
    [ "$mode" = report ] && report_args=(--report-tokens 1)
    d0="$(cpu_ticks "$SIDECAR_PID")" r0="$(cpu_ticks "$REDIS_PID")" e0="$(evalsha)"
    report="$("$LOADGEN" "$limit" --socket "$SOCKET" --tenant acme --tokens 2 \
        "${report_args[@]}" --connections "$clients" --seconds "$SECONDS_PER_STEP")"
    d1="$(cpu_ticks "$SIDECAR_PID")" r1="$(cpu_ticks "$REDIS_PID")" e1="$(evalsha)"
    python3 -c '
import json, sys
mode, clients, limit, report = sys.argv[1:5]
d0, d1, r0, r1 = map(int, sys.argv[5:9])
c0, u0 = map(int, sys.argv[9].split() or [0, 0])
c1, u1 = map(int, sys.argv[10].split())
r = json.loads(report)
if r["denied"] or r["errors"]:
    sys.exit(f"{limit}: {r} (a denial or an error: the budgets must never deny)")
print(mode, clients, limit, r["acquires"], r["seconds"], d1 - d0, r1 - r0, c1 - c0, u1 - u0)' \
        "$mode" "$clients" "$limit" "$report" "$d0" "$d1" "$r0" "$r1" "$e0" "$e1" >> "$ROWS"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# Warm-up: both limits' buckets exist, the script is loaded.
for limit in plain budgeted; do
    "$LOADGEN" "$limit" --socket "$SOCKET" --tenant acme --tokens 2 --report-tokens 1 \
        --connections 8 --seconds 1 >/dev/null
done
for mode in "${MODES[@]}"; do
    for clients in "${CLIENTS[@]}"; do
        for round in $(seq "$ROUNDS"); do
            if (( round % 2 )); then
                step "$mode" "$clients" plain
                step "$mode" "$clients" budgeted
            else
                step "$mode" "$clients" budgeted
                step "$mode" "$clients" plain
            fi
        done
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$ROWS" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
from collections import defaultdict
rows, tick_us = sys.argv[1], 1e6 / int(sys.argv[2])
steps = defaultdict(lambda: {"plain": [], "budgeted": []})
for line in open(rows):
    mode, clients, limit, acquires, seconds, dticks, rticks, calls, usec = line.split()
    acquires, seconds = int(acquires), float(seconds)
    steps[(mode, int(clients))][limit].append({
        "rate": acquires / seconds,
        "cpu": int(dticks) * tick_us / acquires,
        "redis": int(rticks) * tick_us / acquires,
        "script": int(usec) / acquires,
        "per_call": int(usec) / max(int(calls), 1),
        "calls": int(calls) / acquires,
    })
med = statistics.median
def cell(key, plain, budgeted, digits):
    a = [s[key] for s in plain]
    b = [s[key] for s in budgeted]
    ratios = [y / x for x, y in zip(a, b)]
    return (f"{med(a):.{digits}f} / {med(b):.{digits}f} | "
            f"**{med(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f}) |")
print("| what | clients | acquires/s | ratio | daemon CPU µs / acquire | ratio "
      "| EVALSHA µs / acquire | ratio | EVALSHA µs / call | ratio "
      "| Redis CPU µs / acquire | ratio | calls / acquire |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for (mode, clients), by in steps.items():
    plain, budgeted = by["plain"], by["budgeted"]
    what = "acquire + report" if mode == "report" else "acquire"
    calls = f"{med(s['calls'] for s in plain):.3f} / {med(s['calls'] for s in budgeted):.3f}"
    print(f"| {what} | {clients} | " + " ".join(cell(k, plain, budgeted, d) for k, d in
          (("rate", 0), ("cpu", 1), ("script", 2), ("per_call", 1), ("redis", 1)))
          + f" {calls} |")
print(f"\nPlain / budgeted medians of {len(plain)} rounds each, then the median of the "
      "rounds' budgeted / plain ratios (range).")
PY
# The budgets were drawn from and settled: their keys in Redis.
redis-cli -p "$PORT" --scan --pattern 'rk:*:budget:*' | sort >&2
