# Shared by the benchmarks: a private redis-server on a free port and
# sidecars on it, with a bucket ("bench") far larger than any run can drain,
# so that every acquire is a grant and takes the script's full path (refill,
# reserve, write, expire). Source it, then call start_redis_and_sidecar BIN
# (sets PORT and SOCKET), or start_redis and then start_sidecar NAME BIN
# [EXTRA_TOML] once per sidecar (sets SOCKET to the new one's). WORK is the
# scratch directory; everything is stopped and removed on exit.

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Checks for redis-server, builds the release binaries (in CARGO_TARGET_DIR
# if set) and sets BIN (RATEKEEPER_BIN if set: another daemon build) and
# LOADGEN.
build_release() {
    command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
    cargo build --release --quiet
    local target="${CARGO_TARGET_DIR:-$PWD/target}"
    BIN="${RATEKEEPER_BIN:-$target/release/ratekeeper}"
    LOADGEN="$target/release/ratekeeper-loadgen"
}

# For the end-to-end benchmarks driven by Python: checks for redis-server,
# exports RATEKEEPER_BIN (a debug build of this tree unless set) and sets
# PYTHON (unless set: a venv under the target directory named VENV, with
# the client and its EXTRA installed). Usage: python_bench_env EXTRA VENV
python_bench_env() {
    command -v redis-server >/dev/null || { echo "needs redis-server (scripts/test installs it)" >&2; exit 1; }
    local target="${CARGO_TARGET_DIR:-$PWD/target}"
    if [ -z "${RATEKEEPER_BIN:-}" ]; then
        cargo build --quiet --bin ratekeeper
        export RATEKEEPER_BIN="$target/debug/ratekeeper"
    fi
    if [ -z "${PYTHON:-}" ]; then
        local venv="$target/$2"
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "./clients/python[$1]"
        PYTHON="$venv/bin/python"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start_redis() {
    PORT="$(free_port)"
    # shellcheck disable=SC2086  # REDIS_EXTRA: extra arguments, split on purpose
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" ${REDIS_EXTRA:-} \
        --logfile "$WORK/redis.log" &
    PIDS+=($!)
    until redis-cli -p "$PORT" PING >/dev/null 2>&1; do sleep 0.05; done
}

# SIDECAR_THREADS: the sidecar's [server] threads (default 1); set but empty
# leaves the key out, for builds older than it.
start_sidecar() {
    local name="$1" bin="$2" extra="${3:-}" threads=""
    [ -n "${SIDECAR_THREADS-1}" ] && threads="threads = ${SIDECAR_THREADS-1}"
    SOCKET="$WORK/$name.sock"
    cat > "$WORK/$name.toml" <<TOML
[server]
socket = "$SOCKET"
$threads

[redis]
url = "redis://127.0.0.1:$PORT/0"
key_prefix = "$name"

$extra

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

start_redis_and_sidecar() {
    start_redis
    start_sidecar rk "$1"
}
