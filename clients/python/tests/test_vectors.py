"""Every file of proto-spec/vectors/, held against the sans-IO codec.

Each valid case's hex must decode to its JSON value (the serde representation
described in PROTOCOL.md §11) and the JSON value must encode back to the exact
hex; each invalid case must be refused the way it says. The variant names
below are the spec's tables in tag order, so a wrong tag fails here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import _proto as p
from ratekeeper._core.requests import Settlement
from ratekeeper._proto.errors import FrameTooLarge, MalformedMessage, ProtocolError
from ratekeeper._proto.token_acquire import encode_token_acquire

VECTORS = Path(__file__).resolve().parents[3] / "proto-spec" / "vectors"

#: PROTOCOL.md §4: each enum's variant names, in tag order.
SPEC_VARIANTS = {
    p.REQUEST: [
        "Hello",
        "Acquire",
        "Report",
        "Release",
        "Cancel",
        "Estimate",
        "Status",
        "Ping",
        "Health",
        "Inspect",
        "Feedback",
        "LeaseFeedback",
        "UsageReport",
        "Budgets",
    ],
    p.COST: ["Tokens", "Messages", "Conversation"],
    p.BLOCK: ["Text", "Image"],
    p.RESPONSE: [
        "Hello",
        "Granted",
        "Denied",
        "Settled",
        "Released",
        "Cancelled",
        "Estimated",
        "Status",
        "Pong",
        "Error",
        "Health",
        "Inspection",
        "Noted",
        "Budgets",
    ],
}

FRAME_TYPES = {"ClientFrame": p.ClientFrame, "ServerFrame": p.ServerFrame}


def from_serde(wire: p.WireType, value: Any) -> Any:
    """The message value for a JSON value in serde's representation."""
    if isinstance(wire, p.Opt):
        return None if value is None else from_serde(wire.inner, value)
    if isinstance(wire, p.Vec):
        assert isinstance(value, list)
        return tuple(from_serde(wire.inner, item) for item in value)
    if isinstance(wire, p.Struct):
        return struct_from_serde(wire.cls, value)
    if isinstance(wire, p.Enum):
        names = SPEC_VARIANTS[wire]
        if isinstance(value, str):
            variant = wire.variants[names.index(value)]
            assert not variant.WIRE, f"{value} is not a unit variant"
            return variant()
        ((name, fields),) = value.items()
        return struct_from_serde(wire.variants[names.index(name)], fields)
    if wire is p.BOOL:
        assert isinstance(value, bool)
    elif wire is p.STR:
        assert isinstance(value, str)
    else:
        assert isinstance(value, int)
        assert not isinstance(value, bool)
    return value


def struct_from_serde(cls: type, fields: dict) -> Any:
    assert list(fields) == [name for name, _ in cls.WIRE], f"{cls.__name__} field order"
    return cls(**{name: from_serde(wire, fields[name]) for name, wire in cls.WIRE})


def to_serde(wire: p.WireType, value: Any) -> Any:
    """The JSON value in serde's representation for a message value."""
    if isinstance(wire, p.Opt):
        return None if value is None else to_serde(wire.inner, value)
    if isinstance(wire, p.Vec):
        return [to_serde(wire.inner, item) for item in value]
    if isinstance(wire, p.Struct):
        return struct_to_serde(value)
    if isinstance(wire, p.Enum):
        name = SPEC_VARIANTS[wire][type(value).TAG]
        return name if not value.WIRE else {name: struct_to_serde(value)}
    return value


def struct_to_serde(value: Any) -> dict:
    return {name: to_serde(wire, getattr(value, name)) for name, wire in value.WIRE}


def load_cases() -> list:
    cases = []
    for path in sorted(VECTORS.glob("*.json")):
        spec = json.loads(path.read_text())
        for case in spec["cases"]:
            cases.append(pytest.param(spec["type"], case, id=f"{path.stem}/{case['name']}"))
    return cases


CASES = load_cases()
VALID = [c for c in CASES if "value" in c.values[1]]
INVALID = [c for c in CASES if "error" in c.values[1]]


def test_every_vector_file_is_read():
    files = {path.stem for path in VECTORS.glob("*.json")}
    assert len(files) >= 22, files
    assert {c.id.split("/")[0] for c in CASES} == files


@pytest.mark.parametrize(("frame_type", "case"), VALID)
def test_valid_case_decodes_to_its_value(frame_type, case):
    cls = FRAME_TYPES[frame_type]
    decoded = p.decode_frame(bytes.fromhex(case["hex"]), cls)
    assert type(decoded) is cls
    assert struct_to_serde(decoded) == case["value"]


@pytest.mark.parametrize(("frame_type", "case"), VALID)
def test_valid_case_value_encodes_to_its_hex(frame_type, case):
    frame = struct_from_serde(FRAME_TYPES[frame_type], case["value"])
    assert p.encode_frame(frame).hex() == case["hex"]


@pytest.mark.parametrize(("frame_type", "case"), VALID)
def test_valid_case_decodes_from_any_split(frame_type, case):
    """The frame decoder gives the same frame however the bytes arrive."""
    data = bytes.fromhex(case["hex"])
    expected = p.decode_frame(data, FRAME_TYPES[frame_type])
    for split in {1, 3, 4, 5, len(data) // 2, len(data) - 1}:
        decoder = p.FrameDecoder(FRAME_TYPES[frame_type])
        frames = []
        for start in range(0, len(data), split):
            decoder.receive_data(data[start : start + split])
            frames.extend(decoder.frames())
        assert frames == [expected]
        assert decoder.buffered == 0


@pytest.mark.parametrize(("frame_type", "case"), INVALID)
def test_invalid_case_is_refused(frame_type, case):
    data = bytes.fromhex(case["hex"])
    decoder = p.FrameDecoder(FRAME_TYPES[frame_type])
    if case["error"] == "frame_too_large":
        # Refused on the 4 prefix bytes alone, before any payload arrives.
        assert len(data) == p.LENGTH_PREFIX_LEN
        decoder.receive_data(data)
        with pytest.raises(FrameTooLarge):
            decoder.next_frame()
        decoder.receive_data(b"\x00" * 16)
        with pytest.raises(FrameTooLarge):
            decoder.next_frame()
    else:
        # A request of a later revision ("unsupported") is, to a decoder of
        # this one, as undecodable as a malformed payload.
        assert case["error"] in ("malformed", "unsupported")
        decoder.receive_data(data)
        with pytest.raises(MalformedMessage):
            decoder.next_frame()
        # The frame boundary is intact: the next frame still decodes.
        ping = p.encode_frame(p.ClientFrame(5, p.Ping()))
        pong = p.encode_frame(p.ServerFrame(5, p.Pong()))
        decoder.receive_data(ping if frame_type == "ClientFrame" else pong)
        assert decoder.next_frame().request_id == 5


def test_every_variant_and_error_code_has_a_vector():
    seen: set = set()

    def walk(wire: p.WireType, value: Any) -> None:
        if isinstance(wire, (p.Opt, p.Vec)):
            items = [] if value is None else ([value] if isinstance(wire, p.Opt) else value)
            for item in items:
                walk(wire.inner, item)
        elif isinstance(wire, (p.Struct, p.Enum)):
            if isinstance(wire, p.Enum):
                seen.add(type(value))
            for name, inner in value.WIRE:
                walk(inner, getattr(value, name))

    codes = set()
    for param in VALID:
        frame_type, case = param.values
        frame = p.decode_frame(bytes.fromhex(case["hex"]), FRAME_TYPES[frame_type])
        walk(p.Struct(type(frame)), frame)
        if isinstance(getattr(frame, "response", None), p.ErrorReply):
            codes.add(frame.response.code)
    for enum in SPEC_VARIANTS:
        assert set(enum.variants) <= seen
    assert set(range(1, 17)) <= codes


# ---------------------------------------------------------------------------
# The precompiled paths give the generic codec's bytes and values
# ---------------------------------------------------------------------------

CLIENT_VALID = [c for c in VALID if c.values[0] == "ClientFrame"]
SERVER_VALID = [c for c in VALID if c.values[0] == "ServerFrame"]


@pytest.mark.parametrize(("frame_type", "case"), CLIENT_VALID)
def test_encode_request_gives_the_vector_bytes(frame_type, case):
    frame = struct_from_serde(p.ClientFrame, case["value"])
    assert p.encode_request(frame.request_id, frame.request).hex() == case["hex"]
    request = frame.request
    if isinstance(request, p.Acquire) and isinstance(request.cost, p.TokenCost):
        packed = encode_token_acquire(
            frame.request_id,
            request.limit,
            request.tenant,
            request.priority,
            request.cost.input_tokens,
            request.cost.output_tokens,
            request.max_wait_ms,
        )
        assert packed.hex() == case["hex"]


def settlement_vectors():
    """The valid client vectors of a Report, a UsageReport or a Release: the
    frames a `Settlement` packs (every other vector has no settlement to compare)."""
    settlements = (p.Report, p.UsageReport, p.Release)
    vectors = [
        param
        for param in CLIENT_VALID
        if isinstance(
            struct_from_serde(p.ClientFrame, param.values[1]["value"]).request, settlements
        )
    ]
    assert vectors, "proto-spec/vectors has no Report or Release vector"
    return vectors


@pytest.mark.parametrize(("frame_type", "case"), settlement_vectors())
def test_a_settlement_packs_the_vector_bytes(frame_type, case):
    frame = struct_from_serde(p.ClientFrame, case["value"])
    request = frame.request
    if isinstance(request, p.Report):
        settlement = Settlement(request.lease, request.input_tokens, request.output_tokens, False)
    elif isinstance(request, p.UsageReport):
        usage = request.usage
        settlement = Settlement(
            request.lease,
            usage.input_tokens,
            usage.output_tokens,
            False,
            usage.cached_input_tokens,
            usage.cache_write_tokens,
        )
        if not settlement.usage_report:
            # Without cache figures a report says as much as a Report, which
            # every daemon knows: the client sends that instead.
            report = p.Report(request.lease, usage.input_tokens, usage.output_tokens)
            assert settlement.message() == report
            return
    else:
        settlement = Settlement(request.lease, 0, 0, True)
    assert settlement.message() == request
    assert settlement.frame(frame.request_id, p.MAX_FRAME_LEN).hex() == case["hex"]


def test_a_usage_report_falls_back_to_a_report_of_every_input_token():
    settlement = Settlement(42, 120, 230, False, 1000, 300)
    assert settlement.usage_report
    fallback = settlement.as_report()
    assert fallback.message() == p.Report(42, 120 + 1000 + 300, 230)
    assert not fallback.usage_report
    assert fallback.as_report() is fallback


@pytest.mark.parametrize(
    ("settlement", "error"),
    [
        (Settlement(-1, 0, 0, False), ValueError),
        (Settlement(1, 2**64, 0, False), ValueError),
        (Settlement(1, 0, 1.5, False), TypeError),
        (Settlement(2**64, 0, 0, True), ValueError),
    ],
)
def test_a_settlement_refuses_what_the_codec_refuses(settlement, error):
    with pytest.raises(error):
        settlement.frame(1, p.MAX_FRAME_LEN)


@pytest.mark.parametrize(("frame_type", "case"), SERVER_VALID)
def test_a_fixed_answer_is_a_frozen_instance_of_its_message_type(frame_type, case):
    decoder = p.FrameDecoder()
    decoder.receive_data(bytes.fromhex(case["hex"]))
    _, response = decoder.next_answer()
    expected = p.decode_frame(bytes.fromhex(case["hex"])).response
    assert type(response) is type(expected)
    assert (response, repr(response), hash(response)) == (expected, repr(expected), hash(expected))
    if dataclasses.fields(response):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(response, dataclasses.fields(response)[0].name, 0)


def test_every_token_acquire_vector_is_held_against_the_packed_layout():
    acquires = [
        c
        for c in CLIENT_VALID
        if "Tokens" in json.dumps(c.values[1]["value"])
        and "Acquire" in c.values[1]["value"]["request"]
    ]
    assert len(acquires) >= 6


@pytest.mark.parametrize(
    ("limit", "tenant", "priority", "counts", "max_wait_ms"),
    [
        ("bench", None, None, (10, 0), 0),
        ("bench", None, None, (10, 0), None),
        ("", "", "", (0, 0), 1),
        ("gpt-4o", "acme", None, (2**64 - 1, 2**64 - 1), 2**64 - 1),
        ("gpt-4o", None, "batch", (1, 2), 3_600_000),
        ("claude-ü", "客户", "interactive", (300, 0), None),
        ("x" * 300, "t" * 300, "p" * 300, (5, 5), 5),  # longer than any cached layout
    ],
)
def test_encode_token_acquire_is_encode_frame(limit, tenant, priority, counts, max_wait_ms):
    acquire = p.Acquire(limit, p.TokenCost(*counts), tenant, priority, max_wait_ms)
    for request_id in (1, 77, 2**64 - 1):
        expected = p.encode_frame(p.ClientFrame(request_id, acquire))
        for _ in range(2):  # the layout built, then the layout cached
            packed = encode_token_acquire(request_id, limit, tenant, priority, *counts, max_wait_ms)
            assert packed == expected


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("bench", None, None, -1, 0, None), ValueError),
        (("bench", None, None, 2**64, 0, None), ValueError),
        (("bench", None, None, 1, 0, -5), ValueError),
        (("bench", None, None, 1.5, 0, None), TypeError),
        ((3, None, None, 1, 0, None), TypeError),
        (("bench", 7, None, 1, 0, None), TypeError),
    ],
)
def test_encode_token_acquire_refuses_what_the_codec_refuses(args, error):
    with pytest.raises(error):
        p.encode_frame(
            p.ClientFrame(1, p.Acquire(args[0], p.TokenCost(*args[3:5]), *args[1:3], args[5]))
        )
    with pytest.raises(error):
        encode_token_acquire(1, *args)


def test_encode_token_acquire_checks_the_frame_bound():
    with pytest.raises(FrameTooLarge):
        encode_token_acquire(1, "x" * 100, None, None, 1, 0, None, max_frame_len=100)
    assert encode_token_acquire(1, "x" * 10, None, None, 1, 0, None, max_frame_len=100)


@pytest.mark.parametrize(("frame_type", "case"), SERVER_VALID)
def test_next_answer_gives_the_decoded_frame(frame_type, case):
    data = bytes.fromhex(case["hex"])
    expected = p.decode_frame(data, p.ServerFrame)
    for split in {1, 3, 4, 5, len(data) // 2, len(data)}:
        decoder = p.FrameDecoder(p.ServerFrame)
        answers = []
        for start in range(0, len(data), split):
            chunk = data[start : start + split]
            buffer = decoder.get_buffer()  # as recv_into fills it
            buffer[: len(chunk)] = chunk
            decoder.buffer_updated(len(chunk))
            while (answer := decoder.next_answer()) is not p.NEED_DATA:
                answers.append(answer)
        assert answers == [(expected.request_id, expected.response)]
        assert decoder.buffered == 0


def test_a_fixed_size_answer_with_a_foreign_tag_is_decoded_generically():
    # Settled and Released have the same size; a tag above 255 must not pass for either.
    settled = bytearray(p.encode_frame(p.ServerFrame(3, p.Settled(-4))))
    settled[12 + 1] = 1  # tag 3 + 256
    decoder = p.FrameDecoder()
    decoder.receive_data(bytes(settled))
    with pytest.raises(MalformedMessage):
        decoder.next_answer()


def test_the_decoder_buffer_grows_for_a_large_frame_and_shrinks_after():
    limits = tuple(
        p.LimitStatus(f"limit-{index}", 0, (p.BucketStatus("tokens", 1, 1, 1),))
        for index in range(3000)
    )
    big = p.encode_frame(p.ServerFrame(9, p.StatusReply("embedded", limits)))
    small = p.encode_frame(p.ServerFrame(10, p.Pong()))
    assert len(big) > p.BUFFER_SIZE
    decoder = p.FrameDecoder()
    stream, answers = big + small + small, []
    while stream:
        buffer = decoder.get_buffer()
        size = min(len(buffer), len(stream), 5000)
        buffer[:size], stream = stream[:size], stream[size:]
        decoder.buffer_updated(size)
        while (answer := decoder.next_answer()) is not p.NEED_DATA:
            answers.append(answer)
    assert [request_id for request_id, _ in answers] == [9, 10, 10]
    assert answers[0][1].limit("limit-2999").waiters == 0
    assert len(decoder.get_buffer()) == p.BUFFER_SIZE  # back to its size once empty


def padding_frame(request_id: int, size: int) -> bytes:
    """A valid `Error` answer of exactly `size` bytes, length prefix included."""
    bare = len(p.encode_frame(p.ServerFrame(request_id, p.ErrorReply(15, ""))))
    assert size >= bare
    frame = p.encode_frame(p.ServerFrame(request_id, p.ErrorReply(15, "x" * (size - bare))))
    assert len(frame) == size
    return frame


@pytest.mark.parametrize("payload_size", range(9))
@pytest.mark.parametrize("method", ["next_answer", "next_frame"])
def test_a_frame_too_short_for_its_header_is_malformed_even_at_the_buffer_end(payload_size, method):
    # A payload under 9 bytes cannot hold the request id and the tag's low
    # byte; ending right at the end of the decoder's buffer, it was read past.
    tiny = p.LENGTH_PREFIX_LEN + payload_size
    padding = padding_frame(1, p.BUFFER_SIZE - tiny)
    decoder = p.FrameDecoder()
    decoder.receive_data(padding)
    decoder.receive_data(payload_size.to_bytes(4, "little") + b"\x07" * payload_size)
    decode = getattr(decoder, method)
    first = decode()
    assert (first if method == "next_answer" else (first.request_id, first.response))[0] == 1
    with pytest.raises(MalformedMessage):
        decode()
    assert decoder.buffered == 0
    assert decode() is p.NEED_DATA  # the stream goes on after a malformed frame


def random_stream(rng: random.Random) -> bytes:
    """Frames a daemon might send, valid and not: tiny ones, truncated ones,
    garbage, with a padding frame first that puts them near the buffer's end."""
    valid = [bytes.fromhex(case.values[1]["hex"]) for case in SERVER_VALID]
    parts = []
    if rng.random() < 0.7:
        parts.append(padding_frame(2, p.BUFFER_SIZE - rng.randrange(0, 80)))
    for _ in range(rng.randrange(1, 8)):
        kind = rng.randrange(5)
        if kind == 0:  # a tiny frame: a length prefix and fewer bytes than a header
            size = rng.randrange(0, 13)
            parts.append(size.to_bytes(4, "little") + rng.randbytes(size))
        elif kind == 1:  # a valid answer
            parts.append(rng.choice(valid))
        elif kind == 2:  # a valid answer with bytes flipped
            frame = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(p.LENGTH_PREFIX_LEN, len(frame))] = rng.randrange(256)
            parts.append(bytes(frame))
        elif kind == 3:  # a valid answer's payload under a shorter length prefix
            frame = rng.choice(valid)
            size = rng.randrange(0, len(frame) - p.LENGTH_PREFIX_LEN)
            parts.append(size.to_bytes(4, "little") + frame[p.LENGTH_PREFIX_LEN :][:size])
        else:  # raw bytes, length prefix included
            parts.append(rng.randbytes(rng.randrange(0, 24)))
    return b"".join(parts)


def decode_everything(decoder: p.FrameDecoder, method: str) -> bool:
    """Decodes until `NEED_DATA`; False once the stream broke (`FrameTooLarge`).
    Every failure must be the client's `ProtocolError`, never another exception."""
    decode = getattr(decoder, method)
    for _ in range(10_000):  # more than the frames any stream above holds
        try:
            if decode() is p.NEED_DATA:
                return True
        except FrameTooLarge:
            return False
        except ProtocolError:
            continue
    raise AssertionError("the decoder never asked for more data")


@pytest.mark.parametrize("method", ["next_answer", "next_frame"])
def test_random_and_short_bytes_raise_only_the_protocol_error(method):
    rng = random.Random(27_11)  # seeded: a failure reproduces
    for _ in range(2000):
        stream = random_stream(rng)
        decoder = p.FrameDecoder(p.ServerFrame)
        whole = rng.random() < 0.5
        while stream:  # all at once, or in chunks received as the socket does
            size = len(stream) if whole else min(len(stream), rng.randrange(1, 9000))
            if rng.random() < 0.5:
                decoder.receive_data(stream[:size])
            else:
                buffer = decoder.get_buffer()
                size = min(size, len(buffer))
                buffer[:size] = stream[:size]
                decoder.buffer_updated(size)
            stream = stream[size:]
            if not decode_everything(decoder, method):
                break
    for size in range(64):  # short strings as whole frames and as payloads
        data = rng.randbytes(size)
        for decode in (p.decode_frame, p.decode_payload):
            with contextlib.suppress(ProtocolError):
                decode(data)
