"""The Node workers of the end-to-end runs: the Node client's OpenAI wrapper calling the fake.

A `Scenario` with `workers="node"` runs `processes` Node processes instead
of Python ones, each `clients/node/test/e2e-fleet-worker.mjs`: one
`Client` of the built package (`clients/node/dist`, loaded by the package's
name) and one `openai` SDK client (`clients/node/node_modules`), wrapped by
`ratekeeper-client/openai`, with `threads` concurrent calls, as a Node
server handles concurrent requests on one event loop. They send the
requests of the Python workers (`_e2e_workers.chat_request`, drawn here
from each process's seed and handed to the process) by messages, until the
deadline, and answer the tally of `_e2e_workers.Tally`, so that
`_e2e.analyse` reads their runs as it reads the Python fleet's.

The protocol is JSON lines: the harness writes a process's spec on its
stdin, the process answers `{"ready": true}` once connected to its sidecar,
the harness writes one more line to every process at once (the run's start,
as the Python workers' barrier), and each process answers its tally.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

from _daemon import PACKAGE_ROOT
from _e2e_workers import chat_request

NODE_CLIENT = PACKAGE_ROOT.parent / "node"
WORKER = NODE_CLIENT / "test" / "e2e-fleet-worker.mjs"
#: What a Node worker needs besides `node`, and how to get it.
NEEDED = {
    NODE_CLIENT / "dist" / "esm" / "openai.js": "the built client: `npm run build` in clients/node",
    NODE_CLIENT / "node_modules" / "openai" / "package.json": (
        "the openai SDK: `npm ci` in clients/node"
    ),
}
#: The requests handed to each process, sent in turn by its calls (again
#: from the first when a run sends more): a run sends at most a few hundred
#: per process.
REQUESTS_PER_PROCESS = 1024


def node_command() -> list[str]:
    """The command of a Node worker; a RuntimeError saying what is missing."""
    node = shutil.which("node")
    missing = [] if node else ["`node` on PATH (Node >= 18.18)"]
    missing += [what for path, what in NEEDED.items() if not path.is_file()]
    if missing:
        raise RuntimeError(f"the Node fleet needs {'; '.join(missing)}")
    return [node, str(WORKER)]


class NodeProcess:
    """One Node worker; its stdout lines arrive on `lines` (None at its end)."""

    def __init__(self, command: list[str], spec: dict, log_path: Path) -> None:
        self.log_path = log_path
        self.lines: queue.Queue = queue.Queue()
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=NODE_CLIENT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        try:
            self.send(spec)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, message: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except OSError as error:
            raise AssertionError(
                f"a Node worker stopped reading ({error}):\n{self.log()}"
            ) from None

    def answer(self, timeout: float) -> dict:
        """The next line the process wrote, parsed."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"a Node worker said nothing for {timeout:g} s:\n{self.log()}"
            ) from None
        if line is None:
            code = self.process.wait(timeout=10)
            raise AssertionError(f"a Node worker exited with {code}:\n{self.log()}")
        return json.loads(line)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.reader.join(timeout=10)  # it reads the output to its end
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):  # the unread spec of a killed process
                stream.close()


class NodeFleet:
    """The Node worker processes of a run, one per spec of `_e2e.run`."""

    def __init__(self, specs: list[dict], scratch: Path) -> None:
        command = node_command()
        self.processes: list[NodeProcess] = []
        try:
            for spec in specs:
                rng = random.Random(spec["seed"])
                requests = [
                    chat_request(spec["workload"], rng) for _ in range(REQUESTS_PER_PROCESS)
                ]
                node_spec = {**spec, "concurrency": spec["threads"], "requests": requests}
                log_path = scratch / f"node-{spec['index']}.log"
                self.processes.append(NodeProcess(command, node_spec, log_path))
        except BaseException:
            self.close()
            raise

    def start(self, timeout: float) -> float:
        """Waits for every process to be ready, starts them: the start (time.monotonic())."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            ready = process.answer(max(0.0, deadline - time.monotonic()))
            if ready != {"ready": True}:
                raise AssertionError(f"a Node worker answered {ready!r}:\n{process.log()}")
        start = time.monotonic()
        for process in self.processes:
            process.send({"start": True})
        return start

    def tallies(self, timeout: float) -> list[dict]:
        """Every process's tally, once it has ended."""
        deadline = time.monotonic() + timeout
        tallies = [
            process.answer(max(0.0, deadline - time.monotonic())) for process in self.processes
        ]
        for process in self.processes:
            process.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        return tallies

    def logs(self) -> str:
        return "".join(
            f"\n--- Node worker {number} log (tail) ---\n{process.log()}"
            for number, process in enumerate(self.processes)
        )

    def close(self) -> None:
        for process in self.processes:
            process.close()
