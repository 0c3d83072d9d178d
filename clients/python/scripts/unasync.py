#!/usr/bin/env python3
"""Generates the blocking package `_sync` from the asyncio one, `_async`.

The policy of the client (acquire, retries, reconnects, settling, the SDK
wrappers' limited calls) is written once, for asyncio, in the package
`src/ratekeeper/_async`. This script derives every module of `_sync` from
its namesake there by a plain text transform: `async` and `await` are
deleted and names are mapped through the table below, nothing else. The
transports differ for real and are written by hand with the same names and
signatures (`_async/transport.py`; `_sync/transport.py`, with the blocking
slot in `_sync/slot.py`), so the generated code drives them unchanged; the
same goes for the tests, where an asyncio test module has a generated
blocking twin (`TEST_FILES`). The sources are written so that the output keeps ruff's format
(where a statement would fit on one line once `await` is gone, the source
names a local or ends its arguments with a comma); `ruff format --check`
catches one that does not.

    python scripts/unasync.py          # rewrites the generated files
    python scripts/unasync.py --check  # exits 1 if one is stale

`tests/test_generated.py` runs the same transform in memory and fails while a
committed generated file differs from it. Standard library only.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path

#: clients/python: the paths below are relative to it.
ROOT = Path(__file__).resolve().parents[1]

#: The asyncio package and the blocking one generated from it.
ASYNC_PACKAGE = "src/ratekeeper/_async"
SYNC_PACKAGE = "src/ratekeeper/_sync"
#: The modules of each package written by hand: the transports.
HAND_WRITTEN = {
    ASYNC_PACKAGE: frozenset({"transport.py"}),
    SYNC_PACKAGE: frozenset({"transport.py", "slot.py"}),
}


def package_files() -> tuple[tuple[str, str], ...]:
    """Every module of `_async` but its transport, with its generated twin in `_sync`."""
    sources = sorted((ROOT / ASYNC_PACKAGE).glob("*.py"))
    return tuple(
        (f"{ASYNC_PACKAGE}/{path.name}", f"{SYNC_PACKAGE}/{path.name}")
        for path in sources
        if path.name not in HAND_WRITTEN[ASYNC_PACKAGE]
    )


#: The asyncio test modules and the blocking ones generated from them: the
#: tests that mirror line for line (what only one client does is tested by hand).
TEST_FILES = (("tests/test_calls_async.py", "tests/test_calls_sync.py"),)

#: Each asyncio source and the blocking module generated from it.
FILES = package_files() + TEST_FILES


def strays() -> list[str]:
    """Modules in `_sync` that are neither generated nor written by hand: a
    module removed from `_async` leaves its twin behind, which must go too."""
    generated = {Path(target).name for source, target in FILES if target.startswith(SYNC_PACKAGE)}
    return sorted(
        f"{SYNC_PACKAGE}/{path.name}"
        for path in (ROOT / SYNC_PACKAGE).glob("*.py")
        if path.name not in generated and path.name not in HAND_WRITTEN[SYNC_PACKAGE]
    )


#: What the transform replaces, in this order: (regular expression, replacement).
#: Names match whole words only. A name that should differ and is missing here
#: makes `generate` fail (see `_check_no_async_left`), never pass silently.
REPLACEMENTS = (
    # Imports whose sorted order changes with the names.
    (
        r"^from collections\.abc import AsyncIterator, Iterable$",
        "from collections.abc import Iterable, Iterator",
    ),
    # Syntax.
    (r"\basync def ", "def "),
    (r"\basync with ", "with "),
    (r"\basync for ", "for "),
    (r"\bawait ", ""),
    # The protocols of `with`, `for` and context managers.
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAsyncIterator\b", "Iterator"),
    # Our classes.
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncLease\b", "Lease"),
    (r"\bAsyncGate\b", "Gate"),
    (r"\bAsyncOpenAIGate\b", "OpenAIGate"),
    (r"\bAsyncWrapped\b", "Wrapped"),
    (r"\bAsyncResource\b", "Resource"),
    (r"\bAsyncCompletions\b", "Completions"),
    (r"\bAsyncResponses\b", "Responses"),
    (r"\bAsyncEmbeddings\b", "Embeddings"),
    (r"\bAsyncLimitedResponseContext\b", "LimitedResponseContext"),
    (r"\bAsyncLimitedResponse\b", "LimitedResponse"),
    (r"\bAsyncLimitedResponseStreamManager\b", "LimitedResponseStreamManager"),
    (r"\bAsyncObservedEvents\b", "ObservedEvents"),
    (r"\bAsyncLimitedStream\b", "LimitedStream"),
    (r"\bAsyncStreamProxy\b", "StreamProxy"),
    (r"\bAsyncMessages\b", "Messages"),
    (r"\bAsyncMessagesGate\b", "MessagesGate"),
    (r"\bAsyncLimitedEvents\b", "LimitedEvents"),
    (r"\bAsyncLimitedStreamManager\b", "LimitedStreamManager"),
)

_COMPILED = tuple((re.compile(pattern, re.MULTILINE), new) for pattern, new in REPLACEMENTS)

#: Code names (not strings or comments) that must not survive the transform.
_ASYNC_NAME = re.compile(r"^(async|await)$|Async|asyncio|__a(enter|exit|iter|next)__")


def header(source: str) -> str:
    """The comment that opens a generated file."""
    return (
        f"# Generated from {source} by scripts/unasync.py: do not edit.\n"
        "# Edit the source, then run `python scripts/unasync.py` in clients/python.\n"
    )


def generate(text: str, source: str) -> str:
    """The blocking module for the text of an asyncio module named `source`."""
    for pattern, new in _COMPILED:
        text = pattern.sub(new, text)
    _check_no_async_left(text, source)
    return header(source) + text


def _check_no_async_left(text: str, source: str) -> None:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    for token in tokens:
        if token.type == tokenize.NAME and _ASYNC_NAME.search(token.string):
            raise ValueError(
                f"{source}:{token.start[0]}: {token.string!r} is left after the transform; "
                "add it to REPLACEMENTS in scripts/unasync.py"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args()
    stale = []
    for source, target in FILES:
        expected = generate((ROOT / source).read_text(encoding="utf-8"), source)
        path = ROOT / target
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == expected:
            continue
        stale.append(target)
        if not args.check:
            path.write_text(expected, encoding="utf-8")
    if stale:
        verb = "stale" if args.check else "written"
        print("\n".join(f"{verb}: {target}" for target in stale))
    left = strays()
    if left:
        print("\n".join(f"not generated from {ASYNC_PACKAGE}, remove: {path}" for path in left))
    return 1 if (args.check and stale) or left else 0


if __name__ == "__main__":
    sys.exit(main())
