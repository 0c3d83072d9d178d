"""Anthropic-compatible fake providers: POST /v1/messages on 127.0.0.1.

Both answer as the Messages API does: a `message` with `usage` (`input_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`, `output_tokens`),
or with `"stream": true` the server-sent events `message_start` (input
usage), `content_block_*`, `message_delta` (output usage) and
`message_stop`, and errors as `{"type": "error", "error": {"type": ..., "message": ...}}`.

`FakeAnthropic` is the unit tests' fixed-answer fake: the usage figures the
test sets, `anthropic-ratelimit-*` headers with fixed figures, and `force`
to queue answers such as a 429 (`rate_limit_error`) or a 529
(`overloaded_error`) with their `retry-after`.

`StrictAnthropic` limits the way Anthropic's rate-limit documentation says
the real one does, for the end-to-end runs: token buckets ("your capacity is
continuously replenished up to your maximum limit") of requests per minute
(RPM), input tokens per minute (ITPM) and output tokens per minute (OTPM),
with the buckets, the enforcement window ("60 RPM may be enforced as 1
request per second"), the counting of rejected requests, the foreign
application, the latency and the records of the OpenAI-shaped fake
(`_fake_openai.BucketedProvider`, whose docs define them). What it counts:

- input: `input_tokens(body)`, the request's characters (system, message
  texts, tools) at `chars_per_token` (3.5, the daemon's `anthropic` preset
  before its safety factor), charged to ITPM at arrival. Anthropic estimates
  ITPM at the start and adjusts it to the actual count, which counts
  `input_tokens` and `cache_creation_input_tokens` but not
  `cache_read_input_tokens` for current models; the fake knows its count at
  arrival and caches nothing, so its estimate is the count and it reports
  no cache tokens (unless a test asks it to report some:
  `--cache-read-tokens`, `--cache-write-tokens`, never charged);
- output: "OTPM rate limits are estimated based on max_tokens at the
  beginning of each request, and the estimate is adjusted at the end of the
  request to reflect the actual number of output tokens used": `max_tokens`
  is charged at arrival, and when the answer is ready (after the latency)
  the bucket gets back `max_tokens - output_tokens`. A refused request
  produced no output: with `count_rejected` it keeps its request and its
  input tokens (only the request with `rejected_tokens=False`), its output
  estimate is adjusted to zero at once (Anthropic does not document what a
  429 costs; this is OpenAI's rule, input side);
- a request over a per-minute figure (its input over ITPM, its `max_tokens`
  over OTPM) is refused at once with the 429 message Anthropic uses ("This
  request would exceed the rate limit for your organization ... Please
  reduce the prompt length or the maximum tokens requested"), without
  `retry-after`, and charged nothing.

Headers, taken at the decision: `anthropic-ratelimit-{requests,input-tokens,
output-tokens}-{limit,remaining,reset}` and `anthropic-ratelimit-tokens-*`
(input and output together, as Anthropic reports it when no workspace limit
applies): `limit` the per-minute figure, `remaining` the window bucket's
level floored at 0 (token counts rounded to the nearest thousand, as
documented, unless `round_remaining=False`), `reset` the moment the bucket
is full again as an RFC 3339 timestamp in whole seconds, rounded up. A 429
carries `retry-after` in whole seconds (rounded up) and the body
`{"type": "error", "error": {"type": "rate_limit_error", "message": ...}, "request_id": ...}`.

Standalone (`python _fake_anthropic.py --itpm 300000 --otpm 300000 --rpm 3000
...`) the strict fake prints one JSON line with its `base_url`, serves until
SIGTERM or SIGINT, and answers `GET /fake/records`, as `_fake_openai.py` does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from _fake_openai import (
    Bucket,
    BucketedProvider,
    Decision,
    JsonHandler,
    add_limit_options,
    latency_option,
    serve_until_signalled,
)

ERROR_TYPES = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}
#: The strict fake's characters per input token: the daemon's `anthropic`
#: preset estimate (3.5 bytes a token) without its safety factor.
ANTHROPIC_CHARS_PER_TOKEN = 3.5
#: Anthropic rounds the token counts of its `remaining` headers to this.
REMAINING_ROUNDING = 1000
#: The header names of the strict fake's buckets.
HEADER_NAMES = {
    "requests": "requests",
    "input_tokens": "input-tokens",
    "output_tokens": "output-tokens",
}
#: How a 429's message names each limit.
LIMIT_NAMES = {
    "requests": "requests",
    "input_tokens": "input tokens",
    "output_tokens": "output tokens",
}


def _text(content: Any) -> str:
    """The text of a content: a string, or its blocks' text, tool input and results."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            parts.append(block["text"])
        if block.get("type") == "tool_use":
            parts.append((block.get("name") or "") + json.dumps(block.get("input") or {}))
        if block.get("type") == "tool_result":
            parts.append(_text(block.get("content")))
    return "".join(parts)


def input_tokens(body: dict, chars_per_token: float = ANTHROPIC_CHARS_PER_TOKEN) -> int:
    """The input tokens the strict fake counts, charges and reports for a Messages
    request: its characters at `chars_per_token`, rounded up. The characters
    are the `system` prompt's, each message's text (text blocks, tool use as
    name and JSON input, tool results), and the compact JSON of `tools`."""
    chars = len(_text(body.get("system")))
    for message in body.get("messages") or []:
        chars += len(_text(message.get("content")))
    if body.get("tools"):
        chars += len(json.dumps(body["tools"], separators=(",", ":")))
    return math.ceil(chars / chars_per_token)


def message_reply(body: dict, usage: dict) -> dict:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude-fake"),
        "content": [{"type": "text", "text": "fake reply"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": dict(usage),
    }


def message_events(message: dict) -> list[str]:
    """The SSE frames of a streamed `message`."""
    usage = message["usage"]
    start_usage = dict(usage, output_tokens=1)
    start = dict(message, content=[], stop_reason=None, usage=start_usage)
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "fake reply"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]


class FakeAnthropic:
    """The server, what it received, and what it will answer."""

    def __init__(
        self,
        input_tokens: int = 100,
        cache_creation_input_tokens: int = 0,
        cache_read_input_tokens: int = 0,
        output_tokens: int = 20,
        remaining_tokens: int = 1_000_000,
    ) -> None:
        self.usage = {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": cache_creation_input_tokens,
            "cache_read_input_tokens": cache_read_input_tokens,
            "output_tokens": output_tokens,
        }
        self.remaining_tokens = remaining_tokens
        self.lock = threading.Lock()
        self.bodies: list[dict] = []
        self.answered: list[int] = []
        self.forced: list[tuple[int, dict]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def force(self, status: int, count: int = 1, **headers: str) -> None:
        """The next `count` requests get `status` with these headers."""
        headers = {name.replace("_", "-"): value for name, value in headers.items()}
        with self.lock:
            self.forced.extend([(status, headers)] * count)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _decide(self, body: dict) -> tuple[int, dict]:
        headers = {
            "anthropic-ratelimit-requests-limit": "1000",
            "anthropic-ratelimit-requests-remaining": "999",
            "anthropic-ratelimit-input-tokens-limit": "1000000",
            "anthropic-ratelimit-input-tokens-remaining": str(self.remaining_tokens),
            "request-id": "req_fake",
        }
        with self.lock:
            self.bodies.append(body)
            status, forced = self.forced.pop(0) if self.forced else (200, {})
            self.answered.append(status)
        headers.update(forced)
        return status, headers

    def _handler(self) -> type:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.split("?")[0].rstrip("/") != "/v1/messages":
                    error = {"type": "not_found_error", "message": "not found"}
                    return self._json(404, {}, {"type": "error", "error": error})
                status, headers = provider._decide(body)
                if status != 200:
                    kind = ERROR_TYPES.get(status, "api_error")
                    error = {"type": kind, "message": f"fake provider: {status}"}
                    return self._json(status, headers, {"type": "error", "error": error})
                message = message_reply(body, provider.usage)
                if body.get("stream"):
                    return self._stream(headers, message)
                return self._json(200, headers, message)

            def _json(self, status: int, headers: dict, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, headers: dict, message: dict) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for frame in message_events(message):
                    self.wfile.write(frame.encode())
                self.wfile.flush()
                self.close_connection = True

        return Handler


def _rfc3339_after(seconds: float) -> str:
    """The wall-clock moment `seconds` from now, in whole seconds rounded up."""
    moment = math.ceil(time.time() + seconds)
    when = datetime.datetime.fromtimestamp(moment, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _error_body(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}


class StrictAnthropic(BucketedProvider):
    """The Anthropic-shaped strict server: RPM, ITPM and OTPM buckets (see the module's docs)."""

    TOKEN_BUCKET = "input_tokens"

    def __init__(
        self,
        input_tokens_per_minute: float,
        output_tokens_per_minute: float,
        requests_per_minute: float,
        completion_tokens: int = 20,
        *,
        chars_per_token: float = ANTHROPIC_CHARS_PER_TOKEN,
        latency: Optional[tuple[float, float]] = None,
        foreign_fraction: float = 0.0,
        window_seconds: float = 60.0,
        count_rejected: bool = True,
        rejected_tokens: bool = False,
        round_remaining: bool = True,
        cache_read_input_tokens: int = 0,
        cache_creation_input_tokens: int = 0,
        seed: Optional[int] = None,
        port: int = 0,
    ) -> None:
        buckets = {
            "requests": Bucket(requests_per_minute, window_seconds),
            "input_tokens": Bucket(input_tokens_per_minute, window_seconds),
            "output_tokens": Bucket(output_tokens_per_minute, window_seconds),
        }
        super().__init__(
            buckets,
            _StrictHandler,
            latency=latency,
            count_rejected=count_rejected,
            rejected_tokens=rejected_tokens,
            seed=seed,
            port=port,
        )
        self.completion_tokens = completion_tokens
        self.chars_per_token = chars_per_token
        self.foreign_fraction = foreign_fraction
        self.round_remaining = round_remaining
        #: The cache figures each answer's usage reports, as a test asks: the
        #: prompt's own count is `input_tokens` whatever they are, and only
        #: it is charged (this fake caches nothing).
        self.cache_read_input_tokens = cache_read_input_tokens
        self.cache_creation_input_tokens = cache_creation_input_tokens
        self.bodies: list[dict] = []
        self.served = 0
        self.rate_limited = 0
        self.last_headers: dict = {}
        self.start_foreign(foreign_fraction, self._foreign_charges, _anthropic_retry_after)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _foreign_charges(self, interval: float) -> dict[str, float]:
        # Its answers use all of their (small) max_tokens: no adjustment.
        share = self.foreign_fraction * interval
        return {
            "requests": 1,
            "input_tokens": share * self.buckets["input_tokens"].rate,
            "output_tokens": share * self.buckets["output_tokens"].rate,
        }

    def foreign_record(self, charges: dict[str, float]) -> dict:
        return {"charge": charges["input_tokens"], "output_charge": charges["output_tokens"]}

    def rejected_token_charges(self, charges: Mapping[str, float]) -> Mapping[str, float]:
        # A refused request produced no output: its estimate is adjusted to 0 at once.
        return {name: cost for name, cost in charges.items() if name != "output_tokens"}

    def _remaining(self, name: str, level: float) -> str:
        level = max(0.0, level)
        if self.round_remaining and name != "requests":
            return str(math.floor(level / REMAINING_ROUNDING + 0.5) * REMAINING_ROUNDING)
        return str(int(level))

    def _limit_headers(self) -> dict:
        headers = {}
        for name, bucket in self.buckets.items():
            prefix = f"anthropic-ratelimit-{HEADER_NAMES[name]}"
            headers[f"{prefix}-limit"] = str(int(bucket.per_minute))
            headers[f"{prefix}-remaining"] = self._remaining(name, bucket.level)
            headers[f"{prefix}-reset"] = _rfc3339_after(bucket.time_to_full())
        tokens = [self.buckets["input_tokens"], self.buckets["output_tokens"]]
        headers["anthropic-ratelimit-tokens-limit"] = str(int(sum(b.per_minute for b in tokens)))
        both = sum(max(0.0, bucket.level) for bucket in tokens)
        headers["anthropic-ratelimit-tokens-remaining"] = self._remaining("tokens", both)
        latest = max(bucket.time_to_full() for bucket in tokens)
        headers["anthropic-ratelimit-tokens-reset"] = _rfc3339_after(latest)
        headers["request-id"] = "req_fake"
        return headers

    def _rate_limit_message(self, refused_by: str) -> str:
        figure = f"{int(self.buckets[refused_by].per_minute):,}"
        return (
            "This request would exceed the rate limit for your organization (org-fake) of "
            f"{figure} {LIMIT_NAMES[refused_by]} per minute. For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits. You can see the response headers for "
            "current usage. Please reduce the prompt length or the maximum tokens requested, "
            "or try again later."
        )

    def answer(self, body: dict) -> tuple[int, dict, dict]:
        """(status, headers, message or error body) for one request, charging the buckets
        at arrival and adjusting the output estimate when the answer is ready."""
        if not isinstance(body.get("max_tokens"), int):
            error = _error_body("invalid_request_error", "max_tokens: Field required")
            return 400, {"request-id": "req_fake"}, error
        estimate = body["max_tokens"]
        counted = input_tokens(body, self.chars_per_token)
        charges = {"requests": 1, "input_tokens": counted, "output_tokens": estimate}
        with self.lock:
            self.bodies.append(body)
            decision: Decision = self.admit(
                charges,
                path="/v1/messages",
                foreign=False,
                charge=counted,
                output_charge=estimate,
            )
            headers = self._limit_headers()
            self.last_headers = headers
            if decision.status == 200:
                self.served += 1
            else:
                self.rate_limited += 1
                if not decision.too_large:
                    headers["retry-after"] = str(max(1, math.ceil(decision.wait)))
            delay = self.draw_latency()
        if delay:
            time.sleep(delay)
        if decision.status != 200:
            message = self._rate_limit_message(decision.refused_by)
            return 429, headers, _error_body("rate_limit_error", message)
        output = min(self.completion_tokens, estimate)
        with self.lock:
            self.buckets["output_tokens"].give_back(estimate - output, time.monotonic())
        usage = {
            "input_tokens": counted,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": output,
        }
        return 200, headers, message_reply(body, usage)


def _anthropic_retry_after(decision: Decision) -> float:
    """The wait the anthropic SDK reads from the strict fake's 429: `retry-after`."""
    return float(max(1, math.ceil(decision.wait)))


class _StrictHandler(JsonHandler):
    def do_GET(self) -> None:
        if not self.send_records():
            self.send_json(404, {}, _error_body("not_found_error", "not found"))

    def do_POST(self) -> None:
        provider: StrictAnthropic = self.server.provider  # type: ignore[attr-defined]
        body = self.read_json()
        if self.path.split("?")[0].rstrip("/") != "/v1/messages":
            return self.send_json(404, {}, _error_body("not_found_error", "not found"))
        status, headers, payload = provider.answer(body)
        if status == 200 and body.get("stream"):
            return self.send_events(headers, message_events(payload))
        return self.send_json(status, headers, payload)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        description="The strict Anthropic-shaped fake provider (see _fake_anthropic.py)."
    )
    parser.add_argument("--itpm", type=float, required=True, help="input tokens per minute")
    parser.add_argument("--otpm", type=float, required=True, help="output tokens per minute")
    parser.add_argument("--rpm", type=float, required=True, help="requests per minute")
    parser.add_argument("--chars-per-token", type=float, default=ANTHROPIC_CHARS_PER_TOKEN)
    parser.add_argument(
        "--exact-remaining",
        action="store_true",
        help="do not round the token counts of the remaining headers to thousands",
    )
    parser.add_argument("--cache-read-tokens", type=int, default=0, help="reported in each usage")
    parser.add_argument("--cache-write-tokens", type=int, default=0, help="reported in each usage")
    add_limit_options(parser)
    args = parser.parse_args(argv)
    provider = StrictAnthropic(
        args.itpm,
        args.otpm,
        args.rpm,
        args.completion_tokens,
        chars_per_token=args.chars_per_token,
        latency=latency_option(args),
        foreign_fraction=args.foreign,
        window_seconds=args.window_seconds,
        count_rejected=args.count_rejected,
        rejected_tokens=args.rejected_tokens,
        round_remaining=not args.exact_remaining,
        cache_read_input_tokens=args.cache_read_tokens,
        cache_creation_input_tokens=args.cache_write_tokens,
        seed=args.seed,
        port=args.port,
    )
    serve_until_signalled(provider)


if __name__ == "__main__":
    main()
