"""Many processes and threads through one sidecar; fork after first use."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from ratekeeper import Client

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
BURST = 2000


def test_four_processes_of_eight_threads_share_one_bucket(make_daemon, store):
    daemon = make_daemon(SHARED_CONFIG, store=store)
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
    # Admitted work over any interval T is at most burst + rate * T ...
    assert granted <= BURST + RATE * elapsed, (granted, elapsed)
    # ... and the limit was used, not starved: at least the burst and most of the refill.
    assert granted >= BURST + 0.5 * RATE * (elapsed - 0.5), (granted, elapsed)


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


def test_a_wake_is_kept_until_waited_for_and_counts_once():
    """What a thread waiting for the reader sleeps on (a bare lock, not a
    `threading.Event`): a wake before the wait is not lost, two wakes are
    one, `clear` forgets a late one, and a wait without one times out."""
    from ratekeeper._io_sync import Wake

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
