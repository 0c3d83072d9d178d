"""The strict fake providers themselves, and how the end-to-end harness reads them.

The fakes stand in for OpenAI and Anthropic in every end-to-end figure, so
what they enforce is tested on its own: the enforcement window, the
admission of a request larger than the window, the "request too large"
refusal, the counting of rejected requests, the foreign application, the
headers of each provider's shape, and their standalone mode. The limits are
chosen so that no outcome depends on how fast the machine is: a bucket that
refills one token a second is still empty a few milliseconds later.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import anthropic
import openai
import pytest

from _daemon import daemon_binary, wait_for
from _e2e import ONE_SECOND, SHIPPED_CONFIG, Scenario, analyse, shipped_config
from _fake_anthropic import StrictAnthropic, input_tokens
from _fake_openai import RECORDS_PATH, FakeProvider

TESTS = Path(__file__).resolve().parent
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(provider: FakeProvider, max_tokens: int):
    """One chat call; the raw answer, or the RateLimitError it raised."""
    client = openai.OpenAI(base_url=provider.base_url, api_key="x", max_retries=0, timeout=10)
    try:
        return client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=max_tokens
        )
    except openai.RateLimitError as refused:
        return refused
    finally:
        client.close()


@pytest.fixture
def closing():
    """Closes the providers a test opens."""
    opened: list = []
    yield opened.append
    for provider in opened:
        provider.close()


def test_by_default_a_bucket_holds_a_minute_and_the_headers_describe_it(closing):
    provider = FakeProvider(tokens_per_minute=60_000, requests_per_minute=600)
    closing(provider)
    assert provider.capacities == {"tokens": 60_000, "requests": 600}
    answer = chat(provider, max_tokens=600)
    assert answer.status_code == 200
    assert answer.headers["x-ratelimit-limit-tokens"] == "60000"
    assert answer.headers["x-ratelimit-remaining-tokens"] == "59400"
    assert answer.headers["x-ratelimit-remaining-requests"] == "599"
    assert answer.headers["x-ratelimit-reset-tokens"] == "600ms"  # 600 tokens at 1,000 a second


def test_a_one_second_window_admits_a_larger_request_when_full_and_counts_its_refusals(closing):
    # 60 TPM over one second: the bucket holds one token, refilled one a second
    # (and 6 RPM a tenth of a request, refilled in 10 s).
    provider = FakeProvider(
        tokens_per_minute=60, requests_per_minute=6, window_seconds=1, rejected_tokens=True
    )
    closing(provider)
    assert provider.capacities == {"tokens": 1, "requests": 0.1}
    first = chat(provider, max_tokens=30)
    # Thirty windows' worth, admitted from the full bucket, which it leaves 29 below zero.
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "60"  # the per-minute figure
    assert first.headers["x-ratelimit-remaining-tokens"] == "0"
    assert first.headers["x-ratelimit-reset-tokens"] == "30s"
    refused = chat(provider, max_tokens=30)
    assert isinstance(refused, openai.RateLimitError)
    assert "on tokens per min (TPM): Limit 60" in refused.message
    # It waits for one token, the window's capacity, not for its 30.
    assert 25_000 < int(refused.response.headers["retry-after-ms"]) <= 30_000
    after_first, after_refused = provider.records_snapshot()
    assert after_first["tokens_left"] == pytest.approx(-29, abs=0.5)
    # The refusal was charged: OpenAI counts unsuccessful requests.
    assert after_refused["charged"] is True
    assert after_refused["tokens_left"] == pytest.approx(-59, abs=1)
    assert after_refused["requests_left"] < after_first["requests_left"]


def test_by_default_a_429_costs_its_request_not_its_tokens(closing):
    provider = FakeProvider(tokens_per_minute=60, requests_per_minute=6, window_seconds=1)
    closing(provider)
    assert chat(provider, max_tokens=30).status_code == 200
    assert isinstance(chat(provider, max_tokens=30), openai.RateLimitError)
    after_first, after_refused = provider.records_snapshot()
    assert after_refused["charged"] is True
    assert after_refused["tokens_left"] == pytest.approx(after_first["tokens_left"], abs=0.5)
    assert after_refused["requests_left"] < after_first["requests_left"]


def test_without_counting_rejected_requests_a_429_costs_nothing(closing):
    provider = FakeProvider(
        tokens_per_minute=60, requests_per_minute=600, window_seconds=1, count_rejected=False
    )
    closing(provider)
    assert chat(provider, max_tokens=30).status_code == 200
    assert isinstance(chat(provider, max_tokens=30), openai.RateLimitError)
    after_first, after_refused = provider.records_snapshot()
    assert after_refused["charged"] is False
    assert after_refused["tokens_left"] >= after_first["tokens_left"]


def test_a_request_over_the_per_minute_figure_is_too_large_and_not_charged(closing):
    provider = FakeProvider(tokens_per_minute=60, requests_per_minute=600, window_seconds=1)
    closing(provider)
    refused = chat(provider, max_tokens=61)
    assert isinstance(refused, openai.RateLimitError)
    assert refused.message.startswith("Error code: 429 - Request too large for")
    assert "Limit 60, Requested 61" in refused.message
    assert "retry-after" not in refused.response.headers
    (record,) = provider.records_snapshot()
    assert (record["charged"], record["tokens_left"]) == (False, 1)


def test_a_one_second_request_limit(closing):
    provider = FakeProvider(requests_per_minute=60, window_seconds=1)
    closing(provider)
    assert chat(provider, max_tokens=1).status_code == 200
    refused = chat(provider, max_tokens=1)
    assert isinstance(refused, openai.RateLimitError)
    assert "on requests per min (RPM): Limit 60" in refused.message
    assert refused.response.headers["retry-after"] == "1"


def test_the_foreign_application_competes_for_the_same_buckets(closing):
    # It asks for a fifth of 600 RPM and 6,000 TPM: 2 requests a second of 10
    # tokens. (Asking for half, its refusals and retries, all charged, would
    # cost more than the bucket refills: it would never get through again.)
    provider = FakeProvider(
        tokens_per_minute=6_000, requests_per_minute=600, window_seconds=1, foreign_fraction=0.2
    )
    closing(provider)

    def foreign() -> list:
        return [r for r in provider.records_snapshot() if r["foreign"]]

    wait_for(lambda: len(foreign()) >= 2, 10, "two foreign requests")
    assert all((r["charge"], r["status"], r["path"]) == (10, 200, "foreign") for r in foreign())
    assert (provider.served, provider.bodies) == (0, [])  # not ours
    # Someone else emptied the bucket: the foreign application is refused,
    # charged (rejected requests count), and retries until it gets through.
    with provider.lock:
        provider.tokens.level = -50
    wait_for(lambda: any(r["status"] == 429 for r in foreign()), 10, "a foreign request refused")
    first_refusal = next(n for n, r in enumerate(foreign()) if r["status"] == 429)
    assert foreign()[first_refusal]["charged"] is True
    wait_for(
        lambda: any(r["status"] == 200 for r in foreign()[first_refusal:]),
        10,
        "a foreign request admitted again",
    )


def anthropic_call(provider: StrictAnthropic, **request):
    client = anthropic.Anthropic(base_url=provider.base_url, api_key="x", max_retries=0, timeout=10)
    try:
        return client.messages.with_raw_response.create(model="claude-sonnet-4-5", **request)
    except anthropic.RateLimitError as refused:
        return refused
    finally:
        client.close()


def reset_moment(value: str) -> datetime.datetime:
    assert value.endswith("Z")
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc
    )


def test_the_strict_anthropic_fake_counts_input_at_arrival_and_adjusts_output_at_the_end(closing):
    provider = StrictAnthropic(60_000, 60_000, 600, window_seconds=1, round_remaining=False)
    closing(provider)
    request = {
        "max_tokens": 500,
        "system": "s",
        "messages": [{"role": "user", "content": "x" * 700}],
    }
    assert input_tokens(request) == 201  # 701 characters at 3.5 a token, rounded up
    answer = anthropic_call(provider, **request)
    assert answer.status_code == 200
    usage = answer.parse().usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens) == (201, 20, 0)
    headers = answer.headers
    # Taken at the decision, from full one-second buckets (1,000 tokens, 10 requests).
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "60000"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "799"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "500"  # max_tokens, estimated
    assert headers["anthropic-ratelimit-requests-remaining"] == "9"
    assert headers["anthropic-ratelimit-tokens-limit"] == "120000"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "1299"
    now = datetime.datetime.now(datetime.timezone.utc)
    for name in ("requests", "input-tokens", "output-tokens", "tokens"):
        reset = reset_moment(headers[f"anthropic-ratelimit-{name}-reset"])
        assert now - datetime.timedelta(seconds=1) <= reset <= now + datetime.timedelta(seconds=2)
    # When the answer was ready, the output estimate was adjusted to the 20 used.
    assert provider.buckets["output_tokens"].level >= 980
    (record,) = provider.records_snapshot()
    assert (record["charge"], record["output_charge"], record["foreign"]) == (201, 500, False)


def test_the_strict_anthropic_fake_rounds_remaining_tokens_to_thousands(closing):
    provider = StrictAnthropic(120_000, 120_000, 600, window_seconds=1)
    closing(provider)
    answer = anthropic_call(
        provider, max_tokens=700, system="s", messages=[{"role": "user", "content": "x" * 700}]
    )
    # 2,000 - 201 and 2,000 - 700, to the nearest thousand; requests exactly.
    assert answer.headers["anthropic-ratelimit-input-tokens-remaining"] == "2000"
    assert answer.headers["anthropic-ratelimit-output-tokens-remaining"] == "1000"
    assert answer.headers["anthropic-ratelimit-requests-remaining"] == "9"


def test_the_strict_anthropic_fake_refuses_in_anthropics_shape_and_keeps_the_input(closing):
    # 60 ITPM over a second: one input token a second.
    provider = StrictAnthropic(
        60, 60_000, 600, window_seconds=1, round_remaining=False, rejected_tokens=True
    )
    closing(provider)
    request = {"max_tokens": 100, "messages": [{"role": "user", "content": "x" * 35}]}
    # Ten windows' worth, admitted from the full bucket.
    assert anthropic_call(provider, **request).status_code == 200
    refused = anthropic_call(provider, **request)
    assert isinstance(refused, anthropic.RateLimitError)
    assert refused.response.headers["retry-after"] == "10"
    body = refused.response.json()
    assert (body["type"], body["error"]["type"]) == ("error", "rate_limit_error")
    assert "of 60 input tokens per minute" in body["error"]["message"]
    assert body["request_id"]
    answered, rejected = provider.records_snapshot()
    # Charged its request and its 10 input tokens; its output estimate went back.
    assert rejected["charged"] is True
    assert rejected["input_tokens_left"] == pytest.approx(answered["input_tokens_left"] - 10, abs=1)
    assert rejected["output_tokens_left"] >= answered["output_tokens_left"]
    too_large = anthropic_call(
        provider, max_tokens=100, messages=[{"role": "user", "content": "x" * 350}]
    )
    assert isinstance(too_large, anthropic.RateLimitError)
    assert "of 60 input tokens per minute" in too_large.response.json()["error"]["message"]
    assert "retry-after" not in too_large.response.headers
    assert provider.records_snapshot()[-1]["charged"] is False


def test_the_strict_anthropic_fake_streams(closing):
    provider = StrictAnthropic(60_000, 60_000, 600)
    closing(provider)
    client = anthropic.Anthropic(base_url=provider.base_url, api_key="x", max_retries=0, timeout=10)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        message = stream.get_final_message()
    client.close()
    assert (message.usage.input_tokens, message.usage.output_tokens) == (1, 20)


@pytest.mark.parametrize(
    ("script", "limits", "capacity"),
    [
        ("_fake_openai.py", ["--tpm=60000", "--rpm=600"], {"tokens": 1000, "requests": 10}),
        (
            "_fake_anthropic.py",
            ["--itpm=60000", "--otpm=6000", "--rpm=600"],
            {"requests": 10, "input_tokens": 1000, "output_tokens": 100},
        ),
    ],
)
def test_standalone_a_fake_prints_its_url_and_serves_its_records(script, limits, capacity):
    command = [sys.executable, str(TESTS / script), *limits, "--window-seconds=1", "--foreign=0.2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        # The line comes at once; a fake that cannot start exits, ending the read.
        lines: list = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()))
        reader.start()
        reader.join(timeout=30)
        line = lines[0] if lines else ""
        assert line, "the fake printed no line"
        base_url = json.loads(line)["base_url"]
        url = base_url.rsplit("/v1", 1)[0] + RECORDS_PATH
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def document() -> dict:
            with no_proxy.open(url, timeout=10) as answer:
                return json.load(answer)

        figures = document()["buckets"]
        assert {name: bucket["capacity"] for name, bucket in figures.items()} == capacity
        assert document()["count_rejected"] is True
        wait_for(lambda: document()["records"], 10, "a foreign request recorded")
        assert all(record["foreign"] for record in document()["records"])
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()
    assert process.returncode == 0


def test_the_anthropic_example_is_uncommented_with_the_providers_rates(tmp_path):
    config, limit = shipped_config(SHIPPED_CONFIG.read_text(), 300_000, 3_000, provider="anthropic")
    assert limit == "claude-sonnet"
    assert "\ninput_tokens_per_minute = 300000" in config
    assert "\noutput_tokens_per_minute = 300000" in config
    path = tmp_path / "ratekeeper.toml"
    path.write_text(config)
    checked = subprocess.run(
        [str(daemon_binary()), "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    assert "claude-sonnet" in checked.stdout


def test_a_template_that_sets_a_burst_is_refused():
    template = (
        '[[limits]]\nname = "a"\ntokens_per_minute = 1\nrequests_per_minute = 1\n'
        '# --- anthropic example ---\n# [[limits]]\n# name = "b"\n'
        "# input_tokens_per_minute = 1\n# output_tokens_per_minute = 1\n"
        "# burst_output_tokens = 1\n# requests_per_minute = 1\n"
        "# --- end of anthropic example ---\n"
    )
    assert shipped_config(template, 10, 20)[1] == "a"
    with pytest.raises(ValueError, match="sets burst_output_tokens"):
        shipped_config(template, 10, 20, provider="anthropic")


def test_utilization_is_of_what_the_foreign_application_left():
    # A one-second bucket of 60 tokens a second (60 a window), 10 s: the
    # foreign application takes 12 a second, we take the other 48.
    scenario = Scenario(
        "tokens",
        "tokens",
        seconds=10,
        tokens_per_minute=3_600,
        foreign=0.2,
        window_seconds=ONE_SECOND,
    )
    start = 100.0

    def record(at: float, charge: float, foreign: bool, status: int = 200) -> dict:
        return {
            "arrival": start + at,
            "charge": charge,
            "status": status,
            "charged": True,
            "foreign": foreign,
            "tokens_left": 0.0,
        }

    records = [record(0.0, 60, False)]
    for second in range(10):
        records.append(record(second + 0.5, 12, True))
        records.append(record(second + 1.0, 48, False))
    records.append(record(3.0, 48, False, status=429))  # one of ours refused: not admitted
    records.sort(key=lambda r: r["arrival"])
    tally = {"completed": 0, "error_samples": []}
    outcome = analyse(scenario, records, start, [tally])
    assert (outcome.window_start, outcome.burst_spent) == (0.0, True)
    assert outcome.available == pytest.approx(600 - 120)
    assert outcome.utilization == pytest.approx(480 / 480)
    assert outcome.foreign_share == pytest.approx(0.2)
    assert (outcome.requests, outcome.rate_limited, outcome.foreign_requests) == (12, 1, 10)
