"""The rule of a limited call, written once for every SDK wrapper: acquire,
call, settle, forward, retry.

`AsyncGate.limited` acquires a call's cost from the limit (the wrapper's
subclass says how: `acquire`) and makes the call; a failed call settles its
lease by `AsyncLease.settle_failed` (a 429 keeps what the provider counts, the
request and its input; another 4xx releases; anything else keeps the
reservation), and a status in `retried` is then forwarded to the sidecar,
waited out as the headers say and tried again with an acquire of its own.
`AsyncGate.settle` reports the usage the provider answered and forwards its
rate-limit headers (every 429, a sample of the other answers, every raw
answer). `AsyncStreamProxy` is what every wrapped stream shares (close,
context manager, pass-through). The wrappers' gates, endpoints and streams
are in `openai.py` and `anthropic.py`.

Written for asyncio; `scripts/unasync.py` generates `_sync/gate.py` from it
(see `client.py`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from .._core.calls import Cost, Counts, FeedbackSampler, error_headers, retry_delay
from .._core.failed_call import provider_status
from .._proto.errors import ErrorCode, RatekeeperError
from .transport import sleep

if TYPE_CHECKING:
    from .client import AsyncClient
    from .lease import AsyncLease

#: A stream proxy's own type, which `async with` gives back.
_Proxy = TypeVar("_Proxy", bound="AsyncStreamProxy")


class AsyncGate:
    """What every limited call of one wrapped client goes through: the limit,
    the settings, and the sample of answers whose headers are forwarded. Each
    wrapper's gate is a subclass that acquires its own way (`acquire`), names
    the statuses it retries and the logger that tells of them."""

    #: The provider statuses a call is retried after, with a new acquire.
    retried: tuple[int, ...] = (429,)
    #: Where the retries and the failures to settle or forward are told.
    log: logging.Logger = logging.getLogger("ratekeeper")

    def __init__(self, limiter: AsyncClient, settings: Any) -> None:
        self.limiter = limiter
        #: The wrapper's `LimitOptions` (`ratekeeper.openai`'s, `ratekeeper.anthropic`'s).
        self.settings = settings
        self.sampler = FeedbackSampler(settings.feedback_interval)

    async def acquire(self, cost: Cost) -> AsyncLease:
        """A lease for `cost`, acquired the wrapper's way."""
        raise NotImplementedError

    async def limited(self, cost: Cost, call: Callable[[], Any]) -> tuple[Any, AsyncLease]:
        """Acquires `cost` and awaits `call()`, retrying a provider 429 (a status
        in `retried`) as the module says; (what the call answered, its unsettled lease)."""
        settings = self.settings
        attempt = 0
        while True:
            # Every attempt is an acquire of its own: the provider counts each.
            lease = await self.acquire(cost)
            try:
                result = await call()
            except BaseException as error:
                await self.settle_failed(lease, error)
                status = provider_status(error)
                if status not in self.retried:
                    raise
                headers = error_headers(error)
                paused = await self.forward(lease, status, headers)
                if attempt >= settings.max_retries:
                    raise
                # Paused in the sidecar: the next acquire waits exactly as long.
                # Either way it waits in the shared bucket, where a 429'd
                # attempt stays spent, so a retry never finds the room it had.
                delay = 0.0 if paused else retry_delay(headers, attempt, settings.max_retry_wait)
                self.log.info("provider answered %s; retrying in %.3fs", status, delay)
                await sleep(delay)
                attempt += 1
                continue
            return result, lease

    async def settle(self, lease: AsyncLease, counts: Optional[Counts], headers: Any) -> None:
        """Reports `counts` (None: the reservation counts as spent) and forwards
        the answer's `headers` (None: not this one)."""
        await self.report(lease, counts)
        await self.forward(lease, 200, headers)

    async def forward(self, lease: AsyncLease, status: int, headers: Any) -> bool:
        """Forwards an answer's rate-limit headers through `lease`; True if the
        sidecar paused the limit."""
        sampler = self.sampler
        if headers is None or not sampler.enabled or lease.unlimited:
            return False
        try:
            noted = await lease.feedback(status, headers)
        except RatekeeperError as error:
            if error.code == ErrorCode.UNSUPPORTED:  # a daemon from before feedback
                sampler.disable()
            self.log.info("could not forward the provider's headers: %s", error)
            return False
        return noted is not None and noted.paused_ms > 0

    async def report(self, lease: AsyncLease, counts: Optional[Counts]) -> None:
        """Settles with the provider's usage, cache reads and writes apart;
        without one, the reservation counts as spent. Never raises."""
        try:
            if counts is None:
                await lease.settle_as_reserved()
            else:
                await lease.report(
                    input_tokens=counts.input_tokens,
                    output_tokens=counts.output_tokens,
                    cached_input_tokens=counts.cached_input_tokens,
                    cache_write_tokens=counts.cache_write_tokens,
                )
        except RatekeeperError as error:
            self.log.warning("could not settle lease %s: %s", lease.lease_id, error)

    async def settle_failed(self, lease: AsyncLease, error: BaseException) -> None:
        """Settles the lease of a call that raised `error` (`AsyncLease.settle_failed`:
        a 429 as rejected, another 4xx released, the rest kept). Never raises."""
        try:
            await lease.settle_failed(error)
        except RatekeeperError as failed:
            self.log.warning("could not settle lease %s: %s", lease.lease_id, failed)


class AsyncStreamProxy:
    """A provider stream seen through a wrapper, used as the stream itself: what
    the wrapper does not define passes through to it, and it is a context
    manager, as the stream is, whose leaving closes it. Every wrapper's streams
    build on it; a subclass that holds a lease settles it in `_finish`, which
    `close` calls once the stream is closed (the end of the stream, too)."""

    _stream: Any

    async def _finish(self) -> None:
        """What closing does once the stream is closed: nothing here."""

    async def close(self) -> None:
        """Closes the provider's stream, then `_finish`es (settles a lease)."""
        try:
            await self._stream.close()
        finally:
            await self._finish()

    async def __aenter__(self: _Proxy) -> _Proxy:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
