"""An OpenAI-compatible fake provider on 127.0.0.1: POST /v1/chat/completions,
/v1/responses and /v1/embeddings (the endpoints are in `_fake_openai_endpoints.py`).

It limits the way OpenAI's rate-limit guide says the real one does: a token
bucket of tokens per minute and one of requests per minute, refilling
continuously; a request is charged at arrival `rate_limit_charge(body)`
tokens and one request, and nothing is ever refunded (a Responses request
the same by its `max_output_tokens` and text, an embeddings one by its text
alone). Over either limit it answers 429 with OpenAI's error body and
`retry-after` / `retry-after-ms`; every answer, 200 or 429, carries the
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers.

The limits as the providers document them (`Bucket`, shared with the strict
Anthropic fake in `_fake_anthropic.py`):

- enforcement window (`window_seconds`, default 60): OpenAI writes that
  "60,000 requests/minute may be enforced as 1,000 requests/second". With a
  window of W seconds each bucket holds `per_minute * W / 60` (its
  capacity) and refills at `per_minute / 60` a second. A request is admitted
  while the level is at least min(charge, capacity), so one larger than a
  window's worth (a long prompt on a small limit) passes once the bucket is
  full and leaves it below zero; one larger than the per-minute figure
  itself is refused at once, OpenAI's "Request too large" 429, and not
  charged. The headers keep `limit` at the per-minute figure (what OpenAI
  shows), `remaining` is the window bucket's level, floored at 0, `reset`
  the time until it is full;
- rejected requests count (`count_rejected`, default on): OpenAI writes
  that "unsuccessful requests contribute to your per-minute limit", so a
  429 still charges its request. Whether it charges its tokens too the
  documentation does not say; `rejected_tokens=True` makes it so, which may
  take a level below zero. It is off by default because such a provider
  has no steady state once the demand on a key exceeds its limit: every
  refusal digs the level deeper and nobody gets through, whatever the
  limiter does (with 20 % foreign traffic and forwarding on, 90 % of the
  requests got 429s and the other application 0.6-0.8 % of the TPM in two
  runs; without forwarding, simulated with a perfect limiter, both got 0 %);
- foreign traffic (`foreign_fraction`): another application on the same API
  key, a real competitor inside the fake (`ForeignApplication`): a steady
  stream of small requests, each charging `tokens_per_minute /
  requests_per_minute` tokens and one request, arriving at
  `foreign_fraction` of the request rate, so that it asks for that fraction
  of both limits. Its requests are admitted only when the buckets hold them,
  counted when refused like ours, and retried as the SDKs do (after
  `retry-after`, twice at most). They are recorded with `"foreign": True`.

Options for measuring a limiter against it: a latency drawn uniformly from a
range, slept after the limit decision (the provider charges at arrival), and
a record of every request, ours and the foreign application's, for computing
429 counts, utilization and shares afterwards (`records`).

What a chat completion's answer uses: `completion_tokens` (at most its
`max_tokens`) and, of its prompt, `cached_tokens` read from the prompt cache;
or, drawn per answer from the seeded generator, `completion_share` (a range:
that share of its `max_tokens`, at least one) and `cached_share` (that share
of its prompt tokens, rounded down). With `prices` (micro-units of the
currency per million tokens: full-price input, cached input, output) it
bills every chat answer it gives as OpenAI would, the moment it produces
it: per tenant (the request's `user` field) and in total, with the call's
`x-e2e-call` header, so that a test can tell what each call cost
(`billing`). A budget's judge: nobody else's count decides what was spent.

Streams are server-sent events: chat chunks, with a final usage chunk when
`stream_options.include_usage` is set, or the Responses API's typed events,
the usage on the final `response.completed`.

Standalone (`python _fake_openai.py --tpm 300000 --rpm 3000 ...`) it prints
one JSON line with its `base_url`, serves until SIGTERM or SIGINT, and
answers `GET /fake/records` with its records and its buckets' figures, so a
benchmark can run it as a process of its own.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from _fake_openai_endpoints import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_TOKENS,
    ENDPOINTS,
    Chat,
    max_output_tokens,
    prompt_tokens,
    rate_limit_charge,
    request_characters,
)

__all__ = [
    "CALL_HEADER",
    "DEFAULT_MAX_TOKENS",
    "RECORDS_PATH",
    "Billing",
    "Bucket",
    "BucketedProvider",
    "FakeProvider",
    "Prices",
    "max_output_tokens",
    "prompt_tokens",
    "rate_limit_charge",
    "request_characters",
]

RECORDS_PATH = "/fake/records"
#: The request header a caller names its call by in the fake's bill.
CALL_HEADER = "x-e2e-call"
#: Micro-units in one unit of the currency, as spend budgets count money.
MICROS_PER_UNIT = 1_000_000
#: The SDKs' default `max_retries`: how often the foreign application retries a 429.
SDK_MAX_RETRIES = 2
#: The longest `retry-after` the SDKs honour; beyond it they back off by themselves.
SDK_LONGEST_RETRY_AFTER = 60.0
#: The foreign application sends at most this many requests a second (larger
#: ones then, and a smaller share of the request limit), so that a huge
#: request limit does not make the fake spin.
FOREIGN_MOST_PER_SECOND = 50.0


def duration(seconds: float) -> str:
    """OpenAI's reset format: `"20ms"`, `"1.5s"`, `"6m0s"`."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    seconds = round(seconds, 3)
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:g}s" if minutes else f"{rest:g}s"


class Bucket:
    """One provider limit: `per_minute`, enforced over `window_seconds`.

    It holds at most `capacity = per_minute * window_seconds / 60` and refills
    continuously at `per_minute / 60` a second. A cost is admitted while the
    level is at least min(cost, capacity): a cost larger than the window
    holds passes when the bucket is full and takes the level below zero (a
    provider that quantizes a minute's figure into seconds must let it pass,
    or it never could). A cost larger than `per_minute` is never admitted.
    """

    def __init__(self, per_minute: float, window_seconds: float = 60.0) -> None:
        if not 0.0 < window_seconds <= 60.0:
            raise ValueError(f"window_seconds must be in (0, 60], got {window_seconds}")
        self.per_minute = per_minute
        self.window_seconds = window_seconds
        self.capacity = per_minute * window_seconds / 60.0
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.stamp = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def too_large(self, cost: float) -> bool:
        return cost > self.per_minute

    def admits(self, cost: float) -> bool:
        return self.level >= min(cost, self.capacity)

    def wait_for(self, cost: float) -> float:
        """Seconds until `cost` would be admitted."""
        return max(0.0, (min(cost, self.capacity) - self.level) / self.rate)

    def time_to_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)

    def give_back(self, amount: float, now: float) -> None:
        """An estimate charged at arrival adjusted down (never above capacity)."""
        self.refill(now)
        self.level = min(self.capacity, self.level + amount)

    def figures(self) -> dict:
        return {
            "per_minute": self.per_minute,
            "window_seconds": self.window_seconds,
            "capacity": self.capacity,
        }


@dataclass(frozen=True)
class Decision:
    """The limit decision for one request, taken at its arrival."""

    status: int  # 200 or 429
    #: The bucket that refused it (the one with the longest wait), or None.
    refused_by: Optional[str] = None
    wait: float = 0.0  # seconds until every bucket would admit it
    too_large: bool = False  # over a per-minute figure: never admitted
    charged: bool = True  # whether its charges were taken


class BucketedProvider:
    """What the strict fakes share: the buckets and their decision, the foreign
    application, the records, the latency and the HTTP server.

    A subclass names its buckets, says what a request charges each, and
    renders the answers in its provider's shape.
    """

    #: The bucket whose charge a record's `charge` is.
    TOKEN_BUCKET = "tokens"

    def __init__(
        self,
        buckets: dict[str, Bucket],
        handler: type,
        *,
        latency: Optional[tuple[float, float]] = None,
        count_rejected: bool = True,
        rejected_tokens: bool = False,
        seed: Optional[int] = None,
        port: int = 0,
    ) -> None:
        self.buckets = buckets
        self.latency = latency
        self.count_rejected = count_rejected
        self.rejected_tokens = rejected_tokens
        self.random = random.Random(seed)
        self.seed = seed
        self.lock = threading.Lock()
        #: One dict per request, in arrival order, ours and the foreign
        #: application's: `arrival` (time.monotonic() when the limit was
        #: decided), `path`, `charge` (the token charge), `status`, `charged`
        #: (whether the buckets were charged: its request, and its tokens
        #: unless a refusal with `rejected_tokens` off), `foreign`, `refused_by` (the
        #: bucket that refused it, or None), and each bucket's level after the
        #: decision as `<bucket>_left`.
        self.records: list[dict] = []
        self.foreign: Optional[ForeignApplication] = None
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler, False)
        self.server.provider = self  # type: ignore[attr-defined]
        # The SDKs keep a connection per thread: room for every worker's.
        self.server.request_queue_size = 128
        self.server.daemon_threads = True
        self.server.server_bind()
        self.server.server_activate()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def capacities(self) -> dict[str, float]:
        """Each bucket's capacity: what its window holds."""
        return {name: bucket.capacity for name, bucket in self.buckets.items()}

    def start_foreign(
        self,
        fraction: float,
        per_request: Callable[[float], dict[str, float]],
        retry_after: Callable[[Decision], float],
    ) -> None:
        """Starts the foreign application taking `fraction` of the request rate.

        `per_request(interval)` is what each of its requests charges the
        buckets when one arrives every `interval` seconds; `retry_after` the
        wait the SDK reads from a 429's headers.
        """
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"foreign_fraction must be in [0, 1), got {fraction}")
        if fraction == 0.0:
            return
        per_second = min(FOREIGN_MOST_PER_SECOND, fraction * self.buckets["requests"].rate)
        interval = 1.0 / per_second
        self.foreign = ForeignApplication(
            self, per_request(interval), interval, retry_after, random.Random(self.seed)
        )
        self.foreign.start()

    def kept_when_rejected(self, charges: Mapping[str, float]) -> Mapping[str, float]:
        """What a refused request is charged when rejected requests count: all of
        it, or with `rejected_tokens=False` only the request."""
        if not self.rejected_tokens:
            return {"requests": charges["requests"]}
        return self.rejected_token_charges(charges)

    def rejected_token_charges(self, charges: Mapping[str, float]) -> Mapping[str, float]:
        """The charges a refused request keeps when its tokens count: all of them."""
        return charges

    def foreign_record(self, charges: dict[str, float]) -> dict:
        """What a foreign request's record says besides the levels: its token charge."""
        return {"charge": charges[self.TOKEN_BUCKET]}

    def close(self) -> None:
        if self.foreign is not None:
            self.foreign.stop()
        self.server.shutdown()
        self.server.server_close()

    def admit(
        self, charges: Mapping[str, float], *, path: str, foreign: bool, **record: Any
    ) -> Decision:
        """Decides one request at its arrival and records it; the caller holds `lock`."""
        now = time.monotonic()
        for bucket in self.buckets.values():
            bucket.refill(now)
        too_large = [name for name, cost in charges.items() if self.buckets[name].too_large(cost)]
        if too_large:
            decision = Decision(429, too_large[0], 0.0, too_large=True, charged=False)
        else:
            waits = {name: self.buckets[name].wait_for(cost) for name, cost in charges.items()}
            if not any(waits.values()):
                decision = Decision(200)
            else:
                refused_by = max(waits, key=waits.__getitem__)
                decision = Decision(429, refused_by, waits[refused_by], charged=self.count_rejected)
            kept = charges if decision.status == 200 else self.kept_when_rejected(charges)
            if decision.charged:
                for name, cost in kept.items():
                    self.buckets[name].level -= cost
        self._record(now, path, record, decision.status, decision.charged, foreign, decision)
        return decision

    def record_forced(self, status: int, path: str, **record: Any) -> None:
        """Records a forced answer (not charged); the caller holds `lock`."""
        now = time.monotonic()
        for bucket in self.buckets.values():
            bucket.refill(now)
        self._record(now, path, record, status, False, False, None)

    def _record(
        self,
        now: float,
        path: str,
        extra: dict,
        status: int,
        charged: bool,
        foreign: bool,
        decision: Optional[Decision],
    ) -> None:
        entry = {"arrival": now, "path": path, **extra, "status": status, "charged": charged}
        entry["foreign"] = foreign
        entry["refused_by"] = decision.refused_by if decision is not None else None
        for name, bucket in self.buckets.items():
            entry[f"{name}_left"] = bucket.level
        self.records.append(entry)

    def draw_latency(self) -> float:
        """A latency to sleep after deciding; the caller holds `lock`."""
        return self.random.uniform(*self.latency) if self.latency else 0.0

    def records_snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.records)

    def records_document(self) -> dict:
        """What `GET /fake/records` answers: the records and the buckets' figures."""
        with self.lock:
            records = list(self.records)
        buckets = {name: bucket.figures() for name, bucket in self.buckets.items()}
        return {
            "records": records,
            "buckets": buckets,
            "count_rejected": self.count_rejected,
            "rejected_tokens": self.rejected_tokens,
            **self.extra_document(),
        }

    def extra_document(self) -> dict:
        """What a subclass adds to `GET /fake/records`."""
        return {}


class ForeignApplication:
    """Another application on the same API key, competing for the same buckets.

    A steady stream: one request every `interval` seconds from its start,
    whatever happens to the earlier ones (its users do not wait for ours).
    A refused request is retried after the wait its SDK reads from the 429
    (`retry_after`), or with the SDK's own backoff when there is none or it is
    longer than a minute, at most `SDK_MAX_RETRIES` times; a request larger
    than a limit is not retried. It never sleeps a latency: the provider
    charges at arrival, and nobody waits for its answers.
    """

    def __init__(
        self,
        provider: BucketedProvider,
        charges: dict[str, float],
        interval: float,
        retry_after: Callable[[Decision], float],
        rng: random.Random,
    ) -> None:
        self.provider = provider
        self.charges = charges
        self.record = provider.foreign_record(charges)
        self.interval = interval
        self.retry_after = retry_after
        self.random = rng
        self.stopped = threading.Event()
        self.gave_up = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    def _backoff(self, attempt: int) -> float:
        """The SDKs' backoff: 0.5 s doubling, at most 8 s, less up to 25 % jitter."""
        return min(0.5 * 2.0**attempt, 8.0) * (1.0 - 0.25 * self.random.random())

    def _run(self) -> None:
        next_arrival = time.monotonic()
        retries: list[tuple[float, int]] = []  # (due, attempt), a heap
        while not self.stopped.is_set():
            due = min(next_arrival, retries[0][0]) if retries else next_arrival
            if self.stopped.wait(max(0.0, due - time.monotonic())):
                return
            if retries and retries[0][0] <= next_arrival:
                _, attempt = heapq.heappop(retries)
            else:
                attempt = 0
                next_arrival += self.interval
            with self.provider.lock:
                decision = self.provider.admit(
                    self.charges, path="foreign", foreign=True, **self.record
                )
            if decision.status == 200:
                continue
            if decision.too_large or attempt >= SDK_MAX_RETRIES:
                self.gave_up += 1
                continue
            wait = self.retry_after(decision)
            if not 0.0 < wait <= SDK_LONGEST_RETRY_AFTER:
                wait = self._backoff(attempt)
            heapq.heappush(retries, (time.monotonic() + wait, attempt + 1))


def micros(amount: str) -> int:
    """A decimal amount of the currency (`"0.40"`) in whole micro-units."""
    exact = Decimal(amount) * MICROS_PER_UNIT
    if exact != exact.to_integral_value():
        raise ValueError(f"{amount!r} has more than six decimals")
    return int(exact)


@dataclass(frozen=True)
class Prices:
    """A model's prices in micro-units per million tokens, as a limit's `price`
    gives them in dollars (`input`: full-price input)."""

    input: int
    cached_input: int
    output: int

    @classmethod
    def parse(cls, input: str, cached_input: str, output: str) -> Prices:
        """From dollars per million tokens, as the config writes them."""
        return cls(micros(input), micros(cached_input), micros(output))

    def cost(self, full_input: int, cached_input: int, output: int) -> int:
        """What a call costs in micro-units, rounded up as the daemon settles it."""
        billed = full_input * self.input + cached_input * self.cached_input + output * self.output
        return -(-billed // 1_000_000)


class Billing:
    """What the fake billed for the chat completions it answered: each call (its
    `x-e2e-call` header, tenant, cost and the moment it was produced), and the
    totals, per tenant and overall, in micro-units. Spend only ever grows, so
    the totals at the end are the largest the running totals ever were."""

    def __init__(self, prices: Prices) -> None:
        self.prices = prices
        self.calls: list[dict] = []
        self.total = 0
        self.tenants: dict[str, int] = {}

    def bill(self, usage: dict, tenant: Optional[str], call: Optional[str]) -> int:
        """Bills one answer's chat `usage`; the caller holds the provider's lock."""
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        full = usage["prompt_tokens"] - cached
        cost = self.prices.cost(full, cached, usage["completion_tokens"])
        self.total += cost
        if tenant is not None:
            self.tenants[tenant] = self.tenants.get(tenant, 0) + cost
        self.calls.append({"call": call, "tenant": tenant, "cost": cost, "at": time.monotonic()})
        return cost

    def document(self) -> dict:
        return {"calls": list(self.calls), "total": self.total, "tenants": dict(self.tenants)}


class FakeProvider(BucketedProvider):
    """The OpenAI-shaped server, its buckets and records; `forced` answers go out
    before any limiting."""

    def __init__(
        self,
        tokens_per_minute: float = 1e9,
        requests_per_minute: float = 1e9,
        completion_tokens: int = 20,
        *,
        cached_tokens: int = 0,
        completion_share: Optional[tuple[float, float]] = None,
        cached_share: Optional[tuple[float, float]] = None,
        prices: Optional[Prices] = None,
        chars_per_token: float = CHARS_PER_TOKEN,
        latency: Optional[tuple[float, float]] = None,
        foreign_fraction: float = 0.0,
        window_seconds: float = 60.0,
        count_rejected: bool = True,
        rejected_tokens: bool = False,
        seed: Optional[int] = None,
        port: int = 0,
    ) -> None:
        buckets = {
            "tokens": Bucket(tokens_per_minute, window_seconds),
            "requests": Bucket(requests_per_minute, window_seconds),
        }
        super().__init__(
            buckets,
            _OpenaiHandler,
            latency=latency,
            count_rejected=count_rejected,
            rejected_tokens=rejected_tokens,
            seed=seed,
            port=port,
        )
        self.completion_tokens = completion_tokens
        #: Of each prompt's tokens, how many the usage says were read from
        #: the prompt cache (at most the prompt; 0: no details in the usage).
        self.cached_tokens = cached_tokens
        #: Chat answers only: ranges each answer's completion (as a share of its
        #: `max_tokens`) and cached prompt (as a share of its prompt) are
        #: drawn from, in place of the two fixed figures above.
        self.completion_share = completion_share
        self.cached_share = cached_share
        self.sizes = random.Random(None if seed is None else seed + 1)
        #: With prices, what the chat answers cost (see the module's docs).
        self.billing = Billing(prices) if prices is not None else None
        self.chars_per_token = chars_per_token
        self.foreign_fraction = foreign_fraction
        self.bodies: list[dict] = []
        self.served = 0
        self.rate_limited = 0
        self.forced: list[tuple[int, dict]] = []
        self.last_usage: Optional[dict] = None
        self.last_headers: dict = {}
        self.start_foreign(foreign_fraction, self._foreign_charges, _openai_retry_after)

    @property
    def tokens(self) -> Bucket:
        return self.buckets["tokens"]

    @property
    def requests(self) -> Bucket:
        return self.buckets["requests"]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _foreign_charges(self, interval: float) -> dict[str, float]:
        # At its natural pace (`interval` = 1 / (fraction * request rate)) this
        # is tokens_per_minute / requests_per_minute tokens a request.
        return {"tokens": self.foreign_fraction * self.tokens.rate * interval, "requests": 1}

    def extra_document(self) -> dict:
        """The bill, when the fake has prices."""
        if self.billing is None:
            return {}
        with self.lock:
            return {"billing": self.billing.document()}

    def force(self, status: int, count: int = 1, **headers: str) -> None:
        """The next `count` requests get `status` with exactly these headers (no
        `x-ratelimit-*` of the buckets'), whatever the buckets hold; they are
        not charged."""
        headers = {name.replace("_", "-"): value for name, value in headers.items()}
        with self.lock:
            self.forced.extend([(status, headers)] * count)

    def _limit_headers(self) -> dict:
        headers = {}
        for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            headers[f"x-ratelimit-limit-{kind}"] = str(int(bucket.per_minute))
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(bucket.level)))
            headers[f"x-ratelimit-reset-{kind}"] = duration(bucket.time_to_full())
        return headers

    def _answer_sizes(self, endpoint: Any, body: dict) -> tuple[int, int]:
        """(completion tokens, cached prompt tokens) of one answer: the fixed
        figures, or for a chat answer with shares, drawn."""
        completion, cached = self.completion_tokens, self.cached_tokens
        if endpoint.path != Chat.path or not (self.completion_share or self.cached_share):
            return completion, cached
        with self.lock:
            completion_draw = self.sizes.uniform(*self.completion_share or (0.0, 0.0))
            cached_draw = self.sizes.uniform(*self.cached_share or (0.0, 0.0))
        if self.completion_share:
            completion = max(1, math.ceil(max_output_tokens(body) * completion_draw))
        if self.cached_share:
            prompt = prompt_tokens(body.get("messages") or [], body.get("tools"))
            cached = math.floor(prompt * cached_draw)
        return completion, cached

    def _decide(
        self, endpoint: Any, body: dict, headers_in: Optional[Mapping[str, str]] = None
    ) -> tuple[int, dict, dict, Optional[dict]]:
        """(status, headers, usage, error) for one request, charging the buckets
        (and, with prices, billing a chat answer once its latency has passed)."""
        charge = endpoint.charge(body, self.chars_per_token)
        usage = endpoint.usage(body, *self._answer_sizes(endpoint, body))
        with self.lock:
            self.bodies.append(body)
            error = None
            if self.forced:
                status, headers = self.forced.pop(0)
                if status != 200:
                    error = _error(status, "fake provider: forced", "tokens")
                self.record_forced(status, endpoint.path, charge=charge)
            else:
                decision = self.admit(
                    {"tokens": charge, "requests": 1},
                    path=endpoint.path,
                    foreign=False,
                    charge=charge,
                )
                status = decision.status
                headers = self._limit_headers()
                if decision.too_large:
                    error = self._too_large_error(charge)
                elif status == 429:
                    error = self._rate_limit_error(decision.refused_by, charge, decision.wait)
                    headers["retry-after"] = str(math.ceil(decision.wait))
                    headers["retry-after-ms"] = str(math.ceil(decision.wait * 1000))
                self.last_headers = headers
            if status == 200:
                self.served += 1
                self.last_usage = usage
            elif status == 429:
                self.rate_limited += 1
            delay = self.draw_latency()
        if delay:
            time.sleep(delay)
        if self.billing is not None and status == 200 and endpoint.path == Chat.path:
            call = (headers_in or {}).get(CALL_HEADER)
            with self.lock:
                self.billing.bill(usage, body.get("user"), call)
        return status, headers, usage, error

    def _rate_limit_error(self, kind: str, charge: int, wait: float) -> dict:
        bucket = self.buckets[kind]
        short = "RPM" if kind == "requests" else "TPM"
        requested = 1 if kind == "requests" else charge
        used = max(0.0, bucket.capacity - bucket.level)
        message = (
            f"Rate limit reached for fake-model in organization org-fake on {kind} per min "
            f"({short}): Limit {int(bucket.per_minute)}, Used {round(used)}, "
            f"Requested {requested}. Please try again in {duration(wait)}. "
            "Visit https://platform.openai.com/account/rate-limits to learn more."
        )
        return _error(429, message, kind)

    def _too_large_error(self, charge: int) -> dict:
        message = (
            "Request too large for fake-model in organization org-fake on tokens per min "
            f"(TPM): Limit {int(self.tokens.per_minute)}, Requested {charge}. "
            "The input or output tokens must be reduced in order to run successfully. "
            "Visit https://platform.openai.com/account/rate-limits to learn more."
        )
        return _error(429, message, "tokens")


def _openai_retry_after(decision: Decision) -> float:
    """The wait the openai SDK reads from the fake's 429: `retry-after-ms`."""
    return math.ceil(decision.wait * 1000) / 1000.0


class JsonHandler(BaseHTTPRequestHandler):
    """What every fake's handler shares: quiet, HTTP/1.1, JSON and SSE answers,
    and `GET /fake/records` for the strict ones."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle's
    # algorithm holds the body until the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def read_json(self) -> dict:
        length = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def send_json(self, status: int, headers: dict, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, headers: dict, frames: list[str]) -> None:
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

    def send_records(self) -> bool:
        """Answers `GET /fake/records`; False for any other path."""
        if self.path != RECORDS_PATH:
            return False
        self.send_json(200, {}, self.server.provider.records_document())  # type: ignore[attr-defined]
        return True


class _OpenaiHandler(JsonHandler):
    def do_GET(self) -> None:
        if not self.send_records():
            self.send_json(404, {}, _error(404, "not found", "invalid_request_error"))

    def do_POST(self) -> None:
        provider: FakeProvider = self.server.provider  # type: ignore[attr-defined]
        body = self.read_json()
        endpoint = ENDPOINTS.get(self.path.rstrip("/"))
        if endpoint is None:
            return self.send_json(404, {}, _error(404, "not found", "invalid_request_error"))
        status, headers, usage, error = provider._decide(endpoint, body, self.headers)
        if error is not None:
            return self.send_json(status, headers, error)
        if body.get("stream"):
            return self.send_events(headers, endpoint.events(body, usage))
        return self.send_json(200, headers, endpoint.reply(body, usage))


def _error(status: int, message: str, kind: str) -> dict:
    """OpenAI's error body; a 429 names the limit (`requests` or `tokens`) as its type."""
    if status == 429:
        code = "rate_limit_exceeded"
    elif status >= 500:
        kind, code = "server_error", None
    else:
        kind, code = "invalid_request_error", None
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """The standalone options both strict fakes take besides their limits."""
    parser.add_argument("--port", type=int, default=0, help="on 127.0.0.1; 0 picks a free one")
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=60.0,
        help="enforce each per-minute limit over this many seconds (default 60)",
    )
    parser.add_argument(
        "--count-rejected",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a 429 still charges its request (default on)",
    )
    parser.add_argument(
        "--rejected-tokens",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --count-rejected, a 429 charges its tokens too (default off)",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="sleep a uniform random latency in [MIN, MAX] ms after deciding",
    )
    parser.add_argument(
        "--foreign",
        type=float,
        default=0.0,
        help="fraction of the limits another application on the key asks for",
    )
    parser.add_argument("--completion-tokens", type=int, default=20)
    parser.add_argument("--seed", type=int)


def latency_option(args: argparse.Namespace) -> Optional[tuple[float, float]]:
    if not args.latency_ms:
        return None
    return (args.latency_ms[0] / 1000.0, args.latency_ms[1] / 1000.0)


def serve_until_signalled(provider: Any) -> None:
    """Prints the provider's `base_url` as one JSON line, serves until SIGTERM or SIGINT."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(json.dumps({"base_url": provider.base_url}), flush=True)
    stop.wait()
    provider.close()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tpm", type=float, required=True, help="tokens per minute")
    parser.add_argument("--rpm", type=float, required=True, help="requests per minute")
    parser.add_argument("--chars-per-token", type=float, default=CHARS_PER_TOKEN)
    parser.add_argument(
        "--cached-tokens",
        type=int,
        default=0,
        help="of each prompt, the tokens the usage says were read from the cache",
    )
    parser.add_argument(
        "--completion-share",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="each chat answer's completion: a share of its max_tokens drawn in [LOW, HIGH]",
    )
    parser.add_argument(
        "--cached-share",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="each chat answer's cached prompt tokens: a share of its prompt drawn in [LOW, HIGH]",
    )
    parser.add_argument(
        "--prices",
        nargs=3,
        metavar=("INPUT", "CACHED_INPUT", "OUTPUT"),
        help="bill chat answers at these dollars per million tokens (GET /fake/records: billing)",
    )
    add_limit_options(parser)
    args = parser.parse_args(argv)
    provider = FakeProvider(
        args.tpm,
        args.rpm,
        args.completion_tokens,
        cached_tokens=args.cached_tokens,
        completion_share=tuple(args.completion_share) if args.completion_share else None,
        cached_share=tuple(args.cached_share) if args.cached_share else None,
        prices=Prices.parse(*args.prices) if args.prices else None,
        chars_per_token=args.chars_per_token,
        latency=latency_option(args),
        foreign_fraction=args.foreign,
        window_seconds=args.window_seconds,
        count_rejected=args.count_rejected,
        rejected_tokens=args.rejected_tokens,
        seed=args.seed,
        port=args.port,
    )
    serve_until_signalled(provider)


if __name__ == "__main__":
    main()
