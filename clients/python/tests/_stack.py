"""The user's stack end to end: the Gunicorn example and the Celery example together.

`run(StackRun(...))` starts, all on loopback: a `redis-server` (the shared
buckets in db 0, Celery's broker and results in db 1); two `ratekeeper`
daemons on it with the shipped default config (`_e2e.shipped_config`: only
the first limit's rates set to the provider's, and the Redis URL), one for
the web tier and one for the task tier, as on two hosts; the fake provider
as its own process (`_e2e.ProviderProcess`); and the examples as their
docstrings run them: `gunicorn -w 4 ... gunicorn_app:app` and `celery ...
-A celery_app worker --concurrency 8`, each on its own sidecar.

With `limiter="per-process"` the same commands run with the limiter users
had before instead (`_per_process.py`: a token bucket of the whole limit in
each of the 12 worker processes): Gunicorn's config and Celery's app module
are swapped for the ones in this directory, nothing else.

The load: at the start a minute of the limit's worth of tasks is queued (a
batch job's backlog), then HTTP requests (`POST /ask`, by `HTTP_CLIENTS`
paced client threads) and tasks each arrive at half of `load` times the
limit. Questions are English prose of 1,000-3,000 characters, so the token
limit binds. The provider keeps minute buckets (`window_seconds`); the
backlog would spend its initial burst quickly, but the shipped presets pace
from the start (a one-second enforcement window) and never do. The run is
measured from the moment the provider's bucket first holds at most a tenth
of its capacity, or, for a limiter that has sent for `PACED_AFTER` seconds
without drawing it below nine tenths, from its first request (the warm-up
before it is reported and its 429s counted), for `seconds` more.

The outcome is `_e2e.analyse`'s, from the provider's record of every
request: the 429s (all of them, warm-up included), and the utilization of
the binding (token) limit in the steady window (from the bucket's lowest
point in the measured run's first half to its end).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from celery import Celery

from _daemon import Daemon, RedisServer, free_port
from _e2e import (
    BURST_SPENT_LEVEL,
    MINUTE,
    SHIPPED_CONFIG,
    Outcome,
    ProviderProcess,
    Scenario,
    analyse,
    shipped_config,
)
from _e2e_workers import prose
from _examples import DOCUMENTED_PORT, Served, documented_commands, user_env

TESTS = Path(__file__).resolve().parent
#: HTTP client threads driving the Gunicorn app (each paced; at most one request in flight).
HTTP_CLIENTS = 8
#: Chars of a question: (shortest, longest).
QUESTION_CHARS = (1000, 3000)
#: The charge of an average question (1/4 token a character, above both
#: examples' max_tokens), to turn the token limit into requests a second.
MEAN_CHARGE = sum(QUESTION_CHARS) / 2 / 4
TASK = "celery_app.summarise"
#: How long servers may take to boot on a busy 2-core machine.
BOOT_TIMEOUT = 90.0
#: How long the fleet may take to spend the provider's initial burst.
WARM_UP_TIMEOUT = 120.0


@dataclass(frozen=True)
class StackRun:
    """One run of the stack: who limits, how hard it is driven, the provider's limits."""

    limiter: str = "ratekeeper"  # or "per-process"
    seconds: float = 60.0  # measured, after the warm-up
    load: float = 2.0  # offered requests a second ÷ what the token limit admits
    tokens_per_minute: int = 120_000
    requests_per_minute: int = 3_000
    latency_ms: tuple[float, float] = (20.0, 200.0)
    seed: int = 1
    #: The provider's enforcement window. A minute's: against one second's
    #: this stack used 86 % of the limit in one run (0 429s), below the 98 %
    #: goal, which issue 26's note records as not yet understood.
    window_seconds: float = MINUTE

    @property
    def admitted_per_second(self) -> float:
        return self.tokens_per_minute / 60.0 / MEAN_CHARGE

    @property
    def backlog(self) -> int:
        """Tasks queued at the start: a minute of the limit's worth."""
        return round(self.admitted_per_second * 60)

    def scenario(self) -> Scenario:
        """The `_e2e.Scenario` the analysis and the provider take."""
        return Scenario(
            "tokens",
            "messages",
            sidecars=2,
            seconds=self.seconds,
            tokens_per_minute=self.tokens_per_minute,
            requests_per_minute=self.requests_per_minute,
            latency_ms=self.latency_ms,
            seed=self.seed,
            window_seconds=self.window_seconds,
        )


def summary(run: StackRun, outcome: Outcome) -> str:
    spent = "" if outcome.burst_spent else ", BURST NOT SPENT"
    return (
        f"gunicorn -w 4 + celery --concurrency 8, {run.limiter} limiter, {run.load:g}x the limit "
        f"for {run.seconds:g}s: {outcome.requests} requests, {outcome.rate_limited} 429s "
        f"({outcome.rate_limited_fraction:.2%}); tokens utilization {outcome.utilization:.2%} "
        f"from t={outcome.window_start:.1f}s (level {outcome.level_at_window_start:.1%}{spent}); "
        f"{outcome.workers}"
    )


def question(rng: random.Random) -> str:
    """English prose of QUESTION_CHARS characters, cut at a word."""
    paragraphs = prose()
    wanted = rng.randint(*QUESTION_CHARS)
    index = rng.randrange(len(paragraphs))
    text = ""
    while len(text) < wanted:
        text += paragraphs[index % len(paragraphs)] + "\n\n"
        index += 1
    cut = text.rfind(" ", 0, wanted + 1)
    return text[: cut if cut > 0 else wanted]


class Tally:
    """What the drivers saw, under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []

    def add(self, what: str, error: Optional[str] = None) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1
            if error is not None and len(self.errors) < 5:
                self.errors.append(error)

    def snapshot(self) -> dict:
        with self.lock:
            return {**self.counts, "error_samples": list(self.errors)}


def paced(rate: float, stop: threading.Event, offset: float = 0.0):
    """Moments at `rate` a second from now + `offset` until `stop` is set: sleeps
    until each; one that is already late is due at once, without catching up."""
    interval = 1.0 / rate
    due = time.monotonic() + offset
    while not stop.is_set():
        if stop.wait(max(0.0, due - time.monotonic())):
            return
        yield
        due = max(due + interval, time.monotonic() - interval)


def drive_http(port: int, rate: float, stop: threading.Event, seed: int, tally: Tally):
    """One HTTP client thread: POST /ask at `rate` a second (at most one at a time)."""
    rng = random.Random(seed)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in paced(rate, stop, offset=rng.uniform(0, 1.0 / rate)):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/ask",
            data=json.dumps({"question": question(rng)}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        try:
            with opener.open(request, timeout=60) as answer:
                answer.read()
                status = answer.status
        except urllib.error.HTTPError as refused:
            status = refused.code
            refused.close()
        except OSError as error:
            if not stop.is_set():
                tally.add("http_errors", repr(error))
            continue
        if stop.is_set():
            return
        if status in (200, 503):
            tally.add(f"http_{status}")
        else:
            tally.add("http_errors", f"HTTP {status}")


def drive_tasks(
    sender: Celery, backlog: int, rate: float, stop: threading.Event, seed: int, tally: Tally
) -> None:
    """Queues `backlog` tasks at once, then one at `rate` a second."""
    rng = random.Random(seed)
    for _ in range(backlog):
        sender.send_task(TASK, args=[question(rng)], ignore_result=True)
        tally.add("tasks_queued")
    for _ in paced(rate, stop):
        sender.send_task(TASK, args=[question(rng)], ignore_result=True)
        tally.add("tasks_queued")


def commands(limiter: str, port: int) -> tuple[str, str]:
    """The Gunicorn and Celery commands: the examples' documented ones, on `port`;
    for the per-process limiter, with this directory's config and app module."""
    gunicorn = documented_commands("gunicorn_app")[1].replace(DOCUMENTED_PORT, str(port))
    celery = documented_commands("celery_app")[1]
    if limiter == "per-process":
        documented = (gunicorn, celery)
        gunicorn = gunicorn.replace(
            "-c clients/python/examples/gunicorn_conf.py", f"-c {TESTS / '_per_process.py'}"
        )
        celery = celery.replace("-A celery_app ", "-A _per_process_celery ")
        if gunicorn == documented[0] or celery == documented[1]:
            raise AssertionError(f"the documented commands changed: {documented}")
    elif limiter != "ratekeeper":
        raise ValueError(f"limiter must be 'ratekeeper' or 'per-process', not {limiter!r}")
    return gunicorn, celery


#: How long a limiter must have sent without drawing a minute provider's
#: bucket down before it counts as pacing from the start.
PACED_AFTER = 5.0


def burst_spent(provider: ProviderProcess, stack: StackRun, began: float) -> float:
    """When the measured run starts: the provider's first request against a
    window shorter than a minute, else when its token bucket first held at
    most a tenth of its capacity (the initial burst spent); waits for it,
    polling its records."""
    deadline = began + WARM_UP_TIMEOUT
    # A limiter that paces keeps a one-second bucket above a tenth (its
    # headroom): against a window shorter than a minute there is no burst to
    # spend, and the run is measured from its first request, as `_e2e` does.
    short_window = stack.window_seconds < MINUTE
    while True:
        records = provider.records()
        if short_window and records:
            return records[0]["arrival"]
        # A limiter that paces from the start (the presets' one-second
        # window) never spends a minute provider's burst: once it has sent
        # for a few seconds without drawing the bucket below nine tenths,
        # the whole run is steady.
        paced = [r for r in records if r["arrival"] >= began + PACED_AFTER]
        if paced and all(
            r["tokens_left"] >= (1 - BURST_SPENT_LEVEL) * stack.scenario().binding_capacity
            for r in records
        ):
            return records[0]["arrival"]
        low = [
            r["arrival"]
            for r in provider.records()
            if r["tokens_left"] <= BURST_SPENT_LEVEL * stack.scenario().binding_capacity
        ]
        if low:
            return min(low)
        if time.monotonic() > deadline:
            raise AssertionError(f"the burst was not spent within {WARM_UP_TIMEOUT}s")
        time.sleep(0.5)


def run(stack: StackRun, template: Path = SHIPPED_CONFIG) -> Outcome:
    """Runs `stack` end to end; every process is stopped however it ends."""
    scenario = stack.scenario()
    config, limit = shipped_config(
        template.read_text(), stack.tokens_per_minute, stack.requests_per_minute
    )
    if limit != "gpt-4o-mini":
        raise ValueError(f"the examples use the limit gpt-4o-mini; the template's first is {limit}")
    scratch = Path(tempfile.mkdtemp(prefix="rk-stack-"))
    redis = RedisServer()
    broker_url = redis.url.rsplit("/", 1)[0] + "/1"
    daemons: list[Daemon] = []
    provider: Optional[ProviderProcess] = None
    served: list[Served] = []
    sender: Optional[Celery] = None
    tally = Tally()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        daemons = [Daemon(config, redis_url=redis.url).start() for _ in range(2)]
        provider = ProviderProcess(scenario, scratch / "provider.log")
        port = free_port()
        gunicorn, celery = commands(stack.limiter, port)
        for command, daemon in ((gunicorn, daemons[0]), (celery, daemons[1])):
            env = user_env(daemon.socket, provider.base_url, broker_url)
            env["PER_PROCESS_TPM"] = str(stack.tokens_per_minute)
            env["PYTHONPATH"] = str(TESTS)
            served.append(Served(command, env))
        served[0].wait_for_log(r"Booting worker with pid", count=4, timeout=BOOT_TIMEOUT)
        served[1].wait_for_log(r"celery@\S+ ready\.", timeout=BOOT_TIMEOUT)
        sender = Celery("driver", broker=broker_url)
        sender.connection_for_write().ensure_connection(max_retries=3)
        prose()

        half = stack.load * stack.admitted_per_second / 2
        for index in range(HTTP_CLIENTS):
            seed = stack.seed * 100 + index
            threads.append(
                threading.Thread(
                    target=drive_http,
                    args=(port, half / HTTP_CLIENTS, stop, seed, tally),
                    daemon=True,
                )
            )
        threads.append(
            threading.Thread(
                target=drive_tasks,
                args=(sender, stack.backlog, half, stop, stack.seed, tally),
                daemon=True,
            )
        )
        began = time.monotonic()
        for thread in threads:
            thread.start()
        start = burst_spent(provider, stack, began)
        time.sleep(max(0.0, start + stack.seconds - time.monotonic()))
        records = provider.records()
        stop.set()
        counts = tally.snapshot()
        counts["warm_up_s"] = round(start - began, 1)
        failures = re.findall(rf"Task {TASK}\[\S+\] raised unexpected: (.*)", served[1].log())
        counts["task_failures"] = len(failures)
        counts["error_samples"] += failures[:3]
    except BaseException:
        for process in served:
            print(f"\n--- {process.command} (tail) ---\n{process.log()[-4000:]}")
        for daemon in daemons:
            print(f"\n--- daemon log (tail) ---\n{daemon.log()[-3000:]}")
        if provider is not None:
            print(f"\n--- provider log ---\n{provider.log_path.read_text()[-3000:]}")
        raise
    finally:
        stop.set()
        for process in served:
            process.close()
            process.remove()
        if sender is not None:
            sender.close()
        if provider is not None:
            provider.close()
        for daemon in daemons:
            daemon.close()
        redis.close()
        for thread in threads:
            thread.join(timeout=5)
        shutil.rmtree(scratch, ignore_errors=True)
    return analyse(scenario, records, start, [counts])
