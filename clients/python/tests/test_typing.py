"""mypy sees what `ratekeeper.openai.wrap` returns as the client it was given,
and the clients' `reserve` keywords by name and type.

`typed_openai.py` uses a wrapped `openai.OpenAI` and `openai.AsyncOpenAI` as
mypy should see them (`assert_type`, and errors marked as expected). The same
file with `wrap` typed as returning `Any` must fail the check, so the check
can fail. `typed_client.py` does the same for `Client.reserve` and
`AsyncClient.reserve`, whose check must fail for a `reserve(**options: Any)`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SNIPPET = Path(__file__).resolve().parent / "typed_openai.py"
IMPORT_WRAP = "from ratekeeper.openai import wrap\n"
CLIENT_SNIPPET = Path(__file__).resolve().parent / "typed_client.py"
IMPORT_CLIENTS = "from ratekeeper import AsyncClient, AsyncLease, Client, Lease\n"
#: The clients as they were, with `reserve(limit, tokens, **options: Any)`.
UNTYPED_CLIENTS = """\
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Optional

from ratekeeper import AsyncLease, Lease


class Client:
    def reserve(
        self, limit: str, tokens: Optional[int] = None, **options: Any
    ) -> AbstractContextManager[Lease]:
        raise NotImplementedError


class AsyncClient:
    def reserve(
        self, limit: str, tokens: Optional[int] = None, **options: Any
    ) -> AbstractAsyncContextManager[AsyncLease]:
        raise NotImplementedError
"""
#: mypy's cache, outside the repository and kept between runs: checking the
#: `openai` package from cold takes about 15 s, from the cache about 1.
CACHE = Path(tempfile.gettempdir()) / f"ratekeeper-mypy-cache-{os.getuid()}"


def mypy(path: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--warn-unused-ignores",
        # Errors inside the packages imported are not this check's.
        "--follow-imports=silent",
        "--cache-dir",
        str(CACHE),
        "--no-error-summary",
        str(path),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_wrapped_client_keeps_its_type():
    checked = mypy(SNIPPET)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_check_fails_for_a_wrap_that_returns_any(tmp_path):
    source = SNIPPET.read_text(encoding="utf-8")
    assert IMPORT_WRAP in source
    untyped = (
        "from typing import Any\n\n\ndef wrap(client: Any, limiter: Any, limit: str) -> Any: ...\n"
    )
    copy = tmp_path / "untyped_openai.py"
    copy.write_text(source.replace(IMPORT_WRAP, untyped), encoding="utf-8")
    checked = mypy(copy)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert 'Expression is of type "Any", not "OpenAI"' in checked.stdout
    assert 'Unused "type: ignore" comment' in checked.stdout


def test_reserve_takes_acquires_keywords_by_name_and_type():
    checked = mypy(CLIENT_SNIPPET)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_check_fails_for_a_reserve_that_takes_any_keyword(tmp_path):
    source = CLIENT_SNIPPET.read_text(encoding="utf-8")
    assert IMPORT_CLIENTS in source
    copy = tmp_path / "untyped_client.py"
    copy.write_text(source.replace(IMPORT_CLIENTS, UNTYPED_CLIENTS), encoding="utf-8")
    checked = mypy(copy)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    unused = checked.stdout.count('Unused "type: ignore" comment')
    assert unused == source.count("  # type: ignore["), checked.stdout
