"""An OpenAI-compatible fake provider: POST /v1/chat/completions on 127.0.0.1.

It limits like the real one: a token bucket of tokens per minute (a request
costs its prompt plus its `max_tokens`, nothing is refunded) and one of
requests per minute, both refilling continuously. Over the limit it answers
429 with `retry-after`, `retry-after-ms` and the `x-ratelimit-*` headers;
every answer carries the `x-ratelimit-*` headers. Streams are server-sent
events, with a final usage chunk when `stream_options.include_usage` is set.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional


def prompt_tokens(messages: list, tools: Any = None) -> int:
    """The fake's tokenizer: about four characters a token, four per message, three to prime."""
    total = 3
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        total += 4 + math.ceil(len(content) / 4)
    if tools:
        total += math.ceil(len(json.dumps(tools, separators=(",", ":"))) / 4)
    return total


def duration(seconds: float) -> str:
    """OpenAI's reset format: `"20ms"`, `"1.5s"`, `"6m0s"`."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


class Bucket:
    def __init__(self, per_minute: float) -> None:
        self.capacity = per_minute
        self.rate = per_minute / 60.0
        self.level = per_minute
        self.stamp = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, cost: float) -> float:
        return max(0.0, (cost - self.level) / self.rate)


class FakeProvider:
    """The server and its counters; `forced` answers go out before any limiting."""

    def __init__(
        self,
        tokens_per_minute: float = 1e9,
        requests_per_minute: float = 1e9,
        completion_tokens: int = 20,
    ) -> None:
        self.tokens = Bucket(tokens_per_minute)
        self.requests = Bucket(requests_per_minute)
        self.completion_tokens = completion_tokens
        self.lock = threading.Lock()
        self.bodies: list[dict] = []
        self.served = 0
        self.rate_limited = 0
        self.forced: list[tuple[int, dict]] = []
        self.last_usage: Optional[dict] = None
        self.last_headers: dict = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def force(self, status: int, count: int = 1, **headers: str) -> None:
        """The next `count` requests get `status` with these headers, whatever the buckets."""
        headers = {name.replace("_", "-"): value for name, value in headers.items()}
        with self.lock:
            self.forced.extend([(status, headers)] * count)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _decide(self, body: dict) -> tuple[int, dict, dict]:
        """(status, headers, usage) for one request, debiting the buckets."""
        prompt = prompt_tokens(body.get("messages") or [], body.get("tools"))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 4096
        completion = min(self.completion_tokens, max_tokens)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        with self.lock:
            self.bodies.append(body)
            if self.forced:
                status, headers = self.forced.pop(0)
                if status == 429:
                    self.rate_limited += 1
                return status, headers, usage
            now = time.monotonic()
            self.tokens.refill(now)
            self.requests.refill(now)
            cost = prompt + max_tokens
            wait = max(self.tokens.wait_for(cost), self.requests.wait_for(1))
            if wait == 0:
                self.tokens.level -= cost
                self.requests.level -= 1
                self.served += 1
                self.last_usage = usage
            else:
                self.rate_limited += 1
            headers = {}
            for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
                headers[f"x-ratelimit-limit-{kind}"] = str(int(bucket.capacity))
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(bucket.level)))
                headers[f"x-ratelimit-reset-{kind}"] = duration(bucket.wait_for(bucket.capacity))
            self.last_headers = headers
            if wait > 0:
                headers["retry-after"] = str(math.ceil(wait))
                headers["retry-after-ms"] = str(math.ceil(wait * 1000))
                return 429, headers, usage
            return 200, headers, usage

    def _handler(self) -> type:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._json(404, {}, {"error": {"message": "not found"}})
                status, headers, usage = provider._decide(body)
                if status != 200:
                    kind = "rate_limit_exceeded" if status == 429 else "invalid_request_error"
                    error = {"message": f"fake provider: {status}", "type": kind, "code": kind}
                    return self._json(status, headers, {"error": error})
                model = body.get("model", "fake")
                if body.get("stream"):
                    return self._stream(headers, body, model, usage)
                return self._json(
                    200,
                    headers,
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "fake reply"},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": usage,
                    },
                )

            def _json(self, status: int, headers: dict, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, headers: dict, body: dict, model: str, usage: dict) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                include_usage = (body.get("stream_options") or {}).get("include_usage")

                def event(choices: list, with_usage: Any = None) -> None:
                    chunk = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": model,
                        "choices": choices,
                    }
                    if include_usage:
                        chunk["usage"] = with_usage
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                for index, piece in enumerate(["fake", " streamed", " reply"]):
                    delta = {"content": piece}
                    if index == 0:
                        delta["role"] = "assistant"
                    event([{"index": 0, "delta": delta, "finish_reason": None}])
                event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
                if include_usage:
                    event([], usage)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler
