"""A WSGI app behind Gunicorn whose workers share one rate limit through the sidecar.

Run (with the sidecar listening on RATEKEEPER_SOCKET or /tmp/ratekeeper.sock):

    pip install gunicorn 'ratekeeper[openai]'
    gunicorn -w 4 -c examples/gunicorn_conf.py 'gunicorn_app:app' --chdir examples

The client is created lazily at module level; it is fork-safe, so even when
Gunicorn preloads the app (`--preload`) each worker opens its own connection
on first use. `gunicorn_conf.py` shows the explicit `post_fork` alternative.
"""

from __future__ import annotations

import json

import ratekeeper

limiter = ratekeeper.Client(on_unavailable="allow")  # keep serving if the sidecar is down


def call_provider(prompt: str) -> dict:
    """Stands in for the real LLM call; returns OpenAI-style usage."""
    return {"text": prompt.upper(), "usage": {"prompt_tokens": len(prompt) // 4 + 1}}


def app(environ, start_response):
    prompt = environ.get("QUERY_STRING") or "hello"
    try:
        with limiter.reserve("gpt-4o-mini", len(prompt) // 4 + 1, max_tokens=256) as lease:
            reply = call_provider(prompt)
            lease.report(input_tokens=reply["usage"]["prompt_tokens"], output_tokens=0)
    except ratekeeper.RateLimited as denied:
        start_response(
            "503 Service Unavailable",
            [
                ("Retry-After", str(max(1, round(denied.retry_after)))),
                ("Content-Type", "text/plain"),
            ],
        )
        return [b"busy, try again later\n"]
    body = json.dumps({"reply": reply["text"]}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
