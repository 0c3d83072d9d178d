"""The sidecar stopping or restarting under a running client: a stopped one
fails the next call at once, a restart is ridden out with `connect_timeout`."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import pytest

from ratekeeper import AsyncClient, Client, SidecarUnavailable, SidecarUnavailableWarning

from _daemon import Daemon, wait_for

CONFIG = """
[[limits]]
name = "roomy"
tokens_per_minute = 60000000
burst_tokens = 10000000

[[limits]]
name = "slow"
tokens_per_minute = 60
burst_tokens = 1

[[priorities]]
name = "default"
max_wait_ms = 10000
"""


class Workload:
    """Threads that acquire and report in a loop, counting successes and errors."""

    def __init__(self, client: Client, threads: int = 4) -> None:
        self.client = client
        self.done = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                lease = self.client.acquire("roomy", 5, max_wait=1)
                lease.report(5)  # None when the lease went down with its daemon
            except Exception as error:
                with self.lock:
                    self.errors.append(repr(error))
                return
            with self.lock:
                self.done += 1

    def wait_for_more(self, count: int) -> None:
        target = self.done + count
        wait_for(lambda: self.done >= target or self.errors, 20, f"{count} more calls")

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(20)


#: Longest a call may take to give up on a stopped sidecar: far above the
#: milliseconds it takes, so a busy machine passes, and far below the
#: 5 s a call used to wait for a successor that never came.
FAST = 2.0

#: How a sidecar stops: SIGTERM (it drains and removes its socket file), or
#: SIGKILL, as a crash (the file stays behind, and connecting is refused).
STOPS = ["terminate", "kill"]


def stop(daemon: Daemon, how: str) -> None:
    getattr(daemon, how)()


@pytest.mark.parametrize("how", STOPS)
def test_a_stopped_sidecar_fails_the_next_call_at_once(make_daemon, how):
    daemon = make_daemon(CONFIG)
    client = Client(daemon.socket)  # the defaults: what a worker gets
    client.acquire("roomy", 5).report(5)
    stop(daemon, how)
    for call in (lambda: client.acquire("roomy", 5), lambda: client.status("roomy")):
        started = time.monotonic()
        with pytest.raises(SidecarUnavailable):
            call()
        assert time.monotonic() - started < FAST
    daemon.start()
    assert client.acquire("roomy", 5).report(5) == 0


@pytest.mark.parametrize("how", STOPS)
def test_a_stopped_sidecar_is_allowed_past_at_once(make_daemon, how):
    daemon = make_daemon(CONFIG)
    client = Client(daemon.socket, on_unavailable="allow")
    client.acquire("roomy", 5).report(5)
    stop(daemon, how)
    started = time.monotonic()
    with pytest.warns(SidecarUnavailableWarning):
        lease = client.acquire("roomy", 5)
    assert time.monotonic() - started < FAST
    assert lease.unlimited


@pytest.mark.parametrize("how", STOPS)
def test_a_stopped_sidecar_fails_the_next_asyncio_call_at_once(make_daemon, how):
    daemon = make_daemon(CONFIG)

    async def main() -> tuple[float, float]:
        client = AsyncClient(daemon.socket)
        await (await client.acquire("roomy", 5)).report(5)
        await asyncio.to_thread(stop, daemon, how)
        started = time.monotonic()
        with pytest.raises(SidecarUnavailable):
            await client.acquire("roomy", 5)
        failed = time.monotonic() - started
        allowing = AsyncClient(daemon.socket, on_unavailable="allow")
        await asyncio.to_thread(daemon.start)
        await (await allowing.acquire("roomy", 5)).report(5)
        await asyncio.to_thread(stop, daemon, how)
        started = time.monotonic()
        with pytest.warns(SidecarUnavailableWarning):
            lease = await allowing.acquire("roomy", 5)
        assert lease.unlimited
        allowed = time.monotonic() - started
        await client.close()
        await allowing.close()
        return failed, allowed

    failed, allowed = asyncio.run(main())
    assert failed < FAST
    assert allowed < FAST


@pytest.mark.parametrize("how", STOPS)
def test_a_sidecar_back_before_the_next_call_is_reached_with_the_defaults(make_daemon, how):
    """No `connect_timeout`: the broken connection is still replaced at once."""
    daemon = make_daemon(CONFIG)
    client = Client(daemon.socket)
    client.acquire("roomy", 5).report(5)
    stop(daemon, how)
    daemon.start()
    assert client.acquire("roomy", 5).report(5) == 0

    async def main() -> int:
        async_client = AsyncClient(daemon.socket)
        await (await async_client.acquire("roomy", 5)).report(5)
        await asyncio.to_thread(stop, daemon, how)
        await asyncio.to_thread(daemon.start)
        returned = await (await async_client.acquire("roomy", 5)).report(5)
        await async_client.close()
        return returned

    assert asyncio.run(main()) == 0


def test_calls_survive_a_crash_and_restart(make_daemon, store):
    daemon = make_daemon(CONFIG, store=store)
    client = Client(daemon.socket, timeout=5, connect_timeout=5)
    workload = Workload(client)
    try:
        workload.wait_for_more(50)
        for _ in range(3):
            daemon.kill()  # the socket file stays behind, as after a crash
            daemon.start()
            workload.wait_for_more(50)
    finally:
        workload.finish()
    assert workload.errors == []
    assert daemon.log().count("client said hello") >= 4  # one connection per daemon
    client.close()


def test_calls_survive_a_graceful_restart(make_daemon):
    """SIGTERM: the old daemon drains, answers new acquires ShuttingDown, and
    removes its socket; a successor binds the same path; the client moves over."""
    old = make_daemon(CONFIG)
    client = Client(old.socket, timeout=5, connect_timeout=5)
    client.acquire("slow", 1).report(1)  # the burst of "slow"
    held = []
    holder = threading.Thread(target=lambda: held.append(client.acquire("slow", 1)))
    holder.start()  # held back ~1 s: keeps the old daemon draining
    wait_for(lambda: client.status("slow").limit("slow").waiters == 1, 10, "a held acquire")
    workload = Workload(client)
    successor = Daemon(CONFIG, socket=old.socket)
    try:
        workload.wait_for_more(20)
        old.terminate(wait=False)
        wait_for(lambda: "shutting down" in old.log(), 10, "the drain to begin")
        successor.start()
        workload.wait_for_more(50)
        assert workload.errors == []
        assert "client said hello" in successor.log()
        assert old.process.wait(20) == 0
    finally:
        workload.finish()
        holder.join(20)
        successor.close()


def test_a_crashed_sidecar_is_waited_for_within_the_deadline_then_recovers(make_daemon):
    """With a `connect_timeout`, a refused connect is retried until the
    acquire's deadline (`max_wait` plus `timeout`), the shorter."""
    daemon = make_daemon(CONFIG)
    client = Client(daemon.socket, timeout=0.5, connect_timeout=5)
    client.ping()
    daemon.kill()
    started = time.monotonic()
    with pytest.raises(SidecarUnavailable):
        client.acquire("roomy", 5, max_wait=0.2)
    assert 0.5 <= time.monotonic() - started < 2.0
    daemon.start()
    assert client.acquire("roomy", 5, max_wait=0.2).report(5) == 0


def test_allow_mode_proceeds_while_down_and_limits_again_after(make_daemon):
    daemon = make_daemon(CONFIG)
    client = Client(daemon.socket, timeout=0.3, connect_timeout=0.3, on_unavailable="allow")
    assert not client.acquire("roomy", 5).unlimited
    daemon.kill()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unlimited = [client.acquire("roomy", 5) for _ in range(5)]
    assert all(lease.unlimited for lease in unlimited)
    assert {w.category for w in caught} == {SidecarUnavailableWarning}
    daemon.start()
    lease = client.acquire("roomy", 5)
    assert not lease.unlimited
    assert lease.report(5) == 0


def test_a_lease_of_a_dead_connection_settles_as_a_no_op(make_daemon):
    daemon = make_daemon(CONFIG)
    client = Client(daemon.socket, timeout=2)
    lease = client.acquire("roomy", 5)
    daemon.restart()
    # The daemon that granted it is gone: nothing to report to, nothing raised.
    assert lease.report(5) is None
    assert lease.settled
    assert client.acquire("roomy", 5).report(5) == 0


def test_async_calls_survive_a_restart(make_daemon):
    daemon = make_daemon(CONFIG)

    async def main() -> int:
        client = AsyncClient(daemon.socket, timeout=5, connect_timeout=5)
        done = 0

        async def worker() -> None:
            nonlocal done
            while not stop.is_set():
                lease = await client.acquire("roomy", 5, max_wait=1)
                await lease.report(5)
                done += 1

        stop = asyncio.Event()
        tasks = [asyncio.create_task(worker()) for _ in range(8)]
        while done < 50:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(daemon.restart)
        target = done + 100
        while done < target:
            await asyncio.sleep(0.01)
            for task in tasks:
                if task.done():
                    task.result()  # raises what the worker raised
        stop.set()
        await asyncio.gather(*tasks)
        await client.close()
        return done

    assert asyncio.run(asyncio.wait_for(main(), 30)) >= 150
