"""A FastAPI service that limits its OpenAI calls through the sidecar.

Run (the sidecar on RATEKEEPER_SOCKET, OPENAI_API_KEY set):

    pip install fastapi uvicorn 'ratekeeper[openai]'
    uvicorn fastapi_app:app --workers 4 --app-dir examples

The asyncio client and the wrapped OpenAI client are created in the lifespan,
on the server's event loop, and closed at shutdown. A denial becomes a 503
with `Retry-After`, so callers back off instead of timing out.
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager

import openai
from fastapi import FastAPI, HTTPException, Request

import ratekeeper
from ratekeeper.openai import wrap


@asynccontextmanager
async def lifespan(app: FastAPI):
    limiter = ratekeeper.AsyncClient(on_unavailable="allow")
    provider = openai.AsyncOpenAI()
    app.state.llm = wrap(provider, limiter, limit="gpt-4o-mini", max_wait=5)
    yield
    await provider.close()
    await limiter.close()


app = FastAPI(lifespan=lifespan)


@app.post("/ask")
async def ask(request: Request, question: str) -> dict:
    try:
        reply = await request.app.state.llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": question}],
            max_tokens=300,
        )
    except ratekeeper.RateLimited as denied:
        raise HTTPException(
            status_code=503,
            detail="rate limited, try again later",
            headers={"Retry-After": str(math.ceil(denied.retry_after))},
        ) from denied
    return {"answer": reply.choices[0].message.content}
