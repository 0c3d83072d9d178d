"""Huge prompts through the socket (issue 9, finding 5), on a release daemon.

Usage: python3 bench/tokens/huge_prompts.py [DAEMON]   (default target/release/ratekeeper)

Standard library and the Python client only (clients/python/src on the path).
Two measurements, each on a fresh daemon with the embedded store and a
tiktoken-counted limit:
1. one acquire by messages of a single 3.9 MiB word (the slowest text there
   is for BPE): how long it takes and what it adds to the daemon's RSS;
2. twelve such acquires pipelined on one connection while another client
   sends 2 KB acquires by messages with max_wait 0.5 s, then the first
   client disconnects: how long the small acquires take, how much CPU the
   daemon spends once nobody waits for the counts, and its peak RSS.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))

from ratekeeper import _proto as p  # noqa: E402 (after the path is set)
from ratekeeper._core.session import Session  # noqa: E402 (after the path is set)
from ratekeeper._proto.messages import ChatMessage, ChatRequest  # noqa: E402 (after the path is set)

CONFIG = """[[limits]]
name = "gpt"
model = "gpt-4o-mini"
tokens_per_minute = 600000000
burst_tokens = 100000000
"""
WORD = 3_900_000


def mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(daemon: str) -> tuple[subprocess.Popen, str]:
    work = tempfile.mkdtemp()
    config = os.path.join(work, "rk.toml")
    with open(config, "w") as out:
        out.write(CONFIG)
    path = os.path.join(work, "rk.sock")
    log = open(os.path.join(work, "log"), "w")  # noqa: SIM115 (the daemon writes it until it exits)
    env = {**os.environ, "RATEKEEPER_SOCKET": path}
    process = subprocess.Popen([daemon, "serve", "--config", config], env=env, stderr=log)
    while not os.path.exists(path):
        if process.poll() is not None:
            sys.exit(f"the daemon exited: see {log.name}")
        time.sleep(0.01)
    return process, path


class Connection:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.session = Session("huge-prompts")
        self.received: list = []
        request_id, data = self.session.hello_frame()
        self.sock.sendall(data)
        self.session.accept_hello(self.answer(request_id))

    def send(self, request) -> int:
        request_id = self.session.next_id()
        frame = p.encode_frame(p.ClientFrame(request_id, request))
        self.sock.sendall(frame)
        return request_id

    def answer(self, request_id: int):
        while True:
            for index, frame in enumerate(self.received):
                if frame.request_id == request_id:
                    return self.received.pop(index)
            data = self.sock.recv(65536)
            if not data:
                sys.exit("the daemon closed the connection")
            self.received.extend(self.session.receive_data(data))


def acquire(text: str, max_wait_ms: int):
    chat = ChatRequest((ChatMessage("user", (text,)),), None, 10)
    return p.Acquire("gpt", chat, max_wait_ms=max_wait_ms)


def main() -> None:
    daemon = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/ratekeeper")

    process, path = start(daemon)
    client = Connection(path)
    before = mib(process.pid, "VmRSS")
    started = time.monotonic()
    answer = client.answer(client.send(acquire("a" * WORD, 0))).response
    took = time.monotonic() - started
    print(
        f"one 3.9 MiB word: {took * 1000:.0f} ms ({type(answer).__name__}); "
        f"RSS {before:.0f} MiB before, peak {mib(process.pid, 'VmHWM'):.0f} MiB"
    )
    process.terminate()
    process.wait()

    process, path = start(daemon)
    hog, other = Connection(path), Connection(path)
    cpu_before = cpu_seconds(process.pid)
    for letter in "abcdefghijkl":
        hog.send(acquire(letter * WORD, 0))
    waits, answers = [], set()
    for _ in range(5):
        started = time.monotonic()
        answer = other.answer(other.send(acquire("word " * 400, 500))).response
        waits.append(round((time.monotonic() - started) * 1000))
        answers.add(type(answer).__name__)
    hog.sock.close()
    at_close = cpu_seconds(process.pid)
    time.sleep(5)
    after = cpu_seconds(process.pid)
    print(
        f"twelve pipelined, then a disconnect: the other client's 2 KB acquires took {waits} ms "
        f"({', '.join(sorted(answers))}); daemon CPU {at_close - cpu_before:.2f} s until the "
        f"disconnect, {after - at_close:.2f} s in the 5 s after; peak RSS "
        f"{mib(process.pid, 'VmHWM'):.0f} MiB"
    )
    process.terminate()
    process.wait()


if __name__ == "__main__":
    main()
