"""The real `ratekeeper` daemon (and `redis-server`) for the tests, on private paths.

`Daemon` runs `ratekeeper serve` on a socket in a fresh temporary directory,
waits until it answers, and can be killed, stopped and started again on the
same socket. `RedisServer` runs `redis-server` on a free port without
persistence, and can be killed and started again on that port. Both print
their log when asked, for failing tests.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BIN = PACKAGE_ROOT.parent.parent / "target" / "debug" / "ratekeeper"
START_TIMEOUT = 10.0


def noon_offset_hours(now: Optional[datetime.datetime] = None) -> int:
    """Hours ahead of UTC of the whole-hour zone where it is within half an
    hour of noon now (-11 to 12): a budget test run there cannot see its
    day end, however late the suite runs."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    offset = round(12.0 - (now.hour + now.minute / 60.0))
    return 12 if offset == -12 else offset


def zone_name(offset_hours: int) -> str:
    """The IANA name of the zone `offset_hours` ahead of UTC (`Etc/GMT-5` is UTC+5)."""
    return "UTC" if offset_hours == 0 else f"Etc/GMT{-offset_hours:+d}"


def daemon_binary() -> Path:
    """RATEKEEPER_BIN, else ../../target/debug/ratekeeper relative to the package."""
    path = Path(os.environ.get("RATEKEEPER_BIN") or DEFAULT_BIN)
    if not path.is_file():
        raise RuntimeError(
            f"no ratekeeper binary at {path}: run `cargo build` or set RATEKEEPER_BIN"
        )
    return path


def wait_for(condition, timeout: float, what: str, interval: float = 0.005) -> None:
    """Polls `condition` until it holds; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Daemon:
    """One `ratekeeper serve` process; `start` again reuses the same socket path."""

    def __init__(
        self,
        config: str,
        redis_url: Optional[str] = None,
        socket: Optional[str] = None,
        key_prefix: Optional[str] = None,
        on_failure: Optional[str] = None,
        redis_options: str = "",
    ) -> None:
        # A short directory: Unix socket paths are limited to about 100 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="rk-py-"))
        self.socket = socket or str(self.dir / "ratekeeper.sock")
        self.config_path = self.dir / "ratekeeper.toml"
        if redis_url:
            config = f'{config}\n[redis]\nurl = "{redis_url}"\n'
            if key_prefix:
                config += f'key_prefix = "{key_prefix}"\n'
            if on_failure:
                config += f'on_failure = "{on_failure}"\n'
            config += redis_options  # more lines of the [redis] table
        self.store = "redis" if redis_url else "embedded"
        self.config_path.write_text(config)
        self.log_path = self.dir / "daemon.log"
        self.process: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self) -> Daemon:
        assert self.process is None or self.process.poll() is not None, "already running"
        env = dict(os.environ, RATEKEEPER_SOCKET=self.socket)
        env.pop("RATEKEEPER_REDIS_URL", None)
        env.pop("RATEKEEPER_CONFIG", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(daemon_binary()),
                    "serve",
                    "--config",
                    str(self.config_path),
                    "--log-level",
                    "debug",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.starts += 1
        wait_for(self._listening, START_TIMEOUT, f"the daemon to listen:\n{self.log()}")
        return self

    def _listening(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the daemon exited with {self.process.returncode}:\n{self.log()}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            probe.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash: the socket file stays behind."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def terminate(self, wait: bool = True) -> Optional[int]:
        """SIGTERM: the daemon drains and removes its socket."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30) if wait else None

    def restart(self) -> None:
        self.kill()
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """`redis-server` on a free loopback port, no persistence, answering PING."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rk-redis-"))
        # Another process (a test suite beside this one) may bind the port
        # between `free_port` and redis-server's own bind: then try another.
        for attempts_left in reversed(range(5)):
            self.port = free_port()
            try:
                self.start()
                return
            except AssertionError:
                log = (self.dir / "redis.log").read_text(errors="replace")
                if attempts_left == 0 or "Address already in use" not in log:
                    raise

    def start(self) -> None:
        """Starts the server on its port (again, empty, after `stop`)."""
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._pong, START_TIMEOUT, "redis-server to answer PING")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _pong(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """Sends one command on a connection of its own; returns the raw reply."""
        request = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
            conn.sendall(request.encode())
            return conn.recv(65536)

    def stop(self) -> None:
        """SIGKILL, as a crash; `start` brings it back on the same port."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
