"""A lease and its settlement, written once like the client (see `client.py`):
`scripts/unasync.py` generates the blocking `_sync/lease.py` from this file.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from .. import _proto as p
from .._core import requests as req
from .._core.deadlines import SETTLE_RETRY_DELAYS, Deadline, settle_retry_pause
from .._core.errors import ConnectionLost
from .._core.failed_call import failed_call
from .._core.requests import Reservation, cache_counts, report_counts
from .._core.results import expect
from .._proto.errors import ErrorCode, RatekeeperError
from .transport import Connection, sleep

if TYPE_CHECKING:
    from .client import AsyncClient

log = logging.getLogger("ratekeeper")


class AsyncLease:
    """A reservation granted by the daemon. Settle it once: `report` or `release`
    (or `settle_as_reserved`, `settle_as_rejected`, `settle_failed`).

    A lease is settled on the connection that acquired it. If that connection
    is gone (the sidecar restarted), the daemon has already forgotten the lease
    and kept its reservation; settling it then does nothing and returns None.
    """

    def __init__(
        self,
        client: AsyncClient,
        conn: Optional[Connection],
        limit: str,
        granted: Optional[p.Granted],
        request: req.AcquireRequest,
    ) -> None:
        self._client = client
        self._conn = conn
        self._request = request
        #: The limit the tokens were reserved in.
        self.limit = limit
        if granted is None:
            #: The daemon's lease id; None for an unlimited lease (sidecar unavailable, "allow").
            self.lease_id: Optional[int] = None
            reserved = request.reservation(0)
            #: Tokens reserved (input + output).
            self.tokens: int = reserved.input_tokens + reserved.output_tokens
            #: Seconds the daemon held the grant back until the reservation was due.
            self.waited = 0.0
        else:
            self.lease_id = granted.lease
            self.tokens = granted.tokens
            self.waited = granted.waited_ms / 1000.0
        self._granted_at = time.monotonic()
        #: Whether the lease was reported, released, or lost with its connection.
        self.settled = granted is None
        #: The daemon's answer to the settlement: tokens given back (negative: debited).
        self.tokens_returned: Optional[int] = None

    @property
    def reserved(self) -> Reservation:
        """What was reserved on each side, used to settle a lease as fully used."""
        return self._request.reservation(0 if self.lease_id is None else self.tokens)

    @property
    def unlimited(self) -> bool:
        """True for the no-op lease handed out while the sidecar is unavailable ("allow")."""
        return self.lease_id is None

    async def report(
        self,
        used: Optional[int] = None,
        *,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> Optional[int]:
        """Settles the lease with the provider's usage: `report(total)` or by side.

        `cached_input_tokens` (input read from the provider's prompt cache) and
        `cache_write_tokens` (input written to it) let spend budgets price the
        call by kind of token; given, `input_tokens` (or `used`) counts only
        the input billed at the full price, the three never overlapping
        (OpenAI: `prompt_tokens - cached_tokens`; Anthropic: `input_tokens`).
        The daemon works out what the rate limit counts. A report with cache
        figures goes as a `UsageReport` (protocol revision 6); a daemon that
        predates it gets a `Report` whose input is all three input figures
        added up (remembered for the connection): conservative, since it
        counts cache reads even where the provider's limit does not.

        Returns the tokens given back (negative when the usage exceeded the
        reservation and the overrun was debited), or None when nothing was sent.
        """
        counts = report_counts(used, input_tokens, output_tokens)
        cached, written = cache_counts(cached_input_tokens, cache_write_tokens)
        lease = self.lease_id or 0
        settlement = req.Settlement(lease, counts[0], counts[1], False, cached, written)
        return await self._settle(settlement, p.Settled)

    async def release(self) -> Optional[int]:
        """Gives the whole reservation back: the provider was never called."""
        return await self._settle(req.Settlement(self.lease_id or 0, 0, 0, True), p.Released)

    async def settle_as_reserved(self) -> Optional[int]:
        """Reports exactly what was reserved: keeps the reservation, closes the lease."""
        reserved = self.reserved
        return await self.report(
            input_tokens=reserved.input_tokens,
            output_tokens=reserved.output_tokens,
        )

    async def settle_as_rejected(self) -> Optional[int]:
        """Settles a call the provider refused but counts (a 429): the request
        and its input stay spent, the reserved output goes back.

        Providers count what their rate limiters refuse (OpenAI: "unsuccessful
        requests contribute to your per-minute limit"), so `release` would
        hand the fleet room the provider no longer has, and every retry would
        find it: a retry storm. Retry with a new acquire, which waits in the
        shared bucket. The output was never generated: a limit that refunds
        (`settle = "refund"`) gets it back; one that keeps its charge (`none`,
        the `openai` preset) keeps all of it, as OpenAI does. Returns what
        `report` returns.
        """
        return await self.report(input_tokens=self.reserved.input_tokens, output_tokens=0)

    async def settle_failed(self, error: BaseException, *, called: bool = True) -> Optional[int]:
        """Settles the lease after its provider call raised `error`, as the wrappers do.

        A 429 is `settle_as_rejected`; a 529 (overloaded) or another 4xx is
        `release` (refused, never processed); any other status keeps the
        reservation (`settle_as_reserved`: it may have been processed), and so
        does an error without a status, unless `called` is false (the call
        may not have been made), which releases it. Returns what the
        settlement returns.
        """
        outcome = failed_call(error, called)
        if outcome == "rejected":
            return await self.settle_as_rejected()
        if outcome == "release":
            return await self.release()
        return await self.settle_as_reserved()

    async def feedback(self, status: int, headers: Any = None) -> Optional[p.Noted]:
        """Forwards what the provider answered the call this lease was for.

        `status` is the HTTP status, `headers` the answer's headers (a mapping
        or (name, value) pairs; only the rate-limit ones are sent). A 429
        pauses the limit for every worker until its `retry-after`; the
        `remaining` headers lower the shared buckets to the provider's count.
        Call it after settling the lease. None for an unlimited lease.
        """
        if self.unlimited:
            return None
        since_grant = time.monotonic() - self._granted_at
        return await self._client.feedback(
            self.limit, status, headers, since_grant=since_grant, lease=self.lease_id
        )

    async def _settle(self, request: req.Settlement, kind: type) -> Optional[int]:
        """Sends `request` on the lease's connection until it is settled.

        A `StoreUnavailable` answer means the daemon could not apply the
        settlement and kept the lease: the same request is sent again after
        each pause of `SETTLE_RETRY_DELAYS`, within `timeout`, and the
        last answer is raised if none settled it. A `UsageReport` that the
        daemon does not know (PROTOCOL.md §10) is sent again as a `Report`,
        and so is every later one on that connection.
        """
        if self.unlimited:
            self.settled = True
            return None
        conn = self._conn
        if request.usage_report and conn is not None and not conn.usage_reports:
            request = request.as_report()
        deadline = Deadline(self._client.timeout)
        pauses = iter(SETTLE_RETRY_DELAYS)
        while True:
            try:
                if conn is None or not conn.alive:
                    raise ConnectionLost("gone")
                response = await self._client._request_on(conn, request, deadline)
            except ConnectionLost:
                self.settled = True
                log.info("lease %s was lost with its connection; the daemon kept it", self.lease_id)
                return None
            if request.usage_report and req.unsupported(response):
                log.info("the sidecar predates usage reports; reporting lease %s", self.lease_id)
                conn.usage_reports = False
                request = request.as_report()
                continue
            try:
                answer = expect(response, kind)
                break
            except RatekeeperError as error:
                if error.code == ErrorCode.UNKNOWN_LEASE:
                    self.settled = True
                pause = settle_retry_pause(error, pauses, deadline)
                if pause is None:
                    raise
                log.info("lease %s is not settled yet, retrying: %s", self.lease_id, error)
            await sleep(pause)
        self.settled = True
        self.tokens_returned = answer.tokens_returned
        return answer.tokens_returned

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Settles an unsettled lease: as fully used if the body ended normally;
        if it raised, by what the error says of the provider's answer
        (`settle_failed(exc, called=False)`): a 429 as rejected, 5xx kept,
        anything else (another 4xx, an error of the body's own) released."""
        if self.settled:
            return
        if exc is None:
            await self.settle_as_reserved()
            return
        try:
            await self.settle_failed(exc, called=False)
        except RatekeeperError as error:
            log.warning("could not settle lease %s: %s", self.lease_id, error)

    def __repr__(self) -> str:
        name = type(self).__name__
        if self.unlimited:
            return f"<{name} {self.limit!r} unlimited>"
        state = "settled" if self.settled else "open"
        return f"<{name} {self.limit!r} id={self.lease_id} tokens={self.tokens} {state}>"
