#!/usr/bin/env bash
# Soak: ten minutes (or SECONDS given) of mixed load on one sidecar over a
# private Redis, with Redis restarts, killed clients, SIGHUPs and hostile
# clients, sampling the daemon's RSS, open fds, leases and connections each
# second. Writes samples.csv, soak.svg and result.md next to this script.
# Not part of CI; see bench/soak/README.md.
#
# Usage: bench/soak/run.sh [SECONDS]   (default 600)
# RATEKEEPER_BIN=path soaks another daemon build.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
cargo build --release --quiet
target="${CARGO_TARGET_DIR:-$PWD/target}"
exec python3 bench/soak/soak.py \
    --daemon "${RATEKEEPER_BIN:-$target/release/ratekeeper}" \
    --loadgen "$target/release/ratekeeper-loadgen" \
    --seconds "${1:-600}" --out bench/soak
