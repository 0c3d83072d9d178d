#!/usr/bin/env bash
# The user's stack end to end: the Gunicorn example (gunicorn -w 4) and the
# Celery example (--concurrency 8) together, driven at twice the provider's
# limit against the strict fake OpenAI provider with the shipped default
# config; first through ratekeeper, then with a token bucket of the whole
# limit in each worker process; prints a Markdown table. See
# bench/stack/README.md.
#
# Usage: bench/stack/run.sh [SECONDS]     (default 60)
#   RATEKEEPER_BIN: the daemon to measure (default: a debug build of this tree)
#   PYTHON: a Python with ratekeeper[examples] installed (default: a venv under target/)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_RUN="${1:-60}"

# shellcheck source=bench/lib.sh
. bench/lib.sh
python_bench_env examples stack-bench-venv
out="$WORK"
echo "$(nproc) cores; $(redis-server --version | cut -d' ' -f1-3); $("$PYTHON" --version); daemon $RATEKEEPER_BIN"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PYTHON" bench/stack/bench.py --limiter ratekeeper --seconds "$SECONDS_PER_RUN" --json "$out/1.json"
"$PYTHON" bench/stack/bench.py --limiter per-process --seconds "$SECONDS_PER_RUN" --json "$out/2.json"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$PYTHON" bench/stack/bench.py --table "$out"/1.json "$out"/2.json
