"""The blocking client against the real daemon: the calls, their answers, their errors."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import threading
import time
import warnings

import pytest

import ratekeeper
from ratekeeper import (
    Client,
    CostExceedsCapacity,
    InvalidRequest,
    RateLimited,
    SidecarUnavailable,
    SidecarUnavailableWarning,
    UnknownLease,
    UnknownLimit,
    UnknownPriority,
)

from _daemon import wait_for

CAPACITY = 1_000_000  # burst of the "exact" limit


def level(client: Client, limit: str, bucket: str = "tokens") -> int:
    return client.status(limit).limit(limit).bucket(bucket).level


def test_ping_says_hello_with_the_process_name(daemon, client):
    assert 0 < client.ping() < 1
    assert f"pid={__import__('os').getpid()}" in daemon.log()


def test_status_lists_every_configured_limit(client):
    status = client.status()
    assert status.store == "embedded"
    assert {limit.name for limit in status.limits} == {"basic", "tiny", "capped", "requests"}
    requests = status.limit("requests")
    assert [b.name for b in requests.buckets] == ["tokens", "requests"]
    assert requests.bucket("requests").capacity == 2
    assert requests.bucket("requests").per_minute == 60


def test_estimate_of_tokens_is_the_given_counts(client):
    assert client.estimate("basic", 100, max_tokens=50) == ratekeeper.Estimated(100, 50)


def test_acquire_report_and_release_settle_the_buckets(make_daemon, store):
    daemon = make_daemon(store=store)
    with Client(daemon.socket) as client:
        assert client.status().store == store
        lease = client.acquire("exact", 1200, max_tokens=800)
        assert (lease.tokens, lease.waited, lease.settled) == (2000, 0.0, False)
        assert level(client, "exact") == CAPACITY - 2000

        assert lease.report(1500) == 500
        assert lease.settled
        assert lease.tokens_returned == 500
        assert level(client, "exact") == CAPACITY - 1500

        overrun = client.acquire("exact", 100)
        assert overrun.report(input_tokens=100, output_tokens=150) == -150
        assert level(client, "exact") == CAPACITY - 1500 - 250

        unused = client.acquire("exact", 300)
        assert unused.release() == 300
        assert level(client, "exact") == CAPACITY - 1750


def test_a_lease_settles_once(client):
    lease = client.acquire("basic", 10)
    lease.release()
    with pytest.raises(UnknownLease) as caught:
        lease.report(10)
    assert caught.value.code == 11
    assert not caught.value.retryable


def test_reserve_releases_when_the_body_raises(make_daemon, store):
    daemon = make_daemon(store=store)
    with Client(daemon.socket) as client:
        leases = []

        def body():
            with client.reserve("exact", 500) as lease:
                leases.append(lease)
                assert level(client, "exact") == CAPACITY - 500
                raise KeyError("provider call failed before it was made")

        with pytest.raises(KeyError):
            body()
        (lease,) = leases
        assert lease.settled
        assert lease.tokens_returned == 500
        assert level(client, "exact") == CAPACITY


def test_reserve_reports_the_usage_given_to_it(make_daemon, store):
    daemon = make_daemon(store=store)
    with Client(daemon.socket) as client:
        with client.reserve("exact", 400, max_tokens=600) as lease:
            lease.report(input_tokens=380, output_tokens=20)
        assert lease.tokens_returned == 600
        assert level(client, "exact") == CAPACITY - 400


@pytest.mark.parametrize("kind", [Client, ratekeeper.AsyncClient])
def test_reserve_takes_exactly_the_arguments_of_acquire(kind):
    """Named and typed one by one (`typed_client.py` holds mypy to them), and
    forwarded: a keyword `acquire` gains must be added to `reserve` too."""
    import inspect

    reserve = inspect.signature(kind.reserve.__wrapped__)
    acquire = inspect.signature(kind.acquire)
    assert list(reserve.parameters.values()) == list(acquire.parameters.values())
    with pytest.raises(TypeError, match="tokns"):
        Client().reserve("exact", tokns=1).__enter__()


def test_reserve_forwards_its_keywords_to_acquire(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket) as client:
        chat = [{"role": "user", "content": "Hello there"}]
        with client.reserve(
            "exact", messages=chat, max_tokens=5, priority="patient", max_wait=1
        ) as lease:
            estimated = client.estimate("exact", messages=chat, max_tokens=5)
            assert lease.tokens == estimated.input_tokens + estimated.output_tokens
            assert lease.reserved.output_tokens == 5
            lease.report(lease.tokens)
        with pytest.raises(UnknownPriority):  # reached the daemon: forwarded
            client.reserve("exact", 1, priority="no-such-class").__enter__()


def test_reserve_keeps_the_reservation_when_the_body_does_not_report(make_daemon, store):
    daemon = make_daemon(store=store)
    with Client(daemon.socket) as client:
        with client.reserve("exact", 400, max_tokens=600) as lease:
            pass
        # Settled as fully used: the daemon's lease is closed, nothing came back.
        assert lease.settled
        assert lease.tokens_returned == 0
        assert level(client, "exact") == CAPACITY - 1000
        with pytest.raises(UnknownLease):
            lease.release()


def test_a_denial_raises_rate_limited_with_retry_after(client):
    client.acquire("tiny", 10, max_wait=0).report(10)  # the whole burst of 10
    with pytest.raises(RateLimited) as caught:
        client.acquire("tiny", 5, max_wait=0)
    denied = caught.value
    assert denied.bucket == "tokens"
    assert denied.limit == "tiny"
    assert denied.retryable
    # One token a second: 5 tokens are due in at most 5 s.
    assert 3.5 < denied.retry_after <= 5.0


def test_the_request_bucket_refuses_too(client):
    client.acquire("requests", 1, max_wait=0).report(1)
    client.acquire("requests", 1, max_wait=0).report(1)
    with pytest.raises(RateLimited) as caught:
        client.acquire("requests", 1, max_wait=0)
    assert caught.value.bucket == "requests"


def test_an_acquire_is_held_back_until_its_reservation_is_due(make_daemon, store):
    daemon = make_daemon(store=store)
    with Client(daemon.socket) as client:
        client.acquire("metered", 1000).report(1000)  # empties the 1000-token burst
        started = time.monotonic()
        lease = client.acquire("metered", 200, max_wait=2)  # 1000 tokens/s: due in 0.2 s
        elapsed = time.monotonic() - started
        assert 0.18 <= lease.waited <= elapsed
        assert elapsed < 1.0


def test_a_held_acquire_does_not_delay_other_requests(make_daemon, store):
    daemon = make_daemon(store=store)
    with Client(daemon.socket) as client:
        client.acquire("metered", 1000).report(1000)
        grants = []

        def wait_for_tokens():
            grants.append(client.acquire("metered", 800, max_wait=5))  # due in 0.8 s

        waiter = threading.Thread(target=wait_for_tokens)
        waiter.start()
        # The daemon holds the acquire back; meanwhile pings on the same socket pass.
        for _ in range(20):
            assert client.ping() < 0.5
        # The waiter's acquire reaches the daemon when its thread runs.
        deadline = time.monotonic() + 5
        while client.status("metered").limit("metered").waiters != 1:
            assert time.monotonic() < deadline, "the acquire never waited in the daemon"
        waiter.join(10)
        assert grants[0].waited >= 0.7


def test_threads_share_one_connection_and_get_their_own_answers(client):
    errors = []

    def worker(index: int) -> None:
        try:
            for round_ in range(25):
                tokens = 1 + index * 100 + round_
                lease = client.acquire("basic", tokens)
                assert lease.tokens == tokens
                assert lease.report(tokens) == 0
                client.ping()
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert client._slot.conn is not None


@pytest.mark.parametrize(
    ("call", "error", "code"),
    [
        (lambda c: c.acquire("gpt-5", 10), UnknownLimit, 6),
        (lambda c: c.acquire("basic", 10, priority="nope"), UnknownPriority, 7),
        (lambda c: c.acquire("tiny", 10, priority="batch"), UnknownPriority, 7),
        (lambda c: c.acquire("basic", 0), InvalidRequest, 5),
        (lambda c: c.acquire("x" * 129, 10), InvalidRequest, 5),
        (lambda c: c.acquire("basic", 10, tenant="t" * 129), InvalidRequest, 5),
        (lambda c: c.acquire("capped", 501), CostExceedsCapacity, 8),
        (lambda c: c.acquire("tiny", 11), CostExceedsCapacity, 8),
        (lambda c: c.acquire("basic", 6_000_000, priority="batch"), CostExceedsCapacity, 8),
        (lambda c: c.estimate("gpt-5", 10), UnknownLimit, 6),
        (lambda c: c.status("gpt-5"), UnknownLimit, 6),
    ],
    ids=[
        "unknown-limit",
        "unknown-priority",
        "priority-not-for-limit",
        "zero-cost",
        "long-limit-name",
        "long-tenant-name",
        "above-max-request-tokens",
        "above-burst",
        "above-what-batch-may-draw",
        "estimate-unknown-limit",
        "status-unknown-limit",
    ],
)
def test_refusals_raise_their_exception(client, call, error, code):
    with pytest.raises(error) as caught:
        call(client)
    assert caught.value.code == code
    assert not caught.value.retryable
    assert caught.value.message


COUNTING_CONFIG = """
[[limits]]
name = "counted"
tokens_per_minute = 1000000
model = "gpt-4o"
"""


def test_the_daemon_counts_the_tokens_of_messages(make_daemon):
    """Messages (text parts, names, tool calls as JSON) are counted by the
    daemon's tokenizer: reserved as the prompt plus max_tokens."""
    daemon = make_daemon(COUNTING_CONFIG)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}], "name": "bob"},
    ]
    with Client(daemon.socket) as client:
        estimate = client.estimate("counted", messages=messages, max_tokens=16)
        assert estimate.output_tokens == 16
        assert 10 < estimate.input_tokens < 40
        longer = client.estimate("counted", messages=[*messages, *messages], max_tokens=16)
        assert longer.input_tokens > estimate.input_tokens
        lease = client.acquire("counted", messages=messages, max_tokens=16)
        assert lease.tokens == estimate.input_tokens + 16
        assert lease.reserved.output_tokens == 16
        assert lease.report(input_tokens=estimate.input_tokens, output_tokens=6) == 10


def test_arguments_are_checked_before_sending(client):
    with pytest.raises(ValueError, match="exactly one"):
        client.acquire("basic")
    with pytest.raises(ValueError, match="exactly one"):
        client.acquire("basic", 10, messages=[])
    with pytest.raises(ValueError, match="max_wait"):
        client.acquire("basic", 10, max_wait=-1)
    with pytest.raises(ValueError, match="on_unavailable"):
        Client(on_unavailable="ignore")
    lease = client.acquire("basic", 10)
    with pytest.raises(ValueError, match="either"):
        lease.report(5, input_tokens=5)
    lease.release()


def test_an_unreachable_sidecar_is_then_known_to_be_down(tmp_path):
    client = Client(str(tmp_path / "nobody.sock"), timeout=0.3)
    with pytest.raises(SidecarUnavailable) as caught:
        client.acquire("basic", 10, max_wait=0.2)
    assert caught.value.retryable
    # Known to be down now: the next call tries once and fails at once.
    started = time.monotonic()
    with pytest.raises(SidecarUnavailable):
        client.ping()
    assert time.monotonic() - started < 0.2


def test_allow_proceeds_unlimited_with_a_warning(tmp_path):
    client = Client(str(tmp_path / "nobody.sock"), timeout=0.2, on_unavailable="allow")
    with pytest.warns(SidecarUnavailableWarning, match="without a rate limit on 'basic'"):
        lease = client.acquire("basic", 1200, max_tokens=300)
    assert lease.unlimited
    assert lease.lease_id is None
    assert lease.tokens == 1500
    assert lease.report(1400) is None
    assert lease.release() is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidecarUnavailableWarning)
        with client.reserve("basic", 10) as reserved:
            assert reserved.unlimited
    # Other calls are not limited work: they still raise.
    with pytest.raises(SidecarUnavailable):
        client.status()


def test_an_interrupted_acquire_is_cancelled_and_its_reservation_returned(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket) as client:
        client.acquire("exact", CAPACITY).report(CAPACITY)  # empty: one token a minute

        class Interrupted(Exception):
            pass

        def interrupt(signum, frame):
            raise Interrupted

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(Interrupted):
                client.acquire("exact", 1, max_wait=3600)  # due in a minute
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        # The client sent Cancel: the daemon stops holding it and refunds it.
        waiters = lambda: client.status("exact").limit("exact").waiters  # noqa: E731
        wait_for(lambda: waiters() == 0, 5, "the cancelled acquire to be dropped")
        assert level(client, "exact") >= 0


def test_an_acquire_answered_after_its_deadline_is_cancelled_or_released(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket, timeout=0.2) as client:
        full = level(client, "exact")
        daemon.process.send_signal(signal.SIGSTOP)  # silent: the acquire waits past its deadline
        try:
            with pytest.raises(SidecarUnavailable, match="no answer from the sidecar"):
                client.acquire("exact", 10, max_wait=0)
        finally:
            daemon.process.send_signal(signal.SIGCONT)
        # The daemon now reads the acquire and the client's Cancel behind it:
        # either it cancels the acquire, or it grants it and the client, on
        # reading the late grant, releases it. No reservation is left behind.
        wait_for(lambda: level(client, "exact") == full, 5, "the bucket to be full again")


def test_a_call_takes_the_lone_path_only_with_nothing_else_unanswered(client, monkeypatch):
    """With another request out, a call waits for its answer like any other
    instead of taking the reading (the next reader would be woken for
    nothing: 0.85x the acquires/s with 8 threads in each of 4 processes)."""
    from ratekeeper import _proto as p
    from ratekeeper._sync import transport

    client.ping()
    conn = client._slot.conn
    submitted = []
    submit = transport.Connection.submit

    def counted_submit(self, request, deadline):
        submitted.append(type(request).__name__)
        return submit(self, request, deadline)

    monkeypatch.setattr(transport.Connection, "submit", counted_submit)
    client.ping()
    assert submitted == []  # alone: sent and read in one call, no future
    conn.send_and_forget(p.Ping())  # out, and nobody reads for it yet
    client.ping()
    assert submitted == ["Ping", "Ping"]  # the forgotten one, then this call's
    assert not conn._pending  # this call's reading delivered both answers
    client.ping()
    assert submitted == ["Ping", "Ping"]  # alone again


def test_a_lone_round_trip_wakes_its_thread_once(client):
    """The reader waits for the answer in `poll`, not blocked in `recv`: the
    kernel wakes a thread blocked in `recv` on a Unix socket also when the
    daemon reads the request (its send buffer drained), a second context
    switch per round trip, for nothing."""
    client.acquire("basic", 1).release()
    rounds = 300
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    for _ in range(rounds):
        # Answered after a Redis call: the daemon reads the request first.
        client.acquire("basic", 1, max_wait=0)
    switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
    # One wait for each answer at most (none when it is already there).
    assert switches / rounds < 1.5, f"{switches} voluntary context switches in {rounds} acquires"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.acquire("basic", 1200.7), "tokens must be an int.*float 1200.7"),
        (lambda c: c.acquire("basic", 1200.0), "tokens must be an int.*float"),
        (lambda c: c.acquire("basic", True), "tokens must be an int.*bool"),
        (lambda c: c.acquire("basic", "100"), "tokens must be an int.*str"),
        (lambda c: c.acquire("basic", 10, max_tokens=2.5), "max_tokens must be an int"),
        (lambda c: c.estimate("basic", 10.5), "tokens must be an int"),
    ],
)
def test_token_counts_must_be_ints(client, call, message):
    with pytest.raises(TypeError, match=message):
        call(client)


def test_reported_counts_must_be_ints(client):
    lease = client.acquire("basic", 10)
    with pytest.raises(TypeError, match="used must be an int"):
        lease.report(9.9)
    with pytest.raises(TypeError, match=r"output_tokens must be an int.*float"):
        lease.report(input_tokens=5, output_tokens=2.0)
    assert not lease.settled
    assert lease.report(input_tokens=5, output_tokens=5) == 0


def test_int_likes_are_accepted():
    class Count:
        def __init__(self, value: int) -> None:
            self.value = value

        def __index__(self) -> int:
            return self.value

    from ratekeeper._core.requests import token_count

    assert token_count("tokens", Count(12)) == 12
    with pytest.raises(ValueError, match="must not be negative"):
        token_count("tokens", -1)


#: Names above the daemon's bound of 128 UTF-8 bytes, each with what Hello sends:
#: cut at the last whole character within the bound.
LONG_NAMES = [
    ("a" * 200, "a" * 128),
    ("é" * 100, "é" * 64),  # 200 bytes: 64 characters fit
    ("a" + "é" * 100, "a" + "é" * 63),  # byte 128 is inside an "é": 127 bytes sent
    ("日本" * 30, "日本" * 21),  # three bytes each: 42 characters, 126 bytes
    ("🦀" * 40, "🦀" * 32),  # four bytes each
]


@pytest.mark.parametrize(
    ("name", "sent"), LONG_NAMES, ids=["ascii", "two-byte", "split", "three-byte", "four-byte"]
)
def test_a_long_client_name_is_cut_to_the_bound_in_bytes(make_daemon, name, sent):
    daemon = make_daemon()
    with Client(daemon.socket, name=name, timeout=5.0) as client:
        assert client.ping() < 1  # said Hello: the daemon took the name
    assert len(sent.encode()) <= ratekeeper._proto.MAX_NAME_LEN
    assert f'client="{sent}"' in daemon.log()


def test_the_asyncio_client_cuts_a_long_name_in_bytes(make_daemon):
    daemon = make_daemon()

    async def ping() -> float:
        async with ratekeeper.AsyncClient(daemon.socket, name="é" * 100, timeout=5.0) as client:
            return await client.ping()

    assert asyncio.run(asyncio.wait_for(ping(), 30)) < 1
    assert f'client="{"é" * 64}"' in daemon.log()


def test_the_default_name_of_a_long_non_ascii_program_is_cut_in_bytes(make_daemon, monkeypatch):
    daemon = make_daemon()
    monkeypatch.setattr("sys.argv", ["/opt/" + "программа" * 10])  # 180 bytes
    with Client(daemon.socket, timeout=5.0) as client:
        assert client.ping() < 1
    cut = ("программа" * 10 + f" pid={os.getpid()}").encode()[:128].decode(errors="ignore")
    assert f'client="{cut}"' in daemon.log()


def test_session_names_are_cut_at_a_character_boundary():
    from ratekeeper._core.session import Session
    from ratekeeper._core.settings import clip_name

    assert clip_name("short") == "short"
    assert clip_name("é" * 64) == "é" * 64  # exactly the bound
    assert clip_name("a" + "é" * 64) == "a" + "é" * 63
    assert clip_name("x" * 10, 4) == "xxxx"
    for size in range(len("a€🦀é".encode()) + 1):
        clipped = clip_name("a€🦀é", size)
        assert len(clipped.encode()) <= size
        assert "a€🦀é".startswith(clipped)
    assert clip_name("prog\udcff") == "prog?"  # a file name that is not UTF-8, in sys.argv
    assert Session("日" * 50).client_name == "日" * 42
