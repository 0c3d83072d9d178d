"""An OpenAI-compatible fake provider on 127.0.0.1: POST /v1/chat/completions,
/v1/responses and /v1/embeddings (the endpoints are in `_fake_openai_endpoints.py`).

It limits the way OpenAI's rate-limit guide says the real one does: a token
bucket of tokens per minute and one of requests per minute, each holding one
minute's worth and refilling continuously; a request is charged at arrival
`rate_limit_charge(body)` tokens and one request, and nothing is ever
refunded (a Responses request the same by its `max_output_tokens` and text,
an embeddings one by its text alone). Over either limit it answers 429 with OpenAI's error body and
`retry-after` / `retry-after-ms`; every answer, 200 or 429, carries the
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers.

Options for measuring a limiter against it: a latency drawn uniformly from a
range, slept after the limit decision (the provider charges at arrival);
foreign traffic, another application on the same API key taking a fraction
of both limits; and a record of every request (arrival, charge, status,
what was left) for computing 429 counts and utilization afterwards.

Streams are server-sent events: chat chunks, with a final usage chunk when
`stream_options.include_usage` is set, or the Responses API's typed events,
the usage on the final `response.completed`.

Standalone (`python _fake_openai.py --tpm 300000 --rpm 3000 ...`) it prints
one JSON line with its `base_url`, serves until SIGTERM or SIGINT, and
answers `GET /fake/records` with its records, so a benchmark can run it as a
process of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from _fake_openai_endpoints import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_TOKENS,
    ENDPOINTS,
    max_output_tokens,
    prompt_tokens,
    rate_limit_charge,
    request_characters,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "RECORDS_PATH",
    "FakeProvider",
    "max_output_tokens",
    "prompt_tokens",
    "rate_limit_charge",
    "request_characters",
]

RECORDS_PATH = "/fake/records"


def duration(seconds: float) -> str:
    """OpenAI's reset format: `"20ms"`, `"1.5s"`, `"6m0s"`."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    seconds = round(seconds, 3)
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:g}s" if minutes else f"{rest:g}s"


class Bucket:
    """One provider limit: `per_minute` capacity, refilled continuously.

    Foreign traffic takes `foreign_fraction` of the rate all the time. Since
    it takes less than the refill, it never finds the bucket empty: what is
    left for us refills at `(1 - foreign_fraction) * rate`.
    """

    def __init__(self, per_minute: float, foreign_fraction: float = 0.0) -> None:
        self.capacity = per_minute
        self.rate = per_minute / 60.0 * (1.0 - foreign_fraction)
        self.level = per_minute
        self.stamp = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, cost: float) -> float:
        return max(0.0, (cost - self.level) / self.rate)


class FakeProvider:
    """The server, its buckets and records; `forced` answers go out before any limiting."""

    def __init__(
        self,
        tokens_per_minute: float = 1e9,
        requests_per_minute: float = 1e9,
        completion_tokens: int = 20,
        *,
        chars_per_token: float = CHARS_PER_TOKEN,
        latency: Optional[tuple[float, float]] = None,
        foreign_fraction: float = 0.0,
        seed: Optional[int] = None,
        port: int = 0,
    ) -> None:
        if not 0.0 <= foreign_fraction < 1.0:
            raise ValueError(f"foreign_fraction must be in [0, 1), got {foreign_fraction}")
        self.tokens = Bucket(tokens_per_minute, foreign_fraction)
        self.requests = Bucket(requests_per_minute, foreign_fraction)
        self.completion_tokens = completion_tokens
        self.chars_per_token = chars_per_token
        self.latency = latency
        self.foreign_fraction = foreign_fraction
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.bodies: list[dict] = []
        #: One dict per request, in arrival order: `arrival` (time.monotonic()
        #: when the limit was decided), `charge`, `status`, and the levels
        #: `tokens_left` / `requests_left` after the decision.
        self.records: list[dict] = []
        self.served = 0
        self.rate_limited = 0
        self.forced: list[tuple[int, dict]] = []
        self.last_usage: Optional[dict] = None
        self.last_headers: dict = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler(), False)
        # The openai SDK keeps a connection per thread: room for every worker's.
        self.server.request_queue_size = 128
        self.server.daemon_threads = True
        self.server.server_bind()
        self.server.server_activate()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def force(self, status: int, count: int = 1, **headers: str) -> None:
        """The next `count` requests get `status` with exactly these headers (no
        `x-ratelimit-*` of the buckets'), whatever the buckets hold; they are
        not charged."""
        headers = {name.replace("_", "-"): value for name, value in headers.items()}
        with self.lock:
            self.forced.extend([(status, headers)] * count)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _limit_headers(self) -> dict:
        headers = {}
        for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            headers[f"x-ratelimit-limit-{kind}"] = str(int(bucket.capacity))
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(bucket.level)))
            headers[f"x-ratelimit-reset-{kind}"] = duration(bucket.wait_for(bucket.capacity))
        return headers

    def _decide(self, endpoint: Any, body: dict) -> tuple[int, dict, dict, Optional[dict]]:
        """(status, headers, usage, error) for one request, charging the buckets."""
        charge = endpoint.charge(body, self.chars_per_token)
        usage = endpoint.usage(body, self.completion_tokens)
        with self.lock:
            now = time.monotonic()
            self.bodies.append(body)
            self.tokens.refill(now)
            self.requests.refill(now)
            error = None
            if self.forced:
                status, headers = self.forced.pop(0)
                if status != 200:
                    error = _error(status, "fake provider: forced", "tokens")
            else:
                waits = {
                    "requests": self.requests.wait_for(1),
                    "tokens": self.tokens.wait_for(charge),
                }
                if max(waits.values()) == 0:
                    status = 200
                    self.tokens.level -= charge
                    self.requests.level -= 1
                else:
                    status = 429
                    kind = max(waits, key=waits.__getitem__)
                    error = self._rate_limit_error(kind, charge, waits[kind])
                headers = self._limit_headers()
                if status == 429:
                    wait = max(waits.values())
                    headers["retry-after"] = str(math.ceil(wait))
                    headers["retry-after-ms"] = str(math.ceil(wait * 1000))
                self.last_headers = headers
            if status == 200:
                self.served += 1
                self.last_usage = usage
            elif status == 429:
                self.rate_limited += 1
            self.records.append(
                {
                    "arrival": now,
                    "path": endpoint.path,
                    "charge": charge,
                    "status": status,
                    "tokens_left": self.tokens.level,
                    "requests_left": self.requests.level,
                }
            )
            delay = self.random.uniform(*self.latency) if self.latency else 0.0
        if delay:
            time.sleep(delay)
        return status, headers, usage, error

    def _rate_limit_error(self, kind: str, charge: int, wait: float) -> dict:
        bucket = self.requests if kind == "requests" else self.tokens
        short = "RPM" if kind == "requests" else "TPM"
        requested = 1 if kind == "requests" else charge
        used = bucket.capacity - max(0.0, bucket.level)
        message = (
            f"Rate limit reached for fake-model in organization org-fake on {kind} per min "
            f"({short}): Limit {int(bucket.capacity)}, Used {round(used)}, "
            f"Requested {requested}. Please try again in {duration(wait)}. "
            "Visit https://platform.openai.com/account/rate-limits to learn more."
        )
        return _error(429, message, kind)

    def records_snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.records)

    def _handler(self) -> type:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle's
            # algorithm holds the body until the client's delayed ACK.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path != RECORDS_PATH:
                    return self._json(404, {}, _error(404, "not found", "invalid_request_error"))
                return self._json(200, {}, {"records": provider.records_snapshot()})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                endpoint = ENDPOINTS.get(self.path.rstrip("/"))
                if endpoint is None:
                    return self._json(404, {}, _error(404, "not found", "invalid_request_error"))
                status, headers, usage, error = provider._decide(endpoint, body)
                if error is not None:
                    return self._json(status, headers, error)
                if body.get("stream"):
                    return self._stream(headers, endpoint.events(body, usage))
                return self._json(200, headers, endpoint.reply(body, usage))

            def _json(self, status: int, headers: dict, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, headers: dict, frames: list[str]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for frame in frames:
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def _error(status: int, message: str, kind: str) -> dict:
    """OpenAI's error body; a 429 names the limit (`requests` or `tokens`) as its type."""
    if status == 429:
        code = "rate_limit_exceeded"
    elif status >= 500:
        kind, code = "server_error", None
    else:
        kind, code = "invalid_request_error", None
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="on 127.0.0.1; 0 picks a free one")
    parser.add_argument("--tpm", type=float, required=True, help="tokens per minute")
    parser.add_argument("--rpm", type=float, required=True, help="requests per minute")
    parser.add_argument(
        "--latency-ms",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="sleep a uniform random latency in [MIN, MAX] ms after deciding",
    )
    parser.add_argument(
        "--foreign", type=float, default=0.0, help="fraction of both limits used by others"
    )
    parser.add_argument("--chars-per-token", type=float, default=CHARS_PER_TOKEN)
    parser.add_argument("--completion-tokens", type=int, default=20)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    latency = None
    if args.latency_ms:
        latency = (args.latency_ms[0] / 1000.0, args.latency_ms[1] / 1000.0)
    provider = FakeProvider(
        args.tpm,
        args.rpm,
        args.completion_tokens,
        chars_per_token=args.chars_per_token,
        latency=latency,
        foreign_fraction=args.foreign,
        seed=args.seed,
        port=args.port,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(json.dumps({"base_url": provider.base_url}), flush=True)
    stop.wait()
    provider.close()


if __name__ == "__main__":
    main()
