"""Acquire round trips from Python: through the sidecar, or EVALSHA from every worker.

For 1, 4 and 8 worker processes, each mode runs for a fixed time and reports
acquires per second and the p50/p99 round trip of one acquire:

- `sidecar sync`: `ratekeeper.Client.acquire`, one thread per process;
- `sidecar asyncio`: `ratekeeper.AsyncClient.acquire` from 8 tasks per process;
- `redis-py sync`: the tutorial's way, every worker calling the acquire script
  itself (`redis.Redis` + `register_script`), one thread per process;
- `redis-py asyncio`: the same with `redis.asyncio` from 8 tasks per process.

Both paths run the same script (lua/acquire.lua) on the same two buckets
(tokens and requests) of the same Redis, sized so that every acquire is a
grant. Run it with bench/python/run.sh, which starts Redis and the sidecar.

    python bench/python/bench.py --socket /tmp/rk.sock --redis redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from pathlib import Path

LIMIT = "bench"
CAPACITY, PER_MINUTE = 10_000_000_000, 1_000_000_000
LUA = Path(__file__).resolve().parents[2] / "lua"
#: The sidecar's acquire script, after the shared helpers when they are split out.
SCRIPT = "".join(
    (LUA / name).read_text() for name in ("bucket.lua", "acquire.lua") if (LUA / name).exists()
)
TASKS_PER_PROCESS = 8


def script_args() -> tuple[list[str], list]:
    """The keys and arguments of one sidecar acquire of one token on LIMIT."""
    keys = [f"pybench:{{{LIMIT}}}:tokens", f"pybench:{{{LIMIT}}}:requests"]
    bucket = [CAPACITY, PER_MINUTE, 1, 0]
    return keys, [0, "", *bucket, *bucket]


def sidecar_sync(socket: str, redis_url: str, seconds: float) -> list[float]:
    import ratekeeper

    client = ratekeeper.Client(socket)
    client.ping()
    return _loop(lambda: client.acquire(LIMIT, 1, max_wait=0), seconds)


def redis_sync(socket: str, redis_url: str, seconds: float) -> list[float]:
    import redis

    connection = redis.Redis.from_url(redis_url)
    acquire = connection.register_script(SCRIPT)
    keys, args = script_args()
    acquire(keys=keys, args=args)  # loads the script
    return _loop(lambda: acquire(keys=keys, args=args), seconds)


def _loop(call, seconds: float) -> list[float]:
    latencies = []
    end = time.perf_counter() + seconds
    while True:
        started = time.perf_counter()
        if started >= end:
            return latencies
        call()
        latencies.append(time.perf_counter() - started)


def sidecar_async(socket: str, redis_url: str, seconds: float) -> list[float]:
    import ratekeeper

    async def main() -> list[float]:
        client = ratekeeper.AsyncClient(socket)
        await client.ping()
        return await _tasks(lambda: client.acquire(LIMIT, 1, max_wait=0), seconds)

    return asyncio.run(main())


def redis_async(socket: str, redis_url: str, seconds: float) -> list[float]:
    import redis.asyncio

    async def main() -> list[float]:
        connection = redis.asyncio.Redis.from_url(redis_url)
        acquire = connection.register_script(SCRIPT)
        keys, args = script_args()
        await acquire(keys=keys, args=args)
        latencies = await _tasks(lambda: acquire(keys=keys, args=args), seconds)
        await connection.aclose()
        return latencies

    return asyncio.run(main())


async def _tasks(call, seconds: float) -> list[float]:
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def task() -> None:
        while True:
            started = time.perf_counter()
            if started >= end:
                return
            await call()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(task() for _ in range(TASKS_PER_PROCESS)))
    return latencies


MODES = {
    "sidecar sync": sidecar_sync,
    "redis-py sync": redis_sync,
    "sidecar asyncio": sidecar_async,
    "redis-py asyncio": redis_async,
}


def _worker(mode: str, socket: str, redis_url: str, seconds: float, barrier, results) -> None:
    barrier.wait()
    results.put(MODES[mode](socket, redis_url, seconds))


def run(mode: str, processes: int, socket: str, redis_url: str, seconds: float) -> dict:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_worker, args=(mode, socket, redis_url, seconds, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    latencies = sorted(x for _ in workers for x in results.get(timeout=seconds + 60))
    for worker in workers:
        worker.join()
    return {
        "per_second": len(latencies) / seconds,
        "p50_us": statistics.quantiles(latencies, n=100)[49] * 1e6,
        "p99_us": statistics.quantiles(latencies, n=100)[98] * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the sidecar's socket")
    parser.add_argument("--redis", required=True, help="the sidecar's Redis, redis://host:port/db")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8])
    options = parser.parse_args()
    print("| processes | mode | acquires/s | p50 µs | p99 µs |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for processes in options.processes:
        for mode in MODES:
            result = run(mode, processes, options.socket, options.redis, options.seconds)
            print(
                f"| {processes} | {mode} | {result['per_second']:,.0f} "
                f"| {result['p50_us']:,.0f} | {result['p99_us']:,.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
