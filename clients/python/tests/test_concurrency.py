"""Many processes and threads through one sidecar; fork after first use."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import select
import signal
import stat
import threading
import time

import pytest

from ratekeeper import AsyncClient, Client

from _workers import hammer

SHARED_CONFIG = """
[[limits]]
name = "shared"
tokens_per_minute = 120000
burst_tokens = 2000

[[limits]]
name = "roomy"
tokens_per_minute = 60000000
burst_tokens = 10000000
"""
RATE = 2000.0  # tokens per second of "shared"


def test_four_processes_of_eight_threads_share_one_bucket(make_daemon, store):
    daemon = make_daemon(SHARED_CONFIG, store=store)
    with Client(daemon.socket) as client:
        # The declared burst less the default headroom: the bound is the real bucket's.
        capacity = client.status("shared").limit("shared").bucket("tokens").capacity
    assert capacity < 2000
    spawn = multiprocessing.get_context("spawn")
    processes_count, threads, duration, tokens = 4, 8, 2.0, 50
    barrier = spawn.Barrier(processes_count)
    results = spawn.Queue()
    processes = [
        spawn.Process(
            target=hammer,
            args=(daemon.socket, "shared", threads, duration, tokens, barrier, results),
        )
        for _ in range(processes_count)
    ]
    for process in processes:
        process.start()
    totals = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0

    assert [t["errors"] for t in totals] == [[]] * processes_count
    granted = sum(t["tokens"] for t in totals)
    assert all(t["granted"] > 0 for t in totals), totals  # every process got answers
    assert sum(t["denied"] for t in totals) > 0  # demand exceeded the limit
    elapsed = max(t["last_grant"] for t in totals) - min(t["first_sent"] for t in totals)
    # Admitted work over any interval T is at most capacity + rate * T ...
    assert granted <= capacity + RATE * elapsed, (granted, elapsed)
    # ... and the limit was used, not starved: at least the burst and most of the refill.
    assert granted >= capacity + 0.5 * RATE * (elapsed - 0.5), (granted, elapsed)


def _child_uses_inherited_client(client: Client, results) -> None:
    try:
        fresh = client._slot.conn is None  # the fork hook dropped the parent's socket
        errors = []

        def work() -> None:
            try:
                for _ in range(30):
                    lease = client.acquire("roomy", 7)
                    assert lease.tokens == 7
                    lease.report(7)
                    client.ping()
            except Exception as error:
                errors.append(repr(error))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results.put((os.getpid(), fresh, client._slot.conn.pid, errors))
    except BaseException as error:
        results.put((os.getpid(), False, None, [repr(error)]))


@pytest.mark.parametrize("how", ["multiprocessing", "os.fork"])
def test_a_forked_child_reconnects_and_the_parent_keeps_its_socket(make_daemon, how):
    daemon = make_daemon(SHARED_CONFIG)
    client = Client(daemon.socket)
    client.acquire("roomy", 10).report(10)  # first use: the parent is connected
    parent_conn = client._slot.conn
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    if how == "multiprocessing":
        child = fork.Process(target=_child_uses_inherited_client, args=(client, results))
        child.start()
        child_pid = child.pid
    else:
        child_pid = os.fork()
        if child_pid == 0:  # pragma: no cover - the child
            try:
                _child_uses_inherited_client(client, results)
                results.close()
                results.join_thread()
            finally:
                os._exit(0)
    # The parent works on its own socket meanwhile; answers must not cross.
    for index in range(100):
        lease = client.acquire("roomy", 1000 + index)
        assert lease.tokens == 1000 + index
        lease.report(1)
    pid, fresh, conn_pid, errors = results.get(timeout=60)
    if how == "multiprocessing":
        child.join(30)
        assert child.exitcode == 0
    else:
        assert os.waitpid(child_pid, 0)[1] == 0
    assert (pid, fresh, conn_pid, errors) == (child_pid, True, child_pid, [])
    assert f"pid={child_pid}" in daemon.log()  # the child said hello as itself
    assert client._slot.conn is parent_conn
    assert client.ping() < 1
    client.close()


def _open_sockets() -> set[tuple[int, int]]:
    """The sockets this process holds a descriptor of, by (device, inode)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            info = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor of the listing itself, closed by now
        if stat.S_ISSOCK(info.st_mode):
            sockets.add((info.st_dev, info.st_ino))
    return sockets


def _socket_of(client: AsyncClient) -> tuple[int, int]:
    info = os.fstat(client._slot.conn._transport.get_extra_info("socket").fileno())
    return info.st_dev, info.st_ino


def _asyncio_child_report(client: AsyncClient, parent_socket: tuple[int, int]) -> dict:
    """What a forked child finds of the parent's client, then uses it on a loop of its own."""
    fresh = client._slot.conn is None  # the fork hook dropped the parent's connection
    inherited = parent_socket in _open_sockets()

    async def work() -> int:
        for _ in range(30):
            lease = await client.acquire("roomy", 7)
            assert lease.tokens == 7
            await lease.report(7)
        await client.ping()
        return client._slot.conn.pid

    conn_pid = asyncio.run(asyncio.wait_for(work(), 30))
    return {"pid": os.getpid(), "fresh": fresh, "inherited": inherited, "conn_pid": conn_pid}


def _read_until_eof(fd: int, timeout: float) -> bytes:
    """All a pipe gives until its writer closes it; fails after `timeout` seconds."""
    deadline, data = time.monotonic() + timeout, b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError(f"no report from the child within {timeout}s")
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists descriptors in /proc")
def test_a_forked_child_of_an_asyncio_client_drops_the_parents_socket(make_daemon):
    daemon = make_daemon(SHARED_CONFIG)
    client = AsyncClient(daemon.socket, timeout=5.0)
    loop = asyncio.new_event_loop()

    def run(coroutine):
        return loop.run_until_complete(asyncio.wait_for(coroutine, 30))

    async def use(tokens: int) -> None:
        lease = await client.acquire("roomy", tokens)
        assert lease.tokens == tokens
        await lease.report(1)

    try:
        run(use(10))  # first use: the parent is connected, on its loop
        parent_conn = client._slot.conn
        parent_socket = _socket_of(client)
        read_end, write_end = os.pipe()
        child_pid = os.fork()
        if child_pid == 0:  # pragma: no cover - the child
            try:
                os.close(read_end)
                report = _asyncio_child_report(client, parent_socket)
            except BaseException as error:
                report = {"error": repr(error)}
            finally:
                os.write(write_end, json.dumps(report).encode())
                os._exit(0)
        os.close(write_end)
        try:
            # The parent goes on on its own socket meanwhile; answers must not cross.
            for index in range(100):
                run(use(1000 + index))
            report = json.loads(_read_until_eof(read_end, 60))
        except BaseException:
            os.kill(child_pid, signal.SIGKILL)
            raise
        finally:
            os.close(read_end)
            _, status = os.waitpid(child_pid, 0)
        assert status == 0
        assert report == {
            "pid": child_pid,
            "fresh": True,  # the child starts without the parent's connection,
            "inherited": False,  # holds no descriptor of its socket,
            "conn_pid": child_pid,  # and opened one of its own on first use
        }
        assert f"pid={child_pid}" in daemon.log()  # the child said hello as itself
        assert client._slot.conn is parent_conn
        assert _socket_of(client) == parent_socket
        assert run(client.ping()) < 1
        run(client.close())
    finally:
        loop.close()


def test_a_wake_is_kept_until_waited_for_and_counts_once():
    """What a thread waiting for the reader sleeps on (a bare lock, not a
    `threading.Event`): a wake before the wait is not lost, two wakes are
    one, `clear` forgets a late one, and a wait without one times out."""
    from ratekeeper._sync.transport import Wake

    wake = Wake()
    assert wake.wait(0) is False
    wake.set()
    wake.set()
    assert wake.wait(0) is True
    assert wake.wait(0.01) is False  # the second set was the same wake
    wake.set()
    wake.clear()
    assert wake.wait(0) is False
    woken = []
    sleeper = threading.Thread(target=lambda: woken.append(wake.wait(None)))
    sleeper.start()
    wake.set()
    sleeper.join(timeout=10)
    assert woken == [True]
