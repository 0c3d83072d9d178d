"""Every protocol error code surfaces as its own exception class.

Codes the daemon can really be driven to send are provoked over a raw
connection (the sans-IO session on a plain socket, so the tests can break the
protocol on purpose); StoreUnavailable is provoked with a dead Redis in
test_redis.py. Internal (a daemon bug), Unsupported (no longer sent since the
daemon counts message tokens) and unknown codes are fed to the core as
synthetic frames, like every other code.
"""

from __future__ import annotations

import socket
import time

import pytest

import ratekeeper
from ratekeeper import _proto as p
from ratekeeper._core import results
from ratekeeper._core.session import Session
from ratekeeper._proto.errors import ERROR_CLASSES, ErrorCode

from _daemon import wait_for

#: PROTOCOL.md §7: code → (exception, retryable).
SPEC_TABLE = {
    1: (ratekeeper.UnsupportedVersion, False),
    2: (ratekeeper.HelloRequired, False),
    3: (ratekeeper.FrameTooLarge, False),
    4: (ratekeeper.MalformedMessage, False),
    5: (ratekeeper.InvalidRequest, False),
    6: (ratekeeper.UnknownLimit, False),
    7: (ratekeeper.UnknownPriority, False),
    8: (ratekeeper.CostExceedsCapacity, False),
    9: (ratekeeper.DuplicateRequestId, False),
    10: (ratekeeper.TooManyInFlight, True),
    11: (ratekeeper.UnknownLease, False),
    12: (ratekeeper.Cancelled, False),
    13: (ratekeeper.StoreUnavailable, True),
    14: (ratekeeper.ShuttingDown, True),
    15: (ratekeeper.InternalError, False),
    16: (ratekeeper.Unsupported, False),
    17: (ratekeeper.Overloaded, True),
}

HOLD_CONFIG = """
[[limits]]
name = "hold"
tokens_per_minute = 60
burst_tokens = 1

[[limits]]
name = "open"
tokens_per_minute = 60000000
burst_tokens = 10000000

[[priorities]]
name = "default"
max_wait_ms = 3600000
"""


class Raw:
    """A socket driven by the sans-IO session, frame by frame."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.session = Session("raw-test")
        self.received: list[p.ServerFrame] = []

    def hello(self) -> p.HelloReply:
        request_id, data = self.session.hello_frame()
        self.sock.sendall(data)
        return self.session.accept_hello(self.answer(request_id))

    def send(self, request: p.Request, request_id: int | None = None) -> int:
        if request_id is None:
            request_id = self.session.next_id()
        self.sock.sendall(p.encode_frame(p.ClientFrame(request_id, request)))
        return request_id

    def answer(self, request_id: int) -> p.ServerFrame:
        while True:
            for index, frame in enumerate(self.received):
                if frame.request_id == request_id:
                    return self.received.pop(index)
            data = self.sock.recv(65536)
            assert data, "the daemon closed the connection"
            self.received.extend(self.session.receive_data(data))

    def error(self, request_id: int) -> ratekeeper.RatekeeperError:
        response = self.answer(request_id).response
        assert isinstance(response, p.ErrorReply), response
        return response.exception()

    def closed(self) -> bool:
        return self.sock.recv(1) == b""

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(daemon):
    connections: list[Raw] = []

    def connect(path: str = daemon.socket) -> Raw:
        connections.append(Raw(path))
        return connections[-1]

    yield connect
    for connection in connections:
        connection.close()


def assert_code(error: ratekeeper.RatekeeperError, code: int) -> None:
    cls, retryable = SPEC_TABLE[code]
    assert type(error) is cls
    assert error.code == code
    assert error.retryable is retryable
    assert error.message


def test_the_classes_are_the_spec_table_one_to_one():
    assert {code: cls for code, (cls, _) in SPEC_TABLE.items()} == ERROR_CLASSES
    assert len(set(ERROR_CLASSES.values())) == len(ERROR_CLASSES)
    assert [int(code) for code in ErrorCode] == list(range(1, 18))
    for code, (cls, retryable) in SPEC_TABLE.items():
        assert cls.code == code
        assert cls.retryable is retryable
        assert issubclass(cls, ratekeeper.RatekeeperError)


@pytest.mark.parametrize("code", sorted(SPEC_TABLE))
def test_every_code_in_a_frame_raises_its_class(code):
    data = p.encode_frame(p.ServerFrame(7, p.ErrorReply(code, f"synthetic {code}")))
    decoder = p.FrameDecoder()
    decoder.receive_data(data)
    frame = decoder.next_frame()
    with pytest.raises(ratekeeper.RatekeeperError) as caught:
        results.expect(frame.response, p.Granted)
    assert_code(caught.value, code)
    assert caught.value.message == f"synthetic {code}"


def test_an_unknown_code_is_a_non_retryable_failure():
    with pytest.raises(ratekeeper.UnknownErrorCode) as caught:
        results.expect(p.ErrorReply(999, "from the future"), p.Pong)
    assert caught.value.code == 999
    assert not caught.value.retryable


def test_a_denial_frame_raises_rate_limited_in_seconds():
    with pytest.raises(ratekeeper.RateLimited) as caught:
        results.granted_or_raise(p.Denied(retry_after_ms=2500, bucket="tenant"), "gpt-4o")
    assert caught.value.retry_after == 2.5
    assert caught.value.bucket == "tenant"
    assert caught.value.code is None


def test_an_unexpected_answer_is_a_protocol_error():
    with pytest.raises(ratekeeper.ProtocolError):
        results.expect(p.Pong(), p.Granted)


def test_unsupported_version(raw):
    connection = raw()
    connection.send(p.Hello(protocol_version=2, client_name="from-the-future"), request_id=3)
    assert_code(connection.error(3), 1)
    assert connection.closed()


def test_hello_required(raw):
    connection = raw()
    connection.send(p.Ping(), request_id=4)
    assert_code(connection.error(4), 2)
    assert connection.closed()


def test_frame_too_large(raw):
    connection = raw()
    connection.hello()
    connection.sock.sendall((p.MAX_FRAME_LEN + 1).to_bytes(4, "little"))
    assert_code(connection.error(0), 3)
    assert connection.closed()


def test_malformed_message(raw):
    connection = raw()
    connection.hello()
    connection.sock.sendall(bytes.fromhex("0d00000009000000000000000700000000"))  # Ping + 1 byte
    assert_code(connection.error(9), 4)
    connection.send(p.Ping(), request_id=10)
    assert connection.answer(10).response == p.Pong()


def test_invalid_request(raw):
    connection = raw()
    connection.hello()
    connection.send(p.Acquire("basic", p.TokenCost(0, 0)), request_id=5)
    assert_code(connection.error(5), 5)


def test_unknown_limit_priority_cost_and_lease(raw):
    connection = raw()
    connection.hello()
    assert_code(connection.error(connection.send(p.Acquire("nope", p.TokenCost(1)))), 6)
    assert_code(
        connection.error(connection.send(p.Acquire("basic", p.TokenCost(1), priority="x"))), 7
    )
    assert_code(connection.error(connection.send(p.Acquire("tiny", p.TokenCost(11)))), 8)
    assert_code(connection.error(connection.send(p.Report(424242, 1, 1))), 11)
    assert_code(connection.error(connection.send(p.Release(424242))), 11)


def test_duplicate_request_id_and_cancelled(make_daemon, raw):
    daemon = make_daemon(HOLD_CONFIG)
    connection = raw(daemon.socket)
    connection.hello()
    connection.send(p.Acquire("hold", p.TokenCost(1)), request_id=20)  # the burst
    assert isinstance(connection.answer(20).response, p.Granted)
    connection.send(p.Acquire("hold", p.TokenCost(1)), request_id=21)  # held back ~1 s
    connection.send(p.Ping(), request_id=21)
    assert_code(connection.error(21), 9)  # the duplicate is refused at once
    connection.send(p.Cancel(21), request_id=22)
    assert connection.answer(22).response == p.CancelReply(found=True)
    assert_code(connection.error(21), 12)  # and the held acquire gets its own answer
    connection.send(p.Cancel(21), request_id=23)
    assert connection.answer(23).response == p.CancelReply(found=False)


def test_too_many_in_flight(make_daemon, raw):
    daemon = make_daemon(HOLD_CONFIG)
    connection = raw(daemon.socket)
    hello = connection.hello()
    assert hello.max_in_flight == p.MAX_IN_FLIGHT
    # One token a second, burst 1: the first acquire is granted, the k-th is
    # held back k seconds, so the daemon soon has max_in_flight unanswered.
    extra = 50
    first = 100
    batch = b"".join(
        p.encode_frame(p.ClientFrame(request_id, p.Acquire("hold", p.TokenCost(1))))
        for request_id in range(first, first + hello.max_in_flight + extra)
    )
    connection.sock.sendall(batch)
    while True:
        data = connection.sock.recv(65536)
        assert data
        refused = [
            frame
            for frame in connection.session.receive_data(data)
            if isinstance(frame.response, p.ErrorReply)
        ]
        if refused:
            break
    # Only requests beyond the bound are refused (a few more could have been
    # admitted as earlier ones were granted, one a second).
    assert refused[0].request_id >= first + hello.max_in_flight
    assert_code(refused[0].response.exception(), 10)
    # Ping is never refused, even now.
    connection.send(p.Ping(), request_id=5001)
    assert connection.answer(5001).response == p.Pong()


def test_shutting_down(make_daemon, raw):
    daemon = make_daemon(HOLD_CONFIG)
    connection = raw(daemon.socket)
    connection.hello()
    granted = connection.send(p.Acquire("hold", p.TokenCost(1)))
    assert isinstance(connection.answer(granted).response, p.Granted)
    # Held: keeps the drain busy. (Its id comes from the session like the
    # later ones: a fixed id was reused by the polling below once it had
    # counted that far, and the daemon rightly answered DuplicateRequestId.)
    connection.send(p.Acquire("hold", p.TokenCost(1)))

    def waiters() -> int:
        status = connection.answer(connection.send(p.Status("hold"))).response
        return status.limit("hold").waiters

    wait_for(lambda: waiters() == 1, 10, "the acquire to be held before the signal")
    daemon.terminate(wait=False)
    deadline = time.monotonic() + 10
    while True:  # grants until the daemon has begun to drain, then ShuttingDown
        request_id = connection.send(p.Acquire("open", p.TokenCost(1), max_wait_ms=0))
        response = connection.answer(request_id).response
        if isinstance(response, p.ErrorReply):
            break
        assert isinstance(response, p.Granted)
        assert time.monotonic() < deadline, "the daemon never started draining"
    assert_code(response.exception(), 14)
    # The acquire held before the signal should still be granted during the
    # drain, but the daemon sometimes exits before writing that answer (its
    # connection writers are not awaited after the request tasks finish);
    # reported, so it is not asserted here.


def test_frames_before_a_broken_one_are_still_delivered():
    session = Session("sans-io")
    good = p.encode_frame(p.ServerFrame(3, p.Pong()))
    bad = bytes.fromhex("0c00000002000000000000000a000000")  # Response tag 10
    frames = session.receive_data(good + bad + good)
    assert next(frames) == p.ServerFrame(3, p.Pong())
    with pytest.raises(ratekeeper.MalformedMessage):
        next(frames)


def test_an_oversized_frame_from_the_daemon_is_refused_on_its_prefix():
    session = Session("sans-io")
    frames = session.receive_data((p.MAX_FRAME_LEN + 1).to_bytes(4, "little"))
    with pytest.raises(ratekeeper.FrameTooLarge):
        next(frames)
