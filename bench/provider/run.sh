#!/usr/bin/env bash
# The issue-11 matrix against a strict fake provider: every combination of
# workload (token- or request-bound), acquire (by token count or by
# messages) and 1 or 2 sidecars with no foreign traffic, then 20 % foreign
# traffic with and without forwarding the provider's answers; prints a
# Markdown table. See bench/provider/README.md.
#
# Usage: bench/provider/run.sh [--window-seconds W] [--provider SHAPE]
#                               [--foreign-seeds N | --zero-rounds N] [SECONDS]
#   --window-seconds W: the provider enforces each per-minute limit over W
#     seconds (default 60; 1 is what OpenAI and Anthropic say they may do)
#   --provider SHAPE: openai (default) or anthropic: the fake's shape, and the
#     config's limit for it (the example's Anthropic limit, uncommented)
#   --foreign-seeds N: instead of the matrix, only 20 % foreign traffic with
#     forwarding, by messages through 2 sidecars, seeds 1 to N (issue 26's
#     goal of < 0.5 % 429s is counted over all of them)
#   --zero-rounds N: instead of the matrix, N rounds of the four zero-429
#     cases that clients/python/tests/test_provider_e2e.py runs (pairwise)
#   SECONDS: the length of each run (default 40)
#   RATEKEEPER_BIN: the daemon to measure (default: a debug build of this tree)
#   CONFIG: the config template (default examples/ratekeeper.toml)
#   RPM_REQUEST_BOUND: requests per minute of the request-bound runs (default 1200)
#   PYTHON: a Python with ratekeeper, openai and anthropic installed (default: a venv under target/)
set -euo pipefail
cd "$(dirname "$0")/../.."
WINDOW_SECONDS=60
PROVIDER=openai
FOREIGN_SEEDS=0
ZERO_ROUNDS=0
while [ $# -gt 0 ]; do
    case "$1" in
        --window-seconds) WINDOW_SECONDS="$2"; shift 2 ;;
        --provider) PROVIDER="$2"; shift 2 ;;
        --foreign-seeds) FOREIGN_SEEDS="$2"; shift 2 ;;
        --zero-rounds) ZERO_ROUNDS="$2"; shift 2 ;;
        -*) echo "unknown option $1 (see the usage at the top of $0)" >&2; exit 2 ;;
        *) break ;;
    esac
done
SECONDS_PER_RUN="${1:-40}"
CONFIG="${CONFIG:-examples/ratekeeper.toml}"
RPM_REQUEST_BOUND="${RPM_REQUEST_BOUND:-1200}"

# shellcheck source=bench/lib.sh
. bench/lib.sh
python_bench_env openai,anthropic provider-bench-venv
out="$WORK"
runs=0
measure() {
    runs=$((runs + 1))
    "$PYTHON" bench/provider/bench.py --config "$CONFIG" --seconds "$SECONDS_PER_RUN" \
        --provider "$PROVIDER" --window-seconds "$WINDOW_SECONDS" \
        --json "$out/$(printf %02d "$runs").json" "$@"
}

echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$PYTHON" --version); daemon $RATEKEEPER_BIN"
echo "provider: $PROVIDER shape, $WINDOW_SECONDS s window; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$FOREIGN_SEEDS" -gt 0 ]; then
    for seed in $(seq 1 "$FOREIGN_SEEDS"); do
        measure --workload tokens --acquire messages --sidecars 2 --foreign 0.2 --feedback --seed "$seed"
    done
elif [ "$ZERO_ROUNDS" -gt 0 ]; then
    for _ in $(seq 1 "$ZERO_ROUNDS"); do
        measure --workload tokens --acquire tokens --sidecars 1
        measure --workload tokens --acquire messages --sidecars 2
        measure --workload requests --rpm "$RPM_REQUEST_BOUND" --acquire tokens --sidecars 2
        measure --workload requests --rpm "$RPM_REQUEST_BOUND" --acquire messages --sidecars 1
    done
else
    for workload in tokens requests; do
        rpm=3000
        [ "$workload" = requests ] && rpm="$RPM_REQUEST_BOUND"
        for acquire in tokens messages; do
            for sidecars in 1 2; do
                measure --workload "$workload" --rpm "$rpm" --acquire "$acquire" --sidecars "$sidecars"
            done
        done
    done
    for acquire in tokens messages; do
        measure --workload tokens --acquire "$acquire" --sidecars 2 --foreign 0.2 --no-feedback
        measure --workload tokens --acquire "$acquire" --sidecars 2 --foreign 0.2 --feedback
    done
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$PYTHON" bench/provider/bench.py --table "$out"/*.json
