"""CPU time of the Python client alone per acquire, one caller at a time.

The issue's figure: one thread (or one asyncio task), one round trip at a
time, `time.process_time()` of the client process over N acquires (each
followed by its settlement, unless `--settle none`) divided by N. Each
client (`--clients label=src_dir ...`) runs in fresh processes, alternating
round by round against the same daemon, so that the machine's load falls on
all of them alike; prints the median and the range of the rounds.

`floor` is the same round trips written as bare `socket` calls on prepared
frames (one `sendall`, one `recv_into`, one `unpack_from` each): the system
calls and the wake-ups that no Python client can avoid.

    python bench/python/cpu.py --socket "$XDG_RUNTIME_DIR/rk.sock" \\
        --clients after=clients/python/src \\
        before=/tmp/before/clients/python/src --rounds 8 -n 10000 --settle report
    python bench/python/cpu.py --socket "$XDG_RUNTIME_DIR/rk.sock" --profile 5000   # cProfile, sync

Run it with bench/python/run-cpu.sh, which starts Redis and the sidecar.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket as socketlib
import statistics
import struct
import subprocess
import sys
import time

LIMIT = "bench"
TOKENS = 10
WARM_UP = 500


def sync_loop(ratekeeper, path: str, count: int, settle: str) -> float:
    client = ratekeeper.Client(path)
    acquire = client.acquire

    def one() -> None:
        lease = acquire(LIMIT, TOKENS, max_wait=0)
        if settle == "report":
            lease.report(TOKENS)
        elif settle == "release":
            lease.release()

    for _ in range(WARM_UP):
        one()
    started = time.process_time()
    for _ in range(count):
        one()
    return time.process_time() - started


def async_loop(ratekeeper, path: str, count: int, settle: str) -> float:
    async def main() -> float:
        client = ratekeeper.AsyncClient(path)
        acquire = client.acquire

        async def one() -> None:
            lease = await acquire(LIMIT, TOKENS, max_wait=0)
            if settle == "report":
                await lease.report(TOKENS)
            elif settle == "release":
                await lease.release()

        for _ in range(WARM_UP):
            await one()
        started = time.process_time()
        for _ in range(count):
            await one()
        return time.process_time() - started

    return asyncio.run(main())


def floor_loop(path: str, count: int, settle: str) -> float:
    """The same exchanges as bare socket calls on frames packed by hand (PROTOCOL.md)."""
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    sock.connect(path)
    name = b"cpu-floor"
    # Hello: request id 1, tag 0, protocol version u16 1, client name.
    hello = struct.pack("<QIHQ", 1, 0, 1, len(name)) + name
    sock.sendall(struct.pack("<I", len(hello)) + hello)
    time.sleep(0.2)
    sock.recv(65536)
    limit = LIMIT.encode()
    # Acquire (tag 1): limit, no tenant, no priority, TokenCost (tag 0), Some(max_wait_ms = 0).
    acquire = struct.Struct(f"<IQIQ{len(limit)}sBBIQQBQ")
    acquire_size = acquire.size - 4
    report = struct.Struct("<IQIQQQ")  # Report (tag 2): lease, input, output
    release = struct.Struct("<IQIQ")  # Release (tag 3): lease
    granted = struct.Struct("<IQIQQQ")  # length, request id, Granted (tag 1), lease, tokens, waited
    buffer = bytearray(65536)
    ids = iter(range(2, 2**62))
    recv_into, sendall = sock.recv_into, sock.sendall

    def one() -> None:
        sendall(
            acquire.pack(acquire_size, next(ids), 1, len(limit), limit, 0, 0, 0, TOKENS, 0, 1, 0)
        )
        recv_into(buffer)
        _, _, tag, lease, _, _ = granted.unpack_from(buffer)
        if tag != 1:
            raise RuntimeError(f"expected Granted (1), got response tag {tag}")
        if settle == "report":
            sendall(report.pack(report.size - 4, next(ids), 2, lease, TOKENS, 0))
            recv_into(buffer)
        elif settle == "release":
            sendall(release.pack(release.size - 4, next(ids), 3, lease))
            recv_into(buffer)

    for _ in range(WARM_UP):
        one()
    started = time.process_time()
    for _ in range(count):
        one()
    return time.process_time() - started


def one_round(src: str, path: str, count: int, settle: str, kind: str) -> float:
    """Seconds of CPU per acquire in this process."""
    if src == "floor":
        return floor_loop(path, count, settle) / count
    sys.path.insert(0, os.path.abspath(src))
    import ratekeeper

    assert ratekeeper.__file__.startswith(os.path.abspath(src)), ratekeeper.__file__
    loop = sync_loop if kind == "sync" else async_loop
    return loop(ratekeeper, path, count, settle) / count


def profile(src: str, path: str, count: int, settle: str) -> None:
    import cProfile
    import pstats

    sys.path.insert(0, os.path.abspath(src))
    import ratekeeper

    sync_loop(ratekeeper, path, WARM_UP, settle)
    profiler = cProfile.Profile()
    profiler.runcall(sync_loop, ratekeeper, path, count, settle)
    stats = pstats.Stats(profiler)
    calls = sum(stat[1] for stat in stats.stats.values())  # type: ignore[attr-defined]
    print(f"{calls / (count + WARM_UP):.1f} Python function calls per iteration")
    stats.sort_stats("tottime").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument(
        "--clients",
        nargs="+",
        default=["after=clients/python/src", "floor=floor"],
        help="label=src_dir (a client's clients/python/src), or label=floor",
    )
    parser.add_argument("-n", type=int, default=10_000, help="acquires per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--settle", choices=["none", "release", "report"], default="report")
    parser.add_argument("--kind", choices=["sync", "asyncio"], default="sync")
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile N sync iterations")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        per = one_round(options.one, options.socket, options.n, options.settle, options.kind)
        print(json.dumps(per))
        return
    if options.profile:
        src = options.clients[0].partition("=")[2]
        profile(src, options.socket, options.profile, options.settle)
        return
    clients = dict(item.partition("=")[::2] for item in options.clients)
    rounds: dict[str, list[float]] = {label: [] for label in clients}
    for _ in range(options.rounds):
        for label, src in clients.items():
            command = [
                sys.executable, __file__, "--socket", options.socket, "--one", src,
                "-n", str(options.n), "--settle", options.settle, "--kind", options.kind,
            ]  # fmt: skip
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rounds[label].append(json.loads(out) * 1e6)
    print(
        f"{options.kind}, settle={options.settle}, {options.rounds} rounds of {options.n}; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    print("| client | median µs | min-max µs |")
    print("| --- | ---: | ---: |")
    for label, values in rounds.items():
        print(
            f"| {label} | {statistics.median(values):.1f} | {min(values):.1f}-{max(values):.1f} |"
        )


if __name__ == "__main__":
    main()
