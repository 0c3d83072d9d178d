"""Issue 30's end-to-end run of spend budgets, and the post-hoc limiter it is measured against.

`Stack.run(limiter)` drives one workload through one of two limiters, all real
processes on loopback: a `redis-server`, the fake OpenAI provider
(`_fake_openai.py`) as a process of its own, and 4 worker processes of 8
threads (`work`), 32 concurrent workers. The limiters:

- `"ratekeeper"`: two `ratekeeper` daemons on that Redis (`CONFIG`: a limit
  with `budget = { day = "1.00" }`, `tenant_budget = { day = "0.10" }`, its
  own `price`, and rates nobody reaches), half the workers on each. A worker
  acquires the call's prompt tokens and `max_tokens` with its tenant, calls
  the provider, and reports the usage with its cached tokens (what the
  OpenAI wrapper does, by token count rather than by messages: the daemon's
  tokenizer and the fake's four characters a token count differently, and a
  call that costs more than it reserved is a documented overrun, which this
  run is not about);
- `"post-hoc"`: what gateways do. Counters of micro-units in the same Redis,
  one for the limit and one per tenant: before a call a worker reads them and
  refuses if either is at its budget; after the answer it adds what the
  answer cost (`INCRBY`), as priced from its usage.

The fake provider is the judge: it prices each answer at the limit's prices
(`PRICES`, rounded up to a micro-unit per call as the daemon settles) the
moment it produces it, per tenant (the request's `user` field) and in total,
with each call's id (`x-e2e-call`). Spend only grows, so its totals at the
end are the most that was ever spent.

The workload (`draw_call`, seeded per worker thread): prompts of 800-1,600
tokens (the fake's own count, which the workers reserve exactly),
`max_tokens` of 100-250; the fake answers each with a completion of 50-100 %
of its `max_tokens` and reads 0-50 % of its prompt from the cache. Worker
`i` serves tenant `i % 8` (4 workers per tenant, across both sidecars and
all processes); while its tenant's budget lasts, one call in 16 goes without
a tenant (the limit's budget alone). A worker whose tenant's budget is spent
goes on with untenanted calls only, and stops at its first denial by the
limit's budget. So both kinds of budget bind, in turn: the tenants' $0.80
first (untenanted calls have spent about $0.05 by then), then the limit's
$1.00 with untenanted calls.

Both budgets are spent to at least 95 % before their first denial whatever
the interleaving. A call reserves at most `most_reserved()` (1,600 input
tokens at $0.40 and 250 output tokens at $1.60 per million: $0.00104). At a
budget's first denial, what the calls granted before it will not have spent
is what was left (less than the denied call's reservation) plus what the
calls then in flight reserved beyond their cost: for a tenant at most 3
other workers' calls, under 4 x $0.00104 = 4.2 % of $0.10; for the limit at
most 31, under 32 x $0.00104 = 3.3 % of $1.00. A grant counts as before a
denial when the worker had its answer before the denied worker asked: a
grant that overlaps the denial is not counted, which can only lower the
figure (by a whole call only if the denied acquire took longer to reach
Redis than a call takes, 50 ms at least; the runs measure 98.5-99.5 %).

The calendar day of the budgets starts at midnight of `[budgets] time_zone`:
`noon_zone` picks the whole-hour zone where it is about noon when the run
starts, so no run straddles a midnight.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import openai
import redis

import ratekeeper

from _daemon import Daemon, RedisServer, daemon_binary, noon_offset_hours, zone_name
from _e2e import FAKE_PROVIDERS, GRACE, ProviderProcess
from _e2e_workers import prose
from _fake_openai import CALL_HEADER, Prices, micros
from _fake_openai_endpoints import prompt_tokens

LIMIT = "budgeted"
MODEL = "gpt-4.1-mini"
#: Dollars per million tokens (gpt-4.1-mini's): input, cached input, output.
PRICES = ("0.40", "0.10", "1.60")
BUDGET = "1.00"
TENANT_BUDGET = "0.10"
TENANTS = 8
PROCESSES = 4
THREADS = 8
#: The fake's prompt tokens of a call, and its `max_tokens`.
PROMPT_TOKENS = (800, 1600)
MAX_TOKENS = (100, 250)
#: The fake's answers: completion as a share of `max_tokens`, cached share of the prompt.
COMPLETION_SHARE = (0.5, 1.0)
CACHED_SHARE = (0.0, 0.5)
#: The share of a worker's calls sent without a tenant while its tenant's budget lasts.
UNTENANTED_SHARE = 1 / 16
LATENCY_MS = (50.0, 150.0)
#: The longest a run's workers go on before giving up (a run takes 10-20 s).
MOST_SECONDS = 150.0
#: The bucket names of the two budgets' denials (`Denied` names the bucket).
LIMIT_BUDGET = "budget_day"
TENANT_BUDGET_BUCKET = "tenant_budget_day"
#: Unexpected errors kept per process (all are counted).
ERRORS_KEPT = 5
LIMITERS = ("ratekeeper", "post-hoc")

CONFIG = """
[budgets]
time_zone = "{zone}"

[[limits]]
name = "{limit}"
model = "{model}"
provider = "openai"
tokens_per_minute = 1000000000
price = {{ input = "{input}", cached_input = "{cached}", output = "{output}" }}
budget = {{ day = "{budget}" }}
tenant_budget = {{ day = "{tenant_budget}" }}

[metrics]
tenants = [{tenants}]
"""


def prices() -> Prices:
    return Prices.parse(*PRICES)


def most_reserved() -> int:
    """The largest reservation of a call, in micro-units (what a call can cost at most)."""
    price = prices()
    return price.cost(PROMPT_TOKENS[1], 0, 0) + price.cost(0, 0, MAX_TOKENS[1])


def noon_zone(now: Optional[datetime] = None) -> str:
    """The whole-hour zone (`Etc/GMT-N` is UTC+N) where it is 11:30-12:30 now."""
    return zone_name(noon_offset_hours(now))


def config(zone: str) -> str:
    input_price, cached, output = PRICES
    return CONFIG.format(
        zone=zone,
        limit=LIMIT,
        model=MODEL,
        input=input_price,
        cached=cached,
        output=output,
        budget=BUDGET,
        tenant_budget=TENANT_BUDGET,
        tenants=", ".join(f'"{name}"' for name in tenant_names()),
    )


def tenant_names() -> list[str]:
    return [f"tenant-{number}" for number in range(TENANTS)]


def draw_call(rng: random.Random) -> tuple[list[dict], int, int]:
    """(messages, the fake's prompt tokens, max_tokens) of one call: one user
    message of prose whose count (3 + 4 + a token per 4 characters) is drawn."""
    tokens = rng.randint(*PROMPT_TOKENS)
    characters = 4 * (tokens - 7)
    paragraphs = prose()
    index = rng.randrange(len(paragraphs))
    text = ""
    while len(text) < characters:
        text += paragraphs[index % len(paragraphs)] + "\n\n"
        index += 1
    messages = [{"role": "user", "content": text[:characters]}]
    assert prompt_tokens(messages) == tokens
    return messages, tokens, rng.randint(*MAX_TOKENS)


class Ratekeeper:
    """The sidecar: reserve before the call, report the usage after it."""

    def __init__(self, spec: dict) -> None:
        self.client = ratekeeper.Client(spec["socket"], name=f"budget-e2e-{spec['index']}")
        self.client.ping()

    def admit(self, tenant: Optional[str], prompt: int, max_tokens: int) -> Any:
        """The lease; raises `BudgetExhausted` for a budget's denial."""
        return self.client.acquire(LIMIT, prompt, max_tokens=max_tokens, tenant=tenant)

    def settle(self, lease: Any, tenant: Optional[str], usage: Any) -> None:
        cached = cached_tokens(usage)
        lease.report(
            input_tokens=usage.prompt_tokens - cached,
            output_tokens=usage.completion_tokens,
            cached_input_tokens=cached,
        )

    def failed(self, lease: Any) -> None:
        lease.settle_as_reserved()

    def close(self) -> None:
        self.client.close()


def cached_tokens(usage: Any) -> int:
    """The prompt tokens read from the cache (the fake leaves out details of none)."""
    details = usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details is not None else 0


def posthoc_key(tenant: Optional[str]) -> str:
    return f"posthoc:{LIMIT}:{tenant}" if tenant else f"posthoc:{LIMIT}"


class PostHoc:
    """A gateway's budget: refuse when spent >= budget, count each answer's cost after it."""

    def __init__(self, spec: dict) -> None:
        self.redis = redis.Redis.from_url(spec["redis_url"], socket_timeout=30)
        self.redis.ping()
        self.prices = prices()
        self.budget = micros(BUDGET)
        self.tenant_budget = micros(TENANT_BUDGET)

    def admit(self, tenant: Optional[str], prompt: int, max_tokens: int) -> Any:
        keys = [posthoc_key(None)] + ([posthoc_key(tenant)] if tenant else [])
        spent = [int(value or 0) for value in self.redis.mget(keys)]
        if tenant and spent[1] >= self.tenant_budget:
            raise ratekeeper.BudgetExhausted(3600.0, TENANT_BUDGET_BUCKET, LIMIT)
        if spent[0] >= self.budget:
            raise ratekeeper.BudgetExhausted(3600.0, LIMIT_BUDGET, LIMIT)
        return None

    def settle(self, admission: Any, tenant: Optional[str], usage: Any) -> None:
        cached = cached_tokens(usage)
        cost = self.prices.cost(usage.prompt_tokens - cached, cached, usage.completion_tokens)
        pipeline = self.redis.pipeline(transaction=False)
        pipeline.incrby(posthoc_key(None), cost)
        if tenant:
            pipeline.incrby(posthoc_key(tenant), cost)
        pipeline.execute()

    def failed(self, admission: Any) -> None:
        pass  # nothing was counted before the call

    def close(self) -> None:
        self.redis.close()


GATES = {"ratekeeper": Ratekeeper, "post-hoc": PostHoc}


class Log:
    """What one process's threads saw: grants, denials and errors, under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.grants: list = []  # (call id, tenant, monotonic time the grant was back)
        self.denials: list = []  # (monotonic time the acquire was sent, bucket, tenant)
        self.errors = 0
        self.error_samples: list[str] = []

    def error(self, error: BaseException) -> None:
        with self.lock:
            self.errors += 1
            if len(self.error_samples) < ERRORS_KEPT:
                self.error_samples.append(repr(error))


def work(spec: dict, barrier: Any, results: Any) -> None:
    """A worker process of `THREADS` threads; puts its `Log`'s figures on `results`."""
    gate = GATES[spec["limiter"]](spec)
    client = openai.OpenAI(base_url=spec["base_url"], api_key="x", max_retries=0, timeout=30)
    log = Log()
    prose()
    barrier.wait(timeout=GRACE)
    deadline = time.monotonic() + MOST_SECONDS

    def thread_body(worker: int) -> None:
        rng = random.Random(spec["seed"] * 1000 + worker)
        own_tenant: Optional[str] = tenant_names()[worker % TENANTS]
        for number in range(1_000_000):
            if time.monotonic() > deadline:
                return
            untenanted = rng.random() < UNTENANTED_SHARE
            tenant = None if untenanted else own_tenant
            messages, prompt, max_tokens = draw_call(rng)
            call = f"{worker}-{number}"
            asked = time.monotonic()
            try:
                admission = gate.admit(tenant, prompt, max_tokens)
            except ratekeeper.BudgetExhausted as denied:
                with log.lock:
                    log.denials.append((asked, denied.bucket, tenant))
                if denied.bucket != TENANT_BUDGET_BUCKET:
                    return  # the limit's budget is spent: this worker is done
                own_tenant = None  # its customer sees the upgrade page from now on
                continue
            except Exception as error:
                log.error(error)
                continue
            with log.lock:
                log.grants.append((call, tenant, time.monotonic()))
            try:
                answer = client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=max_tokens,
                    user=tenant or openai.omit,
                    extra_headers={CALL_HEADER: call},
                )
            except Exception as error:
                gate.failed(admission)
                log.error(error)
                continue
            try:
                gate.settle(admission, tenant, answer.usage)
            except Exception as error:
                log.error(error)

    def guarded(worker: int) -> None:
        try:
            thread_body(worker)
        except Exception as error:  # counted, so that a thread cannot die unseen
            log.error(error)

    threads = [
        threading.Thread(target=guarded, args=(spec["index"] * THREADS + number,))
        for number in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gate.close()
    client.close()
    results.put(
        {
            "grants": log.grants,
            "denials": log.denials,
            "errors": log.errors,
            "error_samples": log.error_samples,
            "end": time.monotonic(),
        }
    )


class BillingProvider(ProviderProcess):
    """The fake OpenAI provider billing at `PRICES`, with the workload's random answers."""

    def __init__(self, log_path: Path, seed: int) -> None:
        command = [
            sys.executable,
            str(FAKE_PROVIDERS["openai"]),
            "--tpm=1e12",
            "--rpm=1e12",
            "--prices",
            *PRICES,
            "--completion-share",
            *(str(share) for share in COMPLETION_SHARE),
            "--cached-share",
            *(str(share) for share in CACHED_SHARE),
            f"--seed={seed}",
            "--latency-ms",
            *(str(bound) for bound in LATENCY_MS),
        ]
        self.start(command, log_path)


@dataclass
class Budget:
    """One budget's figures from a run, in micro-units."""

    name: str  # "limit", or the tenant's name
    amount: int
    spent: int  # billed by the provider in the run: the most ever spent
    first_denial: Optional[float]  # seconds from the start, when the denied acquire was sent
    spent_before_denial: int  # billed for the calls granted before that

    @property
    def overshoot(self) -> int:
        return max(0, self.spent - self.amount)

    @property
    def before_denial_share(self) -> float:
        return self.spent_before_denial / self.amount


@dataclass
class Outcome:
    """What one run measured: the limit's budget, each tenant's, and the counts."""

    limiter: str
    limit: Budget
    tenants: list[Budget]
    calls: int  # answered by the provider
    denials: int
    seconds: float  # from the start to the last worker's end
    errors: int = 0
    error_samples: list = field(default_factory=list)
    #: The daemon's own account of the limit's budget after the run (ratekeeper only).
    daemon_budgets: list = field(default_factory=list)

    @property
    def worst_tenant(self) -> Budget:
        return max(self.tenants, key=lambda budget: (budget.overshoot, budget.spent))

    @property
    def least_before_denial(self) -> Budget:
        return min(self.tenants, key=lambda budget: budget.spent_before_denial)

    def summary(self) -> str:
        limit, worst = self.limit, self.worst_tenant
        return (
            f"{self.limiter}: {self.calls} calls, {self.denials} denials in {self.seconds:.1f} s; "
            f"limit spent {dollars(limit.spent)} of {dollars(limit.amount)} "
            f"(overshoot {dollars(limit.overshoot)}, {limit.before_denial_share:.2%} "
            f"before its first denial); tenants spent {dollars(self.least_spent())}-"
            f"{dollars(worst.spent)} of {dollars(worst.amount)} (worst overshoot "
            f"{dollars(worst.overshoot)}, least before a denial "
            f"{self.least_before_denial.before_denial_share:.2%}); "
            f"{self.errors} errors {self.error_samples}"
        )

    def least_spent(self) -> int:
        return min(budget.spent for budget in self.tenants)


def dollars(micro_units: int) -> str:
    return f"${micro_units / 1_000_000:.6f}"


def side_by_side(ours: Outcome, posthoc: Outcome) -> str:
    """A table of the two runs' figures, for the test's output and MEASUREMENTS.md."""
    rows = [
        ("calls answered", str(ours.calls), str(posthoc.calls)),
        (
            f"limit: most spent of ${BUDGET}",
            dollars(ours.limit.spent),
            dollars(posthoc.limit.spent),
        ),
        ("limit: overshoot", dollars(ours.limit.overshoot), dollars(posthoc.limit.overshoot)),
        (
            "limit: spent before first denial",
            f"{ours.limit.before_denial_share:.2%}",
            f"{posthoc.limit.before_denial_share:.2%}",
        ),
        (
            f"tenants: most spent of ${TENANT_BUDGET}",
            dollars(ours.worst_tenant.spent),
            dollars(posthoc.worst_tenant.spent),
        ),
        (
            "tenants: worst overshoot",
            dollars(ours.worst_tenant.overshoot),
            dollars(posthoc.worst_tenant.overshoot),
        ),
        (
            "tenants: total overshoot",
            dollars(sum(budget.overshoot for budget in ours.tenants)),
            dollars(sum(budget.overshoot for budget in posthoc.tenants)),
        ),
        (
            "tenants: least spent before a denial",
            f"{ours.least_before_denial.before_denial_share:.2%}",
            f"{posthoc.least_before_denial.before_denial_share:.2%}",
        ),
    ]
    width = max(len(row[0]) for row in rows)
    lines = [f"| {'':{width}} | ratekeeper | post-hoc |", f"| {'-' * width} | ---: | ---: |"]
    lines += [f"| {name:{width}} | {a} | {b} |" for name, a, b in rows]
    return "\n".join(lines)


def analyse(limiter: str, billing: dict, start: float, logs: list[dict]) -> Outcome:
    """The outcome of a run from the provider's bill and the workers' logs."""
    cost = {call["call"]: call["cost"] for call in billing["calls"]}
    grants = [grant for log in logs for grant in log["grants"]]
    denials = [denial for log in logs for denial in log["denials"]]
    ends = [log["end"] for log in logs]

    def budget(name: str, amount: int, spent: int, bucket: str, tenant: Optional[str]) -> Budget:
        times = [at for at, which, whose in denials if which == bucket and whose == tenant]
        first = min(times) if times else None
        before = sum(
            cost.get(call, 0)
            for call, whose, at in grants
            if (tenant is None or whose == tenant) and (first is None or at < first)
        )
        offset = None if first is None else first - start
        return Budget(name, amount, spent, offset, before)

    limit = budget("limit", micros(BUDGET), billing["total"], LIMIT_BUDGET, None)
    tenants = [
        budget(
            name,
            micros(TENANT_BUDGET),
            billing["tenants"].get(name, 0),
            TENANT_BUDGET_BUCKET,
            name,
        )
        for name in tenant_names()
    ]
    return Outcome(
        limiter=limiter,
        limit=limit,
        tenants=tenants,
        calls=len(billing["calls"]),
        denials=len(denials),
        seconds=max(ends) - start,
        errors=sum(log["errors"] for log in logs),
        error_samples=[sample for log in logs for sample in log["error_samples"]],
    )


def daemon_budgets(daemon: Daemon) -> list:
    """`ratekeeper status --json`'s budget rows of the limit."""
    answer = subprocess.run(
        [str(daemon_binary()), "status", "--json", "--socket", daemon.socket],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(answer.stdout).get("budgets", [])


class Stack:
    """Redis and the two sidecars on it, shared by the runs of a test."""

    def __init__(self) -> None:
        self.zone = noon_zone()
        self.redis = RedisServer()
        self.daemons: list[Daemon] = []
        try:
            for _ in range(2):
                self.daemons.append(Daemon(config(self.zone), redis_url=self.redis.url).start())
        except BaseException:
            self.close()
            raise

    def logs(self) -> str:
        return "".join(f"\n--- daemon log (tail) ---\n{d.log()[-4000:]}" for d in self.daemons)

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()
        self.redis.close()

    def run(self, limiter: str, seed: int = 1) -> Outcome:
        """One run of the workload through `limiter` ("ratekeeper" or "post-hoc")."""
        if limiter not in LIMITERS:
            raise ValueError(f"limiter must be one of {LIMITERS}, not {limiter!r}")
        scratch = Path(tempfile.mkdtemp(prefix="rk-budget-"))
        provider: Optional[BillingProvider] = None
        workers: list = []
        try:
            provider = BillingProvider(scratch / "provider.log", seed)
            spawn = multiprocessing.get_context("spawn")
            barrier = spawn.Barrier(PROCESSES + 1)
            results = spawn.Queue()
            for index in range(PROCESSES):
                spec = {
                    "index": index,
                    "limiter": limiter,
                    "socket": self.daemons[index % len(self.daemons)].socket,
                    "redis_url": self.redis.url,
                    "base_url": provider.base_url,
                    "seed": seed * 100 + index,
                }
                process = spawn.Process(target=work, args=(spec, barrier, results))
                process.start()
                workers.append(process)
            barrier.wait(timeout=GRACE)
            start = time.monotonic()
            logs = [results.get(timeout=MOST_SECONDS + GRACE) for _ in workers]
            for process in workers:
                process.join(timeout=GRACE)
            billing = provider.document()["billing"]
            outcome = analyse(limiter, billing, start, logs)
            if limiter == "ratekeeper":
                outcome.daemon_budgets = daemon_budgets(self.daemons[0])
        except BaseException:
            print(self.logs())
            if provider is not None:
                print(f"\n--- provider log ---\n{provider.log_path.read_text()[-4000:]}")
            raise
        finally:
            for process in workers:
                if process.is_alive():
                    process.kill()
                    process.join()
            if provider is not None:
                provider.close()
            shutil.rmtree(scratch, ignore_errors=True)
        return outcome


def main(argv: Optional[list[str]] = None) -> None:
    """Runs the pair (ratekeeper, then post-hoc) once per seed, each pair on a
    Redis and sidecars of its own, and prints their figures side by side."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args(argv)
    for seed in args.seeds:
        stack = Stack()
        try:
            ours = stack.run("ratekeeper", seed=seed)
            posthoc = stack.run("post-hoc", seed=seed)
        finally:
            stack.close()
        print(f"seed {seed}, budget time zone {stack.zone}")
        print(f"{ours.summary()}\n{posthoc.summary()}\n{side_by_side(ours, posthoc)}\n", flush=True)


if __name__ == "__main__":
    main()
