"""Content blocks counted by the real daemon (protocol revision 4): Anthropic's
Messages shape (`system`, images, tool use and results, tools) and OpenAI images,
with the providers' published image figures; image sizes read from the bytes;
unknown blocks refused."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib

import pytest

from ratekeeper import AsyncClient, Client
from ratekeeper import _proto as p
from ratekeeper._core import content
from ratekeeper._core import requests as req
from ratekeeper._proto.errors import ErrorCode

CONFIG = """
[[limits]]
name = "claude"
provider = "anthropic"
tokens_per_minute = 10000000

[[limits]]
name = "gpt"
provider = "openai"
model = "gpt-4o"
tokens_per_minute = 10000000
"""


def png(width: int, height: int) -> bytes:
    """The first bytes of a PNG: signature and IHDR (enough for its size)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + crc


def jpeg(width: int, height: int) -> bytes:
    """SOI, an APP0 segment, then a baseline SOF0 frame header."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits)
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png(1000, 1000), (1000, 1000)),
        (png(3000, 2000), (3000, 2000)),
        (jpeg(1024, 768), (1024, 768)),
        (gif(200, 100), (200, 100)),
        (webp_vp8x(4096, 8192), (4096, 8192)),
        (webp_vp8l(640, 480), (640, 480)),
        (b"not an image", None),
        (b"", None),
    ],
)
def test_image_sizes_are_read_from_the_bytes(data, size):
    assert content.image_size(data) == size


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def anthropic_image(data: bytes) -> dict:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(data)},
    }


TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather of a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]

#: An Anthropic conversation: a tool use and its result, an image, a long system prompt.
SYSTEM = [{"type": "text", "text": "You answer about the weather. " * 380}]
MESSAGES = [
    {
        "role": "user",
        "content": [anthropic_image(png(1000, 1000)), {"type": "text", "text": "Where?"}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "-3 degrees, snow"}],
            }
        ],
    },
]

#: The same text as OpenAI-style messages: what a `ChatRequest` counts.
TEXT_ONLY = [
    {"role": "system", "content": [{"type": "text", "text": SYSTEM[0]["text"]}]},
    {"role": "user", "content": "Where?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "text", "text": "get_weather"},
            {"type": "text", "text": '{"city":"Oslo"}'},
        ],
    },
    {"role": "user", "content": "-3 degrees, snow"},
]


def test_the_anthropic_shape_counts_system_tools_results_and_images(make_daemon):
    """An 11 KB `system` is counted (it counted 0 before), tool use and tool
    results count as their text, and on top of the text: Anthropic's ~1334
    tokens for a 1000 x 1000 image and its 346-token tool-use prompt."""
    daemon = make_daemon(CONFIG)
    with Client(daemon.socket) as client:
        text = client.estimate("claude", messages=TEXT_ONLY, max_tokens=100, tools=TOOLS)
        assert text.input_tokens > len(SYSTEM[0]["text"]) / 4
        counted = client.estimate(
            "claude", messages=MESSAGES, system=SYSTEM, max_tokens=100, tools=TOOLS
        )
        assert counted == p.Estimated(text.input_tokens + 1334 + 346, 100)
        # A string system is one text block; without tools, no tool prompt.
        as_string = client.estimate(
            "claude", messages=MESSAGES[:1], system=SYSTEM[0]["text"], max_tokens=1
        )
        assert as_string == client.estimate(
            "claude", messages=MESSAGES[:1], system=SYSTEM, max_tokens=1
        )
        alone = client.estimate("claude", messages=TEXT_ONLY[1:2], max_tokens=1)
        with_system = client.estimate(
            "claude", messages=TEXT_ONLY[1:2], system=SYSTEM[0]["text"], max_tokens=1
        )
        assert with_system.input_tokens > alone.input_tokens + len(SYSTEM[0]["text"]) / 4
        # Acquire reserves what estimate said; an image too large is scaled
        # down and costs Anthropic's ceiling of 1,600 tokens.
        big = [{"role": "user", "content": [anthropic_image(png(3000, 2000))]}]
        small = [{"role": "user", "content": []}]
        base = client.estimate("claude", messages=small, api="anthropic", max_tokens=10)
        lease = client.acquire("claude", messages=big, max_tokens=10)
        assert lease.tokens == base.input_tokens + 1600 + 10
        lease.release()


@pytest.mark.parametrize(
    ("image_url", "tokens"),
    [
        # OpenAI's vision guide: 1024 x 1024 at high detail is 765 tokens,
        # 2048 x 4096 is 1105, anything at low detail 85.
        ({"url": "data:image/png;base64," + b64(png(1024, 1024)), "detail": "high"}, 765),
        ({"url": "data:image/webp;base64," + b64(webp_vp8x(2048, 4096))}, 1105),
        ({"url": "data:image/jpeg;base64," + b64(jpeg(4096, 8192)), "detail": "low"}, 85),
        # A URL's size is not known: the most an image can cost, 8 tiles.
        ({"url": "https://example.com/cat.png"}, 1445),
    ],
)
def test_openai_images_count_by_the_tile_formula(make_daemon, image_url, tokens):
    daemon = make_daemon(CONFIG)
    text = [{"type": "text", "text": "What is in this image?"}]
    with Client(daemon.socket) as client:
        without = client.estimate("gpt", messages=[{"role": "user", "content": text}])
        with_image = client.estimate(
            "gpt",
            messages=[
                {"role": "user", "content": [*text, {"type": "image_url", "image_url": image_url}]}
            ],
        )
        assert with_image.input_tokens == without.input_tokens + tokens


def test_the_async_client_counts_the_anthropic_shape(make_daemon):
    daemon = make_daemon(CONFIG)

    async def main() -> None:
        async with AsyncClient(daemon.socket) as client:
            text = await client.estimate("claude", messages=TEXT_ONLY, max_tokens=100, tools=TOOLS)
            counted = await client.estimate(
                "claude", messages=MESSAGES, system=SYSTEM, max_tokens=100, tools=TOOLS
            )
            assert counted.input_tokens == text.input_tokens + 1334 + 346

    asyncio.run(main())


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"type": "video", "source": {}}, "content block type 'video' is not known"),
        (
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}},
            "a document of source type 'base64' (a PDF) cannot be counted",
        ),
        ({"type": "image", "source": {"type": "svg"}}, "an image source of type 'svg'"),
    ],
)
def test_blocks_that_cannot_be_counted_are_refused(client, block, message):
    """Refused before anything is sent, naming the block: never counted as nothing."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, block]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[1\]") as caught:
        client.estimate("basic", messages=messages, system="Be brief.")
    assert message in str(caught.value)


def test_documents_of_text_and_search_results_count_as_their_text():
    document = {
        "type": "document",
        "title": "Notes",
        "source": {"type": "text", "media_type": "text/plain", "data": "The sky is blue."},
    }
    conversation = content.anthropic_conversation(
        [{"role": "user", "content": [document]}], None, None, 5
    )
    assert conversation.messages[0].blocks == (
        p.TextBlock("Notes"),
        p.TextBlock("The sky is blue."),
    )


def test_system_is_anthropic_and_not_for_token_costs(client):
    with pytest.raises(ValueError, match="system"):
        client.estimate("basic", 10, system="Be brief.")
    with pytest.raises(ValueError, match="system"):
        client.estimate("basic", messages=[], system="Be brief.", api="openai")
    with pytest.raises(ValueError, match="api"):
        client.estimate("basic", messages=[], api="gemini")


def test_an_older_daemons_malformed_answer_to_a_conversation_reads_as_unsupported():
    """A daemon of revision 3 answers MalformedMessage to Cost tag 2 (PROTOCOL.md §10)."""
    conversation = content.anthropic_conversation(MESSAGES, SYSTEM, TOOLS, 10)
    malformed = p.ErrorReply(ErrorCode.MALFORMED_MESSAGE, "unknown Cost tag 2")
    mapped = req.older_daemon(malformed, conversation)
    assert mapped.code == ErrorCode.UNSUPPORTED
    assert "revision 4" in mapped.message
    # Only for a conversation, and only for that error.
    chat = req.message_cost(TEXT_ONLY, 10)
    assert isinstance(chat, p.ChatRequest)
    assert req.older_daemon(malformed, chat) is malformed
    denied = p.Denied(1000, "input_tokens")
    assert req.older_daemon(denied, conversation) is denied
