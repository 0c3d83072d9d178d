"""What the `limit` decorator checks without waiting: which functions a client
can limit, and the usage a decorated function reports.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Union

from .requests import token_count

#: What a decorated function's `usage` returns: a total, `(input, output)`, or None (unknown).
Usage = Union[int, tuple[int, int], None]


def usage_counts(used: Usage) -> Optional[tuple[int, int]]:
    """`usage(result)` of a decorated function as (input, output) tokens; None if unknown.

    A single total is counted as input tokens, as `report(used)` does.
    """
    if used is None:
        return None
    if isinstance(used, tuple):
        if len(used) != 2:
            raise ValueError(f"usage must return a total or (input, output), got {used!r}")
        return token_count("input_tokens", used[0]), token_count("output_tokens", used[1])
    return token_count("used", used), 0


def check_decorated(function: Callable[..., Any], coroutines: bool, client: str) -> None:
    """Refuses a function the client cannot limit: the asyncio client takes
    coroutine functions, the blocking one plain functions (not generators)."""
    name = getattr(function, "__qualname__", repr(function))
    if not callable(function):
        raise TypeError(f"{client}.limit decorates functions, got {name}")
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise TypeError(f"{client}.limit cannot limit the generator function {name}")
    if inspect.iscoroutinefunction(function) != coroutines:
        other = "Client" if coroutines else "AsyncClient"
        kind = "coroutine" if coroutines else "plain (not async)"
        raise TypeError(f"{client}.limit decorates {kind} functions; use {other}.limit for {name}")
