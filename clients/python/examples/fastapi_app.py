r"""A FastAPI service whose uvicorn workers share one rate limit through the sidecar.

From the repository root, with the sidecar running (see the README's "Run it")
on RATEKEEPER_SOCKET or the default socket, and OPENAI_API_KEY set
(OPENAI_BASE_URL points the SDK at another server):

    pip install './clients/python[openai]' fastapi uvicorn
    uvicorn fastapi_app:app --app-dir clients/python/examples \
        --host 127.0.0.1 --port 8000 --workers 4
    curl -sS -X POST http://127.0.0.1:8000/ask -H 'content-type: application/json' \
        -d '{"question": "Why is the sky blue?"}'

The asyncio client and the wrapped OpenAI client are created in the lifespan,
on the server's event loop, and closed at shutdown. A denial (`RateLimited`)
and a passing failure behind the sidecar (`StoreUnavailable` when Redis is
down and the daemon's `on_failure` is `fail_closed`, the default) become a
503 with `Retry-After`, so callers back off instead of timing out. With
`on_unavailable="allow"`, an unreachable sidecar lets calls through unlimited.
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager

import openai
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

import ratekeeper
from ratekeeper.openai import wrap
from ratekeeper.retry import is_retryable, retry_after


@asynccontextmanager
async def lifespan(app: FastAPI):
    limiter = ratekeeper.AsyncClient(on_unavailable="allow")  # keep serving without a sidecar
    provider = openai.AsyncOpenAI()
    app.state.llm = wrap(provider, limiter, limit="gpt-4o-mini", max_wait=5)
    yield
    await provider.close()
    await limiter.close()


app = FastAPI(lifespan=lifespan)


class Question(BaseModel):
    question: str


@app.post("/ask")
async def ask(request: Request, body: Question) -> dict:
    try:
        reply = await request.app.state.llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": body.question}],
            max_tokens=300,
        )
    except ratekeeper.RatekeeperError as error:
        if not is_retryable(error):  # a bug or a misconfiguration: let it be a 500
            raise
        raise HTTPException(
            status_code=503,
            detail=f"busy, try again later ({type(error).__name__})",
            # A denial says when; a store or sidecar failure does not: 1 s.
            headers={"Retry-After": str(max(1, math.ceil(retry_after(error) or 1)))},
        ) from error
    return {"answer": reply.choices[0].message.content}
