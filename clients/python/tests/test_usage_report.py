"""Usage reports (protocol revision 6): cache reads and writes reported apart.

A report with cache figures goes as a `UsageReport`, so that the daemon's
spend budgets can price each kind of token; the daemon works out the
rate-limit figure itself. A daemon that predates revision 6 answers it
`Unsupported` (0.1 daemons: `MalformedMessage`), and the client then sends a
`Report` of every input token, remembered for the connection. `OlderProxy`
(`_proxy.py`) stands between the client and a real daemon: it records
every request and, when told to, answers `UsageReport` as an older daemon
does. A spend budget's denial raises `BudgetExhausted`, a `RateLimited`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anthropic
import openai
import pytest

from ratekeeper import AsyncClient, BudgetExhausted, Client, RateLimited
from ratekeeper import _proto as p
from ratekeeper._core.results import granted_or_raise
from ratekeeper._proto.errors import ErrorCode
from ratekeeper.anthropic import wrap as wrap_anthropic
from ratekeeper.openai import wrap as wrap_openai
from ratekeeper.retry import is_retryable

from _fake_anthropic import FakeAnthropic
from _fake_openai import FakeProvider, prompt_tokens
from _proxy import OlderProxy

CONFIG = """
[[limits]]
name = "exact"
tokens_per_minute = 1
burst_tokens = 1000000

[[limits]]
name = "claude"
provider = "anthropic"
input_tokens_per_minute = 1
output_tokens_per_minute = 1
burst_input_tokens = 1000000
burst_output_tokens = 1000000
"""
CAPACITY = 1_000_000
MESSAGES = [{"role": "user", "content": "Summarise the plot of Hamlet in one sentence."}]


@pytest.fixture
def proxy(make_daemon, tmp_path) -> Iterator[OlderProxy]:
    recording = OlderProxy(make_daemon(CONFIG).socket, tmp_path)
    yield recording
    recording.close()


def level(client: Client) -> int:
    return client.status("exact").limit("exact").bucket("tokens").level


def test_a_report_with_cache_figures_goes_as_a_usage_report(proxy):
    with Client(proxy.path, timeout=5) as client:
        lease = client.acquire("exact", 1000)
        returned = lease.report(
            input_tokens=100, output_tokens=20, cached_input_tokens=300, cache_write_tokens=50
        )
        (sent,) = proxy.sent(p.UsageReport)
        assert sent == p.UsageReport(lease.lease_id, p.Usage(100, 300, 50, 20))
        assert lease.settled
        assert lease.tokens_returned == returned
        assert not proxy.sent(p.Report)

        # Cache writes count towards every rate limit: settled to 100 + 50 + 20.
        lease = client.acquire("exact", 1000)
        assert lease.report(input_tokens=100, output_tokens=20, cache_write_tokens=50) == 830


def test_a_report_without_cache_figures_stays_a_report(proxy):
    with Client(proxy.path, timeout=5) as client:
        lease = client.acquire("exact", 1000)
        assert lease.report(input_tokens=100, output_tokens=20, cached_input_tokens=0) == 880
        lease = client.acquire("exact", 1000)
        assert lease.report(300) == 700
        first, second = proxy.sent(p.Report)
        assert (first.input_tokens, first.output_tokens) == (100, 20)
        assert second == p.Report(lease.lease_id, 300, 0)
        assert not proxy.sent(p.UsageReport)


@pytest.mark.parametrize("code", [ErrorCode.UNSUPPORTED, ErrorCode.MALFORMED_MESSAGE])
def test_an_older_daemon_gets_a_report_of_every_input_token(proxy, code):
    proxy.refuse_with = code
    with Client(proxy.path, timeout=5) as client:
        lease = client.acquire("exact", 1000)
        before = level(client)
        # 100 full-price, 300 read from the cache, 50 written: 450 input tokens.
        returned = lease.report(
            input_tokens=100, output_tokens=20, cached_input_tokens=300, cache_write_tokens=50
        )
        assert returned == 1000 - 470
        assert before + 530 <= level(client) <= before + 532
        assert proxy.sent(p.Report) == [p.Report(lease.lease_id, 450, 20)]

        # Remembered for the connection: the next report goes as a Report at once.
        second = client.acquire("exact", 1000)
        assert second.report(input_tokens=10, output_tokens=0, cached_input_tokens=90) == 900
        assert len(proxy.sent(p.UsageReport)) == 1
        assert proxy.sent(p.Report)[-1] == p.Report(second.lease_id, 100, 0)


def test_the_async_client_falls_back_the_same_way(proxy):
    proxy.refuse_with = ErrorCode.UNSUPPORTED

    async def main() -> None:
        async with AsyncClient(proxy.path, timeout=5) as client:
            for _ in range(2):
                lease = await client.acquire("exact", 1000)
                returned = await lease.report(
                    input_tokens=100, output_tokens=20, cached_input_tokens=300
                )
                assert returned == 1000 - 420

    asyncio.run(main())
    assert len(proxy.sent(p.UsageReport)) == 1
    assert [report.input_tokens for report in proxy.sent(p.Report)] == [400, 400]


@pytest.mark.parametrize(
    ("figures", "error"),
    [
        ({"cached_input_tokens": -1}, ValueError),
        ({"cache_write_tokens": -5}, ValueError),
        ({"cached_input_tokens": 1.5}, TypeError),
        ({"cache_write_tokens": True}, TypeError),
    ],
)
def test_cache_figures_are_token_counts(proxy, figures, error):
    with Client(proxy.path, timeout=5) as client:
        lease = client.acquire("exact", 10)
        with pytest.raises(error):
            lease.report(input_tokens=1, output_tokens=1, **figures)
        lease.release()


def test_the_anthropic_wrapper_reports_cache_reads_and_writes_apart(proxy):
    fake = FakeAnthropic(
        input_tokens=100,
        cache_read_input_tokens=5000,
        cache_creation_input_tokens=50,
        output_tokens=20,
    )
    try:
        raw = anthropic.Anthropic(base_url=fake.base_url, api_key="test-key", max_retries=0)
        with Client(proxy.path, timeout=5) as limiter:
            claude = wrap_anthropic(raw, limiter, limit="claude")
            claude.messages.create(model="claude-sonnet-4-6", max_tokens=300, messages=MESSAGES)
            with claude.messages.stream(
                model="claude-sonnet-4-6", max_tokens=300, messages=MESSAGES
            ) as stream:
                "".join(stream.text_stream)
            events = claude.messages.create(
                model="claude-sonnet-4-6", max_tokens=300, messages=MESSAGES, stream=True
            )
            list(events)
    finally:
        fake.close()
    usages = [report.usage for report in proxy.sent(p.UsageReport)]
    assert usages == [p.Usage(100, 5000, 50, 20)] * 3
    assert not proxy.sent(p.Report)


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_wrapper_reports_cached_tokens_apart(proxy, stream):
    fake = FakeProvider(cached_tokens=8)
    try:
        raw = openai.OpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
        with Client(proxy.path, timeout=5) as limiter:
            llm = wrap_openai(raw, limiter, limit="exact")
            answer = llm.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=50, stream=stream
            )
            if stream:
                list(answer)
    finally:
        fake.close()
    prompt = prompt_tokens(MESSAGES)
    (sent,) = proxy.sent(p.UsageReport)
    # OpenAI's prompt_tokens include the cached ones: input is the rest.
    assert sent.usage == p.Usage(prompt - 8, 8, 0, 20)


def test_openai_usage_without_details_has_no_cached_tokens(proxy, provider):
    raw = openai.OpenAI(base_url=provider.base_url, api_key="test-key", max_retries=0)
    with Client(proxy.path, timeout=5) as limiter:
        llm = wrap_openai(raw, limiter, limit="exact")
        llm.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=50)
    assert proxy.sent(p.Report)[-1].input_tokens == prompt_tokens(MESSAGES)
    assert not proxy.sent(p.UsageReport)


def test_the_responses_api_reports_cached_tokens_apart(proxy):
    fake = FakeProvider(cached_tokens=5)
    try:
        raw = openai.OpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
        with Client(proxy.path, timeout=5) as limiter:
            llm = wrap_openai(raw, limiter, limit="exact")
            llm.responses.create(model="gpt-4o-mini", input="Hi there", max_output_tokens=50)
    finally:
        fake.close()
    (sent,) = proxy.sent(p.UsageReport)
    assert (sent.usage.cached_input_tokens, sent.usage.cache_write_tokens) == (5, 0)


@pytest.mark.parametrize(
    ("bucket", "kind"),
    [
        ("budget_day", BudgetExhausted),
        ("tenant_budget_month", BudgetExhausted),
        ("group_budget_week", BudgetExhausted),
        ("budget_rolling_hour", BudgetExhausted),
        ("tokens", RateLimited),
        ("tenant", RateLimited),
        ("tokens_per_day", RateLimited),
    ],
)
def test_a_spend_budgets_denial_is_budget_exhausted(bucket, kind):
    with pytest.raises(RateLimited) as raised:
        granted_or_raise(p.Denied(3_600_000, bucket), "gpt")
    assert type(raised.value) is kind
    assert (raised.value.retry_after, raised.value.bucket, raised.value.limit) == (
        3600.0,
        bucket,
        "gpt",
    )
    # A budget resets in hours or days: no retry loop should sleep that long.
    assert is_retryable(raised.value) is (kind is RateLimited)
    assert bucket in str(raised.value)
