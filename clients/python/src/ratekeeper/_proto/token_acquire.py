"""The frame of an `Acquire` of a token count, packed in one step.

An acquire by token count is the client's most frequent request. Its frame is
`encode_frame(ClientFrame(request_id, Acquire(limit, TokenCost(...), tenant,
priority, max_wait_ms)))` byte for byte, but packed with one precompiled
`struct` layout per `(limit, tenant, priority)`, without building a
dataclass; `test_vectors.py` holds the two to each other.
"""

from __future__ import annotations

import struct
from typing import Any, Optional

from .errors import FrameTooLarge
from .framing import LENGTH_PREFIX_LEN, MAX_FRAME_LEN, MAX_NAME_LEN, encode_frame
from .messages import COST, REQUEST, Acquire, ClientFrame, TokenCost
from .wire import _U32, U64


def encode_token_acquire(
    request_id: int,
    limit: str,
    tenant: Optional[str],
    priority: Optional[str],
    input_tokens: int,
    output_tokens: int,
    max_wait_ms: Optional[int],
    max_frame_len: int = MAX_FRAME_LEN,
) -> bytes:
    """The frame of an `Acquire` of a `TokenCost`, without building either.

    Byte for byte `encode_frame(ClientFrame(request_id, Acquire(limit,
    TokenCost(input_tokens, output_tokens), tenant, priority, max_wait_ms)))`,
    in one `pack`: the bytes fixed by the names are encoded once per
    `(limit, tenant, priority)`, through the declared wire types. Raises as
    `encode_frame` does.
    """
    layout = _acquire_layouts.get((limit, tenant, priority))
    if layout is None:
        layout = _acquire_layout(limit, tenant, priority)
    no_wait, wait, names = layout
    try:
        if max_wait_ms is None:
            size = no_wait.size - LENGTH_PREFIX_LEN
            frame = no_wait.pack(size, request_id, names, input_tokens, output_tokens, 0)
        else:
            size = wait.size - LENGTH_PREFIX_LEN
            frame = wait.pack(size, request_id, names, input_tokens, output_tokens, 1, max_wait_ms)
    except struct.error:  # not an int, or out of range: the codec says which
        acquire = Acquire(
            limit, TokenCost(input_tokens, output_tokens), tenant, priority, max_wait_ms
        )
        return encode_frame(ClientFrame(request_id, acquire), max_frame_len)
    if size > max_frame_len:
        raise FrameTooLarge(f"a frame of {size} bytes exceeds the maximum of {max_frame_len}")
    return frame


#: `encode_token_acquire`'s layouts by names, a few hundred bytes each, at most this many.
_ACQUIRE_LAYOUTS_KEPT = 1024
_acquire_layouts: dict[tuple[Any, Any, Any], tuple[struct.Struct, struct.Struct, bytes]] = {}


def _acquire_layout(
    limit: str, tenant: Optional[str], priority: Optional[str]
) -> tuple[struct.Struct, struct.Struct, bytes]:
    """The layouts (without, with a wait) of the Acquire frames of those names, and the names.

    Length prefix, `ClientFrame.request_id`, then the `Request` tag, the names
    as their declared wire types encode them and the `Cost` tag (one `s`
    field), then the two counts and the `max_wait_ms` option: the order of
    the declarations, which `_check_acquire_declarations` holds them to.
    """
    names = bytearray(_U32.pack(Acquire.TAG))
    for (_, wire), value in zip(Acquire.WIRE[:3], (limit, tenant, priority)):
        wire.encode(names, value)
    names += _U32.pack(TokenCost.TAG)
    head = f"<IQ{len(names)}s"
    layout = (struct.Struct(head + "QQB"), struct.Struct(head + "QQBQ"), bytes(names))
    if len(names) <= 4 * MAX_NAME_LEN:
        if len(_acquire_layouts) >= _ACQUIRE_LAYOUTS_KEPT:
            _acquire_layouts.clear()
        _acquire_layouts[(limit, tenant, priority)] = layout
    return layout


def _check_acquire_declarations() -> None:
    """Fails at import if the declarations moved away from what `_acquire_layout` packs."""
    expected = (
        (ClientFrame.WIRE, (("request_id", U64), ("request", REQUEST))),
        (
            tuple(name for name, _ in Acquire.WIRE),
            ("limit", "tenant", "priority", "cost", "max_wait_ms"),
        ),
        ((Acquire.WIRE[3][1], repr(Acquire.WIRE[4][1])), (COST, "Option<u64>")),
        (TokenCost.WIRE, (("input_tokens", U64), ("output_tokens", U64))),
    )
    for declared, packed in expected:
        if declared != packed:
            raise RuntimeError(
                f"encode_token_acquire packs {packed}, the messages declare {declared}"
            )


_check_acquire_declarations()
