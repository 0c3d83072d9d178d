"""The user's stack end to end: the Gunicorn and Celery examples together against
the strict fake OpenAI provider, through ratekeeper or a limiter in each process.

The machinery is the client tests' (`_stack.py`, analysed by `_e2e.py`), so
the test `test_user_stack_e2e.py` and this benchmark measure the same way;
see bench/stack/README.md.

    RATEKEEPER_BIN=target/debug/ratekeeper python bench/stack/bench.py \\
        --limiter ratekeeper --seconds 60 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

from _stack import StackRun, run, summary  # noqa: E402 (after the path is set)


def print_table(outcomes: list[dict]) -> None:
    """Outcomes written by `--json`, as a Markdown table."""
    print(
        "| limiter | load | warm-up + measured | requests | 429s | 429 rate "
        "| tokens utilization (window) | HTTP 200 / 503 / failed | tasks queued / failed |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for outcome in outcomes:
        stack, seen = outcome["stack"], outcome["workers"]
        window = f"{outcome['window_start']:.1f}-{stack['seconds']:.0f} s"
        if not outcome["burst_spent"]:
            window += f", burst not spent ({outcome['level_at_window_start']:.0%} left)"
        print(
            f"| {stack['limiter']} | {stack['load']:g}x | "
            f"{seen['warm_up_s']:.1f} + {stack['seconds']:g} s | {outcome['requests']} | "
            f"{outcome['rate_limited']} | {outcome['rate_limited_fraction']:.2%} | "
            f"{outcome['utilization']:.2%} ({window}) | "
            f"{seen.get('http_200', 0)} / {seen.get('http_503', 0)} / "
            f"{seen.get('http_errors', 0)} | "
            f"{seen.get('tasks_queued', 0)} / {seen.get('task_failures', 0)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limiter", choices=["ratekeeper", "per-process"], default="ratekeeper")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=2.0, help="offered load / the limit")
    parser.add_argument("--tpm", type=int, default=120_000, help="tokens per minute")
    parser.add_argument("--rpm", type=int, default=3_000, help="requests per minute")
    parser.add_argument("--latency-ms", type=float, nargs=2, default=(20.0, 200.0))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the outcome here")
    parser.add_argument(
        "--table", type=Path, nargs="+", metavar="JSON", help="print these outcomes as a table"
    )
    args = parser.parse_args()
    if args.table:
        print_table([json.loads(path.read_text()) for path in args.table])
        return
    stack = StackRun(
        limiter=args.limiter,
        seconds=args.seconds,
        load=args.load,
        tokens_per_minute=args.tpm,
        requests_per_minute=args.rpm,
        latency_ms=tuple(args.latency_ms),
        seed=args.seed,
    )
    outcome = run(stack)
    print(summary(stack, outcome), flush=True)
    if args.json:
        args.json.write_text(json.dumps({**outcome.to_json(), "stack": asdict(stack)}, indent=2))


if __name__ == "__main__":
    main()
