"""The limiter users had before ratekeeper: a token bucket in each worker process.

Each process believes it owns the whole limit: its bucket holds one minute
of `PER_PROCESS_TPM` tokens and refills at that rate, and a call waits until
its bucket has the request's charge, counted exactly as the provider counts
(`_fake_openai.rate_limit_charge`: the most favourable counting there is, so
the 429s it draws come from the per-process split alone). Calls go through
the SDK with its own default retries, as they did.

This file is also a Gunicorn config (`-c .../_per_process.py`): its
`post_fork` gives each worker of `gunicorn_app` such a client instead of
the sidecar's. `_per_process_celery.py` does the same for Celery.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fake_openai import rate_limit_charge  # on the path set above

#: The limit each process enforces on its own: the provider's, from the harness.
PER_PROCESS_TPM = float(os.environ.get("PER_PROCESS_TPM", "0") or 0)


class TokenBucket:
    """One process's bucket: `per_minute` capacity, continuous refill; waits by reservation."""

    def __init__(self, per_minute: float) -> None:
        self.capacity = per_minute
        self.rate = per_minute / 60.0
        self.level = per_minute
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self, cost: float) -> None:
        with self.lock:
            now = time.monotonic()
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now
            self.level -= cost
            wait = max(0.0, -self.level / self.rate)
        time.sleep(wait)


class _Completions:
    def __init__(self, client: openai.OpenAI, bucket: TokenBucket) -> None:
        self.client = client
        self.bucket = bucket

    def create(self, **request):
        self.bucket.take(rate_limit_charge(request))
        return self.client.chat.completions.create(**request)


class _Chat:
    def __init__(self, completions: _Completions) -> None:
        self.completions = completions


class PerProcessOpenAI:
    """`chat.completions.create` of an `openai.OpenAI`, behind this process's own bucket."""

    def __init__(self, client: openai.OpenAI, per_minute: float = PER_PROCESS_TPM) -> None:
        if per_minute <= 0:
            raise ValueError("set PER_PROCESS_TPM to the provider's tokens per minute")
        self.chat = _Chat(_Completions(client, TokenBucket(per_minute)))


# As a Gunicorn config file.
preload_app = True


def post_fork(server, worker):
    import gunicorn_app

    gunicorn_app.llm = PerProcessOpenAI(openai.OpenAI())
