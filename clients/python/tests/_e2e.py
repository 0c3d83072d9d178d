"""End-to-end runs of a fleet against the strict fake provider, and what they measured.

`run(scenario)` starts, all on loopback: a `redis-server` on a free port;
one or two `ratekeeper` daemons on it, each with its own socket, configured
by the shipped example config (`shipped_config`: only the first limit's
rates replaced by the provider's, and a `[redis]` URL appended); the fake
provider (`_fake_openai.py`) as a process of its own, so its CPU does not
compete inside the workers; and worker processes of several threads each
(`_e2e_workers.work`), split evenly across the sidecars. Every process is
stopped when the run ends, however it ends.

`analyse` reads the provider's record of every request it received: the
429s (every one, retries included), and the steady-state utilization of the
binding limit, the provider's bucket that the workload exhausts:

- the steady window starts at the request after which that bucket was at
  its lowest during the first half of the run, and ends at the workers'
  deadline. By its lowest point the initial full bucket has been spent (the
  level falls while a burst is being spent, and rises again only if the
  limiter admits less than the provider refills); `burst_spent` checks
  that it had really come down, to at most a tenth of its capacity;
- utilization = what the provider admitted in the window (charged tokens,
  or requests) ÷ what refilled for us in it: the limit's rate, or with
  foreign traffic the `(1 - foreign)` share of it that remains. What the
  window drew from the level it started with (the level at the deadline
  being lower) is not counted, so nothing banked before the window inflates
  it, and a level that rises (capacity left unused) lowers it.
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
from typing import Optional

from _daemon import PACKAGE_ROOT, Daemon, RedisServer
from _e2e_workers import work
from _fake_openai import RECORDS_PATH

#: The default config users start from.
SHIPPED_CONFIG = PACKAGE_ROOT.parent.parent / "examples" / "ratekeeper.toml"
FAKE_PROVIDER = Path(__file__).resolve().parent / "_fake_openai.py"
#: How long the harness waits for processes beyond the run itself.
GRACE = 120.0
#: The most the binding bucket may hold at the steady window's start, as a
#: fraction of its capacity, for the initial burst to count as spent.
BURST_SPENT_LEVEL = 0.1


@dataclass(frozen=True)
class Scenario:
    """One run: the workload, how workers acquire, and the provider's limits."""

    workload: str  # "tokens": long prompts, the token limit binds; "requests": short ones
    acquire: str  # "tokens": by the charge, computed client-side; "messages": the wrapper
    sidecars: int = 1
    foreign: float = 0.0  # fraction of both limits another application uses
    feedback: bool = True  # forward provider answers to the sidecar
    seconds: float = 40.0
    processes: int = 4
    threads: int = 8
    tokens_per_minute: int = 300_000
    requests_per_minute: int = 3_000
    latency_ms: tuple[float, float] = (20.0, 200.0)
    seed: int = 1

    @property
    def label(self) -> str:
        parts = [
            f"{self.workload}-bound",
            f"by {self.acquire}",
            f"{self.sidecars} sidecar{'s' if self.sidecars > 1 else ''}",
        ]
        if self.foreign:
            parts.append(f"{self.foreign:.0%} foreign")
        parts.append("feedback" if self.feedback else "no feedback")
        return ", ".join(parts)


@dataclass
class Outcome:
    """What a run measured; times are seconds from the workers' start."""

    scenario: Scenario
    requests: int  # every request the provider received, retries included
    rate_limited: int  # every 429 it answered
    first_429_at: Optional[float]
    rate_limited_at: list  # when each 429 was answered, sorted
    binding: str  # the limit the workload exhausts: "tokens" or "requests"
    window_start: float  # the steady window runs from here to the deadline
    level_at_window_start: float  # of the binding bucket, as a fraction of its capacity
    #: Binding units the provider admitted in the window, less what the window
    #: drew from the level it started with.
    admitted: float
    available: float  # binding units that refilled for us in the window
    workers: dict = field(default_factory=dict)  # the processes' tallies, added up
    error_samples: list = field(default_factory=list)
    #: (seconds from the start, units) of each rise of the binding bucket's
    #: floor in the window: capacity left unused for good (a correction that
    #: left the limiter further below the provider, or a fleet that fell
    #: behind), which lowers the utilization by that much.
    floor_rises: list = field(default_factory=list)

    @property
    def rate_limited_fraction(self) -> float:
        return self.rate_limited / self.requests if self.requests else 0.0

    @property
    def utilization(self) -> float:
        return self.admitted / self.available

    @property
    def burst_spent(self) -> bool:
        """Whether the window began after the initial full bucket was spent."""
        return self.level_at_window_start <= BURST_SPENT_LEVEL

    def summary(self) -> str:
        spent = "" if self.burst_spent else ", BURST NOT SPENT"
        errors = f"; first errors {self.error_samples}" if self.error_samples else ""
        rises = ", ".join(f"+{units:,.0f} at {at:.1f}s" for at, units in self.floor_rises[:5])
        rises = f"; floor rose in the window: {rises}" if rises else ""
        return (
            f"{self.scenario.label}: {self.requests} requests, {self.rate_limited} 429s "
            f"({self.rate_limited_fraction:.2%}); {self.binding} utilization "
            f"{self.utilization:.2%} from t={self.window_start:.1f}s "
            f"(level {self.level_at_window_start:.1%}{spent}){rises}; "
            f"workers {self.workers}{errors}"
        )

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "label": self.scenario.label,
            "rate_limited_fraction": self.rate_limited_fraction,
            "utilization": self.utilization,
            "burst_spent": self.burst_spent,
        }


def shipped_config(
    template: str, tokens_per_minute: int, requests_per_minute: int
) -> tuple[str, str]:
    """`template` with its first limit's rates replaced: (config, the limit's name).

    Nothing else changes. A limit that sets its bursts explicitly is refused:
    they would no longer be the provider's one minute's worth.
    """
    lines = template.splitlines(keepends=True)
    starts = [number for number, line in enumerate(lines) if line.strip() == "[[limits]]"]
    if not starts:
        raise ValueError("the config template has no [[limits]]")
    end = next(
        (n for n in range(starts[0] + 1, len(lines)) if lines[n].lstrip().startswith("[")),
        len(lines),
    )
    block = "".join(lines[starts[0] : end])
    for burst in ("burst_tokens", "burst_requests"):
        if re.search(rf"^\s*{burst}\s*=", block, re.MULTILINE):
            raise ValueError(f"the template's first limit sets {burst}: set it from the rate")
    for key, value in (
        ("tokens_per_minute", tokens_per_minute),
        ("requests_per_minute", requests_per_minute),
    ):
        block, count = re.subn(
            rf"^(\s*{key}\s*=\s*)[0-9_]+", rf"\g<1>{value}", block, flags=re.MULTILINE
        )
        if count != 1:
            raise ValueError(f"the template's first limit has {count} {key} lines, not one")
    name = re.search(r'^\s*name\s*=\s*"([^"]+)"', block, re.MULTILINE)
    if name is None:
        raise ValueError("the template's first limit has no name")
    config = "".join(lines[: starts[0]]) + block + "".join(lines[end:])
    return config, name.group(1)


class ProviderProcess:
    """`_fake_openai.py` run standalone on a free loopback port."""

    def __init__(self, scenario: Scenario, log_path: Path) -> None:
        command = [
            sys.executable,
            str(FAKE_PROVIDER),
            f"--tpm={scenario.tokens_per_minute}",
            f"--rpm={scenario.requests_per_minute}",
            f"--foreign={scenario.foreign}",
            f"--seed={scenario.seed}",
            "--latency-ms",
            *(str(bound) for bound in scenario.latency_ms),
        ]
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True
            )
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the fake provider exited:\n{log_path.read_text()}")
        self.base_url = json.loads(line)["base_url"]

    def records(self) -> list[dict]:
        url = self.base_url.rsplit("/v1", 1)[0] + RECORDS_PATH
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with no_proxy.open(url, timeout=30) as answer:
            return json.load(answer)["records"]

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
    config, limit = shipped_config(
        template.read_text(), scenario.tokens_per_minute, scenario.requests_per_minute
    )
    scratch = Path(tempfile.mkdtemp(prefix="rk-e2e-"))
    redis = RedisServer()
    daemons: list[Daemon] = []
    provider: Optional[ProviderProcess] = None
    workers: list = []
    try:
        for _ in range(scenario.sidecars):
            daemons.append(Daemon(config, redis_url=redis.url).start())
        provider = ProviderProcess(scenario, scratch / "provider.log")
        spawn = multiprocessing.get_context("spawn")
        barrier = spawn.Barrier(scenario.processes + 1)
        results = spawn.Queue()
        for index in range(scenario.processes):
            spec = {
                "index": index,
                "socket": daemons[index % len(daemons)].socket,
                "base_url": provider.base_url,
                "limit": limit,
                "workload": scenario.workload,
                "acquire": scenario.acquire,
                "feedback": scenario.feedback,
                "threads": scenario.threads,
                "seconds": scenario.seconds,
                "seed": scenario.seed * 100 + index,
            }
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
        raise
    finally:
        for process in workers:
            if process.is_alive():
                process.kill()
                process.join()
        if provider is not None:
            provider.close()
        for daemon in daemons:
            daemon.close()
        redis.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return analyse(scenario, records, start, tallies)


def analyse(scenario: Scenario, records: list[dict], start: float, tallies: list[dict]) -> Outcome:
    """The outcome of a run from the provider's `records` (see the module's docs).

    `start` is the workers' start (time.monotonic(), the provider's clock too).
    """
    binding = "tokens" if scenario.workload == "tokens" else "requests"
    per_minute = scenario.tokens_per_minute if binding == "tokens" else scenario.requests_per_minute
    level = f"{binding}_left"
    end = start + scenario.seconds
    first_half = [r for r in records if start <= r["arrival"] <= start + scenario.seconds / 2]
    if not first_half:
        raise AssertionError("the provider received no request in the run's first half")
    lowest = min(first_half, key=lambda r: r[level])
    in_window = [r for r in records if lowest["arrival"] < r["arrival"] <= end]
    admitted = sum(
        (r["charge"] if binding == "tokens" else 1) for r in in_window if r["status"] == 200
    )
    refill = per_minute / 60.0 * (1.0 - scenario.foreign)
    last = in_window[-1] if in_window else lowest
    level_at_end = min(per_minute, last[level] + refill * (end - last["arrival"]))
    drawn_from_before = max(0.0, lowest[level] - level_at_end)
    refused = [r["arrival"] - start for r in records if r["status"] == 429]
    workers: dict = {}
    samples: list = []
    for tally in tallies:
        samples.extend(tally.pop("error_samples"))
        for key, value in tally.items():
            workers[key] = workers.get(key, 0) + value
    return Outcome(
        scenario=scenario,
        requests=len(records),
        rate_limited=len(refused),
        first_429_at=min(refused) if refused else None,
        rate_limited_at=sorted(round(at, 2) for at in refused),
        binding=binding,
        window_start=lowest["arrival"] - start,
        level_at_window_start=lowest[level] / per_minute,
        admitted=admitted - drawn_from_before,
        available=refill * (end - lowest["arrival"]),
        workers=workers,
        error_samples=samples,
        floor_rises=floor_rises(in_window, level, start, per_minute),
    )


#: Bins of the floor: the least level the provider recorded in each.
FLOOR_BIN = 0.5
#: The least rise of the floor reported, as a fraction of the capacity.
FLOOR_RISE = 0.003


def floor_rises(records: list[dict], level: str, start: float, capacity: int) -> list:
    """Each rise of the floor of `level` between two bins of `records` that
    have any. At a limit kept busy the provider records each request at the
    limiter's floor; it rises when a correction leaves the limiter further
    below the provider, or when the fleet falls behind."""
    floors: dict = {}
    for record in records:
        at = int((record["arrival"] - start) / FLOOR_BIN)
        floors[at] = min(floors.get(at, record[level]), record[level])
    bins = sorted(floors)
    least = max(2.0, capacity * FLOOR_RISE)
    return [
        (later * FLOOR_BIN, floors[later] - floors[earlier])
        for earlier, later in zip(bins, bins[1:])
        if floors[later] - floors[earlier] >= least
    ]
