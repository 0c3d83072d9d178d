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

# Builds before `[server] threads` refuse the key: leave it out for them.
if [ -n "${BEFORE_BIN:-}" ]; then
    SIDECAR_THREADS="" start_sidecar before-none "$BEFORE_BIN" "$LEASES_TOML"
    SIDECARS+=("before-0:$SOCKET:${PIDS[-1]}:0")
    SIDECAR_THREADS="" start_sidecar before-held "$BEFORE_BIN" "$LEASES_TOML"
    SIDECARS+=("before-$LEASES:$SOCKET:${PIDS[-1]}:$LEASES")
fi

python3 bench/leases/churn.py --seconds "$SECONDS_PER_STEP" --rounds "$ROUNDS" \
    --workers "${WORKERS:-2}" "${SIDECARS[@]}"
