"""Client for the ratekeeper sidecar: one shared rate limit for every worker.

    from ratekeeper import Client

    limiter = Client()  # RATEKEEPER_SOCKET, else the daemon's default socket
    with limiter.reserve("gpt-4o", tokens=1200, max_tokens=800) as lease:
        response = call_the_provider()
        lease.report(response.usage.total_tokens)

`Client` is thread-safe and fork-safe; `AsyncClient` is its asyncio twin.
A denial raises `RateLimited` with `retry_after` in seconds (`BudgetExhausted`,
a subclass, when a spend budget refused); every protocol
error code has its own exception class (see `ERROR_CLASSES`).
`ratekeeper.openai.wrap` limits an OpenAI client's chat completions.
"""

from ._async.client import AsyncClient
from ._async.lease import AsyncLease
from ._core.errors import (
    BudgetExhausted,
    RateLimited,
    SidecarUnavailable,
    SidecarUnavailableWarning,
)
from ._core.estimate import estimate_prompt_tokens
from ._core.settings import DEFAULT_SOCKET, ENV_SOCKET
from ._proto import (
    BucketStatus,
    BudgetStatus,
    ChatMessage,
    Estimated,
    LimitStatus,
    StatusReply,
)
from ._proto.errors import (
    ERROR_CLASSES,
    Cancelled,
    CostExceedsCapacity,
    DuplicateRequestId,
    ErrorCode,
    FrameTooLarge,
    HelloRequired,
    InternalError,
    InvalidRequest,
    MalformedMessage,
    Overloaded,
    ProtocolError,
    RatekeeperError,
    ShuttingDown,
    StoreUnavailable,
    TooManyInFlight,
    UnknownErrorCode,
    UnknownLease,
    UnknownLimit,
    UnknownPriority,
    Unsupported,
    UnsupportedVersion,
)
from ._sync.client import Client
from ._sync.lease import Lease

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET",
    "ENV_SOCKET",
    "ERROR_CLASSES",
    "AsyncClient",
    "AsyncLease",
    "BucketStatus",
    "BudgetExhausted",
    "BudgetStatus",
    "Cancelled",
    "ChatMessage",
    "Client",
    "CostExceedsCapacity",
    "DuplicateRequestId",
    "ErrorCode",
    "Estimated",
    "FrameTooLarge",
    "HelloRequired",
    "InternalError",
    "InvalidRequest",
    "Lease",
    "LimitStatus",
    "MalformedMessage",
    "Overloaded",
    "ProtocolError",
    "RateLimited",
    "RatekeeperError",
    "ShuttingDown",
    "SidecarUnavailable",
    "SidecarUnavailableWarning",
    "StatusReply",
    "StoreUnavailable",
    "TooManyInFlight",
    "UnknownErrorCode",
    "UnknownLease",
    "UnknownLimit",
    "UnknownPriority",
    "Unsupported",
    "UnsupportedVersion",
    "estimate_prompt_tokens",
]
