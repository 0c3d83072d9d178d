"""The client's policy, written once: acquiring, retrying, reconnecting, settling.

`AsyncClient` and `AsyncLease` (`lease.py`) decide what a call does: which
deadline bounds it, when a broken connection is retried and when the sidecar
counts as unavailable, how an acquire nobody waits for any more is cancelled
(and its late grant released), how a lease is settled. Waiting is left to the
connection and slot of the transport (`transport.py`).

The policy is written for asyncio, in this package; `scripts/unasync.py`
generates the blocking `_sync` package from it (all but the transport) by
deleting `async` and `await` and renaming through an explicit table, so both
clients follow the same rules line for line. Edit the module here, then run
`python scripts/unasync.py` in clients/python; a test fails while its twin
in `_sync` is stale.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import warnings
from collections.abc import AsyncIterator, Iterable
from typing import Any, Callable, Optional, TypeVar, Union, cast

from .. import _proto as p
from .._core import requests as req
from .._core import settings
from .._core.connecting import nobody_listening, reconnect_delays, sidecar_busy
from .._core.deadlines import Deadline
from .._core.decorator import Usage, check_decorated, usage_counts
from .._core.errors import (
    ConnectionLost,
    SidecarUnavailable,
    SidecarUnavailableWarning,
    describe,
    unavailable,
)
from .._core.requests import AnyRequest, MessageLike
from .._core.results import expect, granted_or_raise
from .._proto.errors import ErrorCode
from .lease import AsyncLease
from .transport import COROUTINES, Connection, Future, Slot, Timeout, sleep

log = logging.getLogger("ratekeeper")

#: A function `limit` decorates; the decorated one has the same signature.
F = TypeVar("F", bound=Callable[..., Any])


class AsyncClient:
    """A connection to the ratekeeper sidecar, pipelined and shared by every caller.

    The blocking client is shared by the threads of a process and is
    fork-safe; the asyncio client by the tasks of an event loop (another loop,
    or a forked child, opens a connection of its own).

    `socket` defaults to RATEKEEPER_SOCKET, else the daemon's own default
    (`$XDG_RUNTIME_DIR/ratekeeper.sock`, else `/run/ratekeeper/ratekeeper.sock`).
    `expected_uid` (default: RATEKEEPER_EXPECTED_UID, else no check) is the
    uid the daemon must run as: a socket served by another user's process
    (one that bound the path first) is refused before anything is sent, with
    `SidecarUnavailable`.
    `timeout` (seconds) bounds what a call spends beyond its own `max_wait`:
    connecting (retrying a sidecar that resets connections or whose accept
    queue is full), reconnecting after a connection broke, and waiting for an
    answer that is not held back. `connect_timeout` (seconds, default 0)
    is how long a call waits for a sidecar nobody listens for: a refused
    connect (a crashed daemon's socket file), or a missing socket file right
    after a connection of this client broke (a stopped daemon removes it).
    By default that fails at once, so a stopped sidecar costs a call well
    under a millisecond; set it (e.g. 5) to ride out restarts: calls then
    wait for the successor to bind. A socket file that does not exist on the
    first connect fails at once whatever `connect_timeout` is (no daemon was
    started there). A connection that broke is replaced at once either way,
    so a daemon that is back (or a successor already listening) is reached.

    `on_unavailable` says what `acquire` does when the sidecar cannot be
    reached: `"raise"` raises `SidecarUnavailable`; `"allow"` warns and
    returns an unlimited no-op lease, so the application keeps working
    without a shared limit. After one call gave up on an unreachable sidecar,
    later calls try to connect once and fail at once, until it answers again
    (with a `connect_timeout`, one call per outage waits for it, not each).
    """

    def __init__(
        self,
        socket: Optional[Union[str, os.PathLike]] = None,
        *,
        name: Optional[str] = None,
        timeout: float = settings.DEFAULT_TIMEOUT,
        connect_timeout: float = settings.DEFAULT_CONNECT_TIMEOUT,
        on_unavailable: settings.OnUnavailable = "raise",
        expected_uid: Optional[int] = None,
    ) -> None:
        self.socket_path = settings.socket_path(socket)
        self.expected_uid = settings.expected_uid(expected_uid)
        self.name = name
        self.timeout = settings.check_seconds("timeout", timeout)
        self.connect_timeout = settings.check_seconds("connect_timeout", connect_timeout)
        self.on_unavailable: settings.OnUnavailable = settings.check_on_unavailable(on_unavailable)
        self._slot = Slot(self.socket_path, self)
        #: Cleared when the daemon answers `LeaseFeedback` as unsupported
        #: (revision 4 or earlier): feedback then goes as plain `Feedback`.
        self._lease_feedback = True

    # -- connections --------------------------------------------------------

    async def _connect(self, deadline: Deadline) -> Connection:
        """A new connection, within `deadline`.

        Retried within `timeout` while the sidecar resets connections or its
        accept queue is full (it is there, busy); within `connect_timeout`
        while it refuses them, or while its socket file is missing right after
        a connection of ours broke (nobody listens: a successor may bind). A
        missing socket file otherwise, or any other error, gives up at once.
        """
        slot = self._slot
        busy_until = deadline.earlier(self.timeout)
        absent_until = deadline.earlier(self.connect_timeout)
        # Whether a daemon was seen at the path: only then may a missing
        # socket file be a successor about to bind it (or one replacing a
        # stale file) rather than a path where no daemon was ever started.
        was_there = slot.reconnecting
        name = self.name or settings.default_client_name()
        last: Optional[BaseException] = None
        for delay in reconnect_delays():
            try:
                conn = await Connection.open(self.socket_path, name, busy_until, self.expected_uid)
            except (OSError, ConnectionLost) as error:
                if sidecar_busy(error):
                    until = busy_until
                elif nobody_listening(error) and (
                    was_there or not isinstance(error, FileNotFoundError)
                ):
                    until = absent_until
                else:
                    last = error
                    break
                was_there = True
                if last is None and until.remaining() != 0:
                    log.debug("the sidecar at %s: %s; retrying", self.socket_path, error)
                last = error
            else:
                if slot.down:
                    log.warning("the ratekeeper sidecar at %s is reachable again", self.socket_path)
                slot.down = False
                return conn
            remaining = until.remaining()
            if slot.down or remaining == 0:
                break
            await sleep(delay if remaining is None else min(delay, remaining))
        if not slot.down:
            log.warning("the ratekeeper sidecar at %s is unavailable: %s", self.socket_path, last)
        slot.down = True
        raise unavailable(self.socket_path, last)

    async def _request_on(
        self,
        conn: Connection,
        request: AnyRequest,
        deadline: Optional[Deadline] = None,
    ) -> p.Response:
        """One request on a given connection (a lease's), without reconnecting;
        an acquire nobody waits for any more is abandoned.

        Bounded by `deadline`, else by `timeout` from now.
        """
        deadline = deadline or Deadline(self.timeout)
        abandon = self._abandon if type(request) is req.AcquireRequest else None
        try:
            return await conn.call(request, deadline, abandon)
        except Timeout:
            raise self._silent() from None

    def _silent(self) -> SidecarUnavailable:
        """What a call raises when the sidecar sent no answer by its deadline."""
        return SidecarUnavailable(
            f"no answer from the sidecar within {self.timeout}s of the deadline"
        )

    @staticmethod
    def _abandon(conn: Connection, request_id: int, future: Future) -> None:
        """Cancels an acquire nobody waits for any more; releases it if granted anyway."""
        conn.send_and_forget(p.Cancel(request_id))

        def release_late_grant(done: Future) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            if isinstance(done.result(), p.Granted):
                conn.send_and_forget(p.Release(done.result().lease))

        future.add_done_callback(release_late_grant)

    async def _call(self, request: p.Request) -> p.Response:
        """A request that may be resent on a new connection if the old one broke."""
        deadline = Deadline(self.timeout)
        while True:
            conn = await self._slot.get(deadline, self._connect)
            try:
                return await self._request_on(conn, request)
            except ConnectionLost:
                if deadline.expired:
                    raise

    # -- the API ------------------------------------------------------------

    async def acquire(
        self,
        limit: str,
        tokens: Optional[int] = None,
        *,
        messages: Optional[Iterable[MessageLike]] = None,
        max_tokens: Optional[int] = None,
        tools: Any = None,
        system: Any = None,
        api: Optional[req.Api] = None,
        tenant: Optional[str] = None,
        priority: Optional[str] = None,
        max_wait: Optional[float] = None,
    ) -> AsyncLease:
        """Reserves tokens in `limit`, waiting up to `max_wait` seconds for them.

        Give `tokens` (the prompt's tokens, or your whole estimate) and optionally
        `max_tokens` (output tokens to reserve on top), or the chat `messages`
        (and `tools`, and Anthropic's top-level `system`) for the daemon to
        count. `api` says whose shape they are (`"anthropic"`, `"openai"`);
        None tells it from `system` and the content blocks. `max_wait=None`
        uses the priority class's default wait; `0` means only if grantable
        now. Returns a granted `AsyncLease`; raises `RateLimited` (with
        `retry_after`) when the wait would be longer, and the mapped exception
        for any other answer.
        """
        request = req.build_acquire(
            limit, tokens, messages, max_tokens, tools, tenant, priority, max_wait, system, api
        )
        overall = Deadline(None if max_wait is None else max_wait + self.timeout)
        # Set when a connection first breaks: what reconnecting may take (the
        # connect itself waits for nobody listening only `connect_timeout`).
        retry_until: Optional[Deadline] = None
        reconnect = max(self.timeout, self.connect_timeout)
        attempt = request
        while True:
            conn = self._slot.ready()
            if conn is None:
                try:
                    deadline = retry_until or overall
                    conn = await self._slot.get(deadline, self._connect)
                except SidecarUnavailable as error:
                    return self._unavailable(limit, request, error)
            try:
                response = await conn.call(attempt, overall, self._abandon)
            except ConnectionLost as error:
                retry_until = retry_until or overall.earlier(reconnect)
                if retry_until.expired:
                    return self._unavailable(limit, request, error)
                attempt = req.with_remaining_wait(request, overall, self.timeout)
                continue
            except Timeout:  # alive but silent past the deadline
                return self._unavailable(limit, request, self._silent())
            if type(response) is p.Granted:
                return AsyncLease(self, conn, limit, response, request)
            if isinstance(response, p.ErrorReply) and response.code == ErrorCode.SHUTTING_DOWN:
                # This daemon is draining: ask its successor, within the deadline.
                conn.retired = True
                retry_until = retry_until or overall.earlier(reconnect)
                attempt = req.with_remaining_wait(request, overall, self.timeout)
                continue
            response = req.older_daemon(response, request.chat)
            granted = granted_or_raise(response, limit)
            return AsyncLease(self, conn, limit, granted, request)

    def _unavailable(
        self, limit: str, request: req.AcquireRequest, error: SidecarUnavailable
    ) -> AsyncLease:
        if self.on_unavailable == "raise":
            raise error
        warnings.warn(
            f"ratekeeper: proceeding without a rate limit on {limit!r}: {describe(error)}",
            SidecarUnavailableWarning,
            stacklevel=3,
        )
        return AsyncLease(self, None, limit, None, request)

    @contextlib.asynccontextmanager
    async def reserve(
        self,
        limit: str,
        tokens: Optional[int] = None,
        *,
        messages: Optional[Iterable[MessageLike]] = None,
        max_tokens: Optional[int] = None,
        tools: Any = None,
        system: Any = None,
        api: Optional[req.Api] = None,
        tenant: Optional[str] = None,
        priority: Optional[str] = None,
        max_wait: Optional[float] = None,
    ) -> AsyncIterator[AsyncLease]:
        """`acquire` as a context manager: `async with client.reserve(...) as lease:`.

        The arguments are `acquire`'s: `tokens` and/or `max_tokens`, or the
        chat `messages` (with `tools`, `system`, `api`) for the daemon to
        count; `tenant`, `priority` and `max_wait` as for `acquire`.
        If the body raises before the lease was settled, the error decides
        (`AsyncLease.settle_failed`): a provider's 429 (an SDK error with
        that `status_code`) is settled as rejected, keeping the request and
        its input, as the provider counts them; a 5xx keeps the reservation;
        anything else (another 4xx, an error of the body's own) releases it,
        the provider call being assumed not to have happened. If the body
        ends normally without a report, the reservation is kept and the
        lease is settled as fully used: tokens are never handed back on a guess.
        """
        lease = await self.acquire(
            limit,
            tokens,
            messages=messages,
            max_tokens=max_tokens,
            tools=tools,
            system=system,
            api=api,
            tenant=tenant,
            priority=priority,
            max_wait=max_wait,
        )
        async with lease:
            yield lease

    def limit(
        self,
        limit: str,
        tokens: Union[int, Callable[..., int], None] = None,
        *,
        messages: Optional[Callable[..., Iterable[MessageLike]]] = None,
        max_tokens: Optional[int] = None,
        usage: Optional[Callable[[Any], Usage]] = None,
        tenant: Optional[str] = None,
        priority: Optional[str] = None,
        max_wait: Optional[float] = None,
    ) -> Callable[[F], F]:
        """A decorator: every call of the function acquires first, then settles.

            @limiter.limit("gpt-4o-mini", tokens=1200, max_tokens=300)
            def summarize(text): ...

        `tokens` is a count, or a function of the call's arguments returning
        one; `messages` a function of the arguments returning the chat
        messages for the daemon to count. If the function raises, the lease
        is settled as `reserve` settles it (a provider's 429 as rejected, a
        5xx kept, anything else released); if it returns, the lease is reported with
        `usage(result)` (a total, `(input_tokens, output_tokens)`, or
        `(input_tokens, output_tokens, cached_input_tokens, cache_write_tokens)`
        with the input at full price apart, as `Lease.report` takes them), or
        settled as fully used without `usage` or when it returns None. A
        denial raises `RateLimited` before the function is called. The
        blocking `Client` decorates plain functions, `AsyncClient` coroutine
        functions.
        """
        if tokens is not None and not callable(tokens):
            req.token_count("tokens", tokens)
        if max_tokens is not None:
            req.token_count("max_tokens", max_tokens)

        def decorate(function: F) -> F:
            check_decorated(function, COROUTINES, type(self).__name__)

            @functools.wraps(function)
            async def limited(*args: Any, **kwargs: Any) -> Any:
                cost = tokens(*args, **kwargs) if callable(tokens) else tokens
                chat = None if messages is None else messages(*args, **kwargs)
                lease = await self.acquire(
                    limit,
                    cost,
                    messages=chat,
                    max_tokens=max_tokens,
                    tenant=tenant,
                    priority=priority,
                    max_wait=max_wait,
                )
                async with lease:
                    result = await function(*args, **kwargs)
                    try:
                        used = None if usage is None else usage(result)
                        counts = usage_counts(used)
                    except Exception:
                        await lease.settle_as_reserved()  # the call was made: keep its tokens
                        raise
                    if counts is not None:
                        await lease.report(
                            input_tokens=counts[0],
                            output_tokens=counts[1],
                            cached_input_tokens=counts[2],
                            cache_write_tokens=counts[3],
                        )
                return result

            return cast(F, limited)

        return decorate

    async def estimate(
        self,
        limit: str,
        tokens: Optional[int] = None,
        *,
        messages: Optional[Iterable[MessageLike]] = None,
        max_tokens: Optional[int] = None,
        tools: Any = None,
        system: Any = None,
        api: Optional[req.Api] = None,
    ) -> p.Estimated:
        """What an acquire with that cost would reserve, reserving nothing."""
        cost = req.build_cost(tokens, messages, max_tokens, tools, system, api)
        response = await self._call(p.Estimate(limit, cost))
        return expect(req.older_daemon(response, cost), p.Estimated)

    async def feedback(
        self,
        limit: str,
        status: int,
        headers: Any = None,
        *,
        since_grant: float = 0.0,
        lease: Optional[int] = None,
    ) -> p.Noted:
        """Forwards a provider's answer on `limit`: its status and rate-limit headers.

        `since_grant` is how many seconds before the answer the call was
        granted: what the daemon granted since then is subtracted from the
        provider's `remaining` counts (the provider had not seen it yet).
        `lease`, the id of the lease the call was made under, lets the daemon
        subtract exactly what it granted after that lease instead
        (`Lease.feedback` passes it). Returns the daemon's `Noted`: the pause
        applied and the buckets lowered.
        """
        request = req.build_feedback(limit, status, headers, since_grant)
        if lease is not None and self._lease_feedback:
            response = await self._call(p.LeaseFeedback(lease, request))
            if not req.unsupported(response):
                return expect(response, p.Noted)
            self._lease_feedback = False
        return expect(await self._call(request), p.Noted)

    async def status(self, limit: Optional[str] = None) -> p.StatusReply:
        """The store kind and the buckets of one limit, or of every limit."""
        return expect(await self._call(p.Status(limit)), p.StatusReply)

    async def budgets(self, limit: Optional[str] = None) -> list[p.BudgetStatus]:
        """The spend budgets `limit` draws from (every limit's for None), read from
        the store now; amounts in micro-units of money (a dollar is 1,000,000).

        Raises `UnknownLimit` for a limit not configured, `StoreUnavailable`
        while the store is down, and `Unsupported` from a sidecar older than
        protocol revision 6 (it has no budgets).
        """
        response = await self._call(p.Budgets(limit))
        answer = req.predating(response, 6, "show spend budgets")
        return list(expect(answer, p.BudgetsReply).budgets)

    async def ping(self) -> float:
        """Round trip to the daemon, in seconds (connecting first if needed)."""
        await self._slot.get(Deadline(self.timeout), self._connect)
        started = time.perf_counter()
        expect(await self._call(p.Ping()), p.Pong)
        return time.perf_counter() - started

    async def close(self) -> None:
        """Closes the connection. The client can still be used: it reconnects."""
        await self._slot.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        path, on_unavailable = self.socket_path, self.on_unavailable
        return f"<ratekeeper.AsyncClient {path!r} on_unavailable={on_unavailable!r}>"
