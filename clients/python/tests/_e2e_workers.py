"""The worker processes of the end-to-end runs: real Python clients calling the fake.

Each process has one `ratekeeper.Client` and one provider SDK client
(`openai.OpenAI`, or `anthropic.Anthropic` against the Anthropic-shaped
fake), shared by its threads, as a Gunicorn or Celery worker would. A thread
sends chat requests of its workload until the run's deadline, in one of two
ways:

- by token count: it computes the fake's own count itself (OpenAI: the
  charge; Anthropic: the input tokens, and `max_tokens` as output),
  acquires exactly that, calls the provider, reports the usage. A 429 is
  settled the way the provider counts it (`count_rejected`: OpenAI keeps
  the whole charge, Anthropic the input while the output estimate goes
  back; with `rejected_tokens` off only the request, reported as zero
  usage; otherwise released), forwarded (or, with feedback off, waited
  out as the headers say), and the retry acquires again, as the wrappers do;
- by messages: through `ratekeeper.openai.wrap` or `ratekeeper.anthropic.wrap`,
  which acquire by the messages and forward the provider's headers themselves.

Importable by `multiprocessing`'s spawn: `work` is the process's body. The
anthropic SDK is imported only by processes that call the Anthropic shape:
it takes over 2 s to import, in every process of every run.
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
import ratekeeper.anthropic
import ratekeeper.openai
from ratekeeper.openai import retry_delay

from _fake_anthropic import input_tokens
from _fake_openai import rate_limit_charge

#: The model every request names, per provider shape (the shipped config's
#: limits count for them).
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}
#: Provider 429s retried per request, as the wrappers' default.
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


class OpenaiCalls:
    """Chat completions against the OpenAI-shaped fake; `rate_limited` is what
    the SDK raises for a 429."""

    def __init__(self, base_url: str) -> None:
        self.client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=30)
        self.rate_limited = openai.RateLimitError

    def cost(self, messages: list[dict], max_tokens: int) -> tuple[int, Optional[int]]:
        """(tokens, max_tokens) to acquire: the fake's charge, and no output on
        top, so the daemon reserves exactly the charge under either cost rule
        (`sum`: charge + 0; `max`: max(charge, 0))."""
        return rate_limit_charge({"messages": messages, "max_tokens": max_tokens}), None

    def call(self, messages: list[dict], max_tokens: int) -> tuple[Any, int, int]:
        """(headers, input tokens, output tokens) of a successful call."""
        answer = self.client.chat.completions.with_raw_response.create(
            model=MODELS["openai"], messages=messages, max_tokens=max_tokens
        )
        usage = answer.parse().usage
        return answer.headers, usage.prompt_tokens, usage.completion_tokens

    def refused_keeps(self, tokens: int, max_tokens: Optional[int]) -> tuple[int, int]:
        """(input, output) the provider kept of a refused call: OpenAI its charge."""
        return tokens, 0

    def wrapped(self, limiter: ratekeeper.Client, limit: str, interval: Optional[float]) -> Any:
        llm = ratekeeper.openai.wrap(self.client, limiter, limit=limit, feedback_interval=interval)

        def create(messages: list[dict], max_tokens: int) -> None:
            llm.chat.completions.create(
                model=MODELS["openai"], messages=messages, max_tokens=max_tokens
            )

        return create

    def close(self) -> None:
        self.client.close()


class AnthropicCalls:
    """Messages against the Anthropic-shaped strict fake: the system prompt apart."""

    def __init__(self, base_url: str) -> None:
        import anthropic

        self.client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=30)
        self.rate_limited = anthropic.RateLimitError

    @staticmethod
    def _split(messages: list[dict]) -> tuple[str, list[dict]]:
        return messages[0]["content"], messages[1:]

    def cost(self, messages: list[dict], max_tokens: int) -> tuple[int, Optional[int]]:
        """(input, output) to acquire: the fake's input count, and `max_tokens`."""
        system, rest = self._split(messages)
        return input_tokens({"system": system, "messages": rest}), max_tokens

    def call(self, messages: list[dict], max_tokens: int) -> tuple[Any, int, int]:
        system, rest = self._split(messages)
        answer = self.client.messages.with_raw_response.create(
            model=MODELS["anthropic"], max_tokens=max_tokens, system=system, messages=rest
        )
        usage = answer.parse().usage
        used_input = usage.input_tokens + (usage.cache_creation_input_tokens or 0)
        return answer.headers, used_input, usage.output_tokens

    def refused_keeps(self, tokens: int, max_tokens: Optional[int]) -> tuple[int, int]:
        """The strict fake keeps a refused call's input; its output estimate goes back."""
        return tokens, 0

    def wrapped(self, limiter: ratekeeper.Client, limit: str, interval: Optional[float]) -> Any:
        llm = ratekeeper.anthropic.wrap(
            self.client, limiter, limit=limit, feedback_interval=interval
        )

        def create(messages: list[dict], max_tokens: int) -> None:
            system, rest = self._split(messages)
            llm.messages.create(
                model=MODELS["anthropic"], max_tokens=max_tokens, system=system, messages=rest
            )

        return create

    def close(self) -> None:
        self.client.close()


CALLS = {"openai": OpenaiCalls, "anthropic": AnthropicCalls}


def call_by_token_count(
    limiter: ratekeeper.Client,
    calls: Any,
    limit: str,
    messages: list[dict],
    max_tokens: int,
    feedback: Optional[Sampler],
    count_rejected: bool,
    rejected_tokens: bool,
) -> bool:
    """One request acquired by the fake's own count; False if it was still refused
    after retries. With `feedback`, every 429 and a sample of the other answers
    are forwarded."""
    tokens, output = calls.cost(messages, max_tokens)
    for attempt in range(MAX_RETRIES + 1):
        lease = limiter.acquire(limit, tokens, max_tokens=output)
        try:
            headers, used_input, used_output = calls.call(messages, max_tokens)
        except calls.rate_limited as refused:
            if not count_rejected:
                lease.release()
            elif rejected_tokens:
                kept_input, kept_output = calls.refused_keeps(tokens, output)
                lease.report(input_tokens=kept_input, output_tokens=kept_output)
            else:  # only the request counted: the limit's settle rule does the rest
                lease.report(input_tokens=0, output_tokens=0)
            headers = refused.response.headers
            noted = lease.feedback(429, headers) if feedback is not None else None
            if noted is None or noted.paused_ms == 0:
                time.sleep(retry_delay(headers, attempt))
            continue
        except BaseException:
            lease.settle_as_reserved()  # it may have been processed
            raise
        lease.report(input_tokens=used_input, output_tokens=used_output)
        if feedback is not None and feedback.due():
            lease.feedback(200, headers)
        return True
    return False


def work(spec: dict, barrier: Any, results: Any) -> None:
    """A worker process: `spec["threads"]` threads send requests for `spec["seconds"]`.

    Starts when `barrier` lets every process and the harness through at
    once (the harness takes that moment as the run's start). Puts its tally
    on `results`.
    """
    limiter = ratekeeper.Client(spec["socket"], name=f"e2e-{spec['index']}")
    calls = CALLS[spec["provider"]](spec["base_url"])
    interval = FEEDBACK_INTERVAL if spec["feedback"] else None
    wrapped = calls.wrapped(limiter, spec["limit"], interval)
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
                        limiter,
                        calls,
                        spec["limit"],
                        messages,
                        max_tokens,
                        sampler,
                        spec["count_rejected"],
                        spec["rejected_tokens"],
                    )
                else:
                    wrapped(messages, max_tokens)
                    answered = True
                tally.add("completed" if answered else "gave_up")
            except ratekeeper.RateLimited as denied:
                tally.add("denied")
                time.sleep(max(0.0, min(denied.retry_after, deadline - time.monotonic())))
            except calls.rate_limited:  # the wrapper's retries ran out
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
    calls.close()
    results.put({**tally.counts, "error_samples": tally.errors})
