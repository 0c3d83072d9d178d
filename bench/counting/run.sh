#!/usr/bin/env bash
# Issue 27, "counting never starves the rest": the latency of pings and of
# small acquires on other connections, idle and while HOGS connections keep
# the largest prompts (PROMPT_BYTES of prose each, tiktoken o200k_base)
# being counted. One ping and one 1-token acquire every millisecond, each on
# its own connection; the prompts are acquires by messages, one in flight per
# connection, sent again as soon as answered. Prints a Markdown table, a row
# per build, round and phase: latencies in ms from each request's send, the
# prompts counted meanwhile, and the CPU time the daemon's socket loop (its
# runtime thread, from /proc) spends per prompt, measured with the prompts
# alone for ALONE_SECONDS first (a figure the machine's other load hardly
# moves); see bench/counting/README.md.
#
# Usage: bench/counting/run.sh [ROUNDS] [SECONDS]   (default 3 10)
#   HOGS=4 PROMPT_BYTES=3900000   the connections counting, and their prompts
#   PROMPT_TEXT=prose             letter: one letter repeated, tiktoken's slowest;
#                                 parts: 16,384 messages of 4 parts, the slowest to decode
#   BEFORE_BIN=path   adds rows for another daemon build, alternating with
#                     this one in every round
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${1:-3}"
RUN_SECONDS="${2:-10}"
ALONE_SECONDS="${ALONE_SECONDS:-5}"
HOGS="${HOGS:-4}"
PROMPT_BYTES="${PROMPT_BYTES:-3900000}"
PROMPT_TEXT="${PROMPT_TEXT:-prose}"

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
start_redis
# "gpt" counts with tiktoken (o200k_base); its buckets hold far more than
# any run reserves. lib.sh adds "bench" for the small acquires.
GPT_LIMIT='[[limits]]
name = "gpt"
model = "gpt-4o-mini"
tokens_per_minute = 1000000000
burst_tokens = 10000000000
requests_per_minute = 1000000000
burst_requests = 1000000000'
# Each build as name:socket:pid (the pid is its runtime thread's too).
builds=()
if [ -n "${BEFORE_BIN:-}" ]; then
    start_sidecar rk-before "$BEFORE_BIN" "$GPT_LIMIT"
    builds+=("before:$SOCKET:${PIDS[-1]}")
fi
start_sidecar rk-this "$BIN" "$GPT_LIMIT"
builds+=("this:$SOCKET:${PIDS[-1]}")

echo "$(nproc) cores; $("$BIN" --version); load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| build | round | prompts | loop ms per prompt | counted | ping p50 | p99 | max | acquire p50 | p99 | max |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"

# Nanoseconds the daemon $1's runtime thread has run.
loop_ns() { cut -d' ' -f1 "/proc/$1/task/$1/schedstat"; }

# One row: a ping and an acquire connection for RUN_SECONDS, beside HOGS
# counting connections when $4 is "counting" (first alone for
# ALONE_SECONDS, to measure what each prompt costs the loop).
row() {
    local build="$1" socket="$2" pid="$3" phase="$4" round="$5" hog="" start
    echo '{"acquires": 0, "errors": 0}' >"$WORK/alone.json"
    echo '{"acquires": 0, "errors": 0}' >"$WORK/hogs.json"
    echo "0 0" >"$WORK/alone-ns"
    if [ "$phase" = counting ]; then
        start="$(loop_ns "$pid")"
        "$LOADGEN" gpt --socket "$socket" --connections "$HOGS" --prompt-bytes "$PROMPT_BYTES" \
            --prompt-text "$PROMPT_TEXT" --tokens 10 --seconds "$ALONE_SECONDS" >"$WORK/alone.json"
        echo "$start $(loop_ns "$pid")" >"$WORK/alone-ns"
        "$LOADGEN" gpt --socket "$socket" --connections "$HOGS" --prompt-bytes "$PROMPT_BYTES" \
            --prompt-text "$PROMPT_TEXT" --tokens 10 --seconds "$((RUN_SECONDS + 1))" \
            >"$WORK/hogs.json" &
        hog=$!
        # Every connection's first prompt is in before the samples start.
        sleep 1
    fi
    "$LOADGEN" bench --socket "$socket" --ping --interval 1 --seconds "$RUN_SECONDS" \
        >"$WORK/ping.json" &
    local ping=$!
    "$LOADGEN" bench --socket "$socket" --tokens 1 --interval 1 --seconds "$RUN_SECONDS" \
        >"$WORK/acquire.json"
    wait "$ping"
    [ -n "$hog" ] && wait "$hog"
    python3 - "$build" "$round" "$phase" "$WORK/alone-ns" \
        "$WORK/alone.json" "$WORK/hogs.json" "$WORK/ping.json" "$WORK/acquire.json" <<'PY'
import json, sys
build, round_, phase, alone_ns, *paths = sys.argv[1:]
alone, hogs, ping, acquire = (json.load(open(path)) for path in paths)
start, end = (int(ns) for ns in open(alone_ns).read().split())
ms = lambda us: f"{us / 1000:.2f}"
errors = lambda run: f" ({run['errors']} errors)" if run["errors"] else ""
per_prompt = counted = ""
if phase == "counting":
    per_prompt = f"{(end - start) / 1e6 / max(alone['acquires'], 1):.2f}{errors(alone)}"
    counted = f"{hogs['acquires']}{errors(hogs)}"
print(f"| {build} | {round_} | {phase} | {per_prompt} | {counted} "
      f"| {ms(ping['latency_p50_us'])} | {ms(ping['latency_p99_us'])} | {ms(ping['latency_max_us'])} "
      f"| {ms(acquire['latency_p50_us'])} | {ms(acquire['latency_p99_us'])} | {ms(acquire['latency_max_us'])} |")
PY
}

for round in $(seq "$ROUNDS"); do
    for entry in "${builds[@]}"; do
        IFS=: read -r build socket pid <<<"$entry"
        for phase in idle counting; do
            row "$build" "$socket" "$pid" "$phase" "$round"
        done
    done
done
