# Shared by the benchmarks: a private redis-server on a free port and one
# sidecar on it, with a bucket ("bench") far larger than any run can drain,
# so that every acquire is a grant and takes the script's full path (refill,
# reserve, write, expire). Source it, then call start_redis_and_sidecar BIN.
# Sets WORK, PORT and SOCKET; everything is stopped and removed on exit.

WORK="$(mktemp -d)"
cleanup() {
    [ -n "${DAEMON_PID:-}" ] && kill "$DAEMON_PID" 2>/dev/null || true
    [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

start_redis_and_sidecar() {
    local bin="$1"
    PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
        --logfile "$WORK/redis.log" &
    REDIS_PID=$!
    until redis-cli -p "$PORT" PING >/dev/null 2>&1; do sleep 0.05; done

    SOCKET="$WORK/rk.sock"
    cat > "$WORK/bench.toml" <<TOML
[server]
socket = "$SOCKET"

[redis]
url = "redis://127.0.0.1:$PORT/0"

[[limits]]
name = "bench"
tokens_per_minute = 1000000000
burst_tokens = 10000000000
requests_per_minute = 1000000000
burst_requests = 10000000000
TOML
    "$bin" serve --config "$WORK/bench.toml" --log-level warn 2>"$WORK/daemon.log" &
    DAEMON_PID=$!
    until [ -S "$SOCKET" ]; do sleep 0.05; done
}
