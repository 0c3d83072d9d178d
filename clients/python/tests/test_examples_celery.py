"""The Celery example: a worker of concurrency 8 on a Redis broker, started as documented.

Against its `ExampleStack` (the real daemon on Redis, the fake OpenAI
provider through the real `openai` SDK): the documented task runs; a task
that the limit cannot serve within `max_wait` is retried after the
sidecar's `retry_after`, and one that meets Redis or the sidecar down is
retried until they are back; every one ends with the provider's answer.
"""

from __future__ import annotations

import re

import pytest
from celery import Celery

from _examples import ExampleStack, check_install_line, documented_commands

READY = r"celery@\S+ ready\."
TASK = "celery_app.summarise"
RESULT_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def worker(request):
    """(commands, stack, served worker, a Celery app that sends tasks to it)."""
    commands = documented_commands("celery_app")
    stack = ExampleStack()
    sender = Celery("sender", broker=stack.broker.url, backend=stack.broker.url)
    try:
        served = stack.serve(commands[1], READY)
        yield commands, stack, served, sender
    finally:
        sender.close()
        stack.close(failed=request.session.testsfailed > 0)


def retries(log: str, error: str) -> int:
    """How many "retry: Retry in" lines of the worker's log name `error`."""
    return len(re.findall(rf"retry: Retry in \S+: {error}", log))


def test_the_docstring_documents_install_worker_and_a_task():
    commands = documented_commands("celery_app")
    assert [c.split()[0] for c in commands] == [
        "pip",
        "celery",
        "PYTHONPATH=clients/python/examples",
    ]
    assert re.search(r"celery --workdir \S+ -A celery_app worker --concurrency 8", commands[1])
    check_install_line(commands[0])


def test_the_documented_task_runs_through_the_limit(worker):
    commands, stack, _, _ = worker
    before = stack.requests()
    assert stack.run(commands[2]).strip() == "fake reply"
    body = stack.provider.bodies[-1]
    assert (stack.requests(), body["model"], body["max_tokens"]) == (before + 1, "gpt-4o-mini", 200)


def test_a_task_the_limit_cannot_serve_in_time_is_retried_after_retry_after(worker):
    _, stack, served, sender = worker
    seen = retries(served.log(), "RateLimited")
    # 200 tokens with 40 left at 10 a second: a 16 s wait, past max_wait (10 s),
    # so the sidecar denies it with retry_after of about 6 s (less the time
    # the task took to reach a child: the margin for a busy machine).
    with stack.drained(leave=40):
        result = sender.send_task(TASK, args=["Rate limits, shared."])
        served.wait_for_log(r"retry: Retry in \S+: RateLimited", count=seen + 1, timeout=30)
    assert result.get(timeout=RESULT_TIMEOUT) == "fake reply"
    delays = re.findall(r"retry: Retry in (\S+?)s?: RateLimited", served.log())
    assert 0 < float(delays[-1]) <= 6.5, delays


def test_a_task_is_retried_while_redis_is_down_behind_the_sidecar(worker):
    _, stack, served, sender = worker
    seen = retries(served.log(), "StoreUnavailable")
    with stack.redis_down():
        result = sender.send_task(TASK, args=["Redis restarts."])
        served.wait_for_log(r"retry: Retry in \S+: StoreUnavailable", count=seen + 1, timeout=30)
        before = stack.requests()
    assert result.get(timeout=RESULT_TIMEOUT) == "fake reply"
    assert stack.requests() == before + 1


def test_a_task_is_retried_while_the_sidecar_is_down(worker):
    _, stack, served, sender = worker
    seen = retries(served.log(), "SidecarUnavailable")
    with stack.sidecar_down():
        result = sender.send_task(TASK, args=["The sidecar restarts."])
        served.wait_for_log(r"retry: Retry in \S+: SidecarUnavailable", count=seen + 1, timeout=30)
        before = stack.requests()
    assert result.get(timeout=RESULT_TIMEOUT) == "fake reply"
    assert stack.requests() == before + 1
