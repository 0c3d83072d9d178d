"""Answers turned into results: the response a request expects, or the
exception its error code maps to (a denial: `RateLimited`).
"""

from __future__ import annotations

from typing import Any

from .. import _proto as p
from .._proto.errors import ProtocolError
from .errors import denied


def expect(response: p.Response, kind: type) -> Any:
    """`response` if it is a `kind`; the mapped exception if it is an error."""
    if isinstance(response, kind):
        return response
    if isinstance(response, p.ErrorReply):
        raise response.exception()
    raise ProtocolError(f"expected {kind.__name__}, the daemon answered {type(response).__name__}")


def granted_or_raise(response: p.Response, limit: str) -> p.Granted:
    """The grant, or `RateLimited` for a denial (`BudgetExhausted` for a spend
    budget's), or the mapped error."""
    if isinstance(response, p.Denied):
        raise denied(response.retry_after_ms / 1000.0, response.bucket, limit)
    return expect(response, p.Granted)
