//! Spend budgets through the daemon's socket: reserved at the price of the
//! most a call can cost, settled to what its usage cost, denied until the
//! period ends, shown by `Budgets` and `/metrics`, on the embedded store
//! and shared by sidecars on one Redis.

use crate::support;

use std::time::{SystemTime, UNIX_EPOCH};

use ratekeeper::client::Client;
use ratekeeper::proto::{Acquire, BudgetStatus, Cost, Request, Response, Usage};
use support::redis::RedisServer;
use support::{Daemon, granted};

/// In the zone `offset` hours ahead of UTC (`Etc/GMT-5` is five hours
/// ahead), $1 a million input tokens (cache reads $0.50, writes $1.25), $2 a
/// million output: a call of 1,000 input and 1,000 output tokens may cost
/// 1,250 + 2,000 micro-units. The limit's day holds $0.01; each tenant's
/// $0.005, but acme's $0.01; the group's $1 a week for each tenant.
fn config(redis: Option<&RedisServer>, offset: i64) -> String {
    let redis = redis.map_or_else(String::new, |server| {
        format!("[redis]\nurl = \"{}\"\n", server.url())
    });
    let zone = format!("Etc/GMT{:+}", -offset);
    format!(
        r#"
{redis}
[budgets]
time_zone = "{zone}"

[metrics]
listen = "127.0.0.1:0"
tenants = ["acme"]

[[groups]]
name = "org"
tenant_budget = {{ week = "1" }}

[[limits]]
name = "chat"
group = "org"
tokens_per_minute = 1000000
budget = {{ day = "0.01" }}
tenant_budget = {{ day = "0.005" }}
tenant_budgets = {{ acme = {{ day = "0.01" }} }}
price = {{ input = "1", cached_input = "0.50", cache_write = "1.25", output = "2" }}
"#
    )
}

const RESERVED: i64 = 1_250 + 2_000;

const HOUR_MS: i64 = 3_600_000;

/// Hours ahead of UTC of a fixed-offset zone whose local time is about noon
/// now, so that no budget's day ends while a test runs (a budget starts
/// over at midnight, as it should), however late the suite runs.
fn noon_offset_hours() -> i64 {
    12 - (now_ms() / HOUR_MS).rem_euclid(24)
}

fn acquire(tenant: Option<&str>) -> Request {
    Request::Acquire(Acquire {
        limit: "chat".into(),
        tenant: tenant.map(str::to_string),
        priority: None,
        cost: Cost::Tokens {
            input_tokens: 1_000,
            output_tokens: 1_000,
        },
        max_wait_ms: Some(10_000),
    })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The next midnight after `at_ms` in the zone ahead of UTC by `offset`
/// hours.
fn next_midnight(at_ms: i64, offset: i64) -> i64 {
    let local = at_ms + offset * HOUR_MS;
    (local.div_euclid(86_400_000) + 1) * 86_400_000 - offset * HOUR_MS
}

/// The limit's own daily budget as `Budgets` shows it.
async fn limit_budget(client: &Client) -> BudgetStatus {
    let answer = client
        .call(Request::Budgets {
            limit: Some("chat".into()),
        })
        .await
        .unwrap();
    let Response::Budgets { budgets } = answer else {
        panic!("expected budgets, got {answer:?}");
    };
    budgets
        .into_iter()
        .find(|budget| budget.name == "budget_day")
        .expect("the limit's daily budget")
}

/// Runs the budget through its day: three grants fill it, the fourth is
/// denied until midnight; a usage report, a report and a release settle.
async fn spend_the_day(first: &Client, second: &Client, offset: i64) {
    let started = now_ms();
    let mut leases = Vec::new();
    for client in [first, second, first] {
        leases.push(granted(&client.call(acquire(None)).await.unwrap()).0);
    }
    let before = now_ms();
    let denied = second.call(acquire(None)).await.unwrap();
    let after = now_ms();
    let Response::Denied {
        retry_after_ms,
        bucket,
    } = denied
    else {
        panic!("expected a denial, got {denied:?}");
    };
    assert_eq!(bucket, "budget_day");
    // Not by waiting: the budget is whole again when the zone's day ends.
    let latest = next_midnight(before, offset) - before;
    let earliest = next_midnight(after, offset) - after;
    assert!(
        (earliest..=latest).contains(&(retry_after_ms as i64)),
        "retry after {retry_after_ms} ms, expected {earliest}..={latest}"
    );
    let shown = limit_budget(first).await;
    assert_eq!(
        (shown.amount, shown.spent, shown.reserved, shown.remaining),
        (10_000, 0, 3 * RESERVED as u64, 10_000 - 3 * RESERVED)
    );
    assert!(
        shown.period.len() == 10 && shown.resets_at_ms as i64 == next_midnight(started, offset)
    );
    // 500 full-price input, 200 cache reads, 100 cache writes, 250 output:
    // 500 + 100 + 125 + 500 micro-units.
    let usage = Usage {
        input_tokens: 500,
        cached_input_tokens: 200,
        cache_write_tokens: 100,
        output_tokens: 250,
    };
    let settled = first
        .call(Request::UsageReport {
            lease: leases[0],
            usage,
        })
        .await
        .unwrap();
    assert!(matches!(settled, Response::Settled { .. }), "{settled:?}");
    // A Report carries no cache figures: full-price input.
    let report = Request::Report {
        lease: leases[1],
        input_tokens: 400,
        output_tokens: 100,
    };
    second.call(report).await.unwrap();
    let released = first
        .call(Request::Release { lease: leases[2] })
        .await
        .unwrap();
    assert!(
        matches!(released, Response::Released { .. }),
        "{released:?}"
    );
    let spent = (500 + 100 + 125 + 500) + (400 + 200);
    let shown = limit_budget(second).await;
    assert_eq!(
        (shown.spent, shown.reserved, shown.remaining),
        (spent as u64, 0, 10_000 - spent)
    );
}

#[tokio::test]
async fn a_daily_budget_reserves_settles_and_denies_until_midnight() {
    let offset = noon_offset_hours();
    let daemon = Daemon::start(&config(None, offset));
    let (first, second) = (daemon.client().await, daemon.client().await);
    spend_the_day(&first, &second, offset).await;
    // What reports cost is counted per limit and tenant.
    let exposition = support::http_get(&daemon.metrics_address(), "/metrics").1;
    let spent = support::metric(
        &exposition,
        "ratekeeper_spent_micros_total{limit=\"chat\",tenant=\"\"}",
    );
    assert_eq!(spent, Some(1_825.0), "{exposition}");
    let remaining = support::metric(
        &exposition,
        "ratekeeper_budget_remaining{owner=\"chat\",scope=\"limit\",tenant=\"\",budget=\"budget_day\"}",
    );
    assert_eq!(remaining, Some((10_000.0 - 1_825.0) / 1e6), "{exposition}");
}

#[tokio::test]
async fn sidecars_on_one_redis_spend_one_budget() {
    let server = RedisServer::start();
    let offset = noon_offset_hours();
    let first = Daemon::start(&config(Some(&server), offset));
    let second = Daemon::start(&config(Some(&server), offset));
    spend_the_day(&first.client().await, &second.client().await, offset).await;
}

#[tokio::test]
async fn each_tenant_has_its_own_budget_and_a_named_one_its_override() {
    let daemon = Daemon::start(&config(None, noon_offset_hours()));
    let client = daemon.client().await;
    // $0.005 a day: one call of at most $0.00325 fits, a second does not.
    granted(&client.call(acquire(Some("bob"))).await.unwrap());
    let denied = client.call(acquire(Some("bob"))).await.unwrap();
    assert!(
        matches!(&denied, Response::Denied { bucket, .. } if bucket == "tenant_budget_day"),
        "{denied:?}"
    );
    // acme's own $0.01 takes two, then the limit's $0.01 is what is left.
    granted(&client.call(acquire(Some("acme"))).await.unwrap());
    granted(&client.call(acquire(Some("acme"))).await.unwrap());
    let denied = client.call(acquire(Some("acme"))).await.unwrap();
    assert!(
        matches!(&denied, Response::Denied { bucket, .. } if bucket == "budget_day"),
        "{denied:?}"
    );
    // Budgets shows acme's (named in the config), each once.
    let Response::Budgets { budgets } =
        client.call(Request::Budgets { limit: None }).await.unwrap()
    else {
        panic!("expected budgets");
    };
    let rows: Vec<(String, Option<String>, u64)> = budgets
        .iter()
        .map(|b| (b.name.clone(), b.tenant.clone(), b.reserved))
        .collect();
    let reserved = RESERVED as u64;
    assert_eq!(
        rows,
        [
            ("budget_day".into(), None, 3 * reserved),
            (
                "tenant_budget_day".into(),
                Some("acme".into()),
                2 * reserved
            ),
            (
                "group_tenant_budget_week".into(),
                Some("acme".into()),
                2 * reserved
            ),
        ]
    );
}

/// The budget configs the README and docs/budgets.md show are read as
/// written (so a page cannot drift from the config it describes).
#[test]
fn the_documented_budget_configs_load() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for page in ["README.md", "docs/budgets.md"] {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        let blocks: Vec<&str> = text
            .split("```toml\n")
            .skip(1)
            .filter_map(|rest| rest.split("```").next())
            .filter(|block| block.contains("budget"))
            .collect();
        assert!(!blocks.is_empty(), "{page} shows a budget config");
        for block in blocks {
            let config = ratekeeper::config::from_toml_str(block, page)
                .unwrap_or_else(|error| panic!("{page}:\n{block}\n{error}"));
            assert!(
                config.limits.iter().any(|limit| limit.budgets.any()),
                "{page}: {block}"
            );
        }
    }
}

/// A reload that changes a budget's amount applies to the current period
/// at once: what was spent and reserved stays so, the rest follows.
#[tokio::test]
async fn a_reloaded_amount_applies_to_the_period_under_way() {
    for redis in [None, Some(RedisServer::start())] {
        let offset = noon_offset_hours();
        let daemon = Daemon::start(&config(redis.as_ref(), offset));
        let client = daemon.client().await;
        for _ in 0..3 {
            granted(&client.call(acquire(None)).await.unwrap());
        }
        let used = 3 * RESERVED;
        assert_eq!(limit_budget(&client).await.remaining, 10_000 - used);
        // Twice the amount: $0.02, of which the three calls hold as much as before.
        let raised = config(redis.as_ref(), offset)
            .replace("day = \"0.01\" }\ntenant", "day = \"0.02\" }\ntenant");
        assert_ne!(raised, config(redis.as_ref(), offset));
        daemon
            .reload_with(&raised)
            .await
            .expect("the reload applies");
        assert_eq!(limit_budget(&client).await.remaining, 20_000 - used);
        granted(&client.call(acquire(None)).await.unwrap());
        // A cut below what is out: nothing more is granted.
        let cut = raised.replace("day = \"0.02\" }\ntenant", "day = \"0.005\" }\ntenant");
        daemon.reload_with(&cut).await.expect("the reload applies");
        assert_eq!(limit_budget(&client).await.remaining, 5_000 - 4 * RESERVED);
        let denied = client.call(acquire(None)).await.unwrap();
        assert!(
            matches!(&denied, Response::Denied { bucket, .. } if bucket == "budget_day"),
            "{denied:?}"
        );
    }
}

/// While Redis is down, `Budgets` says the store is unavailable rather than
/// show figures it cannot read (`status` then prints them as unknown).
#[tokio::test]
async fn budgets_say_so_while_the_store_is_down() {
    let mut server = RedisServer::start();
    let daemon = Daemon::start(&config(Some(&server), noon_offset_hours()));
    let client = daemon.client().await;
    granted(&client.call(acquire(None)).await.unwrap());
    server.kill();
    let answer = client
        .call(Request::Budgets {
            limit: Some("chat".into()),
        })
        .await
        .unwrap();
    assert_eq!(
        support::error_code(&answer),
        ratekeeper::proto::ErrorCode::StoreUnavailable,
        "{answer:?}"
    );
}
