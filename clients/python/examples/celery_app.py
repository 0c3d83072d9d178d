r"""A Celery worker whose prefork children share one rate limit through the sidecar.

From the repository root, with the sidecar running (see the README's "Run it")
on RATEKEEPER_SOCKET or the default socket, OPENAI_API_KEY set
(OPENAI_BASE_URL points the SDK at another server), and Redis as the broker
and result store at CELERY_BROKER_URL (default redis://127.0.0.1:6379/0):

    pip install './clients/python[openai]' 'celery[redis]'
    celery --workdir clients/python/examples -A celery_app worker --concurrency 8 \
        --loglevel INFO
    PYTHONPATH=clients/python/examples python -c \
        'from celery_app import summarise; print(summarise.delay("Rate limits.").get(timeout=60))'

(`--workdir` is an option of `celery` itself, so it comes before `worker`.)
Each child process builds its clients in `worker_process_init`, named after
it. A task that the limit cannot serve within `max_wait` (`RateLimited`) is
retried after the sidecar's `retry_after` instead of holding its child; a
passing failure behind the sidecar (`StoreUnavailable` when Redis is down
and the daemon's `on_failure` is `fail_closed`, the default) is retried
after a growing delay.
"""

from __future__ import annotations

import os

import openai
from celery import Celery
from celery.signals import worker_process_init

import ratekeeper
from ratekeeper.openai import wrap
from ratekeeper.retry import is_retryable, retry_after

broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
app = Celery("celery_app", broker=broker, backend=os.environ.get("CELERY_RESULT_BACKEND", broker))
llm = None


@worker_process_init.connect
def connect_to_sidecar(**_):
    global llm
    limiter = ratekeeper.Client(name=f"celery-worker pid={os.getpid()}")
    llm = wrap(openai.OpenAI(), limiter, limit="gpt-4o-mini", max_wait=10)


@app.task(bind=True, max_retries=20)
def summarise(self, text: str) -> str:
    try:
        reply = llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": f"Summarise:\n{text}"}],
            max_tokens=200,
        )
    except ratekeeper.RatekeeperError as error:
        if not is_retryable(error):  # a bug or a misconfiguration: fail the task
            raise
        # A denial says when; a store or sidecar failure does not: back off.
        delay = retry_after(error)
        if delay is None:
            delay = min(60, 2**self.request.retries)
        raise self.retry(countdown=delay, exc=error) from error
    return reply.choices[0].message.content
