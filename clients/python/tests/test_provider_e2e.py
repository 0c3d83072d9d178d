"""Issues 11's and 26's "done when": the shipped default config against strict providers.

Each case is one run of `_e2e.run`: a real `redis-server`, real `ratekeeper`
daemons started with `examples/ratekeeper.toml` (only the rates of the limit
for the provider set to the provider's, and the Redis URL), the fake
provider as its own process (token buckets, the provider's own counting,
rejected requests counted as OpenAI documents, 20-200 ms latency), and 4
worker processes of 8 threads using the Python client. The bounds on 429s
asserted are the issues'; their utilization figures are measured by
`bench/provider/run.sh`, and the runs here hold a floor that no machine's
load explains (`LEAST_UTILIZATION`).

Against the minute provider (buckets holding a minute's worth, issue 11),
40 s runs. The matrix, within the CI budget: the three factors of the
zero-429 requirement (token- or request-bound workload, 1 or 2 sidecars,
acquire by token count or by messages) are covered pairwise in 4 runs
instead of all 8, so every pair of levels (e.g. by messages through 2
sidecars, request-bound by token count) is measured once; `bench/provider`
runs all 8. The foreign application is a real competitor inside the fake,
asking for 20 % of both limits (`_fake_openai.ForeignApplication`).

Without forwarding, the other application must still get at least 18 % of
the TPM (issue 26): the fleet must not storm, each retry its own acquire.
The fake counts a rejected request as a request, not its tokens
(`_fake_openai`'s docs say why: a provider that also charged the tokens of
every refusal has no steady state once a key is asked for more than its
limit).

The foreign-traffic cases run against the one-second provider: against a
minute's bucket a fleet that paces at the rate (the presets' default)
leaves the provider's burst unspent for longer than a run, which hides the
competition. With feedback, the 429s are counted over four runs (seeds 1
to 4, about 780 requests), since in one run of a few hundred requests one
more 429 could decide a line. The issue's goal, fewer than 0.5 %, is a
benchmark's figure (0.16 % over sixteen runs, `bench/provider`): four runs
at that rate stay under 0.5 % only most of the time. The test holds
1.25 %, which the rule before (1.5 % over the same runs) broke three runs
in four.

Request-bound runs use 1,200 requests a minute instead of the issue's 3,000:
a Python fleet on 2 cores sends 110-150 requests a second, so a 3,000-request
burst is still being spent after 40 s and no steady state is reached; at
1,200 it is spent in 10-15 s.

Against the one-second provider (issue 26: both providers say a per-minute
limit may be enforced over a second, so the buckets hold one second of the
rate), 20 s runs: there is no minute-sized burst to spend, the fleet
reaches the limit within the first second, so the steady window is nearly
the whole run (`_e2e`'s docs). The OpenAI preset runs against the
OpenAI-shaped fake, the Anthropic preset (the example config's Anthropic
limit) against the Anthropic-shaped one (RPM, ITPM, OTPM). With the
provider shape as a fourth factor, the pairwise matrix takes 5 runs. At most
0.1 % of the requests may be answered 429: in runs of 170-400 requests that
is none. Then the small-limit case: at 30k TPM one call of 10k tokens, 20
times what the one-second window holds, is granted after its wait and gets
no 429.

Every wait in the harness has a timeout of its own (`_e2e.GRACE`, the
workers' barrier, HTTP timeouts), so a stuck run fails instead of hanging.
"""

from __future__ import annotations

import pytest

from _e2e import MINUTE, ONE_SECOND, LargeRequest, Scenario, run, run_large_request

#: Minutes of fleets against the fake provider: `scripts/test --quick` skips them.
pytestmark = pytest.mark.slow

#: The request limit of the request-bound runs (see the module's docs).
REQUEST_BOUND_RPM = 1200
#: The length of the runs against the one-second provider (see the module's docs).
ONE_SECOND_RUN = 20.0
#: Issue 26's bound on 429s against the one-second provider.
MOST_429S = 0.001
#: The least utilization a run must show on any machine, however busy. The
#: figures the issues ask for (>= 98 %, >= 99 % against minute buckets) are
#: measured by `bench/provider/run.sh`, where they are reported with the
#: command: on an idle machine these runs use 99.3-100 % of the limit, but
#: the fleet is 4 Python processes of 8 threads and a Python fake provider
#: on 2 cores, and when another process takes the cores the fleet itself
#: falls behind (96.05 % and 97.68 % in a CI run; 89.6 % with a CPU hog on
#: both cores, the workers' own requests waiting for CPU, in an earlier
#: build; ten rounds beside that hog held 99.49 % at the lowest on
#: 2026-12-07, `bench/provider/README.md`). A utilization
#: figure that depends on the machine is a benchmark's, not a test's
#: (issue 28). What this bound still catches is a limiter that holds a
#: fifth of the limit back: issue 26's misread headers used 60.9 % of it.
LEAST_UTILIZATION = 0.8
#: The least share of the TPM the other application (asking for 20 %) must get.
FOREIGN_LEAST_SHARE = 0.18
#: The feedback runs under foreign traffic, one per seed, counted together
#: (about 780 requests), so that one lucky run cannot decide it either way.
FOREIGN_SEEDS = (1, 2, 3, 4)
#: The most 429s the four runs may have between them, as a share of their
#: requests (10 or more of about 780 fail): 0.16 % over sixteen runs today,
#: about 1.3 expected here, so 10 happen about once in a million runs (once
#: in a thousand at 0.37 %, the most that 5 in 3,120 makes likely); where
#: postponing the waiting reservations only while the provider's count was
#: below half its bucket got 1.5 % (about 12: it fails three times in four),
#: and forwarding without exact placement 7.9-9.8 %.
FOREIGN_MOST_429S = 0.0125

ZERO_429_CASES = [
    Scenario("tokens", "tokens", sidecars=1),
    Scenario("tokens", "messages", sidecars=2),
    Scenario("requests", "tokens", sidecars=2, requests_per_minute=REQUEST_BOUND_RPM),
    Scenario("requests", "messages", sidecars=1, requests_per_minute=REQUEST_BOUND_RPM),
]
#: 20 % of both limits used by another application on the same API key,
#: against the one-second provider: against a minute's bucket a fleet that
#: paces at the rate (the presets' default) leaves the provider's burst
#: unspent, which hides the competition for longer than a run.
FOREIGN = {
    "workload": "tokens",
    "acquire": "messages",
    "sidecars": 2,
    "foreign": 0.2,
    "window_seconds": ONE_SECOND,
    "seconds": ONE_SECOND_RUN,
}


def one_second(workload: str, acquire: str, sidecars: int, provider: str) -> Scenario:
    rpm = REQUEST_BOUND_RPM if workload == "requests" else 3_000
    return Scenario(
        workload,
        acquire,
        sidecars=sidecars,
        seconds=ONE_SECOND_RUN,
        requests_per_minute=rpm,
        provider=provider,
        window_seconds=ONE_SECOND,
    )


#: Workload x acquire x sidecars x provider shape, every pair of levels once.
ONE_SECOND_CASES = [
    one_second("tokens", "tokens", 1, "openai"),
    one_second("tokens", "messages", 2, "anthropic"),
    one_second("requests", "tokens", 2, "anthropic"),
    one_second("requests", "messages", 1, "anthropic"),
    one_second("requests", "messages", 2, "openai"),
]


def measured(scenario: Scenario):
    outcome = run(scenario)
    print(outcome.summary())
    assert outcome.workers["errors"] == 0, outcome.error_samples
    # Against a minute provider a limiter that bursts must have spent the
    # initial minute's worth for a steady state to exist; one that paces at
    # the rate from the start (the presets' one-second window) never draws
    # the provider's bucket down, and its whole run is steady. The
    # one-second provider has no such burst: a fleet that never reaches its
    # limit is measured from the start.
    if scenario.window_seconds >= MINUTE:
        steady = outcome.burst_spent or outcome.paced
        assert steady, f"no steady state to measure: {outcome.summary()}"
    return outcome


@pytest.mark.parametrize("scenario", ZERO_429_CASES, ids=lambda scenario: scenario.label)
def test_the_default_config_uses_the_binding_limit_without_a_429(scenario):
    outcome = measured(scenario)
    assert (outcome.rate_limited, outcome.utilization >= LEAST_UTILIZATION) == (0, True), (
        outcome.summary()
    )


def test_without_forwarding_foreign_traffic_draws_429s_and_still_gets_its_share():
    outcome = measured(Scenario(**FOREIGN, feedback=False))
    assert outcome.rate_limited > 0, outcome.summary()
    assert outcome.foreign_share >= FOREIGN_LEAST_SHARE, outcome.summary()


@pytest.fixture(scope="module")
def forwarded_under_foreign_traffic():
    """The feedback runs under foreign traffic, one per seed, shared by the
    two tests below."""
    return [measured(Scenario(**FOREIGN, feedback=True, seed=seed)) for seed in FOREIGN_SEEDS]


def test_forwarded_headers_keep_429s_rare_and_the_other_applications_share(
    forwarded_under_foreign_traffic,
):
    outcomes = forwarded_under_foreign_traffic
    summaries = "; ".join(outcome.summary() for outcome in outcomes)
    rate_limited = sum(outcome.rate_limited for outcome in outcomes)
    requests = sum(outcome.requests for outcome in outcomes)
    assert rate_limited < FOREIGN_MOST_429S * requests, (
        f"{rate_limited} 429s in {requests}: {summaries}"
    )
    assert all(outcome.foreign_share >= FOREIGN_LEAST_SHARE for outcome in outcomes), summaries
    assert all(outcome.utilization >= LEAST_UTILIZATION for outcome in outcomes), summaries


@pytest.mark.parametrize("scenario", ONE_SECOND_CASES, ids=lambda scenario: scenario.label)
def test_against_a_one_second_provider_the_default_config_uses_its_limit_without_429s(scenario):
    outcome = measured(scenario)
    within = (
        outcome.rate_limited <= MOST_429S * outcome.requests,
        outcome.utilization >= LEAST_UTILIZATION,
    )
    assert within == (True, True), outcome.summary()


def test_on_a_small_limit_a_call_larger_than_the_window_waits_and_passes():
    outcome = run_large_request(LargeRequest())
    print(outcome.summary())
    assert outcome.error is None, outcome.summary()
    assert outcome.admitted(outcome.case.large_tokens), outcome.summary()
    assert outcome.rate_limited == 0, outcome.summary()
