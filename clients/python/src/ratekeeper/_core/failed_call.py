"""What a provider call that failed leaves of its lease: the client's rule,
applied by `Lease.settle_failed` and by both SDK wrappers.
"""

from __future__ import annotations

import urllib.error
from typing import Any, Literal, Optional

#: How a lease settles after its provider call failed (see `failed_call`):
#: `settle_as_rejected`, `release` or `settle_as_reserved`.
FailedCall = Literal["rejected", "release", "keep"]


def _http_status(value: Any) -> bool:
    return type(value) is int and 100 <= value <= 599


def provider_status(error: BaseException) -> Optional[int]:
    """The HTTP status of the provider's answer that `error` reports, if any:
    `status_code` (the openai and anthropic SDKs' `APIStatusError`), else
    `response.status_code` (httpx's `HTTPStatusError`, requests' `HTTPError`),
    else the standard library's `urllib.error.HTTPError.code`."""
    status = getattr(error, "status_code", None)
    if not _http_status(status):
        status = getattr(getattr(error, "response", None), "status_code", None)
    if not _http_status(status) and isinstance(error, urllib.error.HTTPError):
        status = error.code
    return status if _http_status(status) else None


def failed_call(error: BaseException, called: bool) -> FailedCall:
    """What a provider call that raised `error` leaves of its lease (the
    wrappers' rule, and a `with lease:` block's).

    - `"rejected"`: a 429. The provider's rate limiter refused the request
      and still counts it (OpenAI: "unsuccessful requests contribute to your
      per-minute limit"); giving it back would let every retry find room the
      provider no longer has.
    - `"release"`: a 529 (Anthropic's "overloaded": the API short of capacity
      for all its users, not a decision of this organisation's rate limiter)
      or another 4xx: refused, never processed. A retry still backs off.
    - `"keep"`: another status (5xx): it may have been processed.
    - Without a status: `"keep"` when the call itself raised (`called`: a
      timeout or a broken connection may have been processed), `"release"`
      when it may not have been made (the body of a `with` block).
    """
    status = provider_status(error)
    if status == 429:
        return "rejected"
    if status is None:
        return "keep" if called else "release"
    if status == 529 or 400 <= status < 500:
        return "release"
    return "keep"
