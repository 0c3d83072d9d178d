"""Issue 12's user scenario: the Gunicorn and Celery examples together, driven at
twice the provider's limit, with the shipped default config (see `_stack.py`).

Through ratekeeper (two sidecars sharing Redis, one per tier) the provider
answers no 429 and the token limit is used in the steady state; the same
commands with a token bucket of the whole limit in each of the 12 worker
processes draw 429s. How much of the limit is used depends on the machine as
much as on the product (12 worker processes, two sidecars, Redis and the
fake share 2 cores here), so the figure (99.2 %) is `bench/stack`'s; the run
here holds the floor the provider end-to-end tests hold, which no machine's
load explains (issue 28). Each run is measured once the initial
burst is spent, for less time than the bench's 60 s (`bench/stack`): 30 s
through ratekeeper, 10 s with the per-process limiters (whose 429s start
with the warm-up).
"""

from __future__ import annotations

import pytest

from _stack import StackRun, run, summary
from test_provider_e2e import LEAST_UTILIZATION

#: Minutes of fleets against the fake provider: `scripts/test --quick` skips them.
pytestmark = pytest.mark.slow


def test_through_ratekeeper_no_429_and_the_limit_used():
    stack = StackRun(limiter="ratekeeper", seconds=30)
    outcome = run(stack)
    print(summary(stack, outcome))
    errors = outcome.workers.get("http_errors", 0) + outcome.workers["task_failures"]
    assert errors == 0, outcome.error_samples
    # A limiter that paces from the start leaves the provider's burst unspent.
    steady = outcome.burst_spent or outcome.paced
    assert steady, f"no steady state to measure: {summary(stack, outcome)}"
    assert outcome.rate_limited == 0, summary(stack, outcome)
    assert outcome.utilization >= LEAST_UTILIZATION, summary(stack, outcome)


def test_a_limiter_in_each_process_draws_429s():
    stack = StackRun(limiter="per-process", seconds=10)
    outcome = run(stack)
    print(summary(stack, outcome))
    assert outcome.burst_spent, f"no steady state to compare: {summary(stack, outcome)}"
    assert outcome.rate_limited_fraction > 0.05, summary(stack, outcome)
