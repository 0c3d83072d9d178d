"""One end-to-end run of a worker fleet against a strict fake provider.

Starts a private `redis-server`, 1 or 2 `ratekeeper` daemons on it configured
from a config template (the shipped `examples/ratekeeper.toml` by default:
for the OpenAI shape only its first limit's rates are replaced by the
provider's, for the Anthropic shape its commented Anthropic limit is
uncommented with the provider's rates; a `[redis]` URL is appended), the
fake provider of that shape as its own process (`--window-seconds 1`: one
that enforces each per-minute limit over one second), and worker processes
of threads through the Python client; prints one line and writes the
outcome as JSON. The machinery is the client tests' (`_e2e.py`), so the test
`test_provider_e2e.py` and this benchmark measure the same way; see
bench/provider/README.md for the method.

    RATEKEEPER_BIN=target/debug/ratekeeper python bench/provider/bench.py \\
        --workload tokens --acquire messages --sidecars 2 --foreign 0.2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

from _e2e import SHIPPED_CONFIG, Scenario, run  # noqa: E402 (after the path is set)


def print_table(outcomes: list[dict]) -> None:
    """Outcomes written by `--json`, as a Markdown table."""
    print(
        "| case | TPM / RPM | window | requests | 429s | 429 rate | utilization (binding) "
        "| foreign share | steady window |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for outcome in outcomes:
        scenario = outcome["scenario"]
        limits = f"{scenario['tokens_per_minute'] // 1000}k / {scenario['requests_per_minute']}"
        minute = scenario.get("window_seconds", 60) >= 60
        window = f"{outcome['window_start']:.1f} to {scenario['seconds']:.0f} s"
        if not outcome["burst_spent"]:
            left = f"{outcome['level_at_window_start']:.0%} left"
            window += f", burst not spent ({left})" if minute else f", limit not reached ({left})"
        foreign = f"{outcome['foreign_share']:.2%}" if scenario["foreign"] else "-"
        print(
            f"| {outcome['label']} | {limits} | {scenario.get('window_seconds', 60):g} s | "
            f"{outcome['requests']} | {outcome['rate_limited']} | "
            f"{outcome['rate_limited_fraction']:.2%} | "
            f"{outcome['utilization']:.2%} ({outcome['binding']}) | {foreign} | {window} |"
        )
    if len(outcomes) > 1:
        requests = sum(outcome["requests"] for outcome in outcomes)
        rate_limited = sum(outcome["rate_limited"] for outcome in outcomes)
        utilization = [outcome["utilization"] for outcome in outcomes]
        print(
            f"\nAll {len(outcomes)} runs: {rate_limited} 429s in {requests} requests "
            f"({rate_limited / requests:.2%}); utilization {min(utilization):.2%} to "
            f"{max(utilization):.2%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["tokens", "requests"], default="tokens")
    parser.add_argument("--acquire", choices=["tokens", "messages"], default="tokens")
    parser.add_argument("--sidecars", type=int, choices=[1, 2], default=1)
    parser.add_argument(
        "--foreign",
        type=float,
        default=0.0,
        help="share of the limits another application asks for",
    )
    parser.add_argument("--feedback", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--provider",
        choices=["openai", "anthropic"],
        default="openai",
        help="the fake's shape, and the config's limit for it (default openai)",
    )
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=60.0,
        help="the provider enforces each per-minute limit over this many seconds (default 60)",
    )
    parser.add_argument(
        "--count-rejected",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the provider charges the requests it refuses (default on)",
    )
    parser.add_argument(
        "--rejected-tokens",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="and their tokens, not only the request (default off)",
    )
    parser.add_argument(
        "--tpm", type=int, default=300_000, help="tokens per minute (Anthropic: input tokens)"
    )
    parser.add_argument("--otpm", type=int, help="Anthropic's output tokens per minute (--tpm)")
    parser.add_argument("--rpm", type=int, default=3_000, help="requests per minute")
    parser.add_argument("--latency-ms", type=float, nargs=2, default=(20.0, 200.0))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--config", type=Path, default=SHIPPED_CONFIG, help="config template")
    parser.add_argument("--json", type=Path, help="write the outcome here")
    parser.add_argument(
        "--table", type=Path, nargs="+", metavar="JSON", help="print these outcomes as a table"
    )
    args = parser.parse_args()
    if args.table:
        print_table([json.loads(path.read_text()) for path in args.table])
        return
    scenario = Scenario(
        workload=args.workload,
        acquire=args.acquire,
        sidecars=args.sidecars,
        foreign=args.foreign,
        feedback=args.feedback,
        seconds=args.seconds,
        processes=args.processes,
        threads=args.threads,
        tokens_per_minute=args.tpm,
        requests_per_minute=args.rpm,
        latency_ms=tuple(args.latency_ms),
        seed=args.seed,
        provider=args.provider,
        window_seconds=args.window_seconds,
        count_rejected=args.count_rejected,
        rejected_tokens=args.rejected_tokens,
        output_tokens_per_minute=args.otpm,
    )
    outcome = run(scenario, args.config)
    print(outcome.summary(), flush=True)
    if args.json:
        args.json.write_text(json.dumps(outcome.to_json(), indent=2) + "\n")


if __name__ == "__main__":
    main()
