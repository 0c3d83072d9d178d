"""The blocking client is generated from the asyncio one: current, and the same API.

`scripts/unasync.py` derives the package `_sync` (all but its transport) from
`_async`, and the blocking twins of the asyncio tests that mirror them; these
tests regenerate them in memory and fail while a committed file differs (the
check CI runs) or `_sync` holds a module with no source, and hold the public
API of every sync/async pair to the same names and signatures, `async` aside.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import ratekeeper
from ratekeeper._async import anthropic as anthropic_async
from ratekeeper._async import gate as gate_async
from ratekeeper._async import openai as openai_async
from ratekeeper._sync import anthropic as anthropic_sync
from ratekeeper._sync import gate as gate_sync
from ratekeeper._sync import openai as openai_sync

ROOT = Path(__file__).resolve().parents[1]


def load_unasync():
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unasync = load_unasync()


@pytest.mark.parametrize(("source", "target"), unasync.FILES)
def test_the_generated_file_is_current(source, target):
    expected = unasync.generate((ROOT / source).read_text(encoding="utf-8"), source)
    committed = (ROOT / target).read_text(encoding="utf-8")
    assert committed == expected, f"{target} is stale: run `python scripts/unasync.py`"


def test_every_module_of_the_blocking_package_is_generated_or_a_transport():
    assert unasync.strays() == [], "remove it, or generate it from a module of _async"


def test_the_whole_asyncio_package_but_its_transport_is_generated():
    sources = {Path(source).name for source, _ in unasync.package_files()}
    modules = {path.name for path in (ROOT / unasync.ASYNC_PACKAGE).glob("*.py")}
    assert sources == modules - {"transport.py"}
    assert "__init__.py" in sources


def test_a_name_missing_from_the_table_fails_the_transform():
    with pytest.raises(ValueError, match="AsyncWidget"):
        unasync.generate("async def f():\n    return await AsyncWidget()\n", "widget.py")


#: The special methods of `async with` / `async for` and their blocking twins.
ASYNC_DUNDERS = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}

PAIRS = [
    (ratekeeper.Client, ratekeeper.AsyncClient),
    (ratekeeper.Lease, ratekeeper.AsyncLease),
    (gate_sync.Gate, gate_async.AsyncGate),
    (gate_sync.StreamProxy, gate_async.AsyncStreamProxy),
    *(
        (getattr(openai_sync, name), getattr(openai_async, f"Async{name}"))
        # Not `Resource`: what it has besides `__init__` is `_core.wrapping.LimitedView`'s,
        # one class for both.
        for name in (
            "LimitedStream",
            "Completions",
            "Responses",
            "LimitedResponseContext",
            "LimitedResponse",
            "LimitedStreamManager",
            "ObservedEvents",
        )
    ),
    (anthropic_sync.Messages, anthropic_async.AsyncMessages),
    (anthropic_sync.LimitedStreamManager, anthropic_async.AsyncLimitedStreamManager),
    (anthropic_sync.LimitedEvents, anthropic_async.AsyncLimitedEvents),
]

#: Asyncio methods that are not awaited, like the SDK's own: `messages.stream()`
#: gives a context manager to `async with`.
NOT_AWAITED = {
    (anthropic_async.AsyncMessages, "stream"),
    (openai_async.AsyncCompletions, "stream"),
    (openai_async.AsyncResponses, "stream"),
}


def blocking_name(name: str) -> str:
    """`AsyncLease` → `Lease`, `AsyncIterator[AsyncLease]` → `Iterator[Lease]`."""
    return re.sub(r"Async(?=[A-Z])", "", name)


def api(cls: type) -> dict:
    """Public methods and properties, `__init__` and the methods of `with` and
    `for`, by their blocking names: (kind, parameters, return annotation)."""
    members = {}
    for name in vars(cls):
        special = name == "__init__" or name in ASYNC_DUNDERS or name in ASYNC_DUNDERS.values()
        if name.startswith("_") and not special:
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, property):
            members[name] = ("property", *describe(member.fget))
        elif callable(getattr(cls, name)):
            members[ASYNC_DUNDERS.get(name, name)] = ("method", *describe(getattr(cls, name)))
    return members


def awaitable(cls: type, name: str, is_async: bool) -> bool:
    """Whether a method is awaited: a coroutine, or an async context manager's generator."""
    if is_async:
        name = {blocking: name for name, blocking in ASYNC_DUNDERS.items()}.get(name, name)
    function = getattr(cls, name)
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(
        inspect.unwrap(function)
    )


def describe(function) -> tuple:
    signature = inspect.signature(function)
    parameters = tuple(
        (p.name, p.kind, p.default, blocking_name(str(p.annotation)))
        for p in signature.parameters.values()
    )
    return parameters, blocking_name(str(signature.return_annotation))


@pytest.mark.parametrize(("sync", "asyncio_twin"), PAIRS, ids=lambda cls: cls.__name__)
def test_sync_and_asyncio_apis_match(sync, asyncio_twin):
    blocking, awaited = api(sync), api(asyncio_twin)
    assert len(blocking) >= 2  # __init__ and at least one method
    assert blocking == awaited
    for name, (kind, *_) in blocking.items():
        if kind == "method":
            assert not awaitable(sync, name, False), f"{sync.__name__}.{name} is async"
            # Every asyncio method is awaited, but the constructor, `__aiter__`
            # and the decorator factory `limit` (the function it returns is).
            expected = name not in ("__init__", "__iter__", "limit")
            expected = expected and (asyncio_twin, name) not in NOT_AWAITED
            assert awaitable(asyncio_twin, name, True) is expected, (
                f"{asyncio_twin.__name__}.{name}"
            )
