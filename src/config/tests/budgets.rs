//! Spend budgets and prices: what the file says, what is refused, and what
//! the effective config shows.

use super::*;
use crate::budget::money::Price;
use crate::budget::period::Calendar;
use crate::budget::spans::Span;

const PRICED: &str = "[[limits]]\nname = \"chat\"\ntokens_per_minute = 1000\n\
    price = { input = \"2.50\", cached_input = \"1.25\", output = \"10\" }\n";

#[test]
fn budgets_on_a_limit_its_tenants_and_a_group_are_read() {
    let config = parse_ok(
        "[budgets]\ntime_zone = \"Europe/Berlin\"\n\
         [[groups]]\nname = \"org\"\nbudget = { day = \"50\" }\n\
         tenant_budget = { month = \"5.00\" }\n\
         tenant_budgets = { bigco = { month = \"100\" } }\n\
         [[limits]]\nname = \"chat\"\ntokens_per_minute = 1000\ngroup = \"org\"\n\
         budget = { day = \"1.00\", rolling_hour = \"0.2\" }\n\
         tenant_budget = { day = \"0.10\" }\n\
         price = { input = \"2.50\", cached_input = \"1.25\", output = \"10\" }\n",
    );
    assert_eq!(config.budget_time_zone, "Europe/Berlin");
    let chat = config.limit("chat").unwrap();
    let own: Vec<_> = chat.budgets.budget.as_ref().unwrap().amounts().collect();
    assert_eq!(
        own,
        [
            (Span::Calendar(Calendar::Day), 1_000_000),
            (Span::RollingHour, 200_000)
        ]
    );
    assert_eq!(
        chat.price,
        Some(Price {
            input: 2_500_000,
            cached_input: 1_250_000,
            // Not given: the input price.
            cache_write: 2_500_000,
            output: 10_000_000,
        })
    );
    let org = config.group("org").unwrap();
    let month = |tenant| {
        org.budgets
            .of_tenant(tenant)
            .unwrap()
            .amounts()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        month("bigco"),
        [(Span::Calendar(Calendar::Month), 100_000_000)]
    );
    assert_eq!(
        month("anyone"),
        [(Span::Calendar(Calendar::Month), 5_000_000)]
    );
    // A group of budgets only needs no rate.
    assert_eq!(org.tokens_per_minute, None);
}

#[test]
fn without_budgets_the_time_zone_is_utc_and_no_price_is_needed() {
    let config = parse_ok(LIMIT_A);
    assert_eq!(config.budget_time_zone, "UTC");
    assert!(!config.limit("a").unwrap().budgets.any());
    assert_eq!(config.limit("a").unwrap().price, None);
}

#[test]
fn budget_mistakes_are_refused_at_their_place() {
    for (text, expected) in [
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nbudget = { day = \"1,50\" }\nprice = { input = \"1\", output = \"1\" }\n",
            "test.toml:4:18: limits[0] \"a\": budget.day: \"1,50\" is not an amount of money",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nbudget = { day = \"0\" }\nprice = { input = \"1\", output = \"1\" }\n",
            "budget.day must be more than 0",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nbudget = { year = \"1\" }\n",
            "unknown key `year`",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nbudget = {}\nprice = { input = \"1\", output = \"1\" }\n",
            "budget names no amount",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nbudget = { rolling_hour = \"60000\" }\nprice = { input = \"1\", output = \"1\" }\n",
            "budget.rolling_hour must be at most 50000.00",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ntenant_budgets = { acme = { week = \"1.0000001\" } }\nprice = { input = \"1\", output = \"1\" }\n",
            "tenant_budgets.acme.week: \"1.0000001\" has more than six decimals",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprice = { input = \"1\" }\n",
            "price needs output",
        ),
        (
            "[budgets]\ntime_zone = \"Mars/Olympus\"\n",
            "test.toml:2:13: [budgets]: time_zone: unknown time zone \"Mars/Olympus\"",
        ),
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nmodel = \"my-own-model\"\nbudget = { day = \"1\" }\n",
            "limits[0] \"a\": it has a budget but model \"my-own-model\" is not in the price table",
        ),
        (
            "[[groups]]\nname = \"org\"\nbudget = { day = \"1\" }\n[[limits]]\nname = \"a\"\ntokens_per_minute = 1\ngroup = \"org\"\n",
            "limits[0] \"a\": group \"org\"'s budget applies but it names no model",
        ),
    ] {
        let error = parse_err(text);
        assert!(error.contains(expected), "{text}\n-> {error}");
    }
}

#[test]
fn budgets_and_prices_survive_the_effective_config() {
    let text = format!(
        "[budgets]\ntime_zone = \"America/New_York\"\n{PRICED}\
         budget = {{ month = \"20\" }}\ntenant_budgets = {{ acme = {{ day = \"0.000001\" }} }}\n"
    );
    let config = parse_ok(&text);
    let effective = config.to_effective_toml();
    assert!(
        effective.contains("time_zone = \"America/New_York\""),
        "{effective}"
    );
    assert!(effective.contains("month = \"20.00\""), "{effective}");
    assert!(effective.contains("cached_input = \"1.25\""), "{effective}");
    assert_eq!(parse_ok(&effective), config, "{effective}");
}
