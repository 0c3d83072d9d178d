"""The examples in `examples/`, run exactly as their docstrings say.

An example's docstring is the one source of truth for its commands: the
lines indented by four spaces (a trailing backslash continues a command on
the next line), run from the repository root. Each example documents three:
the `pip install` line, the command that serves, and one that tries it.

- The install line is checked, not run (the tests reach nothing but
  loopback): every requirement is installed here with the extras it names,
  a local path is this package with extras it declares, and every argument
  with brackets is quoted (zsh would glob it).
- The other two run through `sh -c` as written, with one liberty: the
  documented port 8000 becomes a free one. Their environment is what a
  user's would be: the sidecar's socket in RATEKEEPER_SOCKET, the SDK
  pointed at the fake provider by OPENAI_BASE_URL, Celery's broker in
  CELERY_BROKER_URL, and this environment's `bin/` first on PATH.

`ExampleStack` is what the examples run against, all on loopback: a
`redis-server` for the buckets (stopped and started to take Redis away), one
for Celery's broker, the daemon on the first with a limit of the examples'
name whose bucket a test can drain, and the fake provider.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Optional

import ratekeeper

from _daemon import PACKAGE_ROOT, Daemon, RedisServer, free_port, wait_for
from _fake_openai import FakeProvider

REPO = PACKAGE_ROOT.parent.parent
EXAMPLES = PACKAGE_ROOT / "examples"
#: The port the examples' commands name; the tests substitute a free one.
DOCUMENTED_PORT = "8000"
#: The limit the examples acquire from.
LIMIT = "gpt-4o-mini"
#: The limit as the examples' tests configure it: a large burst, so that no
#: test waits, refilling slowly (10 tokens a second), so that a drained
#: bucket makes any request wait longer than an example's `max_wait`.
CONFIG = f"""
[[limits]]
name = "{LIMIT}"
provider = "openai"
model = "gpt-4o-mini"
tokens_per_minute = 600
burst_tokens = 100000
burst_headroom_ms = 0
max_request_tokens = 100000
"""
#: How long a served example may take to start (imports on a busy 2-core machine).
START_TIMEOUT = 60.0


def documented_commands(example: str) -> list[str]:
    """The commands in `examples/<example>.py`'s docstring, continuations joined."""
    tree = ast.parse((EXAMPLES / f"{example}.py").read_text())
    doc = ast.get_docstring(tree, clean=True) or ""
    doc = re.sub(r"\\\n\s*", " ", doc)
    return [line[4:] for line in doc.splitlines() if re.match(r" {4}\S", line)]


def check_install_line(line: str) -> None:
    """What a `pip install` line asks for is what this environment has (see the module docs)."""
    words = shlex.split(line)
    assert words[:2] == ["pip", "install"], line
    for requirement in words[2:]:
        if "[" in requirement:
            assert f"'{requirement}'" in line, f"{requirement} must be quoted: {line}"
        match = re.fullmatch(r"([^\[]+)(?:\[([^\]]*)\])?", requirement)
        assert match, requirement
        name, extras = match.group(1), [e for e in (match.group(2) or "").split(",") if e]
        if name.startswith("./"):
            assert (REPO / name).resolve() == PACKAGE_ROOT, f"{name} is not this package"
            name = "ratekeeper"
        distribution = metadata.distribution(name)  # PackageNotFoundError if missing
        declared = set(distribution.metadata.get_all("Provides-Extra") or [])
        assert set(extras) <= declared, f"{requirement}: {name} declares extras {declared}"


def user_env(socket: str, base_url: str, broker_url: str) -> dict:
    """A user's environment for the examples: this one's, pointed at these."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        NO_PROXY="127.0.0.1,localhost",
        RATEKEEPER_SOCKET=socket,
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="sk-fake",
        CELERY_BROKER_URL=broker_url,
        PYTHONUNBUFFERED="1",
    )
    return env


def example_env(stack: ExampleStack) -> dict:
    """A user's environment for the examples, pointed at `stack`."""
    return user_env(stack.daemon.socket, stack.provider.base_url, stack.broker.url)


class ExampleStack:
    """Redis for the buckets and for Celery, the daemon, the fake provider; closed at exit."""

    def __init__(self) -> None:
        self.store = RedisServer()
        self.broker = RedisServer()
        self.daemon = Daemon(CONFIG, redis_url=self.store.url).start()
        self.provider = FakeProvider()
        self.port = free_port()
        self.served: list[Served] = []

    def command(self, line: str) -> str:
        """A documented command as the tests run it: on the stack's port."""
        return line.replace(DOCUMENTED_PORT, str(self.port))

    def serve(self, line: str, ready: str, count: int = 1) -> Served:
        """Runs a documented serving command until the stack closes.

        Ready once its log has `count` lines matching the regex `ready`."""
        served = Served(self.command(line), example_env(self))
        self.served.append(served)
        served.wait_for_log(ready, count)
        return served

    def run(self, line: str, timeout: float = 60.0) -> str:
        """Runs a documented command to its end; its output (it must exit 0)."""
        finished = subprocess.run(
            ["sh", "-c", self.command(line)],
            cwd=REPO,
            env=example_env(self),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert finished.returncode == 0, f"{line}\n{finished.stdout}\n{finished.stderr}"
        return finished.stdout

    def requests(self) -> int:
        """How many requests the provider has received."""
        return len(self.provider.records_snapshot())

    def level(self) -> int:
        """The shared token bucket's level now."""
        with ratekeeper.Client(self.daemon.socket) as client:
            return client.status(LIMIT).limit(LIMIT).bucket("tokens").level

    @contextlib.contextmanager
    def drained(self, leave: int = 0) -> Iterator[None]:
        """The token bucket drained to `leave` tokens (as if other workers had used
        it) while the block runs; the tokens are given back afterwards."""
        with ratekeeper.Client(self.daemon.socket, name="drain") as client:
            level = client.status(LIMIT).limit(LIMIT).bucket("tokens").level
            lease = client.acquire(LIMIT, level - leave, max_tokens=1, max_wait=0)
            try:
                yield
            finally:
                lease.release()

    @contextlib.contextmanager
    def redis_down(self) -> Iterator[None]:
        """The buckets' Redis killed while the block runs, then started again."""
        self.store.stop()
        try:
            yield
        finally:
            self.store.start()

    @contextlib.contextmanager
    def sidecar_down(self) -> Iterator[None]:
        """The daemon stopped (SIGTERM: it removes its socket) while the block runs."""
        self.daemon.terminate()
        try:
            yield
        finally:
            self.daemon.start()

    def close(self, failed: bool = False) -> None:
        for served in self.served:
            served.close()
            if failed:
                print(f"\n--- {served.command} ---\n{served.log()[-6000:]}")
            served.remove()
        if failed:
            print(f"\n--- daemon log (tail) ---\n{self.daemon.log()[-4000:]}")
        self.provider.close()
        self.daemon.close()
        self.broker.close()
        self.store.close()


class Served:
    """A long-running command (run from the repository root) in a process group of its own."""

    def __init__(self, command: str, env: dict) -> None:
        self.command = command
        self.dir = Path(tempfile.mkdtemp(prefix="rk-example-"))
        self.log_path = self.dir / "output.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["sh", "-c", command],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = START_TIMEOUT) -> None:
        def seen() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.command} exited:\n{self.log()}")
            return len(re.findall(pattern, self.log())) >= count

        wait_for(seen, timeout, f"{count}x {pattern!r} from {self.command}", interval=0.1)

    def close(self) -> None:
        """SIGTERM to the whole group, SIGKILL if it lingers."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # children that outlived the shell
        self.process.wait(timeout=10)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def post_question(port: int, question: str, timeout: float = 30.0) -> tuple[int, dict, dict]:
    """POST /ask as the curl line does: (status, headers, JSON body)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/ask",
        data=json.dumps({"question": question}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            return answer.status, dict(answer.headers), json.load(answer)
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, dict(refused.headers), json.loads(refused.read() or b"{}")


def poll(call, accept, timeout: float, what: str):
    """Calls `call()` until `accept(result)`; the last result."""
    deadline = time.monotonic() + timeout
    while True:
        result = call()
        if accept(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {result}")
        time.sleep(0.1)


def retry_after_header(headers: dict) -> Optional[int]:
    value = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    return int(value) if value is not None else None
