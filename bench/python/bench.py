"""Acquires from Python: through the sidecar, or the acquire script from every worker.

For each shape of workers (processes x threads, or processes x asyncio tasks),
each mode runs for a fixed time and reports acquires per second, the p50/p99
round trip, the CPU time spent per acquire by each party, and the Redis
commands each acquire cost:

- client: the worker processes' own CPU (`getrusage` in each process, user +
  system, over its measured window);
- daemon: the sidecar's CPU, from /proc/PID/stat (utime + stime) before and
  after the window;
- redis: the redis-server's CPU, the same way;
- script calls / acquire: EVAL, EVALSHA and their read-only and FCALL
  variants that Redis ran in the window (`INFO commandstats`, before and
  after), per acquire;
- Redis commands / acquire: every command Redis ran in the window, those the
  scripts ran inside included (commandstats counts them too), less the INFO
  and CONFIG calls of the bench itself, per acquire.

Modes, all measured in the same run:

- `sidecar sync`: `ratekeeper.Client.acquire`, one client per process shared
  by its threads;
- `sidecar asyncio`: `ratekeeper.AsyncClient.acquire` from the tasks of one
  event loop per process;
- `redis-py sync`: every worker calling the sidecar's own script itself
  (`redis.Redis` + `register_script` of lua/batch.lua with one acquire, one
  client per process shared by its threads);
- `redis-py asyncio`: the same with `redis.asyncio`, one client per process;
- `tutorial sync`, `tutorial asyncio`: the tutorial's approach, every worker
  calling a plain one-bucket token-bucket script (the client's clock, a
  float wait, tokens only) with redis-py;
- with `--baseline-client DIR`, `baseline sync` and `baseline asyncio` run the
  client found in DIR (another checkout's `clients/python/src`) the same way,
  for a before/after in one sitting.

The sidecar and `redis-py` run the same script (lua/batch.lua) on the same two
buckets (tokens and requests) of the same Redis, sized so that every acquire
of 10 tokens is a grant; each direct call carries a fresh call id, as the
sidecar's calls do. Every mode uses the same Redis, so the Redis columns
compare across modes: the sidecar's coalescing shows as script calls below
one per acquire. Run it with bench/python/run.sh, which starts Redis and the
sidecar and passes their pids.

    python bench/python/bench.py --socket "$XDG_RUNTIME_DIR/rk.sock" \\
        --redis redis://127.0.0.1:6379/0 \\
        --daemon-pid 1234 --redis-pid 1233 --shapes 1x1 1x8 4x8
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

# The shared helpers of bench/, beside this script's directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from redis_commands import command_counts

LIMIT = "bench"
TOKENS = 10
CAPACITY, PER_MINUTE = 10_000_000_000, 1_000_000_000
LUA = Path(__file__).resolve().parents[2] / "lua"
#: The sidecar's script: the bucket library, then the batch.
SCRIPT = (LUA / "bucket.lua").read_text() + (LUA / "batch.lua").read_text()
#: The tutorial's token bucket: one key, the caller's clock, a float wait.
TUTORIAL = """
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate)
local allowed = tokens >= cost
if allowed then tokens = tokens - cost end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 1)
if allowed then return {1, 0} end
return {0, tostring((cost - tokens) / rate)}
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: What the bench itself sends to Redis around a window (commandstats names
#: subcommands `config|get`): not counted as the workload's.
OWN_COMMANDS = frozenset({"info", "config"})


def script_args() -> Callable[[], tuple[list[str], list]]:
    """The keys and arguments of successive sidecar acquires of TOKENS tokens on
    LIMIT, each a call of its own with a fresh call id."""
    prefix = f"pybench:{{{LIMIT}}}"
    # In the bucket's units, as the sidecar sends them: 60000 a token for a
    # rate per minute, which refills PER_MINUTE units a millisecond; then
    # the largest cost an acquire may take (the capacity), and no keep-until
    # (a bucket that refills expires when full).
    shape = [CAPACITY * 60_000, PER_MINUTE, CAPACITY * 60_000, 0]
    draw = [TOKENS * 60_000, 0]
    args = ["", 10_000, 1, f"pybench-{os.getpid()}", *shape, *shape, "a", 0, 2, 2, *draw, 3, *draw]
    calls = itertools.count()
    pid = os.getpid()

    def next_call() -> tuple[list[str], list]:
        record = f"{prefix}:call:{pid}-{next(calls)}"
        return [record, f"{prefix}:tokens", f"{prefix}:requests"], args

    return next_call


def tutorial_args() -> tuple[list[str], list]:
    return [f"tutorial:{LIMIT}"], [CAPACITY, PER_MINUTE / 60, time.time(), TOKENS]


# ---------------------------------------------------------------------------
# What one worker process runs: an acquire callable per mode, then a loop
# ---------------------------------------------------------------------------


def _import_client(baseline: Optional[str]):
    if baseline:
        sys.path.insert(0, baseline)
    import ratekeeper

    if baseline:
        assert ratekeeper.__file__.startswith(baseline), ratekeeper.__file__
    return ratekeeper


def sidecar_sync(socket: str, redis_url: str, baseline: Optional[str] = None) -> Callable:
    client = _import_client(baseline).Client(socket)
    client.ping()
    return lambda: client.acquire(LIMIT, TOKENS, max_wait=0)


def redis_sync(socket: str, redis_url: str, baseline: Optional[str] = None) -> Callable:
    import redis

    script = redis.Redis.from_url(redis_url).register_script(SCRIPT)
    next_call = script_args()

    def acquire():
        keys, args = next_call()
        return script(keys=keys, args=args)

    return acquire


def tutorial_sync(socket: str, redis_url: str, baseline: Optional[str] = None) -> Callable:
    import redis

    script = redis.Redis.from_url(redis_url).register_script(TUTORIAL)

    def acquire():
        keys, args = tutorial_args()
        return script(keys=keys, args=args)

    return acquire


async def sidecar_async(socket: str, redis_url: str, baseline: Optional[str] = None) -> Callable:
    client = _import_client(baseline).AsyncClient(socket)
    await client.ping()
    return lambda: client.acquire(LIMIT, TOKENS, max_wait=0)


async def redis_async(socket: str, redis_url: str, baseline: Optional[str] = None) -> Callable:
    import redis.asyncio

    script = redis.asyncio.Redis.from_url(redis_url).register_script(SCRIPT)
    next_call = script_args()

    def acquire():
        keys, args = next_call()
        return script(keys=keys, args=args)

    return acquire


async def tutorial_async(socket: str, redis_url: str, baseline: Optional[str] = None) -> Callable:
    import redis.asyncio

    script = redis.asyncio.Redis.from_url(redis_url).register_script(TUTORIAL)

    def acquire():
        keys, args = tutorial_args()
        return script(keys=keys, args=args)

    return acquire


class Start:
    """The start of a measured window, shared by the parent and its workers:
    every worker process waits at `ready` after its warm-up and at `go`
    before its window, and the parent samples the counters between the two,
    so that no warm-up call and no measured call falls outside its window."""

    def __init__(self, context, parties: int) -> None:
        self.ready = context.Barrier(parties)
        self.go = context.Barrier(parties)

    def wait(self) -> None:
        self.ready.wait()
        self.go.wait()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_threads(make: Callable, threads: int, seconds: float, start: Start) -> dict:
    """Every thread calls the acquire in a loop for `seconds` after the start."""
    acquire = make()
    for _ in range(100):
        acquire()  # warm up: connected, script loaded, code paths taken
    latencies: list[list[float]] = [[] for _ in range(threads)]
    begin = threading.Barrier(threads + 1)

    def loop(out: list[float]) -> None:
        begin.wait()
        end = time.perf_counter() + seconds
        while True:
            started = time.perf_counter()
            if started >= end:
                return
            acquire()
            out.append(time.perf_counter() - started)

    workers = [threading.Thread(target=loop, args=(out,)) for out in latencies]
    for worker in workers:
        worker.start()
    start.wait()
    cpu = _cpu()
    begin.wait()
    for worker in workers:
        worker.join()
    return {"cpu": _cpu() - cpu, "latencies": [x for out in latencies for x in out]}


def run_tasks(make: Callable, tasks: int, seconds: float, start: Start) -> dict:
    """Every task awaits the acquire in a loop for `seconds` after the start."""

    async def main() -> dict:
        acquire = await make()
        for _ in range(100):
            await acquire()
        latencies: list[float] = []

        async def loop() -> None:
            end = time.perf_counter() + seconds
            while True:
                started = time.perf_counter()
                if started >= end:
                    return
                await acquire()
                latencies.append(time.perf_counter() - started)

        start.wait()  # blocks the loop, on purpose: nothing runs before the start
        cpu = _cpu()
        await asyncio.gather(*(loop() for _ in range(tasks)))
        return {"cpu": _cpu() - cpu, "latencies": latencies}

    return asyncio.run(main())


#: mode -> (how a process makes its acquire, how it runs its workers, client in baseline)
MODES = {
    "sidecar sync": (sidecar_sync, run_threads, False),
    "redis-py sync": (redis_sync, run_threads, False),
    "sidecar asyncio": (sidecar_async, run_tasks, False),
    "redis-py asyncio": (redis_async, run_tasks, False),
    "tutorial sync": (tutorial_sync, run_threads, False),
    "tutorial asyncio": (tutorial_async, run_tasks, False),
    "baseline sync": (sidecar_sync, run_threads, True),
    "baseline asyncio": (sidecar_async, run_tasks, True),
}


def _worker(mode: str, options: dict, workers: int, start: Start, results) -> None:
    make, runner, baseline = MODES[mode]
    base = options["baseline_client"] if baseline else None

    def made():
        return make(options["socket"], options["redis"], base)

    results.put(runner(made, workers, options["seconds"], start))


# ---------------------------------------------------------------------------
# The parent: starts the processes, samples the daemon's and Redis's CPU and
# Redis's command counts
# ---------------------------------------------------------------------------


def process_cpu(pid: Optional[int]) -> float:
    """utime + stime of a process, in seconds, from /proc/PID/stat (0 without a pid)."""
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CommandStats:
    """Redis's `INFO commandstats`: how many times it ran each command."""

    def __init__(self, url: str) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._redis.ping()  # connected now, not inside a window

    def sample(self) -> dict[str, int]:
        """Calls per command (lower case, `config|get` for subcommands) since
        Redis started, those run inside scripts included."""
        stats = self._redis.info("commandstats")
        return {name.removeprefix("cmdstat_"): fields["calls"] for name, fields in stats.items()}


def run(mode: str, processes: int, workers: int, options: dict, stats: CommandStats) -> dict:
    context = multiprocessing.get_context("spawn")
    start, results = Start(context, processes + 1), context.Queue()
    children = [
        context.Process(target=_worker, args=(mode, options, workers, start, results))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    start.ready.wait(timeout=60)
    commands = stats.sample()
    daemon, redis = process_cpu(options["daemon_pid"]), process_cpu(options["redis_pid"])
    start.go.wait(timeout=60)
    outcomes = [results.get(timeout=options["seconds"] + 60) for _ in children]
    daemon = process_cpu(options["daemon_pid"]) - daemon
    redis = process_cpu(options["redis_pid"]) - redis
    scripts, commands = command_counts(commands, stats.sample(), OWN_COMMANDS)
    for child in children:
        child.join()
    latencies = sorted(x for outcome in outcomes for x in outcome["latencies"])
    count = len(latencies)
    quantiles = statistics.quantiles(latencies, n=100)
    client = sum(outcome["cpu"] for outcome in outcomes)
    sidecar = mode.startswith(("sidecar", "baseline"))
    return {
        "per_second": count / options["seconds"],
        "p50_us": quantiles[49] * 1e6,
        "p99_us": quantiles[98] * 1e6,
        "client_us": client / count * 1e6,
        "daemon_us": daemon / count * 1e6 if sidecar else 0.0,
        "redis_us": redis / count * 1e6,
        "scripts_per_acquire": scripts / count,
        "commands_per_acquire": commands / count,
    }


def parse_shape(text: str) -> tuple[int, int]:
    """`PxW` (or `P` alone for `Px1`): processes, and workers in each."""
    processes, _, workers = text.partition("x")
    shape = int(processes), int(workers or 1)
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: processes and workers must be >= 1")
    return shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the sidecar's socket")
    parser.add_argument("--redis", required=True, help="the sidecar's Redis, redis://host:port/db")
    parser.add_argument("--daemon-pid", type=int, help="the sidecar's pid, for its CPU time")
    parser.add_argument("--redis-pid", type=int, help="redis-server's pid, for its CPU time")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        default=[(1, 1), (1, 8), (4, 8)],
        help="processes x threads (sync) or x tasks (asyncio) per process (default: 1x1 1x8 4x8)",
    )
    parser.add_argument("--baseline-client", help="another client's src dir, run as 'baseline'")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), help="default: all that apply")
    options = vars(parser.parse_args())
    modes = options["modes"] or [
        mode
        for mode, (_, _, baseline) in MODES.items()
        if options["baseline_client"] or not baseline
    ]
    stats = CommandStats(options["redis"])
    print(
        "| workers | mode | acquires/s | p50 µs | p99 µs "
        "| client CPU µs | daemon CPU µs | Redis CPU µs | total CPU µs | total vs redis-py "
        "| acquires/s vs tutorial | script calls / acquire | Redis commands / acquire |"
    )
    print("| ---: | --- |" + " ---: |" * 11)
    for processes, workers in options["shapes"]:
        results = {mode: run(mode, processes, workers, options, stats) for mode in modes}
        for mode, result in results.items():
            total = result["client_us"] + result["daemon_us"] + result["redis_us"]
            kind = "sync" if mode.endswith("sync") else "asyncio"
            reference = results.get(f"redis-py {kind}")
            ratio = ""
            if reference:
                ratio = f"{total / (reference['client_us'] + reference['redis_us']):.2f}×"  # noqa: RUF001
            tutorial = results.get(f"tutorial {kind}")
            speed = ""
            if tutorial:
                speed = f"{result['per_second'] / tutorial['per_second']:.2f}×"  # noqa: RUF001
            print(
                f"| {processes}×{workers} | {mode} | {result['per_second']:,.0f} "  # noqa: RUF001
                f"| {result['p50_us']:,.0f} | {result['p99_us']:,.0f} "
                f"| {result['client_us']:.0f} | {result['daemon_us']:.0f} "
                f"| {result['redis_us']:.0f} | {total:.0f} | {ratio} | {speed} "
                f"| {result['scripts_per_acquire']:.3f} | {result['commands_per_acquire']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
