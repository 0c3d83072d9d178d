"""mypy sees what `ratekeeper.openai.wrap` returns as the client it was given.

`typed_openai.py` uses a wrapped `openai.OpenAI` and `openai.AsyncOpenAI` as
mypy should see them (`assert_type`, and errors marked as expected). The same
file with `wrap` typed as returning `Any` must fail the check, so the check
can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SNIPPET = Path(__file__).resolve().parent / "typed_openai.py"
IMPORT_WRAP = "from ratekeeper.openai import wrap\n"
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
