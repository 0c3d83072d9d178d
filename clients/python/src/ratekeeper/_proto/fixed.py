"""Precompiled layouts of the messages made of integers only.

The hot path packs these requests and unpacks these answers with one
`struct` each, without building a dataclass on the way (`framing`'s
`encode_request` and `next_answer`); the answers it makes are still the
frozen dataclasses of `messages`, checked at import against their own
constructors.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from .messages import REQUEST, RESPONSE, ServerFrame
from .wire import U64, _Int


def _answer_maker(cls: type) -> Callable[[tuple], Any]:
    """`make(values)`: the `cls` of an unpacked payload `(request_id, tag, *fields)`.

    Equal to `cls(*values[2:])` and of that very class, but a frozen
    dataclass's `__init__` sets each field through `object.__setattr__`
    (about 5,000 instructions for `Granted`): this fills the instance's
    `__dict__` in one step, for the classes of up to three fields with no
    `__post_init__`, and checks at import that the two agree.
    """
    names = tuple(name for name, _ in cls.WIRE)
    new, set_dict = object.__new__, object.__setattr__
    if len(names) == 1:
        (a,) = names

        def make(values: tuple) -> Any:
            obj = new(cls)
            set_dict(obj, "__dict__", {a: values[2]})
            return obj

    elif len(names) == 2:
        a, b = names

        def make(values: tuple) -> Any:
            obj = new(cls)
            set_dict(obj, "__dict__", {a: values[2], b: values[3]})
            return obj

    elif len(names) == 3:
        a, b, c = names

        def make(values: tuple) -> Any:
            obj = new(cls)
            set_dict(obj, "__dict__", {a: values[2], b: values[3], c: values[4]})
            return obj

    else:
        return lambda values: cls(*values[2:])
    sample = (0, cls.TAG, *range(1, len(names) + 1))
    made, built = make(sample), cls(*sample[2:])
    if hasattr(cls, "__post_init__") or made != built or repr(made) != repr(built):
        return lambda values: cls(*values[2:])
    return make


def _fixed_answers() -> dict[tuple[int, int], tuple[struct.Struct, int, Callable[[tuple], Any]]]:
    """The responses made of integers only, by (payload size, low byte of the tag):
    one layout each for the whole payload (request id, tag, fields), their tag,
    and what makes the response of the unpacked values (`_answer_maker`)."""
    if ServerFrame.WIRE != (("request_id", U64), ("response", RESPONSE)):
        raise RuntimeError(f"next_answer unpacks a request id and a response: {ServerFrame.WIRE}")
    answers = {}
    for cls in RESPONSE.variants:
        if all(isinstance(wire, _Int) for _, wire in cls.WIRE):
            fields = "".join(wire.fmt.format[1:] for _, wire in cls.WIRE)
            layout = struct.Struct("<QI" + fields)
            answers[(layout.size, cls.TAG & 0xFF)] = (layout, cls.TAG, _answer_maker(cls))
    return answers


#: Integer-only responses by (payload size, low byte of the tag), for `next_answer`.
FIXED_ANSWERS = _fixed_answers()


def _fixed_requests() -> dict[type, tuple[struct.Struct, int, tuple[str, ...]]]:
    """The requests made of integers only: one layout each for the whole frame
    (length prefix, request id, tag, fields), their tag and their field names."""
    requests = {}
    for cls in REQUEST.variants:
        if all(isinstance(wire, _Int) for _, wire in cls.WIRE):
            fields = "".join(wire.fmt.format[1:] for _, wire in cls.WIRE)
            names = tuple(name for name, _ in cls.WIRE)
            requests[cls] = (struct.Struct("<IQI" + fields), cls.TAG, names)
    return requests


#: Integer-only requests by class, for `encode_request`.
FIXED_REQUESTS = _fixed_requests()
