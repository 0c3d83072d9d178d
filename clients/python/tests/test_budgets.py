"""Spend budgets as `Client.budgets` shows them (protocol revision 6, `Budgets`).

Against the real daemon, with both stores: an acquire reserves its most
expensive cost in the limit's daily budget, a report settles it at the
price of what was used, and `budgets()` shows spent, reserved and remaining
in micro-units. A daemon that predates revision 6 (played by `OlderProxy`)
makes `budgets()` raise `Unsupported`.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator

import pytest

from ratekeeper import AsyncClient, BudgetStatus, Client, UnknownLimit, Unsupported
from ratekeeper import _proto as p
from ratekeeper._proto.errors import ErrorCode

from _daemon import noon_offset_hours, zone_name
from _proxy import OlderProxy

#: A fixed-offset zone whose local time is about noon now, so that the
#: budget's day cannot end while the suite runs (the budget would start
#: over at midnight, as it should).
OFFSET_HOURS = noon_offset_hours()
ZONE = datetime.timezone(datetime.timedelta(hours=OFFSET_HOURS))

#: $1 a day; a dollar per million input tokens, two per million output tokens:
#: one micro-unit per input token, two per output token.
CONFIG = f"""
[budgets]
time_zone = "{zone_name(OFFSET_HOURS)}"

[[limits]]
name = "chat"
tokens_per_minute = 1000000
budget = {{ day = "1" }}
price = {{ input = "1", output = "2" }}

[[limits]]
name = "free"
tokens_per_minute = 1000000
"""
DOLLAR = 1_000_000


def today() -> tuple[str, int]:
    """The day's label in `ZONE` and the Unix ms of its next midnight."""
    now = datetime.datetime.now(ZONE)
    midnight = datetime.datetime.combine(
        now.date() + datetime.timedelta(days=1), datetime.time(), ZONE
    )
    return now.date().isoformat(), int(midnight.timestamp() * 1000)


def chat_budget(spent: int, reserved: int) -> BudgetStatus:
    """The limit's daily budget as `budgets()` should show it, for today."""
    period, resets_at_ms = today()
    return BudgetStatus(
        owner="chat",
        group=False,
        tenant=None,
        name="budget_day",
        period=period,
        amount=DOLLAR,
        spent=spent,
        reserved=reserved,
        remaining=DOLLAR - spent - reserved,
        resets_at_ms=resets_at_ms,
    )


def test_budgets_show_what_acquires_reserve_and_reports_spend(make_daemon, store):
    daemon = make_daemon(CONFIG, store=store)
    with Client(daemon.socket, timeout=5) as client:
        assert client.budgets() == [chat_budget(spent=0, reserved=0)]

        # Reserved at the most it can cost: 1000 input and 500 output tokens.
        reported = client.acquire("chat", 1000, max_tokens=500)
        in_flight = client.acquire("chat", 3000, max_tokens=1000)
        assert client.budgets("chat") == [chat_budget(spent=0, reserved=2000 + 5000)]

        # Settled at the price of what was used: 600 input, 100 output.
        reported.report(input_tokens=600, output_tokens=100)
        assert client.budgets("chat") == [chat_budget(spent=800, reserved=5000)]

        # A release gives the whole reservation back.
        in_flight.release()
        assert client.budgets() == [chat_budget(spent=800, reserved=0)]

        # A limit without a budget draws none; one not configured is an error.
        assert client.budgets("free") == []
        with pytest.raises(UnknownLimit):
            client.budgets("nope")


def test_the_async_client_shows_the_same_budgets(make_daemon):
    daemon = make_daemon(CONFIG)

    async def main() -> list[BudgetStatus]:
        async with AsyncClient(daemon.socket, timeout=5) as client:
            lease = await client.acquire("chat", 1000, max_tokens=500)
            await lease.report(input_tokens=1000, output_tokens=500)
            return await client.budgets("chat")

    assert asyncio.run(main()) == [chat_budget(spent=2000, reserved=0)]


@pytest.fixture
def proxy(make_daemon, tmp_path) -> Iterator[OlderProxy]:
    older = OlderProxy(make_daemon(CONFIG).socket, tmp_path, refused=(p.Budgets,))
    yield older
    older.close()


@pytest.mark.parametrize("code", [ErrorCode.UNSUPPORTED, ErrorCode.MALFORMED_MESSAGE])
def test_an_older_daemon_has_no_budgets_to_show(proxy, code):
    proxy.refuse_with = code
    with Client(proxy.path, timeout=5) as client:
        with pytest.raises(Unsupported, match="revision 6"):
            client.budgets()
        # The connection goes on.
        assert client.status("chat").store == "embedded"
    assert proxy.sent(p.Budgets) == [p.Budgets(None)]
