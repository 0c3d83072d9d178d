"""Issue 11's "done when": the shipped default config against a strict OpenAI-like provider.

Each case is one 40 s run of `_e2e.run`: a real `redis-server`, real
`ratekeeper` daemons started with `examples/ratekeeper.toml` (only the first
limit's rates set to the provider's, and the Redis URL), the fake provider
as its own process (continuous buckets, OpenAI's character-based charge, no
refunds, 20-200 ms latency), and 4 worker processes of 8 threads using the
Python client. The figures asserted are the issue's.

The matrix, within the CI budget of about 8 minutes on 2 cores: the three
factors of the zero-429 requirement (token- or request-bound workload, 1 or
2 sidecars, acquire by token count or by messages) are covered pairwise in 4
runs instead of all 8, so every pair of levels (e.g. by messages through 2
sidecars, request-bound by token count) is measured once; `bench/provider`
runs all 8. The two foreign-traffic runs differ only in forwarding.

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
    outcome = measured(Scenario(**FOREIGN, feedback=True))
    figures = (outcome.rate_limited_fraction < 0.005, outcome.utilization >= 0.95)
    assert figures == (True, True), outcome.summary()
