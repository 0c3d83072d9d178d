"""The examples compile (their frameworks are not test dependencies), and the
framework-free parts run."""

from __future__ import annotations

import py_compile
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", ["gunicorn_app", "gunicorn_conf", "celery_app", "fastapi_app"])
def test_example_compiles(name, tmp_path):
    py_compile.compile(str(EXAMPLES / f"{name}.py"), cfile=str(tmp_path / "out.pyc"), doraise=True)


def test_the_wsgi_example_answers_and_reports(daemon, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gunicorn_app", EXAMPLES / "gunicorn_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from ratekeeper import Client

    module.limiter = Client(daemon.socket)
    # The session daemon has no "gpt-4o-mini" limit: point the app at "basic".
    source_limit = "gpt-4o-mini"
    original = module.limiter.reserve
    monkeypatch.setattr(
        module.limiter,
        "reserve",
        lambda limit, *a, **k: original("basic" if limit == source_limit else limit, *a, **k),
    )
    statuses = []
    body = module.app({"QUERY_STRING": "ping"}, lambda status, headers: statuses.append(status))
    assert statuses == ["200 OK"]
    assert b"PING" in b"".join(body)
    module.limiter.close()
