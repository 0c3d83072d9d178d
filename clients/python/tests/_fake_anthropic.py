"""An Anthropic-compatible fake provider: POST /v1/messages on 127.0.0.1.

It answers as the Messages API does: a `message` with `usage` (`input_tokens`,
`cache_creation_input_tokens`, `cache_read_input_tokens`, `output_tokens`:
the figures the test sets), or with `"stream": true` the server-sent events
`message_start` (input usage), `content_block_*`, `message_delta` (output
usage) and `message_stop`. Every answer carries `anthropic-ratelimit-*`
headers. `force` queues answers such as a 429 (`rate_limit_error`) or a 529
(`overloaded_error`) with their `retry-after`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ERROR_TYPES = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}


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
                message = {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "claude-fake"),
                    "content": [{"type": "text", "text": "fake reply"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": dict(provider.usage),
                }
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
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        return Handler
