r"""A WSGI app under `gunicorn -w 4` whose workers share one rate limit through the sidecar.

From the repository root, with the sidecar running (see the README's "Run it")
on RATEKEEPER_SOCKET or the default socket, and OPENAI_API_KEY set
(OPENAI_BASE_URL points the SDK at another server):

    pip install './clients/python[openai]' gunicorn
    gunicorn -w 4 -c clients/python/examples/gunicorn_conf.py \
        --chdir clients/python/examples --bind 127.0.0.1:8000 gunicorn_app:app
    curl -sS -X POST http://127.0.0.1:8000/ask -H 'content-type: application/json' \
        -d '{"question": "Why is the sky blue?"}'

The clients are created at import: the ratekeeper client is fork-safe (each
worker opens its own connection on first use, even when Gunicorn preloads
the app in its master, as `gunicorn_conf.py` asks), and neither connects
before a request. `gunicorn_conf.py`'s `post_fork` hook calls `connect()`
again to name each worker in the sidecar's logs; the app works without the
config file too.

A denial (`RateLimited`) and a passing failure behind the sidecar
(`StoreUnavailable` when Redis is down and the daemon's `on_failure` is
`fail_closed`, the default) become a 503 with `Retry-After`.
"""

from __future__ import annotations

import json
import math
from typing import Optional

import openai

import ratekeeper
from ratekeeper.openai import wrap
from ratekeeper.retry import is_retryable, retry_after

llm = None


def connect(name: Optional[str] = None) -> None:
    """The OpenAI client, limited through the sidecar (one per process)."""
    global llm
    limiter = ratekeeper.Client(name=name, on_unavailable="allow")  # serve without a sidecar
    llm = wrap(openai.OpenAI(), limiter, limit="gpt-4o-mini", max_wait=5)


connect()


def answer(status: str, payload: dict, start_response, headers=()) -> list[bytes]:
    body = json.dumps(payload).encode()
    start_response(status, [("Content-Type", "application/json"), *headers])
    return [body]


def app(environ, start_response):
    if (environ["REQUEST_METHOD"], environ["PATH_INFO"]) != ("POST", "/ask"):
        return answer("404 Not Found", {"error": "POST /ask"}, start_response)
    length = int(environ.get("CONTENT_LENGTH") or 0)
    try:
        question = json.loads(environ["wsgi.input"].read(length))["question"]
    except (ValueError, KeyError, TypeError):
        return answer("400 Bad Request", {"error": 'send {"question": "..."}'}, start_response)
    try:
        reply = llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": question}],
            max_tokens=300,
        )
    except ratekeeper.RatekeeperError as error:
        if not is_retryable(error):  # a bug or a misconfiguration: let it be a 500
            raise
        # A denial says when; a store or sidecar failure does not: 1 s.
        seconds = max(1, math.ceil(retry_after(error) or 1))
        return answer(
            "503 Service Unavailable",
            {"error": f"busy, try again later ({type(error).__name__})"},
            start_response,
            [("Retry-After", str(seconds))],
        )
    return answer("200 OK", {"answer": reply.choices[0].message.content}, start_response)
