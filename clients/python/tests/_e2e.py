"""End-to-end runs of a fleet against a strict fake provider, and what they measured.

`run(scenario)` starts, all on loopback: a `redis-server` on a free port;
one or two `ratekeeper` daemons on it, each with its own socket, configured
by the shipped example config (`shipped_config`: for the OpenAI shape only
the first limit's rates replaced by the provider's; for the Anthropic shape
the example's commented Anthropic limit uncommented, with its rates
replaced; and a `[redis]` URL appended); the fake provider of the scenario's
shape as a process of its own (`_fake_openai.py` or the strict fake of
`_fake_anthropic.py`), so its CPU does not compete inside the workers; and
worker processes of several threads each (`_e2e_workers.work`), or with
`workers="node"` Node processes of as many concurrent calls through the
Node client's OpenAI wrapper (`_e2e_node`), split evenly across the
sidecars. Every process is stopped when the run ends, however it ends.

`analyse` reads the provider's record of every request it received, ours
and the foreign application's (`"foreign": true`): our 429s (every one,
retries included), and the steady-state utilization of the binding limit,
the provider's bucket that the workload exhausts (tokens, or for the
Anthropic shape input tokens, or requests):

- the steady window ends at the workers' deadline. Against a provider that
  enforces over a minute, it starts at the record after which the bucket was
  at its lowest during the first half of the run: by its lowest point the
  initial full bucket, a minute's worth, has been spent (the level falls
  while a burst is being spent, and rises again only if the limiter admits
  less than the provider refills); `burst_spent` checks that it had really
  come down, to at most a tenth of its capacity. Against a shorter window
  (one second) there is no minute-sized burst to spend: the bucket holds one
  window of the rate, and the steady window starts at the first record,
  from the workers' start, at which the level is down to a tenth of that
  capacity, the moment the fleet first reached the limit; if it never did
  in the first half, at the run's first record, so that the whole run
  counts. `burst_spent` then says only whether the limit was reached: a
  fleet that never reaches it has used less than the limit from the start,
  which the utilization measures;
- utilization = what the provider admitted of ours in the window (charged
  tokens, or requests) ÷ what remained for us in it: what the bucket
  refilled (its per-minute rate) less what the foreign application's
  requests cost it in the window (admitted ones, and refused ones as far as
  the provider counts rejections). Our own refused requests that the
  provider charged are not admitted, so they lower it. What the window drew
  from the level it started with (the level at the deadline being lower)
  is not counted, so nothing banked before the window inflates it, and a
  level that rises (capacity left unused) lowers it;
- the foreign share = what the provider admitted of the foreign
  application's requests in the window ÷ what the bucket refilled in it:
  the fraction of the limit the other application on the key got (it asks
  for `scenario.foreign` of it).

`run_large_request` is the small-limit case: one sidecar and the one-second
provider at 30k TPM, a warm-up call and then one call of 10k tokens, a third
of the minute's limit and 20 times what the provider's window holds.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import openai

import ratekeeper
from ratekeeper.openai import wrap

from _daemon import PACKAGE_ROOT, Daemon, RedisServer
from _e2e_node import NodeFleet
from _e2e_workers import MODELS, prose, work
from _fake_openai import RECORDS_PATH

#: The default config users start from.
SHIPPED_CONFIG = PACKAGE_ROOT.parent.parent / "examples" / "ratekeeper.toml"
TESTS = Path(__file__).resolve().parent
#: The standalone fake of each provider shape.
FAKE_PROVIDERS = {"openai": TESTS / "_fake_openai.py", "anthropic": TESTS / "_fake_anthropic.py"}
#: The lines around the example config's commented Anthropic limit.
ANTHROPIC_EXAMPLE = ("# --- anthropic example ---", "# --- end of anthropic example ---")
#: Burst settings a template's limit must not set: the runs measure the defaults.
BURSTS = ("burst_tokens", "burst_requests", "burst_input_tokens", "burst_output_tokens")
#: How long the harness waits for processes beyond the run itself.
GRACE = 120.0
#: The most the binding bucket may hold at the steady window's start, as a
#: fraction of the provider's capacity, for the limit to count as reached
#: (and, with a minute window, the initial burst as spent).
BURST_SPENT_LEVEL = 0.1
#: The provider's enforcement windows the runs use: OpenAI's and Anthropic's
#: per-minute figures, and the one second both say they may enforce them over.
MINUTE = 60.0
ONE_SECOND = 1.0


@dataclass(frozen=True)
class Scenario:
    """One run: the workload, how workers acquire, and the provider's limits."""

    workload: str  # "tokens": long prompts, the token limit binds; "requests": short ones
    acquire: str  # "tokens": by the charge, computed client-side; "messages": the wrapper
    sidecars: int = 1
    foreign: float = 0.0  # fraction of both limits another application asks for
    feedback: bool = True  # forward provider answers to the sidecar
    seconds: float = 40.0
    processes: int = 4
    threads: int = 8
    #: Tokens per minute; for the Anthropic shape the input tokens per minute.
    tokens_per_minute: int = 300_000
    requests_per_minute: int = 3_000
    latency_ms: tuple[float, float] = (20.0, 200.0)
    seed: int = 1
    #: The provider's shape ("openai" or "anthropic"), and the shipped
    #: config's limit for it: the first (OpenAI) one, or the Anthropic example.
    provider: str = "openai"
    window_seconds: float = MINUTE  # the provider's enforcement window
    count_rejected: bool = True  # whether the provider charges the requests it refuses
    rejected_tokens: bool = False  # and, if it does, their tokens too (else only the request)
    #: Anthropic's output tokens per minute; None: as many as input tokens, so
    #: that it never binds (the runs measure ITPM or RPM).
    output_tokens_per_minute: Optional[int] = None
    #: "python": `processes` Python processes of `threads` threads; "node":
    #: `processes` Node processes of `threads` concurrent calls, through the
    #: Node client's OpenAI wrapper (by messages, the OpenAI shape only).
    workers: str = "python"

    def __post_init__(self) -> None:
        if self.workers not in ("python", "node"):
            raise ValueError(f"workers must be 'python' or 'node', not {self.workers!r}")
        if self.workers == "node" and (self.acquire, self.provider) != ("messages", "openai"):
            raise ValueError("Node workers acquire by messages against the OpenAI shape only")

    @property
    def label(self) -> str:
        parts = [
            f"{self.workload}-bound",
            f"by {self.acquire}",
            f"{self.sidecars} sidecar{'s' if self.sidecars > 1 else ''}",
        ]
        if self.provider != "openai":
            parts.append(f"{self.provider} shape")
        if self.window_seconds != MINUTE:
            parts.append(f"{self.window_seconds:g} s window")
        if not self.count_rejected:
            parts.append("429s free")
        elif not self.rejected_tokens:
            parts.append("429s cost a request")
        if self.foreign:
            parts.append(f"{self.foreign:.0%} foreign")
        if self.workers != "python":
            parts.append(f"{self.processes}x{self.threads} {self.workers} workers")
        parts.append("feedback" if self.feedback else "no feedback")
        return ", ".join(parts)

    @property
    def otpm(self) -> int:
        return self.output_tokens_per_minute or self.tokens_per_minute

    @property
    def binding_bucket(self) -> str:
        """The provider's bucket the workload exhausts, as its records name it."""
        if self.workload == "requests":
            return "requests"
        return "input_tokens" if self.provider == "anthropic" else "tokens"

    @property
    def binding_per_minute(self) -> int:
        return self.requests_per_minute if self.workload == "requests" else self.tokens_per_minute

    @property
    def binding_capacity(self) -> float:
        """What the provider's binding bucket holds: one window of its rate."""
        return self.binding_per_minute * self.window_seconds / 60.0


@dataclass
class Outcome:
    """What a run measured; times are seconds from the workers' start."""

    scenario: Scenario
    requests: int  # every request of ours the provider received, retries included
    rate_limited: int  # every 429 it answered us
    first_429_at: Optional[float]
    rate_limited_at: list  # when each 429 was answered, sorted
    binding: str  # the limit the workload exhausts: "tokens" or "requests"
    window_start: float  # the steady window runs from here to the deadline
    level_at_window_start: float  # of the binding bucket, as a fraction of its capacity
    #: Binding units the provider admitted of ours in the window, less what
    #: the window drew from the level it started with.
    admitted: float
    available: float  # binding units that remained for us in the window
    workers: dict = field(default_factory=dict)  # the processes' tallies, added up
    error_samples: list = field(default_factory=list)
    #: (seconds from the start, units) of each rise of the binding bucket's
    #: floor in the window: capacity left unused for good (a correction that
    #: left the limiter further below the provider, or a fleet that fell
    #: behind), which lowers the utilization by that much.
    floor_rises: list = field(default_factory=list)
    capacity: float = 0.0  # what the provider's binding bucket holds
    refilled: float = 0.0  # binding units the provider's bucket refilled in the window
    #: The foreign application's binding units the provider admitted in the
    #: window, and what its requests were charged there (refused ones too).
    foreign_admitted: float = 0.0
    foreign_charged: float = 0.0
    foreign_requests: int = 0  # its requests from the workers' start, retries included
    foreign_rate_limited: int = 0  # the 429s it got from the workers' start

    @property
    def rate_limited_fraction(self) -> float:
        return self.rate_limited / self.requests if self.requests else 0.0

    @property
    def utilization(self) -> float:
        return self.admitted / self.available

    @property
    def foreign_share(self) -> float:
        """The fraction of the binding limit the foreign application got in the window."""
        return self.foreign_admitted / self.refilled if self.refilled else 0.0

    @property
    def burst_spent(self) -> bool:
        """Whether the window began with the provider's bucket down to a tenth of
        its capacity: the initial full bucket spent (a minute window), or the
        limit reached (a shorter one, which has no minute-sized burst)."""
        return self.level_at_window_start <= BURST_SPENT_LEVEL

    @property
    def paced(self) -> bool:
        """Whether the provider's bucket never came down from full in the first
        half: a limiter that paces at the rate from the start (a one-second
        enforcement window, the presets' default) against a minute provider,
        whose whole run is then steady."""
        return self.level_at_window_start >= 1.0 - BURST_SPENT_LEVEL

    def summary(self) -> str:
        spent = ""
        if self.paced and self.scenario.window_seconds >= MINUTE:
            spent = ", paced: the provider's burst left unspent"
        elif not self.burst_spent:
            minute = self.scenario.window_seconds >= MINUTE
            spent = ", BURST NOT SPENT" if minute else ", LIMIT NOT REACHED"
        errors = f"; first errors {self.error_samples}" if self.error_samples else ""
        rises = ", ".join(f"+{units:,.0f} at {at:.1f}s" for at, units in self.floor_rises[:5])
        rises = f"; floor rose in the window: {rises}" if rises else ""
        foreign = ""
        if self.scenario.foreign:
            foreign = (
                f"; foreign application {self.foreign_share:.2%} of the {self.binding} limit, "
                f"{self.foreign_rate_limited} 429s in {self.foreign_requests} requests"
            )
        return (
            f"{self.scenario.label}: {self.requests} requests, {self.rate_limited} 429s "
            f"({self.rate_limited_fraction:.2%}); {self.binding} utilization "
            f"{self.utilization:.2%} from t={self.window_start:.1f}s "
            f"(level {self.level_at_window_start:.1%} of {self.capacity:,.0f}{spent})"
            f"{foreign}{rises}; workers {self.workers}{errors}"
        )

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "label": self.scenario.label,
            "rate_limited_fraction": self.rate_limited_fraction,
            "utilization": self.utilization,
            "burst_spent": self.burst_spent,
            "foreign_share": self.foreign_share,
        }


def _set_rates(block: str, rates: dict, where: str) -> str:
    """`block` with each `key = number` of `rates` replaced; each must be there once,
    and no burst may be set: the runs measure the bursts the config defaults to."""
    for burst in BURSTS:
        if re.search(rf"^\s*{burst}\s*=", block, re.MULTILINE):
            raise ValueError(f"{where} sets {burst}: the runs measure the default burst")
    for key, value in rates.items():
        block, count = re.subn(
            rf"^(\s*{key}\s*=\s*)[0-9_]+", rf"\g<1>{value}", block, flags=re.MULTILINE
        )
        if count != 1:
            raise ValueError(f"{where} has {count} {key} lines, not one")
    return block


def _limit_name(block: str, where: str) -> str:
    name = re.search(r'^\s*name\s*=\s*"([^"]+)"', block, re.MULTILINE)
    if name is None:
        raise ValueError(f"{where} has no name")
    return name.group(1)


def shipped_config(
    template: str,
    tokens_per_minute: int,
    requests_per_minute: int,
    *,
    provider: str = "openai",
    output_tokens_per_minute: Optional[int] = None,
) -> tuple[str, str]:
    """`template` with one limit's rates set to the provider's: (config, the limit's name).

    For "openai" the first limit's `tokens_per_minute` and
    `requests_per_minute`; for "anthropic" the limit commented out between
    the `ANTHROPIC_EXAMPLE` lines, uncommented, with `tokens_per_minute` as
    its `input_tokens_per_minute` and `output_tokens_per_minute` (default:
    the same) and `requests_per_minute`. Nothing else changes. A limit that
    sets a burst is refused: the runs measure the config's defaults.
    """
    lines = template.splitlines(keepends=True)
    if provider == "anthropic":
        where = "the template's Anthropic example"
        try:
            begin = next(n for n, line in enumerate(lines) if line.strip() == ANTHROPIC_EXAMPLE[0])
            end = next(
                n for n in range(begin, len(lines)) if lines[n].strip() == ANTHROPIC_EXAMPLE[1]
            )
        except StopIteration:
            raise ValueError(f"the config template has no {ANTHROPIC_EXAMPLE} lines") from None
        block = "".join(re.sub(r"^# ?", "", line) for line in lines[begin + 1 : end])
        rates = {
            "input_tokens_per_minute": tokens_per_minute,
            "output_tokens_per_minute": output_tokens_per_minute or tokens_per_minute,
            "requests_per_minute": requests_per_minute,
        }
        block = _set_rates(block, rates, where)
        config = "".join(lines[: begin + 1]) + block + "".join(lines[end:])
        return config, _limit_name(block, where)
    if provider != "openai":
        raise ValueError(f"provider must be 'openai' or 'anthropic', not {provider!r}")
    where = "the template's first limit"
    starts = [number for number, line in enumerate(lines) if line.strip() == "[[limits]]"]
    if not starts:
        raise ValueError("the config template has no [[limits]]")
    end = next(
        (n for n in range(starts[0] + 1, len(lines)) if lines[n].lstrip().startswith("[")),
        len(lines),
    )
    block = "".join(lines[starts[0] : end])
    rates = {"tokens_per_minute": tokens_per_minute, "requests_per_minute": requests_per_minute}
    block = _set_rates(block, rates, where)
    config = "".join(lines[: starts[0]]) + block + "".join(lines[end:])
    return config, _limit_name(block, where)


def scenario_config(scenario: Scenario, template: Path = SHIPPED_CONFIG) -> tuple[str, str]:
    """The shipped config for `scenario`'s provider and limits: (config, limit name)."""
    return shipped_config(
        template.read_text(),
        scenario.tokens_per_minute,
        scenario.requests_per_minute,
        provider=scenario.provider,
        output_tokens_per_minute=scenario.output_tokens_per_minute,
    )


class ProviderProcess:
    """The scenario's fake provider run standalone on a free loopback port."""

    def __init__(self, scenario: Scenario, log_path: Path) -> None:
        if scenario.provider == "anthropic":
            limits = [
                f"--itpm={scenario.tokens_per_minute}",
                f"--otpm={scenario.otpm}",
                f"--rpm={scenario.requests_per_minute}",
            ]
        else:
            limits = [
                f"--tpm={scenario.tokens_per_minute}",
                f"--rpm={scenario.requests_per_minute}",
            ]
        command = [
            sys.executable,
            str(FAKE_PROVIDERS[scenario.provider]),
            *limits,
            f"--window-seconds={scenario.window_seconds:g}",
            "--count-rejected" if scenario.count_rejected else "--no-count-rejected",
            "--rejected-tokens" if scenario.rejected_tokens else "--no-rejected-tokens",
            f"--foreign={scenario.foreign}",
            f"--seed={scenario.seed}",
            "--latency-ms",
            *(str(bound) for bound in scenario.latency_ms),
        ]
        self.start(command, log_path)

    def start(self, command: list[str], log_path: Path) -> None:
        """Runs the fake's `command`, reading its `base_url` from its first line."""
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True
            )
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the fake provider exited:\n{log_path.read_text()}")
        self.base_url = json.loads(line)["base_url"]

    def document(self) -> dict:
        """`GET /fake/records`: the records and the buckets' figures."""
        url = self.base_url.rsplit("/v1", 1)[0] + RECORDS_PATH
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with no_proxy.open(url, timeout=30) as answer:
            return json.load(answer)

    def records(self) -> list[dict]:
        return self.document()["records"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process.stdout.close()


def run(scenario: Scenario, template: Path = SHIPPED_CONFIG) -> Outcome:
    """Runs `scenario` end to end with the config generated from `template`."""
    config, limit = scenario_config(scenario, template)
    scratch = Path(tempfile.mkdtemp(prefix="rk-e2e-"))
    redis = RedisServer()
    daemons: list[Daemon] = []
    provider: Optional[ProviderProcess] = None
    workers: list = []
    fleet: Optional[NodeFleet] = None
    try:
        for _ in range(scenario.sidecars):
            daemons.append(Daemon(config, redis_url=redis.url).start())
        provider = ProviderProcess(scenario, scratch / "provider.log")
        specs = [
            {
                "index": index,
                "socket": daemons[index % len(daemons)].socket,
                "provider": scenario.provider,
                "base_url": provider.base_url,
                "limit": limit,
                "workload": scenario.workload,
                "acquire": scenario.acquire,
                "feedback": scenario.feedback,
                "count_rejected": scenario.count_rejected,
                "rejected_tokens": scenario.rejected_tokens,
                "threads": scenario.threads,
                "seconds": scenario.seconds,
                "seed": scenario.seed * 100 + index,
            }
            for index in range(scenario.processes)
        ]
        if scenario.workers == "node":
            fleet = NodeFleet(specs, scratch)
            start = fleet.start(timeout=GRACE)
            tallies = fleet.tallies(timeout=scenario.seconds + GRACE)
        else:
            spawn = multiprocessing.get_context("spawn")
            barrier = spawn.Barrier(scenario.processes + 1)
            results = spawn.Queue()
            for spec in specs:
                process = spawn.Process(target=work, args=(spec, barrier, results))
                process.start()
                workers.append(process)
            barrier.wait(timeout=GRACE)
            start = time.monotonic()
            tallies = [results.get(timeout=scenario.seconds + GRACE) for _ in workers]
            for process in workers:
                process.join(timeout=GRACE)
        records = provider.records()
    except BaseException:
        for daemon in daemons:
            print(f"\n--- daemon log (tail) ---\n{daemon.log()[-4000:]}")
        if provider is not None:
            print(f"\n--- provider log ---\n{provider.log_path.read_text()[-4000:]}")
        if fleet is not None:
            print(fleet.logs())
        raise
    finally:
        for process in workers:
            if process.is_alive():
                process.kill()
                process.join()
        if fleet is not None:
            fleet.close()
        if provider is not None:
            provider.close()
        for daemon in daemons:
            daemon.close()
        redis.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return analyse(scenario, records, start, tallies)


def _window_opener(first_half: list[dict], level: str, scenario: Scenario) -> dict:
    """The record the steady window starts after (see the module's docs)."""
    lowest = min(first_half, key=lambda r: r[level])
    if scenario.window_seconds >= MINUTE:
        return lowest
    reached = BURST_SPENT_LEVEL * scenario.binding_capacity
    return next((r for r in first_half if r[level] <= reached), first_half[0])


def analyse(scenario: Scenario, records: list[dict], start: float, tallies: list[dict]) -> Outcome:
    """The outcome of a run from the provider's `records` (see the module's docs).

    `start` is the workers' start (time.monotonic(), the provider's clock too).
    """
    binding = "tokens" if scenario.workload == "tokens" else "requests"
    per_minute = scenario.binding_per_minute
    capacity = scenario.binding_capacity
    rate = per_minute / 60.0
    level = f"{scenario.binding_bucket}_left"
    end = start + scenario.seconds

    def units(record: dict) -> float:
        return record["charge"] if binding == "tokens" else 1

    def charged_units(record: dict) -> float:
        """What a request cost the binding bucket: a refusal only if counted, and
        its tokens only if the provider counts those too."""
        if record["status"] == 200:
            return units(record)
        if not record.get("charged", True):
            return 0.0
        return units(record) if binding == "requests" or scenario.rejected_tokens else 0.0

    ours = [r for r in records if not r.get("foreign")]
    first_half = [r for r in records if start <= r["arrival"] <= start + scenario.seconds / 2]
    if not any(not r.get("foreign") for r in first_half):
        raise AssertionError("the provider received no request of ours in the run's first half")
    opener = _window_opener(first_half, level, scenario)
    in_window = [r for r in records if opener["arrival"] < r["arrival"] <= end]
    admitted = sum(units(r) for r in in_window if not r.get("foreign") and r["status"] == 200)
    foreign = [r for r in in_window if r.get("foreign")]
    foreign_admitted = sum(units(r) for r in foreign if r["status"] == 200)
    foreign_charged = sum(charged_units(r) for r in foreign)
    last = in_window[-1] if in_window else opener
    level_at_end = min(capacity, last[level] + rate * (end - last["arrival"]))
    drawn_from_before = max(0.0, opener[level] - level_at_end)
    refilled = rate * (end - opener["arrival"])
    refused = [r["arrival"] - start for r in ours if r["status"] == 429]
    foreign_run = [r for r in records if r.get("foreign") and start <= r["arrival"] <= end]
    workers: dict = {}
    samples: list = []
    for tally in tallies:
        samples.extend(tally.pop("error_samples"))
        for key, value in tally.items():
            workers[key] = workers.get(key, 0) + value
    return Outcome(
        scenario=scenario,
        requests=len(ours),
        rate_limited=len(refused),
        first_429_at=min(refused) if refused else None,
        rate_limited_at=sorted(round(at, 2) for at in refused),
        binding=binding,
        window_start=opener["arrival"] - start,
        level_at_window_start=opener[level] / capacity,
        admitted=admitted - drawn_from_before,
        available=refilled - foreign_charged,
        workers=workers,
        error_samples=samples,
        floor_rises=floor_rises(in_window, level, start, per_minute),
        capacity=capacity,
        refilled=refilled,
        foreign_admitted=foreign_admitted,
        foreign_charged=foreign_charged,
        foreign_requests=len(foreign_run),
        foreign_rate_limited=sum(1 for r in foreign_run if r["status"] == 429),
    )


#: Bins of the floor: the least level the provider recorded in each.
FLOOR_BIN = 0.5
#: The least rise of the floor reported, as a fraction of the per-minute figure.
FLOOR_RISE = 0.003


def floor_rises(records: list[dict], level: str, start: float, per_minute: float) -> list:
    """Each rise of the floor of `level` between two bins of `records` that
    have any. At a limit kept busy the provider records each request at the
    limiter's floor; it rises when a correction leaves the limiter further
    below the provider, or when the fleet falls behind. Rises under
    `FLOOR_RISE` of the per-minute figure (0.18 s of refill) are not reported."""
    floors: dict = {}
    for record in records:
        at = int((record["arrival"] - start) / FLOOR_BIN)
        floors[at] = min(floors.get(at, record[level]), record[level])
    bins = sorted(floors)
    least = max(2.0, per_minute * FLOOR_RISE)
    return [
        (later * FLOOR_BIN, floors[later] - floors[earlier])
        for earlier, later in zip(bins, bins[1:])
        if floors[later] - floors[earlier] >= least
    ]


@dataclass(frozen=True)
class LargeRequest:
    """Issue 26's small-limit case: a warm-up call, then one far larger than the
    provider's one-second window holds, through the OpenAI wrapper by messages."""

    tokens_per_minute: int = 30_000
    requests_per_minute: int = 500
    warm_up_tokens: int = 1_000  # two seconds of refill: the large call has to wait
    large_tokens: int = 10_000
    window_seconds: float = ONE_SECOND
    latency_ms: tuple[float, float] = (20.0, 200.0)

    def scenario(self) -> Scenario:
        """The provider's side, as the harness takes it."""
        return Scenario(
            "tokens",
            "messages",
            tokens_per_minute=self.tokens_per_minute,
            requests_per_minute=self.requests_per_minute,
            latency_ms=self.latency_ms,
            window_seconds=self.window_seconds,
        )


@dataclass
class LargeOutcome:
    """What the provider recorded of the two calls, and how long the large one took."""

    case: LargeRequest
    records: list  # the provider's records of our requests
    large_seconds: float  # from the warm-up call's answer to the large call's
    error: Optional[str]  # what the large call raised, if it did

    @property
    def rate_limited(self) -> int:
        return sum(1 for r in self.records if r["status"] == 429)

    def admitted(self, charge: int) -> bool:
        return any(r["status"] == 200 and r["charge"] == charge for r in self.records)

    def summary(self) -> str:
        calls = ", ".join(f"{r['charge']:,} tokens: {r['status']}" for r in self.records)
        error = f"; raised {self.error}" if self.error else ""
        return (
            f"{self.case.tokens_per_minute:,} TPM, {self.case.window_seconds:g} s window: "
            f"{calls}; the large call answered {self.large_seconds:.2f} s after the warm-up{error}"
        )


def text_of(characters: int) -> str:
    """English prose of exactly `characters` characters."""
    text = ""
    for paragraph in prose():
        text += paragraph + "\n\n"
        if len(text) >= characters:
            return text[:characters]
    raise ValueError(f"the prose has fewer than {characters} characters")


def run_large_request(case: LargeRequest, template: Path = SHIPPED_CONFIG) -> LargeOutcome:
    """Runs `case`: one sidecar of the shipped config on Redis, the fake provider,
    and this process calling through `ratekeeper.openai.wrap` (its defaults)."""
    scenario = case.scenario()
    config, limit = scenario_config(scenario, template)
    scratch = Path(tempfile.mkdtemp(prefix="rk-e2e-"))
    redis = RedisServer()
    daemon: Optional[Daemon] = None
    provider: Optional[ProviderProcess] = None
    try:
        daemon = Daemon(config, redis_url=redis.url).start()
        provider = ProviderProcess(scenario, scratch / "provider.log")
        client = openai.OpenAI(base_url=provider.base_url, api_key="x", max_retries=0, timeout=30)
        error: Optional[str] = None
        with ratekeeper.Client(daemon.socket, name="e2e-large") as limiter:
            llm = wrap(client, limiter, limit=limit)

            def call(tokens: int) -> Any:
                # Only the user's text: the charge is exactly its characters / 4.
                messages = [{"role": "user", "content": text_of(tokens * 4)}]
                return llm.chat.completions.create(
                    model=MODELS["openai"], messages=messages, max_tokens=16
                )

            call(case.warm_up_tokens)
            warmed = time.monotonic()
            try:
                call(case.large_tokens)
            except Exception as raised:
                error = repr(raised)
            large_seconds = time.monotonic() - warmed
        client.close()
        records = [r for r in provider.records() if not r.get("foreign")]
    except BaseException:
        if daemon is not None:
            print(f"\n--- daemon log (tail) ---\n{daemon.log()[-4000:]}")
        raise
    finally:
        if provider is not None:
            provider.close()
        if daemon is not None:
            daemon.close()
        redis.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return LargeOutcome(case, records, large_seconds, error)
