//! Spend budgets in a plan: which budgets an acquire draws, what each
//! reserves, the bucket of which period, and the refusal of a call no
//! budget can ever hold.

use super::*;
use crate::config::from_toml_str;

const CONFIG: &str = r#"
default_priority = "normal"

[budgets]
time_zone = "America/New_York"

[[priorities]]
name = "normal"
reserved_fraction = 0.1

[[groups]]
name = "org"
budget = { day = "50" }
tenant_budget = { month = "5" }
tenant_budgets = { bigco = { month = "100", week = "40" } }

[[limits]]
name = "chat"
group = "org"
tokens_per_minute = 100000
budget = { day = "1", rolling_hour = "0.25" }
tenant_budget = { day = "0.10" }
price = { input = "3", cached_input = "0.30", cache_write = "3.75", output = "15" }

[[limits]]
name = "plain"
tokens_per_minute = 100000
"#;

fn planner() -> Planner {
    Planner::new(Arc::new(from_toml_str(CONFIG, "test.toml").unwrap()))
}

/// Unix ms of an RFC 3339 instant.
fn at(instant: &str) -> i64 {
    instant.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

fn plan(
    planner: &Planner,
    limit: &str,
    tenant: Option<&str>,
    tokens: (u64, u64),
    at_ms: i64,
) -> Result<AcquirePlan, PlanError> {
    let checked = planner.check_acquire(limit, tenant, None, None)?;
    planner.plan_acquire(checked, tenant, tokens, at_ms)
}

/// The budget draws of a plan: `name key cost+floor/capacity`.
fn budgets(plan: &AcquirePlan) -> Vec<String> {
    plan.reserved
        .iter()
        .filter(|r| r.role.is_budget())
        .map(|r| {
            let draw = &r.draw;
            format!(
                "{} {} {}+{}/{}",
                r.role.name(),
                draw.bucket.key,
                draw.cost,
                draw.floor,
                draw.bucket.capacity
            )
        })
        .collect()
}

#[test]
fn an_acquire_draws_every_budget_that_applies_at_the_dearest_input_price() {
    let planner = planner();
    let noon = at("2026-12-07T17:00:00Z");
    // 1,000 input tokens at $3.75 and 500 output at $15: $0.01125.
    let plan = plan(&planner, "chat", Some("acme"), (1_000, 500), noon).unwrap();
    assert_eq!(
        budgets(&plan),
        [
            "budget_day ratekeeper:{g:org}:chat:budget:day:2026-12-07 11250+100000/1000000",
            "budget_rolling_hour ratekeeper:{g:org}:chat:budget:rolling_hour 11250+25000/250000",
            "tenant_budget_day ratekeeper:{g:org}:chat:tenant:acme:budget:day:2026-12-07 11250+10000/100000",
            "group_budget_day ratekeeper:{g:org}:budget:day:2026-12-07 11250+5000000/50000000",
            "group_tenant_budget_month ratekeeper:{g:org}:tenant:acme:budget:month:2026-12 11250+500000/5000000",
        ]
    );
    let day = &plan.reserved[plan.reserved.len() - 5];
    assert_eq!(
        day.settle,
        Settle::Price(planner.config().limits[0].price.unwrap())
    );
    // The day ends at midnight in New York: 05:00 UTC.
    assert_eq!(day.resets_at_ms, Some(at("2026-12-08T05:00:00Z")));
    assert!(!day.draw.bucket.refill.refills());
    // A rolling budget refills; it has no period.
    assert_eq!(plan.reserved[plan.reserved.len() - 4].resets_at_ms, None);
    // A named tenant has its own budget on the group, in place of the default.
    let plan = plan_for(&planner, Some("bigco"), noon);
    let group_tenant: Vec<&str> = plan
        .iter()
        .filter(|line| line.starts_with("group_tenant"))
        .map(|line| line.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        group_tenant,
        ["group_tenant_budget_week", "group_tenant_budget_month"]
    );
    // Without a tenant, no tenant budget; a limit without budgets draws none.
    assert_eq!(plan_for(&planner, None, noon).len(), 3);
    let plain = plan_ok(&planner, "plain", noon);
    assert!(budgets(&plain).is_empty());
}

fn plan_for(planner: &Planner, tenant: Option<&str>, at_ms: i64) -> Vec<String> {
    budgets(&plan(planner, "chat", tenant, (1, 1), at_ms).unwrap())
}

fn plan_ok(planner: &Planner, limit: &str, at_ms: i64) -> AcquirePlan {
    plan(planner, limit, None, (1, 1), at_ms).unwrap()
}

#[test]
fn each_period_is_a_bucket_of_its_own_in_the_configured_time_zone() {
    let planner = planner();
    let key_of = |instant: &str, name: &str| {
        plan_for(&planner, Some("acme"), at(instant))
            .into_iter()
            .find(|line| line.starts_with(&format!("{name} ")))
            .map(|line| line.split(' ').nth(1).unwrap().to_string())
            .unwrap()
    };
    // Midnight in New York is 05:00 UTC in winter, 04:00 in summer.
    assert!(key_of("2026-12-08T04:59:59.999Z", "budget_day").ends_with(":2026-12-07"));
    assert!(key_of("2026-12-08T05:00:00Z", "budget_day").ends_with(":2026-12-08"));
    assert!(key_of("2026-07-01T03:59:59.999Z", "budget_day").ends_with(":2026-06-30"));
    assert!(key_of("2026-07-01T04:00:00Z", "budget_day").ends_with(":2026-07-01"));
    // The month turns over at the same instant as the day that starts it.
    let month = "group_tenant_budget_month";
    assert!(key_of("2026-12-01T04:59:59.999Z", month).ends_with(":2026-11"));
    assert!(key_of("2026-12-01T05:00:00Z", month).ends_with(":2026-12"));
    // A 25-hour day (clocks back on 2026-11-01): one bucket all day long.
    assert!(key_of("2026-11-01T04:00:00Z", "budget_day").ends_with(":2026-11-01"));
    assert!(key_of("2026-11-02T04:59:59Z", "budget_day").ends_with(":2026-11-01"));
    // A rolling budget is one bucket whenever.
    assert_eq!(
        key_of("2026-12-08T04:00:00Z", "budget_rolling_hour"),
        key_of("2026-12-08T06:00:00Z", "budget_rolling_hour")
    );
}

#[test]
fn a_call_that_can_cost_more_than_a_budget_is_refused_in_money() {
    let planner = planner();
    // 10,000 output tokens at $15 a million: $0.15, above acme's $0.10 a day.
    let refused = plan(&planner, "chat", Some("acme"), (0, 10_000), 0).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "a call that may cost 0.15 can never be granted: the tenant_budget_day budget of \
         limit \"chat\" is 0.10 less 0.01 kept for classes above \"normal\""
    );
}

mod periods {
    use proptest::prelude::*;

    use super::*;
    use crate::budget::period::{Calendar, zone};

    const ZONES: [&str; 5] = [
        "UTC",
        "America/New_York",
        "Europe/Berlin",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
    ];

    fn planner_in(zone_name: &str) -> Planner {
        let config = CONFIG.replace("America/New_York", zone_name);
        Planner::new(Arc::new(from_toml_str(&config, "test.toml").unwrap()))
    }

    /// The calendar budget buckets of an acquire at `at_ms`: (name, key,
    /// resets at, kept until).
    fn calendar_buckets(planner: &Planner, at_ms: i64) -> Vec<(String, String, i64, i64)> {
        plan(planner, "chat", Some("acme"), (1, 1), at_ms)
            .unwrap()
            .reserved
            .iter()
            .filter(|r| r.resets_at_ms.is_some())
            .map(|r| {
                (
                    r.role.name().to_string(),
                    r.draw.bucket.key.to_string(),
                    r.resets_at_ms.unwrap(),
                    r.draw.bucket.keep_until_ms.unwrap(),
                )
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever the instant and the zone, each calendar budget draws
        /// the bucket of the period the instant is in, until the period's
        /// last millisecond, and the next period's from its first: a
        /// budget starts over exactly at midnight, on Monday, on the 1st,
        /// daylight saving or not; and its key outlives the period by the
        /// margin.
        #[test]
        fn a_budget_draws_its_periods_bucket_until_the_period_ends(
            at_ms in 946_684_800_000_i64..4_102_444_800_000,
            zone_index in 0..ZONES.len(),
        ) {
            let zone_name = ZONES[zone_index];
            let planner = planner_in(zone_name);
            let tz = zone(zone_name).unwrap();
            for (name, key, resets_at, keep_until) in calendar_buckets(&planner, at_ms) {
                let calendar = if name.ends_with("_day") {
                    Calendar::Day
                } else if name.ends_with("_week") {
                    Calendar::Week
                } else {
                    Calendar::Month
                };
                let period = calendar.period_at(at_ms, &tz).unwrap();
                prop_assert!(key.ends_with(&format!(":{}", period.label)), "{key} {period:?}");
                prop_assert_eq!(resets_at, period.end_ms);
                prop_assert_eq!(keep_until, period.end_ms + KEEP_AFTER_PERIOD_MS);
                let last = calendar_buckets(&planner, period.end_ms - 1);
                let next = calendar_buckets(&planner, period.end_ms);
                let same = |buckets: &[(String, String, i64, i64)]| {
                    buckets.iter().find(|b| b.0 == name).map(|b| b.1.clone())
                };
                prop_assert_eq!(same(&last), Some(key.clone()));
                prop_assert_ne!(same(&next), Some(key.clone()));
            }
        }
    }
}
