"""Issue 11's "done when": the shipped default config against a strict OpenAI-like provider.

Each case is one 40 s run (the foreign-traffic goal two, below) of
`_e2e.run`: a real `redis-server`, real `ratekeeper` daemons started with
`examples/ratekeeper.toml` (only the first limit's rates set to the
provider's, and the Redis URL), the fake provider as its own process
(continuous buckets, OpenAI's character-based charge, no refunds, 20-200 ms
latency), and 4 worker processes of 8 threads using the Python client. The
figures asserted are the issue's.

The matrix, within the CI budget of about 8 minutes on 2 cores: the three
factors of the zero-429 requirement (token- or request-bound workload, 1 or
2 sidecars, acquire by token count or by messages) are covered pairwise in 4
runs instead of all 8, so every pair of levels (e.g. by messages through 2
sidecars, request-bound by token count) is measured once; `bench/provider`
runs all 8. The foreign-traffic runs differ only in forwarding.

The foreign-traffic goal with feedback is measured over two runs (seeds 1
and 2): its 429s come as a handful in the seconds after the burst runs out,
when the workers queue up (0-2 a run, 0.8 on average over 12 runs; 0-8
and 1.8 before the drain's scatter followed the noise as it falls after the
burst), so in one run of about 920 requests one more of them could decide
the 0.5 % line. Two runs measure the same rate, edge included, with less
variance.

Request-bound runs use 1,200 requests a minute instead of the issue's 3,000:
a Python fleet on 2 cores sends 110-150 requests a second, so a 3,000-request
burst is still being spent after 40 s and no steady state is reached; at
1,200 it is spent in 10-15 s.
"""

from __future__ import annotations

import pytest

from _e2e import Scenario, run

#: The request limit of the request-bound runs (see the module's docs).
REQUEST_BOUND_RPM = 1200

ZERO_429_CASES = [
    Scenario("tokens", "tokens", sidecars=1),
    Scenario("tokens", "messages", sidecars=2),
    Scenario("requests", "tokens", sidecars=2, requests_per_minute=REQUEST_BOUND_RPM),
    Scenario("requests", "messages", sidecars=1, requests_per_minute=REQUEST_BOUND_RPM),
]
#: 20 % of both limits used by another application on the same API key.
FOREIGN = {"workload": "tokens", "acquire": "messages", "sidecars": 2, "foreign": 0.2}


def measured(scenario: Scenario):
    outcome = run(scenario)
    print(outcome.summary())
    assert outcome.workers["errors"] == 0, outcome.error_samples
    assert outcome.burst_spent, f"no steady state to measure: {outcome.summary()}"
    return outcome


@pytest.mark.parametrize("scenario", ZERO_429_CASES, ids=lambda scenario: scenario.label)
def test_the_default_config_uses_the_binding_limit_without_a_429(scenario):
    outcome = measured(scenario)
    assert (outcome.rate_limited, outcome.utilization >= 0.98) == (0, True), outcome.summary()


def test_foreign_traffic_draws_429s_when_nothing_is_forwarded():
    outcome = measured(Scenario(**FOREIGN, feedback=False))
    assert outcome.rate_limited > 0, outcome.summary()


def test_forwarded_headers_keep_429s_rare_under_foreign_traffic():
    outcomes = [measured(Scenario(**FOREIGN, feedback=True, seed=seed)) for seed in (1, 2)]
    summaries = "; ".join(outcome.summary() for outcome in outcomes)
    rate_limited = sum(outcome.rate_limited for outcome in outcomes)
    requests = sum(outcome.requests for outcome in outcomes)
    assert rate_limited < 0.005 * requests, f"{rate_limited} 429s in {requests}: {summaries}"
    assert all(outcome.utilization >= 0.95 for outcome in outcomes), summaries
