"""Issue 13's Redis goals: script calls per admitted acquire, and wait lateness at saturation.

Drives `ratekeeper-loadgen` against one sidecar on a private Redis (started by
bench/saturation/run.sh, which passes the ports and paths) in two steps, and
prints a Markdown table for each:

1. Ample capacity: a limit whose buckets no run can drain, with 1, 8, 32 and
   64 connections, one acquire of 1 token in flight on each. Admitted
   acquires per second, and Redis's script calls (EVAL, EVALSHA and their
   read-only and FCALL variants) and all commands (those the scripts run
   inside included, as `INFO commandstats` counts them) per admitted
   acquire, from `INFO commandstats` before and after each step.

2. Saturation: 32 connections on a fresh limit whose token bucket binds
   (burst B tokens, refill r tokens a ms, both read from
   `ratekeeper status --json`), with a max wait long enough that nothing is
   denied. From the grant log (each grant's arrival at its client, in ms
   since the Unix epoch to the µs), sorted by arrival: the k-th grant, with
   C_k tokens granted up to and including it, could arrive at the earliest
   at t0 + max(0, (C_k - B) / r); its lateness is its arrival less that.
   t0 is the bucket's own first use, read from Redis: the timestamp MONITOR
   gives the first script call naming the limit's keys, taken as Redis
   dispatches the call, before the script reads its clock. So t0 is never
   after the first use and lateness is never understated. A grant arriving
   before its earliest time would be an over-admission: the bucket's clock
   is Redis TIME in whole ms, so up to 1 ms early is clock granularity, more
   is flagged.

Standard library only; Redis is spoken to over a plain socket.

    python3 bench/saturation/saturation.py --port 6379 --socket "$XDG_RUNTIME_DIR/rk.sock" \\
        --ratekeeper target/release/ratekeeper --loadgen target/release/ratekeeper-loadgen
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The shared helpers of bench/, beside this script's directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from redis_commands import command_counts

#: What this script sends to Redis itself: not the sidecar's.
OWN_COMMANDS = frozenset({"info", "config", "monitor"})
#: Grants this much earlier than the ideal are within the bucket's clock
#: (Redis TIME floored to whole ms).
CLOCK_GRANULARITY_MS = 1.0
#: Issue 13's goals.
GOAL_SCRIPTS_PER_ADMITTED, GOAL_LATENESS_P99_MS = 0.25, 2.0


# ---------------------------------------------------------------------------
# Redis over a plain socket: INFO commandstats, and the first use from MONITOR
# ---------------------------------------------------------------------------


def command(*words: str) -> bytes:
    """One command in RESP."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def commandstats(port: int) -> dict[str, int]:
    """Calls per command since Redis started (subcommands as `config|get`)."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(command("INFO", "commandstats"))
        reader = connection.makefile("rb")
        header = reader.readline()
        if not header.startswith(b"$"):
            raise RuntimeError(f"INFO answered {header!r}")
        text = reader.read(int(header[1:]) + 2).decode()
    calls = {}
    for line in text.splitlines():
        name, _, fields = line.partition(":")
        if name.startswith("cmdstat_"):
            stats = dict(field.split("=") for field in fields.split(","))
            calls[name.removeprefix("cmdstat_")] = int(stats["calls"])
    return calls


class FirstUse(threading.Thread):
    """MONITORs Redis until the first command naming `tag` and keeps its
    timestamp (ms since the Unix epoch, µs resolution), then disconnects, so
    that Redis feeds the monitor for a moment only."""

    def __init__(self, port: int, tag: str) -> None:
        super().__init__(daemon=True)
        self.tag = tag.encode()
        self.at_ms: float | None = None
        self.line = ""
        self.error: Exception | None = None
        self.attached = threading.Event()
        self.connection = socket.create_connection(("127.0.0.1", port))

    def run(self) -> None:
        try:
            reader = self.connection.makefile("rb")
            self.connection.sendall(command("MONITOR"))
            if reader.readline() != b"+OK\r\n":
                raise RuntimeError("MONITOR was refused")
            self.attached.set()
            while True:
                line = reader.readline()
                if not line:
                    raise RuntimeError(f"MONITOR ended before any command named {self.tag!r}")
                if self.tag in line:
                    # "+1796125484.330766 [0 127.0.0.1:43152] "evalsha" ..."
                    seconds, micros = line[1:].split(b" ", 1)[0].split(b".")
                    self.at_ms = int(seconds) * 1000 + int(micros) / 1000
                    self.line = line.decode(errors="replace").strip()[:160]
                    return
        except Exception as failure:  # reported by the caller
            self.error = failure
        finally:
            self.attached.set()
            self.connection.close()


# ---------------------------------------------------------------------------
# The load
# ---------------------------------------------------------------------------


def loadgen(options, limit: str, connections: int, seconds: float, *extra: str) -> dict:
    """Runs ratekeeper-loadgen once and returns its JSON report."""
    arguments = [options.loadgen, limit, "--socket", options.socket]
    arguments += ["--connections", str(connections), "--seconds", str(seconds), *extra]
    done = subprocess.run(arguments, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def ample(options) -> list[dict]:
    """Step 1: the ample limit at each number of connections."""
    rows = []
    for connections in options.connections:
        before = commandstats(options.port)
        report = loadgen(options, options.ample_limit, connections, options.ample_seconds)
        scripts, commands = command_counts(before, commandstats(options.port), OWN_COMMANDS)
        granted = report["granted"]
        rows.append(
            {
                "connections": connections,
                "admitted_per_second": granted / report["seconds"],
                "p50_us": report["latency_p50_us"],
                "p99_us": report["latency_p99_us"],
                "denied": report["denied"] + report["errors"],
                "scripts_per_admitted": scripts / granted,
                "commands_per_admitted": commands / granted,
            }
        )
    return rows


def bucket_shape(options) -> dict[str, tuple[int, int]]:
    """Each bucket of the saturated limit: (capacity, refill a minute) in
    tokens, as the daemon reports them before the run (the capacity is the
    usable burst: `burst_headroom_ms` already taken off)."""
    arguments = ["status", "--socket", options.socket, "--limit", options.limit, "--json"]
    status = subprocess.run(
        [options.ratekeeper, *arguments],
        check=True,
        capture_output=True,
        text=True,
    )
    (limit,) = json.loads(status.stdout)["limits"]
    shapes = {}
    for bucket in limit["buckets"]:
        if bucket["level"] != bucket["capacity"]:
            raise SystemExit(f"bucket {bucket['name']} is not full before the run: {bucket}")
        shapes[bucket["name"]] = (bucket["capacity"], bucket["per_minute"])
    return shapes


def saturate(options, workdir: Path) -> dict:
    """Step 2: the saturated limit, with the grant log and the first use."""
    shapes = bucket_shape(options)
    first_use = FirstUse(options.port, "{l:" + options.limit + "}")
    first_use.start()
    first_use.attached.wait(timeout=10)
    if first_use.error:
        raise SystemExit(f"cannot watch for the first use: {first_use.error}")
    before = commandstats(options.port)
    log = workdir / "grants.log"
    extra = ("--max-wait", str(options.max_wait), "--grant-log", str(log))
    report = loadgen(
        options, options.limit, options.saturation_connections, options.seconds, *extra
    )
    scripts, commands = command_counts(before, commandstats(options.port), OWN_COMMANDS)
    first_use.join(timeout=10)
    if first_use.at_ms is None:
        raise SystemExit(f"no first use of {options.limit!r} seen: {first_use.error}")
    grants = []
    for line in log.read_text().splitlines():
        at, tokens = line.split()
        grants.append((float(at), int(tokens)))
    result = lateness(grants, first_use.at_ms, *shapes["tokens"])
    requests_capacity = shapes.get("requests", (math.inf, 0.0))[0]
    result.update(
        report=report,
        shapes=shapes,
        first_use_line=first_use.line,
        requests_bind=len(grants) > requests_capacity,
        scripts_per_admitted=scripts / report["granted"],
        commands_per_admitted=commands / report["granted"],
    )
    return result


# ---------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------


def percentile(values: list[float], quantile: float) -> float:
    """Nearest rank of sorted values, as ratekeeper-loadgen computes its own."""
    rank = min(len(values), max(1, math.ceil(len(values) * quantile)))
    return values[rank - 1]


def lateness(grants: list[tuple[float, int]], t0: float, burst: int, per_minute: int) -> dict:
    """Lateness (ms) of each grant against the earliest time the bucket
    (`burst` tokens, refilled at `per_minute` tokens a minute, first used at
    t0) allows it.

    Also splits it, as a diagnostic, at the time Redis's own arithmetic makes
    the grant due: the bucket counts whole ms from its first use (Redis TIME,
    floored) and rounds each wait up to a whole ms, so it makes the k-th
    grant due at floor(t0) + ceil((C_k - B) / r). What comes after that is
    the sidecar's holding back and the answer's way to the client."""
    rate = per_minute / 60_000  # tokens a ms
    grants = sorted(grants)
    cumulative, late, late_waited, after_due = 0, [], [], []
    ahead_tokens, worst = -math.inf, (-math.inf, 0.0)
    for arrival, tokens in grants:
        cumulative += tokens
        beyond = max(0, cumulative - burst)
        earliest = t0 + beyond / rate
        late.append(arrival - earliest)
        worst = max(worst, (arrival - earliest, arrival - t0))
        if beyond:
            late_waited.append(arrival - earliest)
        # In the bucket's units (60,000 a token): exact integer arithmetic.
        due = math.floor(t0) + -(-beyond * 60_000 // per_minute)
        after_due.append(arrival - due)
        # Tokens granted beyond what the bucket allowed by the arrival.
        ahead_tokens = max(ahead_tokens, cumulative - (burst + rate * (arrival - t0)))
    span = grants[-1][0] - t0
    summary = {
        "t0_ms": t0,
        "burst": burst,
        "rate_per_ms": rate,
        "grants": len(grants),
        "tokens": cumulative,
        "first_arrival_after_t0_ms": grants[0][0] - t0,
        "span_ms": span,
        "utilization": cumulative / (burst + rate * span),
        "early": sum(1 for x in late if x < 0),
        "early_beyond_clock": sum(1 for x in late if x < -CLOCK_GRANULARITY_MS),
        "most_early_ms": max(0.0, -min(late)),
        "most_tokens_ahead": ahead_tokens,
        "most_late_at_ms": worst[1],
        "redis_schedule_mean_ms": (sum(late) - sum(after_due)) / len(late),
    }
    for name, values in (("all", late), ("waited", late_waited), ("after_due", after_due)):
        values.sort()
        summary[name] = {
            "count": len(values),
            "p50_ms": percentile(values, 0.50) if values else math.nan,
            "p99_ms": percentile(values, 0.99) if values else math.nan,
            "max_ms": values[-1] if values else math.nan,
        }
    return summary


def verdict(value: float, goal: float) -> str:
    return "meets" if value <= goal else f"misses by {value - goal:.3g}"


def print_tables(rows: list[dict], saturated: dict | None, options) -> None:
    print(
        f"\nAmple capacity: limit {options.ample_limit!r}, 1-token acquires, "
        f"{options.ample_seconds:g} s per step, one acquire in flight per connection."
    )
    print(
        "\n| connections | admitted/s | p50 µs | p99 µs | denied + errors "
        "| script calls / admitted | Redis commands / admitted |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['connections']} | {row['admitted_per_second']:,.0f} | {row['p50_us']:,} "
            f"| {row['p99_us']:,} | {row['denied']} | {row['scripts_per_admitted']:.3f} "
            f"| {row['commands_per_admitted']:.2f} |"
        )
    for row in rows:
        if row["connections"] == 32:
            print(
                f"\nGoal: script calls per admitted <= {GOAL_SCRIPTS_PER_ADMITTED} at 32 "
                f"connections: {row['scripts_per_admitted']:.3f}, "
                f"{verdict(row['scripts_per_admitted'], GOAL_SCRIPTS_PER_ADMITTED)}."
            )
    if not saturated:
        return
    report = saturated["report"]
    burst, rate = saturated["burst"], saturated["rate_per_ms"]
    print(
        f"\nSaturation: limit {options.limit!r}, {options.saturation_connections} connections, "
        f"1-token acquires, max wait {options.max_wait} ms, {report['seconds']:.1f} s; "
        f"token bucket burst {burst:g}, refill {rate:g} tokens/ms "
        f"({rate * 1000:,.0f}/s); t0 = the first script call naming the limit, from MONITOR."
    )
    print("\n| grants | lateness p50 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, label in (
        ("all", "all"),
        ("waited", "past the burst"),
        ("after_due", "all, after Redis's due time (diagnostic)"),
    ):
        stats = saturated[name]
        print(
            f"| {label} ({stats['count']:,}) | {stats['p50_ms']:.3f} | {stats['p99_ms']:.3f} "
            f"| {stats['max_ms']:.3f} |"
        )
    print(
        "\n| admitted/s | utilization | early, within 1 ms | early by more | denied + errors "
        "| script calls / admitted | Redis commands / admitted |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {report['granted'] / report['seconds']:,.0f} | {saturated['utilization']:.4f} "
        f"| {saturated['early'] - saturated['early_beyond_clock']} "
        f"| {saturated['early_beyond_clock']} | {report['denied'] + report['errors']} "
        f"| {saturated['scripts_per_admitted']:.3f} | {saturated['commands_per_admitted']:.2f} |"
    )
    p99 = saturated["all"]["p99_ms"]
    print(
        f"\nGoal: lateness p99 <= {GOAL_LATENESS_P99_MS} ms at saturation: {p99:.3f} ms, "
        f"{verdict(p99, GOAL_LATENESS_P99_MS)}. The grant most late arrived "
        f"{saturated['most_late_at_ms']:,.0f} ms after t0, the first one "
        f"{saturated['first_arrival_after_t0_ms']:.3f} ms after it. Redis's whole-ms "
        f"schedule accounts for {saturated['redis_schedule_mean_ms']:.3f} ms of the mean "
        f"lateness. At most {saturated['most_early_ms']:.3f} ms early, at most "
        f"{max(0.0, saturated['most_tokens_ahead']):.2f} tokens ahead of burst + rate * time."
    )
    if saturated["early_beyond_clock"]:
        print(
            f"\n**OVER-ADMISSION: {saturated['early_beyond_clock']} grants arrived more than "
            f"{CLOCK_GRANULARITY_MS:g} ms before the bucket allowed them.**"
        )
    if report["denied"] or report["errors"]:
        print("\n**Some acquires were denied or failed: the max wait is too short.**")
    if saturated["requests_bind"]:
        print("\n**The requests bucket held fewer than the grants: it may have bound.**")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the private Redis's port")
    parser.add_argument("--socket", required=True, help="the sidecar's socket")
    parser.add_argument("--ratekeeper", required=True, help="the daemon binary (for status)")
    parser.add_argument("--loadgen", required=True, help="ratekeeper-loadgen")
    parser.add_argument("--ample-limit", default="bench", help="a limit no run can drain")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--ample-seconds", type=float, default=5.0, help="per ample step")
    parser.add_argument("--limit", default="saturated", help="the limit to saturate")
    parser.add_argument("--saturation-connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="of saturation")
    parser.add_argument("--max-wait", type=int, default=2000, help="ms, of each acquire")
    parser.add_argument("--keep", type=Path, help="keep the grant log and results.json here")
    parser.add_argument("--skip-ample", action="store_true", help="only the saturation step")
    options = parser.parse_args()

    rows = [] if options.skip_ample else ample(options)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = options.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        saturated = saturate(options, workdir)
        if options.keep:
            results = {"ample": rows, "saturation": saturated}
            (workdir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_tables(rows, saturated, options)
    if saturated["early_beyond_clock"]:
        sys.exit(3)


if __name__ == "__main__":
    main()
