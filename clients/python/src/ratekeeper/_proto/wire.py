"""Wire types, sans I/O: how each value is laid out in a payload (PROTOCOL.md §3).

Integers, `bool`, `String`, `Option<T>`, `Vec<T>`, structs and enums, each a
`WireType` that encodes into a `bytearray` and decodes from a `Reader`. A
struct is any class whose attribute `WIRE` lists its fields in wire order with
their wire types; `encode_fields` and `decode_fields` walk that list, compiled
once per class into a `_Plan` that packs runs of integers with one
`struct.Struct`. This module knows no message: `messages` declares them.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, ClassVar, Optional

from .errors import MalformedMessage

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class Reader:
    """A cursor over one payload that refuses to read past its end."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise MalformedMessage(
                f"truncated: {size} bytes needed at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> Any:
        end = self.pos + fmt.size
        if end > len(self.data):
            raise MalformedMessage(f"truncated field at offset {self.pos}")
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos = end
        return value

    def remaining(self) -> int:
        return len(self.data) - self.pos


class WireType:
    """How one value is laid out on the wire."""

    def encode(self, out: bytearray, value: Any) -> None:
        raise NotImplementedError

    def decode(self, reader: Reader) -> Any:
        raise NotImplementedError


class _Int(WireType):
    def __init__(self, name: str, fmt: struct.Struct) -> None:
        self.name = name
        self.fmt = fmt

    def encode(self, out: bytearray, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{self.name} must be an int, got {type(value).__name__}")
        try:
            out += self.fmt.pack(value)
        except struct.error:
            raise ValueError(f"{value} does not fit in a {self.name}") from None

    def decode(self, reader: Reader) -> Any:
        return reader.unpack(self.fmt)

    def __repr__(self) -> str:
        return self.name


class _Bool(WireType):
    def encode(self, out: bytearray, value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"bool expected, got {type(value).__name__}")
        out.append(1 if value else 0)

    def decode(self, reader: Reader) -> Any:
        byte = reader.take(1)[0]
        if byte > 1:
            raise MalformedMessage(f"bool byte {byte} is neither 0 nor 1")
        return byte == 1

    def __repr__(self) -> str:
        return "bool"


class _Str(WireType):
    def encode(self, out: bytearray, value: Any) -> None:
        if not isinstance(value, str):
            raise TypeError(f"str expected, got {type(value).__name__}")
        data = value.encode("utf-8")
        out += _U64.pack(len(data))
        out += data

    def decode(self, reader: Reader) -> Any:
        size = reader.unpack(_U64)
        if size > reader.remaining():
            raise MalformedMessage(f"string of {size} bytes runs past the end of the payload")
        try:
            return reader.take(size).decode("utf-8")
        except UnicodeDecodeError as error:
            raise MalformedMessage(f"invalid UTF-8 in a string: {error}") from None

    def __repr__(self) -> str:
        return "String"


class _Generic(WireType):
    """A wire type around another one, `Name<T>`: `Opt` and `Vec`."""

    NAME: ClassVar[str]

    def __init__(self, inner: WireType) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"{self.NAME}<{self.inner!r}>"


class Opt(_Generic):
    """`Option<T>`: byte 0 for None, byte 1 and the value for Some."""

    NAME = "Option"

    def encode(self, out: bytearray, value: Any) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.encode(out, value)

    def decode(self, reader: Reader) -> Any:
        tag = reader.take(1)[0]
        if tag == 0:
            return None
        if tag == 1:
            return self.inner.decode(reader)
        raise MalformedMessage(f"Option tag {tag} is neither 0 nor 1")


class Vec(_Generic):
    """`Vec<T>`: a u64 count, then the elements (stored as a tuple)."""

    NAME = "Vec"

    def encode(self, out: bytearray, value: Any) -> None:
        items = tuple(value)
        out += _U64.pack(len(items))
        for item in items:
            self.inner.encode(out, item)

    def decode(self, reader: Reader) -> Any:
        count = reader.unpack(_U64)
        # Every element takes at least one byte: refuse counts the payload
        # cannot hold before building anything for them.
        if count > reader.remaining():
            raise MalformedMessage(f"list of {count} elements runs past the end of the payload")
        return tuple(self.inner.decode(reader) for _ in range(count))


class Struct(WireType):
    """A message struct: its `WIRE` fields in order, nothing between them."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def encode(self, out: bytearray, value: Any) -> None:
        if not isinstance(value, self.cls):
            raise TypeError(f"{self.cls.__name__} expected, got {type(value).__name__}")
        encode_fields(out, value)

    def decode(self, reader: Reader) -> Any:
        return decode_fields(reader, self.cls)

    def __repr__(self) -> str:
        return self.cls.__name__


class Enum(WireType):
    """An enum: a u32 tag (the variant's index), then the variant's fields."""

    def __init__(self, name: str, variants: tuple[type, ...]) -> None:
        self.name = name
        self.variants = variants
        for tag, variant in enumerate(variants):
            variant.TAG = tag

    def encode(self, out: bytearray, value: Any) -> None:
        variant = type(value)
        tag = getattr(variant, "TAG", None)
        if tag is None or tag >= len(self.variants) or self.variants[tag] is not variant:
            raise TypeError(f"{variant.__name__} is not a variant of {self.name}")
        out += _U32.pack(tag)
        encode_fields(out, value)

    def decode(self, reader: Reader) -> Any:
        tag = reader.unpack(_U32)
        if tag >= len(self.variants):
            raise MalformedMessage(f"unknown {self.name} tag {tag}")
        return decode_fields(reader, self.variants[tag])

    def __repr__(self) -> str:
        return self.name


U16 = _Int("u16", _U16)
U32 = _Int("u32", _U32)
U64 = _Int("u64", _U64)
I64 = _Int("i64", _I64)
BOOL = _Bool()
STR = _Str()


class _Plan:
    """A struct's `WIRE` compiled for speed: runs of fixed-width integers are
    packed and unpacked with one `struct.Struct`, other fields one by one."""

    __slots__ = ("names", "positional", "steps")

    def __init__(self, cls: type) -> None:
        wire = cls.WIRE
        self.names = tuple(name for name, _ in wire)
        # Constructed positionally when the dataclass declares its fields in wire order.
        declared = tuple(f.name for f in dataclasses.fields(cls))
        self.positional = declared[: len(self.names)] == self.names
        self.steps: list[tuple[Optional[struct.Struct], tuple[str, ...], Any]] = []
        run: list[tuple[str, _Int]] = []

        def close_run() -> None:
            if run:
                fmt = struct.Struct("<" + "".join(t.fmt.format[1:] for _, t in run))
                self.steps.append((fmt, tuple(name for name, _ in run), tuple(run)))
                run.clear()

        for name, wire_type in wire:
            if isinstance(wire_type, _Int):
                run.append((name, wire_type))
            else:
                close_run()
                self.steps.append((None, (name,), wire_type))
        close_run()

    def encode(self, out: bytearray, value: Any) -> None:
        for fixed, names, wire in self.steps:
            if fixed is None:
                wire.encode(out, getattr(value, names[0]))
                continue
            values = [getattr(value, name) for name in names]
            try:
                out += fixed.pack(*values)
            except struct.error:
                for (_, int_type), item in zip(wire, values):
                    int_type.encode(out, item)  # raises the precise error
                raise

    def decode(self, reader: Reader, cls: type) -> Any:
        values: list[Any] = []
        for fixed, _, wire in self.steps:
            if fixed is None:
                values.append(wire.decode(reader))
                continue
            end = reader.pos + fixed.size
            if end > len(reader.data):
                raise MalformedMessage(f"truncated field at offset {reader.pos}")
            values.extend(fixed.unpack_from(reader.data, reader.pos))
            reader.pos = end
        if self.positional:
            return cls(*values)
        return cls(**dict(zip(self.names, values)))


def _plan(cls: type) -> _Plan:
    plan = cls.__dict__.get("_PLAN")
    if plan is None:
        plan = _Plan(cls)
        cls._PLAN = plan
    return plan


def encode_fields(out: bytearray, value: Any) -> None:
    """Appends the `WIRE` fields of `value` to `out`, in wire order."""
    _plan(type(value)).encode(out, value)


def decode_fields(reader: Reader, cls: type) -> Any:
    """Reads the `WIRE` fields of `cls` from `reader` and builds a `cls`."""
    return _plan(cls).decode(reader, cls)
