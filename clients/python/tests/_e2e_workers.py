"""The worker processes of the end-to-end runs: real Python clients calling the fake.

Each process has one `ratekeeper.Client` and one `openai.OpenAI`, shared by
its threads, as a Gunicorn or Celery worker would. A thread sends chat
requests of its workload until the run's deadline, in one of two ways:

- by token count: it computes the fake's charge itself, acquires exactly
  that many tokens, calls the provider, reports the usage; on a 429 it
  releases the lease and forwards the answer (or, with feedback off, waits
  as the headers say), then tries again, as the OpenAI wrapper does;
- by messages: through `ratekeeper.openai.wrap`, which acquires by the
  messages and forwards the provider's headers itself.

Importable by `multiprocessing`'s spawn: `work` is the process's body.
"""

from __future__ import annotations

import random
import re
import threading
import time
from functools import lru_cache
from typing import Any, Optional

import openai

import ratekeeper
from ratekeeper.openai import retry_delay, wrap

from _fake_openai import rate_limit_charge

#: The model every request names (the shipped config's limit counts for it).
MODEL = "gpt-4o-mini"
#: Provider 429s retried per request, as the OpenAI wrapper's default.
MAX_RETRIES = 3
#: How often a successful answer's headers are forwarded: the wrapper's default.
FEEDBACK_INTERVAL = 0.25
#: Unexpected errors kept per process (all are counted).
ERRORS_KEPT = 5

#: Per workload: the system prompt, the characters of the user's text and
#: the `max_tokens` range. Long prompts make the token limit bind at 300k
#: TPM / 3k RPM (about 540 tokens a request, 9 requests a second); short
#: ones with small `max_tokens` the request limit (at most 64 tokens a
#: request, 50 requests a second use at most 3,200 of 5,000 tokens a second).
WORKLOADS = {
    "tokens": ("You are a careful assistant. Answer in plain English.", (1000, 3000), (100, 400)),
    "requests": ("Answer briefly.", (40, 200), (16, 64)),
}


@lru_cache(maxsize=1)
def prose() -> tuple[str, ...]:
    """Paragraphs of English prose: the Python documentation's help topics
    (in the standard library), without the grammar and code blocks."""
    from pydoc_data.topics import topics

    paragraphs = []
    for _, text in sorted(topics.items()):
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = " ".join(paragraph.split())
            letters = sum(c.isalpha() or c == " " for c in paragraph)
            if len(paragraph) >= 200 and letters >= 0.9 * len(paragraph):
                paragraphs.append(paragraph)
    return tuple(paragraphs)


def chat_request(workload: str, rng: random.Random) -> tuple[list[dict], int]:
    """One request of `workload`: (messages, max_tokens), text cut at a word."""
    system, (shortest, longest), (least, most) = WORKLOADS[workload]
    paragraphs = prose()
    wanted = rng.randint(shortest, longest)
    index = rng.randrange(len(paragraphs))
    text = ""
    while len(text) < wanted:
        text += paragraphs[index % len(paragraphs)] + "\n\n"
        index += 1
    cut = text.rfind(" ", 0, wanted + 1)
    text = text[: cut if cut > 0 else wanted]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return messages, rng.randint(least, most)


class Tally:
    """What one process's threads saw, added up under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {
            "completed": 0,  # answered 200
            "gave_up": 0,  # still 429 after MAX_RETRIES retries
            "denied": 0,  # RateLimited by the sidecar (its max_wait would pass)
            "errors": 0,
        }
        self.errors: list[str] = []

    def add(self, what: str, error: Optional[BaseException] = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if error is not None and len(self.errors) < ERRORS_KEPT:
                self.errors.append(repr(error))


class Sampler:
    """True at most once per `interval` seconds (shared by a process's threads)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.lock = threading.Lock()
        self.next = 0.0

    def due(self) -> bool:
        with self.lock:
            now = time.monotonic()
            if now < self.next:
                return False
            self.next = now + self.interval
            return True


def call_by_token_count(
    limiter: ratekeeper.Client,
    provider: openai.OpenAI,
    limit: str,
    messages: list[dict],
    max_tokens: int,
    feedback: Optional[Sampler],
) -> bool:
    """One request acquired by its charge; False if it was still refused after retries.

    The acquire names no `max_tokens`, so the daemon reserves exactly the
    charge under either cost rule (`sum`: charge + 0; `max`: max(charge, 0)).
    With `feedback`, every 429 and a sample of the other answers are forwarded.
    """
    charge = rate_limit_charge({"messages": messages, "max_tokens": max_tokens})
    for attempt in range(MAX_RETRIES + 1):
        lease = limiter.acquire(limit, charge)
        try:
            answer = provider.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=max_tokens
            )
        except openai.RateLimitError as refused:
            lease.release()
            headers = refused.response.headers
            noted = lease.feedback(429, headers) if feedback is not None else None
            if noted is None or noted.paused_ms == 0:
                time.sleep(retry_delay(headers, attempt))
            continue
        except BaseException:
            lease.settle_as_reserved()  # it may have been processed
            raise
        usage = answer.parse().usage
        lease.report(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
        if feedback is not None and feedback.due():
            lease.feedback(200, answer.headers)
        return True
    return False


def work(spec: dict, barrier: Any, results: Any) -> None:
    """A worker process: `spec["threads"]` threads send requests for `spec["seconds"]`.

    Starts when `barrier` lets every process and the harness through at
    once (the harness takes that moment as the run's start). Puts its tally
    on `results`.
    """
    limiter = ratekeeper.Client(spec["socket"], name=f"e2e-{spec['index']}")
    provider = openai.OpenAI(base_url=spec["base_url"], api_key="x", max_retries=0, timeout=30)
    interval = FEEDBACK_INTERVAL if spec["feedback"] else None
    wrapped = wrap(provider, limiter, limit=spec["limit"], feedback_interval=interval)
    sampler = Sampler(FEEDBACK_INTERVAL) if spec["feedback"] else None
    tally = Tally()
    limiter.ping()
    prose()
    barrier.wait(timeout=120)
    deadline = time.monotonic() + spec["seconds"]

    def thread_body(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            messages, max_tokens = chat_request(spec["workload"], rng)
            try:
                if spec["acquire"] == "tokens":
                    answered = call_by_token_count(
                        limiter, provider, spec["limit"], messages, max_tokens, sampler
                    )
                else:
                    wrapped.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=max_tokens
                    )
                    answered = True
                tally.add("completed" if answered else "gave_up")
            except ratekeeper.RateLimited as denied:
                tally.add("denied")
                time.sleep(max(0.0, min(denied.retry_after, deadline - time.monotonic())))
            except openai.RateLimitError:  # the wrapper's retries ran out
                tally.add("gave_up")
            except Exception as error:
                tally.add("errors", error)

    threads = [
        threading.Thread(target=thread_body, args=(spec["seed"] * 1000 + number,))
        for number in range(spec["threads"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    limiter.close()
    provider.close()
    results.put({**tally.counts, "error_samples": tally.errors})
