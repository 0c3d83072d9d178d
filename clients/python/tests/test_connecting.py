"""Connecting: a missing or refusing socket fails at once, unless a
`connect_timeout` asks to wait for a sidecar that is starting; against the
real daemon."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ratekeeper import AsyncClient, Client, SidecarUnavailable, SidecarUnavailableWarning
from ratekeeper import _proto as p

from _daemon import Daemon, daemon_binary, wait_for

CONFIG = """
[[limits]]
name = "roomy"
tokens_per_minute = 60000000
burst_tokens = 10000000
"""


def leave_stale_socket(path: str) -> None:
    """A socket file nobody listens on, as a crashed daemon leaves: connecting is refused."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()


class _Signal(logging.Handler):
    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.DEBUG)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.event.set()


@contextmanager
def first_retry() -> Iterator[threading.Event]:
    """Set when the client logs that a refused connect will be retried."""
    logger = logging.getLogger("ratekeeper")
    event = threading.Event()
    handler, level = _Signal(event), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield event
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def late_daemon() -> Iterator[Daemon]:
    """A daemon not started yet, whose socket path holds a stale socket file."""
    daemon = Daemon(CONFIG)
    leave_stale_socket(daemon.socket)
    yield daemon
    daemon.close()


def test_a_missing_socket_file_fails_at_once(tmp_path):
    path = tmp_path / "nobody.sock"
    client = Client(path, timeout=5, connect_timeout=5)
    started = time.monotonic()
    with pytest.raises(SidecarUnavailable, match="no socket file") as caught:
        client.acquire("roomy", 10)
    assert time.monotonic() - started < 0.1
    assert str(path) in str(caught.value)
    assert caught.value.retryable


def test_a_missing_socket_file_allows_at_once(tmp_path):
    client = Client(tmp_path / "nobody.sock", on_unavailable="allow")
    started = time.monotonic()
    with pytest.warns(SidecarUnavailableWarning):
        lease = client.acquire("roomy", 10)
    assert time.monotonic() - started < 0.1
    assert lease.unlimited


def test_a_missing_socket_file_fails_at_once_for_asyncio(tmp_path):
    async def main() -> float:
        client = AsyncClient(tmp_path / "nobody.sock")
        started = time.monotonic()
        with pytest.raises(SidecarUnavailable, match="no socket file"):
            await client.acquire("roomy", 10)
        return time.monotonic() - started

    assert asyncio.run(main()) < 0.1


def test_a_refusing_socket_fails_at_once_by_default(tmp_path):
    path = str(tmp_path / "stale.sock")
    leave_stale_socket(path)
    client = Client(path)
    started = time.monotonic()
    with pytest.raises(SidecarUnavailable, match="refused, nobody listens") as caught:
        client.acquire("roomy", 10)
    assert time.monotonic() - started < 1.0  # it waited 5 s for a successor
    assert caught.value.retryable


def test_a_refusing_socket_is_retried_for_connect_timeout(tmp_path):
    path = str(tmp_path / "stale.sock")
    leave_stale_socket(path)
    client = Client(path, timeout=10, connect_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(SidecarUnavailable, match="refused"):
        client.acquire("roomy", 10)
    assert 0.3 <= time.monotonic() - started < 1.5


def test_a_sidecar_that_starts_late_is_reached(late_daemon):
    client = Client(late_daemon.socket, timeout=1, connect_timeout=30)
    leases = []
    with first_retry() as retrying:
        caller = threading.Thread(target=lambda: leases.append(client.acquire("roomy", 10)))
        caller.start()
        assert retrying.wait(10), "the client never retried the refused connect"
        late_daemon.start()  # removes the stale file, binds, listens
        caller.join(30)
    assert len(leases) == 1
    assert not leases[0].unlimited
    assert leases[0].report(10) == 0
    assert "client said hello" in late_daemon.log()


def test_a_sidecar_that_starts_late_is_reached_by_asyncio(late_daemon):
    async def main() -> int:
        client = AsyncClient(late_daemon.socket, timeout=1, connect_timeout=30)
        with first_retry() as retrying:
            acquire = asyncio.ensure_future(client.acquire("roomy", 10))
            assert await asyncio.to_thread(retrying.wait, 10), "no retry of the refused connect"
            await asyncio.to_thread(late_daemon.start)
            lease = await asyncio.wait_for(acquire, 30)
        assert not lease.unlimited
        returned = await lease.report(10)
        await client.close()
        return returned

    assert asyncio.run(main()) == 0


def test_timeouts_are_checked():
    with pytest.raises(ValueError, match="connect_timeout must not be negative"):
        Client(connect_timeout=-1)
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        Client(timeout="5")  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Client(connect_timeout=0).connect_timeout == 0.0


#: Issue 27's flood: idle connections, half of them after `Hello`, as a
#: worker that opens a client per task and never closes it leaves behind.
FLOOD = 6_000


def _open_files_for(count: int) -> None:
    """Lets this process hold `count` more descriptors (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = soft + count + 256
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= count + 256, f"the open files limit ({soft}) cannot hold the flood"


def test_idle_connections_beyond_the_cap_never_lock_a_busy_worker_out():
    """Issue 27: 6,000 idle connections filled `server.max_connections` and a
    well-behaved worker got `Overloaded` (110 of 4,438 acquires failed). Now
    the connection idle the longest makes room for each new one: a worker
    acquiring all along completes every acquire while the flood is open."""
    _open_files_for(FLOOD)
    hello = p.encode_request(1, p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="leak"))
    daemon = Daemon(CONFIG + "\n[server]\nmax_connections = 1024\n").start()
    flood: list = []
    try:
        worker = Client(daemon.socket, name="busy-worker", timeout=10)
        flooded = threading.Event()
        outcomes: list = []

        def acquire_until_flooded() -> None:
            while not flooded.is_set() or len(outcomes) < 200:
                try:
                    worker.acquire("roomy", 10).report(10)
                    outcomes.append("granted")
                except Exception as failure:  # every failure is the test's finding
                    outcomes.append(repr(failure))

        acquiring = threading.Thread(target=acquire_until_flooded)
        acquiring.start()
        try:
            for number in range(FLOOD):
                leaked = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                flood.append(leaked)
                leaked.connect(daemon.socket)
                if number % 2:
                    leaked.sendall(hello)
        finally:
            flooded.set()
            acquiring.join(timeout=120)
        assert not acquiring.is_alive(), "the worker's acquires did not finish"
        failures = [outcome for outcome in outcomes if outcome != "granted"]
        assert failures == [], f"{len(failures)} of {len(outcomes)} failed: {failures[:3]}"
        # The flood is held at the cap: its oldest connections were closed.
        for leaked in flood[:100]:
            leaked.settimeout(10)
            while leaked.recv(1 << 16):  # a Hello's answer, then the close
                pass
        worker.close()
    finally:
        for leaked in flood:
            leaked.close()
        daemon.close()


@pytest.mark.parametrize(
    "runtime_dir", [None, "", "relative/dir", "/run/user/1000"], ids=lambda d: repr(d)
)
def test_the_default_socket_is_the_daemons_and_never_in_tmp(monkeypatch, tmp_path, runtime_dir):
    """Issue 27: both sides defaulted to /tmp/ratekeeper.sock, which any local
    user can bind first. Now the session's runtime directory, else
    /run/ratekeeper, computed alike by the client and the daemon."""
    monkeypatch.delenv("RATEKEEPER_SOCKET", raising=False)
    env = {key: value for key, value in os.environ.items() if key != "RATEKEEPER_SOCKET"}
    if runtime_dir is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        env.pop("XDG_RUNTIME_DIR", None)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime_dir)
        env["XDG_RUNTIME_DIR"] = runtime_dir
    no_socket = tmp_path / "ratekeeper.toml"
    no_socket.write_text("")
    effective = subprocess.run(
        [str(daemon_binary()), "check-config", str(no_socket)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    daemons = re.search(r'^socket = "([^"]*)"', effective, re.MULTILINE)
    assert daemons is not None, effective
    expected = (
        "/run/user/1000/ratekeeper.sock"
        if runtime_dir == "/run/user/1000"
        else "/run/ratekeeper/ratekeeper.sock"
    )
    assert (Client().socket_path, daemons.group(1)) == (expected, expected)


def test_a_daemon_not_running_as_the_expected_uid_is_refused_before_hello():
    """Issue 27: no client checked who the daemon is. With `expected_uid` (or
    RATEKEEPER_EXPECTED_UID) the kernel's word on the listening process
    (SO_PEERCRED) decides, before the client sends anything."""
    daemon = Daemon(CONFIG).start()
    try:
        impostor_uid = os.getuid() + 1
        wary = Client(daemon.socket, name="wary-client", expected_uid=impostor_uid)
        with pytest.raises(SidecarUnavailable, match=f"not the expected uid {impostor_uid}"):
            wary.acquire("roomy", 10)
        trusting = Client(daemon.socket, name="trusting-client", expected_uid=os.getuid())
        trusting.acquire("roomy", 10).report(10)
        trusting.close()
        wait_for(lambda: "trusting-client" in daemon.log(), 10, "the daemon to log the client")
        # Its Hello, which names the client, was never sent.
        assert "wary-client" not in daemon.log()
    finally:
        daemon.close()


def test_the_expected_uid_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RATEKEEPER_EXPECTED_UID", "1234")
    assert Client("/nowhere.sock").expected_uid == 1234
    monkeypatch.setenv("RATEKEEPER_EXPECTED_UID", "ratekeeper")
    with pytest.raises(ValueError, match="RATEKEEPER_EXPECTED_UID must be a uid"):
        Client("/nowhere.sock")
    monkeypatch.delenv("RATEKEEPER_EXPECTED_UID")
    assert Client("/nowhere.sock").expected_uid is None


def test_an_async_client_checks_the_expected_uid_too():
    daemon = Daemon(CONFIG).start()

    async def acquire_as(uid: int) -> None:
        client = AsyncClient(daemon.socket, expected_uid=uid, connect_timeout=1)
        try:
            lease = await client.acquire("roomy", 10)
            await lease.report(10)
        finally:
            await client.close()

    try:
        with pytest.raises(SidecarUnavailable, match="not the expected uid"):
            asyncio.run(acquire_as(os.getuid() + 1))
        asyncio.run(acquire_as(os.getuid()))
    finally:
        daemon.close()
