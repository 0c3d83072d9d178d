"""A Celery worker whose prefork children share one rate limit through the sidecar.

Run (a broker at CELERY_BROKER_URL, the sidecar on RATEKEEPER_SOCKET):

    pip install celery 'ratekeeper[openai]'
    celery -A celery_app worker --concurrency 8 --workdir examples

Each child process builds its client in `worker_process_init` (the client is
fork-safe anyway; this just keeps one per child, named after it). A denied
task is retried after the sidecar's `retry_after` instead of hammering the
provider.
"""

from __future__ import annotations

import os

import openai
from celery import Celery
from celery.signals import worker_process_init

import ratekeeper
from ratekeeper.openai import wrap

app = Celery("celery_app", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/1"))
llm = None


@worker_process_init.connect
def connect_to_sidecar(**_):
    global llm
    limiter = ratekeeper.Client(name=f"celery-worker pid={os.getpid()}")
    llm = wrap(openai.OpenAI(), limiter, limit="gpt-4o-mini", max_wait=30)


@app.task(bind=True, max_retries=5)
def summarise(self, text: str) -> str:
    try:
        reply = llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": f"Summarise:\n{text}"}],
            max_tokens=200,
        )
    except ratekeeper.RateLimited as denied:
        raise self.retry(countdown=denied.retry_after) from denied
    return reply.choices[0].message.content
