"""What the `limit` decorator checks without waiting: which functions a client
can limit, and the usage a decorated function reports.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Union

from .requests import token_count

#: What a decorated function's `usage` returns: a total, `(input, output)`,
#: `(input, output, cached_input, cache_write)`, or None (unknown).
Usage = Union[int, tuple[int, int], tuple[int, int, int, int], None]


def usage_counts(used: Usage) -> Optional[tuple[int, int, int, int]]:
    """`usage(result)` of a decorated function as (input, output, cached
    input, cache write) tokens; None if unknown.

    A single total is counted as input tokens, as `report(used)` does. With
    cache figures, input is the full-price input only, as in `report`.
    """
    if used is None:
        return None
    if isinstance(used, tuple):
        names = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_tokens")
        if len(used) not in (2, 4):
            raise ValueError(
                "usage must return a total, (input, output) or "
                f"(input, output, cached_input, cache_write), got {used!r}"
            )
        # (input, output) has no cache figures: both 0.
        counts = [token_count(name, count) for name, count in zip(names, used)] + [0, 0]
        return counts[0], counts[1], counts[2], counts[3]
    return token_count("used", used), 0, 0, 0


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
