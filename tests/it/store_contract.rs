//! One contract, every store: the embedded store, Redis alone and as a
//! Cluster, each decorator over the embedded store, and the daemon's whole
//! stack over Redis. Each operation of `limiter::Op` and each lifecycle call
//! gets the answer the contract says, so a store that answers the wrong
//! kind, forgets all-or-nothing, or a decorator that changes what it should
//! only forward, fails here.
//!
//! The buckets refill by the day, so the few seconds a busy machine may add
//! between calls move no level by a whole token; the budget never refills.

use std::sync::Arc;
use std::time::Duration;

use ratekeeper::app::redis_settings;
use ratekeeper::config::RedisConfig;
use ratekeeper::limiter::bucket::{BucketSpec, NEVER_MS, Refill, Window};
use ratekeeper::limiter::{
    Adjustment, Decision, EmbeddedStore, FailFastStore, FailurePolicy, FallbackStore,
    InstrumentedStore, Lowering, Origin, RedisStore, SlotSpec, Store, StoreError, StoreOps, Stores,
};
use ratekeeper::metrics::StoreCalls;

use crate::support::draw;
use crate::support::redis::{RedisCluster, RedisServer};

const DAY_MS: u64 = 86_400_000;

/// `capacity` a day, all of it at once; keys share one hash tag, as the
/// keys of one limit do, so a Cluster takes them in one script call.
fn per_day(name: &str, capacity: u64) -> BucketSpec {
    BucketSpec::new(
        format!("rk:{{contract}}:{name}"),
        capacity,
        Refill::new(capacity, Window::Day, capacity),
    )
}

/// A budget of `capacity` that never refills, kept for two days from now
/// (every store's clock reads as Unix ms; Redis's is `TIME`).
fn never_refilled(name: &str, capacity: u64) -> BucketSpec {
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    BucketSpec::never_refilled(
        format!("rk:{{contract}}:{name}"),
        capacity,
        unix_ms + 2 * DAY_MS as i64,
    )
}

fn adjustment(bucket: &BucketSpec, tokens: i64) -> Adjustment {
    Adjustment {
        bucket: bucket.clone(),
        tokens,
    }
}

/// The wait for `tokens` of a bucket of `capacity` a day, in ms.
fn refill_ms(tokens: u64, capacity: u64) -> u64 {
    tokens * DAY_MS / capacity
}

/// Asserts a wait of `expected_ms`, less what the calls since may have
/// taken off it (a minute at most, on the busiest machine).
fn assert_about(actual_ms: u64, expected_ms: u64, what: &str) {
    assert!(
        (expected_ms.saturating_sub(60_000)..=expected_ms).contains(&actual_ms),
        "{what}: {actual_ms} ms, expected about {expected_ms} ms"
    );
}

/// Runs every operation against `store` and checks each answer.
async fn holds_the_contract(store: &dyn Store, kind: &str) {
    assert_eq!(store.kind(), kind);
    store.warm_up().await.expect("warm_up");
    store.ping().await.expect("ping");
    store.reconciled().await;

    let tokens = per_day("tokens", 1000);
    let requests = per_day("requests", 2);
    let both = [tokens.clone(), requests.clone()];
    assert_eq!(store.levels(&both).await.unwrap(), [1000, 2], "fresh: full");

    // A grant takes from every bucket.
    let grant = store
        .acquire(&[draw(&tokens, 600), draw(&requests, 1)], 0)
        .await
        .unwrap();
    assert!(
        matches!(grant, Decision::Granted { wait_ms: 0, .. }),
        "{grant:?}"
    );
    assert_eq!(store.levels(&both).await.unwrap(), [400, 1]);

    // All or nothing: the tokens fit, the requests do not, so neither is
    // taken, and the denial names the requests.
    let denied = store
        .acquire(&[draw(&tokens, 100), draw(&requests, 2)], 0)
        .await
        .unwrap();
    match denied {
        Decision::Denied {
            bucket,
            retry_after_ms,
        } => {
            assert_eq!(bucket, 1, "the draw that needs the longest");
            assert_about(retry_after_ms, refill_ms(1, 2), "one request");
        }
        granted => panic!("granted past the requests: {granted:?}"),
    }
    assert_eq!(
        store.levels(&both).await.unwrap(),
        [400, 1],
        "nothing taken"
    );

    // A wait longer than allowed is denied with the rest of it; one within
    // it is granted with all of it, and the bucket owes it.
    match store.acquire(&[draw(&tokens, 600)], 1_000).await.unwrap() {
        Decision::Denied {
            bucket: 0,
            retry_after_ms,
        } => assert_about(
            retry_after_ms,
            refill_ms(200, 1000) - 1_000,
            "the wait past 1 s",
        ),
        other => panic!("{other:?}"),
    }
    match store.acquire(&[draw(&tokens, 600)], DAY_MS).await.unwrap() {
        Decision::Granted { wait_ms, .. } => {
            assert_about(wait_ms, refill_ms(200, 1000), "200 tokens of refill")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.levels(&both).await.unwrap(), [-200, 1]);

    // No wait makes room for more than the capacity.
    assert!(matches!(
        store.acquire(&[draw(&tokens, 1001)], DAY_MS).await,
        Err(StoreError::CostExceedsCapacity { .. })
    ));

    // Refunds fill up to the capacity; a debit (an overrun) takes.
    let refunds = [adjustment(&tokens, 600), adjustment(&requests, 1)];
    store.adjust(&refunds, Origin::Store).await.unwrap();
    assert_eq!(store.levels(&both).await.unwrap(), [400, 2]);
    store
        .adjust(&[adjustment(&tokens, 700)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(store.levels(&both).await.unwrap(), [1000, 2], "capped");
    store
        .adjust(&[adjustment(&tokens, -100)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(store.levels(&both).await.unwrap(), [900, 2]);
    store.adjust(&[], Origin::Store).await.unwrap();

    // Feedback lowers a bucket and never raises it.
    for (level, expected) in [(300, 300), (500, 300)] {
        let lowering = Lowering {
            bucket: tokens.clone(),
            level,
            fleet: None,
        };
        store.lower(&[lowering]).await.unwrap();
        assert_eq!(store.levels(&both).await.unwrap(), [expected, 2]);
    }
    store.lower(&[]).await.unwrap();

    holds_the_budget_contract(store).await;
    holds_a_reloaded_budget(store).await;

    // Slots: two holders at most; a holder's second take keeps its slot.
    let slots = SlotSpec {
        key: "rk:{contract}:slots".into(),
        max: 2,
        timeout_ms: DAY_MS,
    };
    assert_eq!(store.slots_held(&slots).await.unwrap(), 0);
    for (holder, taken) in [("a", true), ("b", true), ("c", false), ("a", true)] {
        let origin = store.take_slot(&slots, holder).await.unwrap();
        assert_eq!(origin, taken.then_some(Origin::Store), "take for {holder}");
    }
    assert_eq!(store.slots_held(&slots).await.unwrap(), 2);
    store.give_slot(&slots, "a", Origin::Store).await.unwrap();
    store
        .give_slot(&slots, "nobody", Origin::Store)
        .await
        .unwrap();
    assert_eq!(store.slots_held(&slots).await.unwrap(), 1);
    assert_eq!(
        store.take_slot(&slots, "c").await.unwrap(),
        Some(Origin::Store)
    );
    assert_eq!(store.slots_held(&slots).await.unwrap(), 2);
}

/// A budget (issue 30): a bucket that never refills, drawn beside one that
/// does. No wait makes room in it: a denial says so with `NEVER_MS` and
/// names it, every time (a decorator that repeats denials too); refunds
/// fill it up to its capacity, overruns take, floors hold.
async fn holds_the_budget_contract(store: &dyn Store) {
    let budget = never_refilled("budget:day:2026-12-07", 100);
    let tokens = per_day("budget_tokens", 1000);
    let both = [tokens.clone(), budget.clone()];
    assert_eq!(store.levels(&both).await.unwrap(), [1000, 100], "fresh");
    let grant = store
        .acquire(&[draw(&tokens, 900), draw(&budget, 60)], 0)
        .await
        .unwrap();
    assert!(
        matches!(grant, Decision::Granted { wait_ms: 0, .. }),
        "{grant:?}"
    );
    assert_eq!(store.levels(&both).await.unwrap(), [100, 40]);
    // The tokens would wait (within the day allowed), the budget never
    // has room: it is the one named, with the sentinel, and nothing is taken.
    for attempt in 0..2 {
        let denied = store
            .acquire(&[draw(&tokens, 500), draw(&budget, 50)], DAY_MS)
            .await
            .unwrap();
        assert_eq!(
            denied,
            Decision::Denied {
                retry_after_ms: NEVER_MS,
                bucket: 1
            },
            "attempt {attempt}"
        );
    }
    assert_eq!(store.levels(&both).await.unwrap(), [100, 40]);
    // A floor held for higher classes counts as for any bucket.
    let floored = ratekeeper::limiter::bucket::Draw {
        floor: 10,
        ..draw(&budget, 31)
    };
    assert!(matches!(
        store.acquire(&[floored], 0).await.unwrap(),
        Decision::Denied {
            retry_after_ms: NEVER_MS,
            bucket: 0
        }
    ));
    match store.acquire(&[draw(&budget, 40)], 0).await.unwrap() {
        Decision::Granted { wait_ms: 0, .. } => {}
        other => panic!("what is left is granted at once: {other:?}"),
    }
    assert!(matches!(
        store.acquire(&[draw(&budget, 101)], DAY_MS).await,
        Err(StoreError::CostExceedsCapacity { .. })
    ));
    // Refunds fill up to the capacity; a debit (an overrun) takes.
    store
        .adjust(&[adjustment(&budget, 30)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(store.levels(&both).await.unwrap(), [100, 30]);
    store
        .adjust(&[adjustment(&budget, 500)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(store.levels(&both).await.unwrap(), [100, 100], "capped");
    store
        .adjust(&[adjustment(&budget, -30)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(store.levels(&both).await.unwrap(), [100, 70]);
}

/// A budget whose amount a reload changes (issue 30): the new amount holds
/// for the current period at once, and what was spent stays spent. A
/// bucket that never refills cannot fill up to a raised capacity as a
/// refilling one does, so its level moves by the change: $9 spent of $10,
/// raised to $20, leaves $11; cut to $5, leaves -$4 (nothing more is
/// granted until refunds cover it). Reading under another amount moves
/// nothing stored, and a full budget reads full under any amount.
async fn holds_a_reloaded_budget(store: &dyn Store) {
    let day = never_refilled("budget:day:2026-12-08", 10);
    let with_amount = |capacity| BucketSpec {
        capacity,
        largest: capacity,
        ..day.clone()
    };
    let (raised, cut) = (with_amount(20), with_amount(5));
    let levels = |bucket: &BucketSpec| {
        let bucket = bucket.clone();
        async move { store.levels(&[bucket]).await.unwrap()[0] }
    };
    let granted = |decision: Decision| matches!(decision, Decision::Granted { wait_ms: 0, .. });
    assert!(granted(store.acquire(&[draw(&day, 9)], 0).await.unwrap()));
    assert_eq!(levels(&day).await, 1);
    assert_eq!(levels(&raised).await, 11, "raised by 10: 10 more to spend");
    assert_eq!(levels(&cut).await, -4, "cut by 5: 4 spent above it");
    assert_eq!(levels(&day).await, 1, "a read writes nothing");

    // Drawn under the raised amount: what is left of it.
    assert!(granted(
        store.acquire(&[draw(&raised, 10)], 0).await.unwrap()
    ));
    assert_eq!(levels(&raised).await, 1);
    assert_eq!(levels(&day).await, -9, "19 spent of 10");
    // Under the cut one nothing fits; refunds and overruns count from
    // where the cut put it.
    assert_eq!(
        store.acquire(&[draw(&cut, 1)], DAY_MS).await.unwrap(),
        Decision::Denied {
            retry_after_ms: NEVER_MS,
            bucket: 0
        }
    );
    store
        .adjust(&[adjustment(&cut, 6)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(levels(&cut).await, -8);
    store
        .adjust(&[adjustment(&cut, -2)], Origin::Store)
        .await
        .unwrap();
    assert_eq!(levels(&cut).await, -10);
    assert_eq!(levels(&raised).await, 5, "15 spent of 20");
    // Refunded to full (a Redis key deleted): full under any amount.
    store
        .adjust(&[adjustment(&raised, 100)], Origin::Store)
        .await
        .unwrap();
    for (bucket, full) in [(&day, 10), (&raised, 20), (&cut, 5)] {
        assert_eq!(levels(bucket).await, full);
    }
}

fn redis(urls: Vec<String>) -> Arc<RedisStore> {
    let mut config = RedisConfig::with_url(urls[0].clone());
    if urls.len() > 1 {
        config.url = None;
        config.cluster_nodes = urls;
    }
    Arc::new(RedisStore::new(&redis_settings(&config)).expect("valid config"))
}

fn embedded() -> Arc<dyn Store> {
    Arc::new(EmbeddedStore::new())
}

#[tokio::test]
async fn the_embedded_store() {
    holds_the_contract(&EmbeddedStore::new(), "embedded").await;
}

#[tokio::test]
async fn the_instrumented_store_over_the_embedded_one() {
    let calls = Arc::new(StoreCalls::default());
    let store = InstrumentedStore::new(embedded(), calls.clone(), Duration::MAX);
    holds_the_contract(&store, "embedded").await;
    assert!(
        calls.since_last_success().is_some(),
        "the calls are counted"
    );
}

#[tokio::test]
async fn the_fail_fast_store_over_the_embedded_one() {
    holds_the_contract(&FailFastStore::new(embedded()), "embedded").await;
}

#[tokio::test]
async fn the_fallback_store_under_each_policy_over_the_embedded_one() {
    for policy in [
        FailurePolicy::FailClosed,
        FailurePolicy::FailOpen,
        FailurePolicy::Local,
    ] {
        let store = FallbackStore::new(embedded(), policy, 0.5);
        holds_the_contract(&store, "embedded").await;
        assert_eq!(store.policy_decisions(), 0, "{policy:?}: never needed");
    }
}

#[tokio::test]
async fn the_embedded_stack_the_daemon_builds() {
    let stores = Stores::embedded(Arc::new(StoreCalls::default()));
    holds_the_contract(stores.store.as_ref(), "embedded").await;
}

#[tokio::test]
async fn the_redis_store() {
    let server = RedisServer::start();
    holds_the_contract(redis(vec![server.url()]).as_ref(), "redis").await;
}

#[tokio::test]
async fn the_redis_store_on_a_cluster() {
    let cluster = RedisCluster::start();
    holds_the_contract(redis(cluster.urls()).as_ref(), "redis").await;
}

#[tokio::test]
async fn the_redis_stack_the_daemon_builds() {
    let server = RedisServer::start();
    let stores = Stores::over_redis(
        redis(vec![server.url()]),
        Arc::new(StoreCalls::default()),
        Duration::from_millis(250),
        FailurePolicy::Local,
        0.5,
    );
    holds_the_contract(stores.store.as_ref(), "redis").await;
    let fallback = stores.fallback.expect("a failure policy over Redis");
    assert_eq!(fallback.policy_decisions(), 0);
}
