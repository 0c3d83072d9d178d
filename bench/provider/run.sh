#!/usr/bin/env bash
# The issue-11 matrix against the strict fake OpenAI provider: every
# combination of workload (token- or request-bound), acquire (by token count
# or by messages) and 1 or 2 sidecars with no foreign traffic, then 20 %
# foreign traffic with and without forwarding the provider's answers; prints
# a Markdown table. See the README, section "Provider feedback".
#
# Usage: bench/provider/run.sh [SECONDS]     (default 40)
#   RATEKEEPER_BIN: the daemon to measure (default: a debug build of this tree)
#   CONFIG: the config template (default examples/ratekeeper.toml)
#   RPM_REQUEST_BOUND: requests per minute of the request-bound runs (default 1200)
#   PYTHON: a Python with ratekeeper and openai installed (default: a venv under target/)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_RUN="${1:-40}"
CONFIG="${CONFIG:-examples/ratekeeper.toml}"
RPM_REQUEST_BOUND="${RPM_REQUEST_BOUND:-1200}"

# shellcheck source=bench/lib.sh
. bench/lib.sh
python_bench_env openai provider-bench-venv
out="$WORK"
runs=0
measure() {
    runs=$((runs + 1))
    "$PYTHON" bench/provider/bench.py --config "$CONFIG" --seconds "$SECONDS_PER_RUN" \
        --json "$out/$(printf %02d "$runs").json" "$@"
}

echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$PYTHON" --version); daemon $RATEKEEPER_BIN"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
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
    for feedback in --no-feedback --feedback; do
        measure --workload tokens --acquire "$acquire" --sidecars 2 --foreign 0.2 "$feedback"
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$PYTHON" bench/provider/bench.py --table "$out"/*.json
