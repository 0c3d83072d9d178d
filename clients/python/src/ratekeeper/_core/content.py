"""Requests of content blocks as the wire's `Conversation` (protocol revision 4), sans I/O.

Anthropic's Messages shape (a top-level `system`, content blocks `text`,
`image`, `tool_use`, `tool_result`, `document`, ...) and OpenAI messages whose
content holds images become text blocks for the daemon's counter and image
blocks with their size in pixels, read here from the image's own bytes (PNG,
JPEG, GIF, WebP) when the request carries them; an image given by URL or file
id is sent as 0 x 0, which the daemon prices as the most an image can cost. A
block whose type is not known is refused with `ValueError`, never counted as
nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .. import _proto as p

ANTHROPIC = "anthropic"
OPENAI = "openai"

#: Anthropic block types only Anthropic's shape has: one of them makes a request Anthropic's.
ANTHROPIC_BLOCKS = frozenset(
    {"image", "tool_use", "tool_result", "document", "thinking", "redacted_thinking"}
)

#: Bytes of an image read to find its size (the JPEG frame header may follow EXIF data).
_SNIFF_BYTES = 256 * 1024


def as_mapping(value: Any) -> Any:
    """SDK objects (pydantic models) as dicts; dicts and strings as they are."""
    if isinstance(value, (Mapping, str)):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    return vars(value)


def compact_json(value: Any) -> str:
    """`value` as compact JSON (SDK objects as their dicts); a string as it is."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=as_mapping)


def image_size(data: bytes) -> Optional[tuple[int, int]]:
    """(width, height) in pixels of a PNG, JPEG, GIF or WebP image; None if not known."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> Optional[tuple[int, int]]:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def _jpeg_size(data: bytes) -> Optional[tuple[int, int]]:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            at += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        # Start-of-frame markers (not DHT C4, JPG C8, DAC CC) hold the size.
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def base64_image_size(text: str) -> tuple[int, int]:
    """The size of a base64 image, or (0, 0) when it cannot be read."""
    head = text[: _SNIFF_BYTES * 4 // 3 // 4 * 4]
    try:
        data = base64.b64decode(head)
    except (binascii.Error, ValueError):
        return 0, 0
    size = image_size(data)
    if size is None or min(size) <= 0:
        return 0, 0
    return size


def _data_url_size(url: str) -> tuple[int, int]:
    """The size of a `data:image/...;base64,` URL's image; (0, 0) for any other URL."""
    if not url.startswith("data:"):
        return 0, 0
    header, _, data = url.partition(",")
    if not header.endswith(";base64"):
        return 0, 0
    return base64_image_size(data)


# ---------------------------------------------------------------------------
# Anthropic
# ---------------------------------------------------------------------------


def _anthropic_image(block: Mapping, where: str) -> p.ImageBlock:
    source = as_mapping(block.get("source") or {})
    if source.get("type") == "base64":
        return p.ImageBlock(*base64_image_size(str(source.get("data") or "")))
    if source.get("type") in ("url", "file"):
        return p.ImageBlock(0, 0)
    raise ValueError(f"{where}: an image source of type {source.get('type')!r} cannot be counted")


def _anthropic_document(block: Mapping, where: str) -> list[p.Block]:
    source = as_mapping(block.get("source") or {})
    kind = source.get("type")
    blocks: list[p.Block] = [
        p.TextBlock(str(block[key])) for key in ("title", "context") if block.get(key)
    ]
    if kind == "text":
        blocks.append(p.TextBlock(str(source.get("data") or "")))
    elif kind == "content":
        blocks += anthropic_blocks(source.get("content"), f"{where}.source.content")
    else:
        raise ValueError(
            f"{where}: a document of source type {kind!r} (a PDF) cannot be counted from "
            "the request; acquire with tokens= counted yourself (e.g. messages.count_tokens)"
        )
    return blocks


def _anthropic_block(block: Any, where: str) -> list[p.Block]:
    block = as_mapping(block)
    if isinstance(block, str):
        return [p.TextBlock(block)]
    kind = block.get("type")
    if kind == "text":
        return [p.TextBlock(str(block.get("text") or ""))]
    if kind == "image":
        return [_anthropic_image(block, where)]
    if kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        return [
            p.TextBlock(str(block.get("name") or "")),
            p.TextBlock(compact_json(block.get("input"))),
        ]
    if kind == "tool_result":
        return anthropic_blocks(block.get("content"), f"{where}.content")
    if kind == "document":
        return _anthropic_document(block, where)
    if kind == "thinking":
        return [p.TextBlock(str(block.get("thinking") or ""))]
    if kind == "redacted_thinking":
        return [p.TextBlock(str(block.get("data") or ""))]
    if kind == "search_result":
        head = [p.TextBlock(str(block.get(key) or "")) for key in ("title", "source")]
        return head + anthropic_blocks(block.get("content"), f"{where}.content")
    if isinstance(kind, str) and kind.endswith("_tool_result"):
        return [p.TextBlock(compact_json(block.get("content")))]
    raise ValueError(
        f"{where}: content block type {kind!r} is not known to ratekeeper, so its tokens "
        "cannot be counted; acquire with tokens= counted yourself"
    )


def anthropic_blocks(content: Any, where: str) -> list[p.Block]:
    """The wire blocks of an Anthropic content: a string, or a list of blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [p.TextBlock(content)]
    blocks: list[p.Block] = []
    for index, block in enumerate(content):
        blocks += _anthropic_block(block, f"{where}[{index}]")
    return blocks


def _system_texts(system: Any) -> tuple[str, ...]:
    if system is None:
        return ()
    if isinstance(system, str):
        return (system,) if system else ()
    texts = []
    for index, block in enumerate(system):
        block = as_mapping(block)
        if isinstance(block, str):
            texts.append(block)
        elif block.get("type", "text") == "text":
            texts.append(str(block.get("text") or ""))
        else:
            raise ValueError(f"system[{index}]: a system block must be text, not {block['type']!r}")
    return tuple(texts)


def anthropic_conversation(
    messages: Iterable[Any], system: Any, tools: Any, max_tokens: Optional[int]
) -> p.Conversation:
    """An Anthropic Messages request as the `Conversation` the daemon counts."""
    turns = []
    for index, message in enumerate(messages):
        message = as_mapping(message)
        blocks = anthropic_blocks(message.get("content"), f"messages[{index}].content")
        turns.append(p.Turn(str(message.get("role", "user")), tuple(blocks)))
    return p.Conversation(
        api=ANTHROPIC,
        messages=tuple(turns),
        system=_system_texts(system),
        tools_json=compact_json(list(tools)) if tools else None,
        max_output_tokens=max_tokens,
    )


# ---------------------------------------------------------------------------
# OpenAI
# ---------------------------------------------------------------------------


def _openai_image(part: Mapping) -> p.ImageBlock:
    image = as_mapping(part.get("image_url") or {})
    if isinstance(image, str):
        return p.ImageBlock(*_data_url_size(image))
    return p.ImageBlock(
        *_data_url_size(str(image.get("url") or "")), str(image.get("detail") or "")
    )


def openai_blocks(content: Any) -> list[p.Block]:
    """The wire blocks of an OpenAI content: text parts and images (audio and files
    are not counted, as for `ChatMessage`)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [p.TextBlock(content)]
    blocks: list[p.Block] = []
    for part in content:
        part = as_mapping(part)
        if isinstance(part, str):
            blocks.append(p.TextBlock(part))
        elif part.get("type") == "image_url":
            blocks.append(_openai_image(part))
        elif isinstance(part.get("text"), str):
            blocks.append(p.TextBlock(part["text"]))
        elif isinstance(part.get("refusal"), str):
            blocks.append(p.TextBlock(part["refusal"]))
    return blocks


def openai_conversation(
    chat: p.ChatRequest, messages: Iterable[Any], max_tokens: Optional[int]
) -> p.Conversation:
    """OpenAI messages with images: `chat` (their `ChatRequest`) with image blocks added."""
    turns = []
    for converted, message in zip(chat.messages, messages):
        content = (
            as_mapping(message).get("content") if not isinstance(message, p.ChatMessage) else None
        )
        blocks = (
            openai_blocks(content)
            if content is not None
            else [p.TextBlock(part) for part in converted.content]
        )
        turns.append(
            p.Turn(converted.role, tuple(blocks), converted.name, converted.tool_calls_json)
        )
    return p.Conversation(
        api=OPENAI,
        messages=tuple(turns),
        tools_json=chat.tools_json,
        max_output_tokens=max_tokens,
    )


# ---------------------------------------------------------------------------
# Which shape
# ---------------------------------------------------------------------------


def _part_types(messages: Iterable[Any]) -> set:
    kinds = set()
    for message in messages:
        if isinstance(message, p.ChatMessage):
            continue
        content = as_mapping(message).get("content")
        if isinstance(content, (list, tuple)):
            for part in content:
                part = as_mapping(part)
                if not isinstance(part, str):
                    kinds.add(part.get("type"))
    return kinds


def shape_of(messages: list, system: Any) -> Optional[str]:
    """`ANTHROPIC` for a `system` or Anthropic blocks, `OPENAI` for OpenAI images,
    None for messages a `ChatRequest` holds whole (text, tool calls)."""
    if system is not None:
        return ANTHROPIC
    kinds = _part_types(messages)
    if kinds & ANTHROPIC_BLOCKS:
        return ANTHROPIC
    if "image_url" in kinds:
        return OPENAI
    return None
