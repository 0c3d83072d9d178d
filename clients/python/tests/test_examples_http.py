"""The FastAPI (uvicorn, 4 workers) and Gunicorn (`-w 4`) examples, served as documented.

Each runs once per module against its own `ExampleStack`: the real daemon
on Redis, the fake OpenAI provider reached through the real `openai` SDK.
The documented request is answered; a limit that cannot serve within
`max_wait`, and Redis going away behind the sidecar, are 503s with
`Retry-After`; without the sidecar (`on_unavailable="allow"`) calls go
through unlimited.
"""

from __future__ import annotations

import json

import pytest

from _examples import (
    ExampleStack,
    check_install_line,
    documented_commands,
    poll,
    post_question,
    retry_after_header,
)

#: Each example: its server, and the log line each of its 4 workers writes once it serves.
EXAMPLES = {
    "fastapi_app": ("uvicorn", r"Application startup complete\."),
    "gunicorn_app": ("gunicorn", r"Booting worker with pid"),
}
WORKERS = 4


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def example(request):
    """(commands, stack) with the example serving on the stack's port."""
    name = request.param
    commands = documented_commands(name)
    stack = ExampleStack()
    try:
        stack.serve(commands[1], EXAMPLES[name][1], count=WORKERS)
        yield commands, stack
    finally:
        stack.close(failed=request.session.testsfailed > 0)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_docstring_documents_install_serve_and_try(name):
    commands = documented_commands(name)
    assert [c.split()[0] for c in commands] == ["pip", EXAMPLES[name][0], "curl"]
    check_install_line(commands[0])


def test_the_documented_request_is_answered_through_the_limit(example):
    commands, stack = example
    before, level = stack.requests(), stack.level()
    reply = json.loads(stack.run(commands[2]))
    assert reply == {"answer": "fake reply"}
    body = stack.provider.bodies[-1]
    assert (stack.requests(), body["model"], body["max_tokens"]) == (before + 1, "gpt-4o-mini", 300)
    assert level - stack.level() >= 250  # the 300 tokens charged, less a second's refill


def test_a_limit_that_cannot_serve_in_time_is_a_503_with_retry_after(example):
    _, stack = example
    before = stack.requests()
    with stack.drained():
        # 300 tokens at 10 a second: a 30 s wait, past the example's max_wait of 5 s.
        status, headers, body = post_question(stack.port, "Why is the sky blue?")
        assert (status, before) == (503, stack.requests()), body
        assert 20 <= retry_after_header(headers) <= 30, headers
        assert "RateLimited" in json.dumps(body)
    status, _, body = post_question(stack.port, "Why is the sky blue?")
    assert (status, body) == (200, {"answer": "fake reply"})


def test_redis_down_behind_the_sidecar_is_a_503_then_recovers(example):
    _, stack = example
    before = stack.requests()
    with stack.redis_down():
        status, headers, body = post_question(stack.port, "Why is the sky blue?")
        assert (status, retry_after_header(headers), stack.requests()) == (503, 1, before), body
        assert "StoreUnavailable" in json.dumps(body)
    status, _, body = poll(
        lambda: post_question(stack.port, "Why is the sky blue?"),
        lambda answer: answer[0] != 503,
        timeout=20,
        what="an answer once Redis is back",
    )
    assert (status, body) == (200, {"answer": "fake reply"})


def test_without_the_sidecar_calls_go_through_unlimited(example):
    _, stack = example
    before = stack.requests()
    with stack.sidecar_down():
        status, _, body = post_question(stack.port, "Why is the sky blue?")
        assert (status, body, stack.requests()) == (200, {"answer": "fake reply"}, before + 1)
