"""The responses of PROTOCOL.md §4, sans I/O: one frozen dataclass each.

Their wire layouts are written in `messages`, with every other message's;
this module holds the classes and what they offer their readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from .errors import RatekeeperError, error_for_code


@dataclass(frozen=True)
class HelloReply:
    """Response 0: the version in use and the bounds the daemon enforces."""

    protocol_version: int
    server: str
    max_frame_len: int
    max_in_flight: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Granted:
    """Response 1: the cost is reserved under `lease`; call the provider now."""

    lease: int
    tokens: int
    waited_ms: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Denied:
    """Response 2: not grantable within the wait; nothing reserved."""

    retry_after_ms: int
    bucket: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Settled:
    """Response 3: reserved - used went back (negative: an overrun was debited)."""

    tokens_returned: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Released:
    """Response 4: the whole reservation went back."""

    tokens_returned: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class CancelReply:
    """Response 5 (`Cancelled`): whether an unanswered acquire with that id existed."""

    found: bool
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class Estimated:
    """Response 6: what an acquire with that cost would reserve."""

    input_tokens: int
    output_tokens: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class BucketStatus:
    """One bucket of a limit: capacity, current level (negative while acquires wait), rate."""

    name: str
    capacity: int
    level: int
    per_minute: int
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class LimitStatus:
    """One limit: its buckets and how many acquires this daemon holds back for it."""

    name: str
    waiters: int
    buckets: tuple[BucketStatus, ...] = field(default_factory=tuple)
    WIRE: ClassVar[tuple] = ()

    def bucket(self, name: str) -> Optional[BucketStatus]:
        """The bucket called `name`, if the limit has one."""
        return next((b for b in self.buckets if b.name == name), None)


@dataclass(frozen=True)
class StatusReply:
    """Response 7 (`Status`): the store kind and the limits asked for."""

    store: str
    limits: tuple[LimitStatus, ...] = ()
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]

    def limit(self, name: str) -> Optional[LimitStatus]:
        """The status of the limit called `name`, if it was listed."""
        return next((lim for lim in self.limits if lim.name == name), None)


@dataclass(frozen=True)
class Pong:
    """Response 8: answer to `Ping`."""

    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class ErrorReply:
    """Response 9 (`Error`): a stable `code` and a message for humans."""

    code: int
    message: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]

    def exception(self) -> RatekeeperError:
        """The exception class mapped one to one from `code`."""
        return error_for_code(self.code, self.message)


@dataclass(frozen=True)
class HealthReply:
    """Response 10 (`Health`, struct `HealthStatus`): readiness, the store's state, and why."""

    ready: bool
    store: str
    store_up: bool
    store_down_ms: int
    policy: str
    reason: str
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class BucketInspection:
    """One bucket, inspected: `tenant` for a tenant bucket, `level` None when unknown."""

    name: str
    tenant: Optional[str]
    capacity: int
    per_minute: int
    level: Optional[int]
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class LimitInspection:
    """One limit, inspected: its buckets, then recently seen tenants' buckets."""

    name: str
    waiters: int
    buckets: tuple[BucketInspection, ...] = field(default_factory=tuple)
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class Noted:
    """Response 12 (`Feedback`): the pause applied and how many buckets were lowered."""

    paused_ms: int
    lowered: int
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]


@dataclass(frozen=True)
class InspectReply:
    """Response 11 (`Inspection`): the health fields, where levels come from, the limits."""

    health: HealthReply
    levels_from: str
    limits: tuple[LimitInspection, ...] = ()
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]

    def limit(self, name: str) -> Optional[LimitInspection]:
        """The inspection of the limit called `name`, if it was listed."""
        return next((lim for lim in self.limits if lim.name == name), None)


@dataclass(frozen=True)
class BudgetStatus:
    """One spend budget, read from the store: amounts in micro-units of money
    (a dollar is 1,000,000).

    `owner` is the limit whose budget it is, or the group when `group` is true;
    `tenant` a tenant's budget's tenant (None for the owner's own); `name` its
    bucket as a denial names it (`"budget_day"`, `"tenant_budget_month"`, ...);
    `period` the calendar period counted (`"2026-12-07"`, `"2026-W50"`,
    `"2026-12"`; `""` for a rolling budget). `remaining` is what acquires may
    still take, negative after overruns; `resets_at_ms` when the period ends
    (Unix ms; 0 for a rolling budget).
    """

    owner: str
    group: bool
    tenant: Optional[str]
    name: str
    period: str
    amount: int
    spent: int
    reserved: int
    remaining: int
    resets_at_ms: int
    WIRE: ClassVar[tuple] = ()


@dataclass(frozen=True)
class BudgetsReply:
    """Response 13 (`Budgets`, revision 6): the spend budgets asked for."""

    budgets: tuple[BudgetStatus, ...] = ()
    WIRE: ClassVar[tuple] = ()
    TAG: ClassVar[int]
