"""Instructions the sync client executes per acquire, with the socket faked.

CPU time on a shared 2-core machine moves by tens of percent with the load;
instruction counts do not. This runs `Client.acquire` (and the lease's
`report` or `release`) against an in-process fake socket that answers each
request at once with the daemon's bytes (`Granted`, `Settled`, `Released`),
under valgrind's callgrind, twice: with 0 and with N iterations after the
same warm-up; the difference over N is the client's Python work per
iteration, without the kernel and without waiting (the fake's own few lines
included, alike for every client).

    python bench/python/instructions.py --clients before=/tmp/before/clients/python/src \\
        after=clients/python/src -n 2000 --settle report

Needs valgrind. `--one SRC N SETTLE` runs the loop itself (what valgrind runs).
"""

from __future__ import annotations

import argparse
import re
import socket
import struct
import subprocess
import sys

LIMIT, TOKENS, WARM_UP = "bench", 10, 200


class FakeSocket:
    """Answers each frame sent at once, as the daemon would with ample capacity."""

    def __init__(self) -> None:
        self._real, self._peer = socket.socketpair()  # a file descriptor for poll
        self._out = b""
        self._lease = 0

    def fileno(self) -> int:
        return self._real.fileno()

    def setsockopt(self, *args) -> None:
        self._real.setsockopt(*args)

    def sendall(self, data: bytes) -> None:
        request_id, tag = struct.unpack_from("<QI", data, 4)
        if tag == 1:  # Acquire -> Granted(lease, tokens, waited_ms)
            self._lease += 1
            self._out += struct.pack("<IQIQQQ", 36, request_id, 1, self._lease, TOKENS, 0)
        elif tag == 2:  # Report -> Settled(tokens_returned)
            self._out += struct.pack("<IQIq", 20, request_id, 3, 0)
        elif tag == 3:  # Release -> Released(tokens_returned)
            self._out += struct.pack("<IQIQ", 20, request_id, 4, TOKENS)

    def recv_into(self, buffer) -> int:
        size = len(self._out)
        buffer[:size], self._out = self._out, b""
        return size

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        self._real.close()
        self._peer.close()


def loop(src: str, count: int, settle: str) -> None:
    sys.path.insert(0, src)
    import ratekeeper
    from ratekeeper._core.session import Session
    from ratekeeper._sync.transport import Connection

    client = ratekeeper.Client("/nonexistent")
    client._slot.conn = Connection(Session("fake"), FakeSocket(), [])

    def one() -> None:
        lease = client.acquire(LIMIT, TOKENS, max_wait=0)
        if settle == "report":
            lease.report(TOKENS)
        elif settle == "release":
            lease.release()

    for _ in range(WARM_UP + count):
        one()


def instructions(src: str, count: int, settle: str) -> int:
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, __file__, "--one", src, str(count), settle,
    ]  # fmt: skip
    err = subprocess.run(command, check=True, capture_output=True, text=True).stderr
    return int(re.search(r"refs:\s*([\d,]+)", err).group(1).replace(",", ""))  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", nargs="+", default=["after=clients/python/src"])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--settle", choices=["none", "release", "report"], default="report")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        src, count, settle = options.one
        loop(src, int(count), settle)
        return
    print(f"settle={options.settle}, {options.n} iterations under callgrind")
    print("| client | instructions per iteration |")
    print("| --- | ---: |")
    for item in options.clients:
        label, _, src = item.partition("=")
        base = instructions(src, 0, options.settle)
        total = instructions(src, options.n, options.settle)
        print(f"| {label} | {(total - base) / options.n:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
