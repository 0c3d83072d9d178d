#!/usr/bin/env bash
# What open leases cost a connection's close (issue 9, finding 6): two
# sidecars of the same release build on the same Redis, one holding 100,000
# unreported leases on one connection that stays open, one holding none;
# then connect + Hello + close cycles from other connections, against each
# in alternating order, counting cycles a second and the daemon's CPU per
# cycle. Prints a Markdown table whose ratio column is each sidecar's rate
# over the one without leases; see bench/leases/README.md.
#
# Usage: bench/leases/run.sh [SECONDS_PER_STEP] [ROUNDS] [LEASES]   (default 3, 5, 100000)
# WORKERS=n churning processes (default 2).
# BEFORE_BIN=path also measures another daemon build (e.g. the commit
# before the fix) the same way, in the same run; its config leaves out
# `[server] threads`, which builds before 5594bfb do not know.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_STEP="${1:-3}"
ROUNDS="${2:-5}"
LEASES="${3:-100000}"

# Room for every lease, and none expires during the run.
LEASES_TOML="[leases]
max_open = 1000000
expire_after_ms = 86400000"

# shellcheck source=bench/lib.sh
. bench/lib.sh
build_release
start_redis
start_sidecar none "$BIN" "$LEASES_TOML"
SIDECARS=("after-0:$SOCKET:${PIDS[-1]}:0")
start_sidecar held "$BIN" "$LEASES_TOML"
SIDECARS+=("after-$LEASES:$SOCKET:${PIDS[-1]}:$LEASES")

# As lib.sh's start_sidecar, without `[server] threads`.
start_old_sidecar() {
    local name="$1" bin="$2"
    SOCKET="$WORK/$name.sock"
    cat > "$WORK/$name.toml" <<TOML
[server]
socket = "$SOCKET"

[redis]
url = "redis://127.0.0.1:$PORT/0"
key_prefix = "$name"

$LEASES_TOML

[[limits]]
name = "bench"
tokens_per_minute = 1000000000
burst_tokens = 10000000000
requests_per_minute = 1000000000
burst_requests = 10000000000
TOML
    "$bin" serve --config "$WORK/$name.toml" --log-level warn 2>"$WORK/$name.log" &
    PIDS+=($!)
    until [ -S "$SOCKET" ]; do sleep 0.05; done
}
if [ -n "${BEFORE_BIN:-}" ]; then
    start_old_sidecar before-none "$BEFORE_BIN"
    SIDECARS+=("before-0:$SOCKET:${PIDS[-1]}:0")
    start_old_sidecar before-held "$BEFORE_BIN"
    SIDECARS+=("before-$LEASES:$SOCKET:${PIDS[-1]}:$LEASES")
fi

python3 bench/leases/churn.py --seconds "$SECONDS_PER_STEP" --rounds "$ROUNDS" \
    --workers "${WORKERS:-2}" "${SIDECARS[@]}"
