#!/usr/bin/env bash
# The issue-11 matrix against a strict fake provider: every combination of
# workload (token- or request-bound), acquire (by token count or by
# messages) and 1 or 2 sidecars with no foreign traffic, then 20 % foreign
# traffic with and without forwarding the provider's answers; prints a
# Markdown table. See bench/provider/README.md.
#
# Usage: bench/provider/run.sh [--window-seconds W] [--provider SHAPE] [SECONDS]
#   --window-seconds W: the provider enforces each per-minute limit over W
#     seconds (default 60; 1 is what OpenAI and Anthropic say they may do)
#   --provider SHAPE: openai (default) or anthropic: the fake's shape, and the
#     config's limit for it (the example's Anthropic limit, uncommented)
#   SECONDS: the length of each run (default 40)
#   RATEKEEPER_BIN: the daemon to measure (default: a debug build of this tree)
#   CONFIG: the config template (default examples/ratekeeper.toml)
#   RPM_REQUEST_BOUND: requests per minute of the request-bound runs (default 1200)
#   PYTHON: a Python with ratekeeper, openai and anthropic installed (default: a venv under target/)
set -euo pipefail
cd "$(dirname "$0")/../.."
WINDOW_SECONDS=60
PROVIDER=openai
while [ $# -gt 0 ]; do
    case "$1" in
        --window-seconds) WINDOW_SECONDS="$2"; shift 2 ;;
        --provider) PROVIDER="$2"; shift 2 ;;
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
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$PYTHON" bench/provider/bench.py --table "$out"/*.json
