# Generated from src/ratekeeper/_openai_async.py by scripts/unasync.py: do not edit.
# Edit the source, then run `python scripts/unasync.py` in clients/python.
"""The OpenAI wrapper's rule for a limited call, written once: acquire, call, settle, retry.

`Gate.limited` acquires a call's cost from the limit and makes the call;
a failed call settles its lease by `Lease.settle_failed` (a 429 keeps
what the provider counts, the request and its input; another 4xx releases;
anything else keeps the reservation), and a 429 (a status in `retried`)
is then forwarded to the sidecar, waited out as the headers say and tried
again with an acquire of its own. `Gate.settle` reports the usage the
provider answered and forwards its rate-limit headers (every 429, a sample of
the other answers, every raw answer). `LimitedStream` settles a stream
when it ends; `StreamProxy` is what every wrapped stream shares (close,
context manager, pass-through). The endpoints built on them are in
`_openai_resources_sync.py`; the Anthropic wrapper's gate and streams are
subclasses (`_anthropic_async.py`).

Written for asyncio; `scripts/unasync.py` generates the blocking
`_openai_sync.py` from this file (see `_async.py`). Edit this one, then run
`python scripts/unasync.py` in clients/python; a test fails while the
generated file is stale.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from ._core import openai as calls
from ._core.calls import Cost, Counts, FeedbackSampler, error_headers, retry_delay
from ._core.estimate import FALLBACK_MAX_TOKENS
from ._core.failed_call import provider_status
from ._io_sync import sleep
from ._proto.errors import ErrorCode, RatekeeperError, Unsupported

if TYPE_CHECKING:
    from ._sync import Client, Lease

#: A stream proxy's own type, which `async with` gives back.
_Proxy = TypeVar("_Proxy", bound="StreamProxy")


class Gate:
    """What every limited call of one wrapped client goes through: the limit,
    the settings, and the sample of answers whose headers are forwarded.
    OpenAI's; another wrapper's gate is a subclass that acquires its own way
    (`acquire`) and names the statuses it retries."""

    #: The provider statuses a call is retried after, with a new acquire.
    retried: tuple[int, ...] = (429,)
    #: Where the retries are told.
    log: logging.Logger = calls.log

    def __init__(self, limiter: Client, settings: Any) -> None:
        self.limiter = limiter
        #: The wrapper's `LimitOptions`: `ratekeeper.openai`'s, or in a subclass
        #: another wrapper's.
        self.settings = settings
        self.sampler = FeedbackSampler(settings.feedback_interval)

    def acquire(self, cost: Cost) -> Lease:
        """A lease for `cost`: counted by the daemon, or by a rough client-side
        estimate while the daemon cannot count messages."""
        settings = self.settings
        limiter = self.limiter
        max_tokens = cost.max_tokens
        if max_tokens is None:
            max_tokens = settings.default_max_tokens
        common: dict[str, Any] = {
            "tenant": settings.tenant,
            "priority": settings.priority,
            "max_wait": settings.max_wait,
        }
        tokens = cost.tokens
        if tokens is not None:
            return limiter.acquire(settings.limit, tokens, max_tokens=max_tokens, **common)
        messages = cost.messages or []
        try:
            return limiter.acquire(
                settings.limit, messages=messages, max_tokens=max_tokens, tools=cost.tools, **common
            )
        except Unsupported:  # transitional: a daemon from before token counting
            prompt = settings.estimate(messages, cost.tools)
            output = FALLBACK_MAX_TOKENS if max_tokens is None else max_tokens
            return limiter.acquire(settings.limit, prompt, max_tokens=output, **common)

    def limited(self, cost: Cost, call: Callable[[], Any]) -> tuple[Any, Lease]:
        """Acquires `cost` and awaits `call()`, retrying a provider 429 (a status
        in `retried`) as the module says; (what the call answered, its unsettled lease)."""
        settings = self.settings
        attempt = 0
        while True:
            # Every attempt is an acquire of its own: the provider counts each.
            lease = self.acquire(cost)
            try:
                result = call()
            except BaseException as error:
                settle_failed(lease, error)
                status = provider_status(error)
                if status not in self.retried:
                    raise
                headers = error_headers(error)
                paused = self.forward(lease, status, headers)
                if attempt >= settings.max_retries:
                    raise
                # Paused in the sidecar: the next acquire waits exactly as long.
                # Either way it waits in the shared bucket, where a 429'd
                # attempt stays spent, so a retry never finds the room it had.
                delay = 0.0 if paused else retry_delay(headers, attempt, settings.max_retry_wait)
                self.log.info("provider answered %s; retrying in %.3fs", status, delay)
                sleep(delay)
                attempt += 1
                continue
            return result, lease

    def settle(self, lease: Lease, counts: Optional[Counts], headers: Any) -> None:
        """Reports `counts` (None: the reservation counts as spent) and forwards
        the answer's `headers` (None: not this one)."""
        report_counts(lease, counts)
        self.forward(lease, 200, headers)

    def forward(self, lease: Lease, status: int, headers: Any) -> bool:
        """Forwards an answer's rate-limit headers; True if the sidecar paused the limit."""
        return forward_feedback(self.sampler, lease, status, headers)


def forward_feedback(
    sampler: FeedbackSampler,
    lease: Lease,
    status: int,
    headers: Any,
) -> bool:
    """Forwards an answer's rate-limit headers through `lease` (every wrapper's rule);
    True if the sidecar paused the limit."""
    if headers is None or not sampler.enabled or lease.unlimited:
        return False
    try:
        noted = lease.feedback(status, headers)
    except RatekeeperError as error:
        if error.code == ErrorCode.UNSUPPORTED:  # a daemon from before feedback
            sampler.disable()
        calls.log.info("could not forward the provider's headers: %s", error)
        return False
    return noted is not None and noted.paused_ms > 0


def report_counts(lease: Lease, counts: Optional[tuple[int, int]]) -> None:
    """Settles with the provider's (input, output) usage; without one, the
    reservation counts as spent (every wrapper's rule)."""
    try:
        if counts is None:
            lease.settle_as_reserved()
        else:
            lease.report(input_tokens=counts[0], output_tokens=counts[1])
    except RatekeeperError as error:
        calls.log_settle_error(lease, error)


def settle_failed(lease: Lease, error: BaseException) -> None:
    """Settles the lease of a call that raised `error` (`Lease.settle_failed`:
    a 429 as rejected, another 4xx released, the rest kept); never raises."""
    try:
        lease.settle_failed(error)
    except RatekeeperError as failed:
        calls.log_settle_error(lease, failed)


class StreamProxy:
    """A provider stream seen through a wrapper, used as the stream itself: what
    the wrapper does not define passes through to it, and it is a context
    manager, as the stream is, whose leaving closes it. Every wrapper's streams
    build on it; a subclass that holds a lease settles it in `_finish`, which
    `close` calls once the stream is closed (the end of the stream, too)."""

    _stream: Any

    def _finish(self) -> None:
        """What closing does once the stream is closed: nothing here."""

    def close(self) -> None:
        """Closes the provider's stream, then `_finish`es (settles a lease)."""
        try:
            self._stream.close()
        finally:
            self._finish()

    def __enter__(self: _Proxy) -> _Proxy:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class LimitedStream(StreamProxy):
    """A provider stream that reports its usage to the lease when it ends.

    Iterate it to the end or close it (it is a context manager, like the
    stream it wraps); a stream abandoned half-way keeps its whole reservation.
    The usage chunk the wrapper asked for is hidden from a caller who did not.
    """

    def __init__(
        self,
        stream: Any,
        lease: Lease,
        api: calls.Api,
        hide_usage: bool,
        gate: Gate,
        headers: Any,
    ) -> None:
        self._stream = stream
        self._iterator = stream.__iter__()
        self._lease = lease
        self._api = api
        self._hide_usage = hide_usage
        self._usage: Any = None
        self._gate = gate
        self._headers = headers

    def __iter__(self) -> LimitedStream:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                event = self._iterator.__next__()
            except BaseException:  # the end of the stream, or a failure
                self.finish()
                raise
            usage = self._api.event_usage(event)
            if usage is not None:
                self._usage = usage
            if self._hide_usage and self._api.usage_only(event):
                continue  # the usage-only chunk the caller did not ask for
            return event

    def finish(self) -> None:
        """Settles the lease with the usage seen so far (none: as reserved)."""
        if not self._lease.settled:
            self._gate.settle(self._lease, self._api.counts(self._usage), self._headers)

    _finish = finish  # what `close` does once the stream is closed
