"""Connection churn against sidecars that hold many open leases or none.

For each sidecar given as LABEL:SOCKET:PID:LEASES, opens one connection
that acquires LEASES one-token leases of the limit "bench" and never
reports them (it stays open to the end, so the leases stay open), then
measures, in alternating order, how many connect + Hello + close cycles a
second WORKERS processes get through on new connections, and the daemon's
CPU time per cycle (from /proc/PID/stat). Prints a Markdown table; a
sidecar holding leases is compared with the one of the same build (the
label up to its last '-') holding none, round by round.

Speaks the wire protocol (proto-spec/PROTOCOL.md) with the standard
library only: frames are a u32 little-endian length and the bincode
"legacy" encoding of the message.
"""

import argparse
import multiprocessing
import os
import socket
import statistics
import struct
import time

PROTOCOL_VERSION = 1
WINDOW = 512  # acquires in flight on the holding connection (daemon: 1024)


def string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def frame(request_id, body):
    payload = struct.pack("<Q", request_id) + body
    return struct.pack("<I", len(payload)) + payload


def hello(request_id, name):
    return frame(request_id, struct.pack("<IH", 0, PROTOCOL_VERSION) + string(name))


def acquire(request_id, limit, tokens):
    body = struct.pack("<I", 1) + string(limit) + b"\x00\x00"  # no tenant, no priority
    body += struct.pack("<IQQ", 0, tokens, 0)  # Cost::Tokens
    body += b"\x01" + struct.pack("<Q", 0)  # max_wait_ms: Some(0)
    return frame(request_id, body)


def ping(request_id):
    return frame(request_id, struct.pack("<I", 7))


class Reader:
    """Whole frames from a stream: (request_id, response tag)."""

    def __init__(self, sock):
        self.sock = sock
        self.buffer = bytearray()

    def next(self):
        while True:
            if len(self.buffer) >= 4:
                (length,) = struct.unpack_from("<I", self.buffer)
                if len(self.buffer) >= 4 + length:
                    request_id, tag = struct.unpack_from("<QI", self.buffer, 4)
                    del self.buffer[: 4 + length]
                    return request_id, tag
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.buffer += chunk


def hold_leases(path, count):
    """A connection holding `count` unreported leases; returns the socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    reader = Reader(sock)
    sock.sendall(hello(1, "bench/leases holder"))
    assert reader.next()[1] == 0, "Hello"
    sent = answered = granted = 0
    next_id = 2
    while answered < count:
        batch = []
        while sent < count and sent - answered < WINDOW:
            batch.append(acquire(next_id, "bench", 1))
            next_id += 1
            sent += 1
        if batch:
            sock.sendall(b"".join(batch))
        _, tag = reader.next()
        answered += 1
        granted += tag == 1  # Granted
    if granted != count:
        raise SystemExit(f"only {granted} of {count} acquires were granted")
    return sock


def still_open(sock):
    sock.sendall(ping(1 << 40))
    return Reader(sock).next()[1] == 8  # Pong


def churn(args):
    """One worker: connect + Hello + close until `seconds` have passed."""
    path, seconds = args
    greeting = hello(1, "bench/leases churn")
    deadline = time.monotonic() + seconds
    cycles = 0
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(greeting)
        answer = b""
        while len(answer) < 4 or len(answer) < 4 + struct.unpack_from("<I", answer)[0]:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed before the Hello answer")
            answer += chunk
        assert struct.unpack_from("<I", answer, 12)[0] == 0, "Hello"
        sock.close()
        cycles += 1
    return cycles


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def step(pool, sidecar, seconds, workers):
    """(cycles a second, daemon CPU µs per cycle) of one timed step."""
    before = cpu_seconds(sidecar["pid"])
    started = time.monotonic()
    cycles = sum(pool.map(churn, [(sidecar["socket"], seconds)] * workers))
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(sidecar["pid"]) - before
    return cycles / elapsed, cpu * 1e6 / cycles


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sidecars", nargs="+", metavar="LABEL:SOCKET:PID:LEASES")
    parser.add_argument("--seconds", type=float, default=3.0, help="per step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="churning processes")
    args = parser.parse_args()
    sidecars = []
    for spec in args.sidecars:
        label, path, pid, leases = spec.split(":")
        sidecars.append({"label": label, "socket": path, "pid": int(pid), "leases": int(leases)})

    holders = []
    for sidecar in sidecars:
        if sidecar["leases"]:
            started = time.monotonic()
            holders.append((sidecar, hold_leases(sidecar["socket"], sidecar["leases"])))
            print(
                f"{sidecar['label']}: {sidecar['leases']} leases open in "
                f"{time.monotonic() - started:.1f} s",
                flush=True,
            )

    results = {sidecar["label"]: [] for sidecar in sidecars}
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for sidecar in sidecars:  # warm-up, not counted
            step(pool, sidecar, 0.5, args.workers)
        for round_ in range(args.rounds):
            order = sidecars if round_ % 2 == 0 else sidecars[::-1]
            for sidecar in order:
                results[sidecar["label"]].append(step(pool, sidecar, args.seconds, args.workers))

    for sidecar, sock in holders:
        if not still_open(sock):
            raise SystemExit(f"{sidecar['label']}: the holding connection did not survive")

    med = statistics.median
    print()
    print(
        "| sidecar | open leases | connect + Hello + close /s (median, range) | "
        "daemon CPU µs per cycle (median) | rate / same build without leases "
        "(median of the rounds' ratios, range) | "
        "CPU per cycle / same build without leases (median) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for sidecar in sidecars:
        rows = results[sidecar["label"]]
        rates = [rate for rate, _ in rows]
        cpus = [cpu for _, cpu in rows]
        line = (
            f"| {sidecar['label']} | {sidecar['leases']:,} | {med(rates):,.0f} "
            f"({min(rates):,.0f}-{max(rates):,.0f}) | {med(cpus):.1f} |"
        )
        reference = next(
            (
                other
                for other in sidecars
                if other["leases"] == 0 and build(other) == build(sidecar)
            ),
            None,
        )
        if reference is None or reference is sidecar:
            print(line + " | |")
            continue
        base = results[reference["label"]]
        ratios = [rate / ref for (rate, _), (ref, _) in zip(rows, base)]
        cpu_ratios = [cpu / ref for (_, cpu), (_, ref) in zip(rows, base)]
        print(
            f"{line} {med(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{med(cpu_ratios):.2f} |"
        )


def build(sidecar):
    """The build a label names: what comes before its last '-'."""
    return sidecar["label"].rsplit("-", 1)[0]


if __name__ == "__main__":
    main()
