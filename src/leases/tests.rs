//! The lease table and settlement arithmetic, case by case.

use super::*;
use crate::limiter::BucketSpec;

fn reserved(role: BucketRole, cost: u64, settle: Settle) -> Reserved {
    Reserved {
        role,
        draw: Draw {
            bucket: BucketSpec::per_minute(role.name(), 10_000, 60),
            cost,
            floor: 0,
        },
        settle,
        resets_at_ms: None,
        spent_counter: None,
    }
}

fn lease(owner: ConnectionId, granted_at: Instant) -> Lease {
    Lease {
        owner,
        origin: Origin::Store,
        tokens: 10,
        reserved: vec![reserved(BucketRole::Tokens, 10, Settle::Total)],
        granted_at,
        learn_as: None,
        slot: None,
        cache_reads_count: true,
    }
}

/// (buckets as role, cost, settle; report input, output) → (adjustment
/// per bucket key, tokens_returned)
#[test]
fn reports_settle_each_bucket_from_its_figure() {
    use BucketRole::*;
    use Settle::*;
    type Buckets = &'static [(BucketRole, u64, Settle)];
    type Adjusted = &'static [(&'static str, i64)];
    type Case = (&'static str, Buckets, (u64, u64), Adjusted, i64);
    let cases: [Case; 6] = [
        (
            "combined, refunded; the request stays spent",
            &[
                (Tokens, 1_500, Total),
                (Requests, 1, Never),
                (Tenant, 1_500, Total),
            ],
            (300, 200),
            &[("tokens", 1_000), ("tenant", 1_000)],
            1_000,
        ),
        (
            "combined, overrun debited",
            &[(Tokens, 1_500, Total)],
            (1_200, 800),
            &[("tokens", -500)],
            -500,
        ),
        (
            "exact usage changes nothing",
            &[(Tokens, 1_500, Total)],
            (1_000, 500),
            &[],
            0,
        ),
        (
            "charge kept (openai); the tenant still settles",
            &[
                (Tokens, 1_000, Never),
                (Tenant, 1_000, Total),
                (GroupTokens, 1_000, Never),
            ],
            (500, 100),
            &[("tenant", 400)],
            0,
        ),
        (
            "separate buckets: input overrun debited, output refunded",
            &[
                (InputTokens, 500, Input),
                (OutputTokens, 1_000, Output),
                (Tenant, 1_500, Total),
            ],
            (700, 300),
            &[
                ("input_tokens", -200),
                ("output_tokens", 700),
                ("tenant", 500),
            ],
            500,
        ),
        (
            "an overrun beyond one full bucket takes one full bucket",
            &[(Tokens, 10, Total)],
            (u64::MAX, u64::MAX),
            &[("tokens", -10_000)],
            -10_000,
        ),
    ];
    for (what, buckets, (input, output), adjustments, returned) in cases {
        let buckets: Vec<Reserved> = buckets
            .iter()
            .map(|&(role, cost, settle)| reserved(role, cost, settle))
            .collect();
        let settlement = settle_usage(&buckets, Reported::Tokens { input, output }, true);
        let got: Vec<(&str, i64)> = settlement
            .adjustments
            .iter()
            .map(|a| (&*a.bucket.key, a.tokens))
            .collect();
        assert_eq!(got, adjustments, "{what}");
        assert_eq!(settlement.tokens_returned, returned, "{what}");
    }
}

#[test]
fn a_disconnect_refund_is_a_fraction_of_each_settling_bucket() {
    use BucketRole::*;
    use Settle::*;
    let buckets = vec![
        reserved(InputTokens, 501, Input),
        reserved(OutputTokens, 1_000, Output),
        reserved(Requests, 1, Never),
        reserved(GroupTokens, 1_501, Never),
    ];
    let refunds: Vec<(String, i64)> = refund_fraction(&buckets, 0.5)
        .into_iter()
        .map(|a| (a.bucket.key.to_string(), a.tokens))
        .collect();
    assert_eq!(
        refunds,
        [
            ("input_tokens".to_string(), 250),
            ("output_tokens".to_string(), 500)
        ]
    );
    let all: Vec<i64> = refund_all(&buckets).iter().map(|a| a.tokens).collect();
    assert_eq!(all, [501, 1_000, 1, 1_501]);
}

#[test]
fn old_leases_expire_and_a_full_table_drops_the_oldest() {
    let start = Instant::now();
    let table = LeaseTable::new(Duration::from_secs(60), 3);
    let first = table.insert(lease(1, start));
    let second = table.insert(lease(1, start + Duration::from_secs(30)));
    assert_eq!(table.expire(start + Duration::from_secs(61)), 1);
    assert!(table.take(first).is_none());
    table.insert(lease(2, start + Duration::from_secs(40)));
    table.insert(lease(2, start + Duration::from_secs(50)));
    table.insert(lease(2, start + Duration::from_secs(55)));
    assert_eq!(table.len(), 3);
    assert!(table.take(second).is_none(), "the oldest made room");
    assert_eq!(table.counters.expired.load(Ordering::Relaxed), 2);
}

#[test]
fn lease_ids_cannot_be_guessed_from_earlier_ones() {
    let now = Instant::now();
    let table = LeaseTable::new(Duration::from_secs(60), 10_000);
    let ids: Vec<u64> = (0..1000).map(|_| table.insert(lease(1, now))).collect();
    assert!(ids.iter().all(|&id| id != 0));
    let distinct: std::collections::HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len());
    let next_is_previous_plus_small = ids
        .windows(2)
        .filter(|pair| pair[1].wrapping_sub(pair[0]) < 1 << 20)
        .count();
    assert_eq!(next_is_previous_plus_small, 0, "ids follow each other");
}

#[test]
fn a_restored_lease_keeps_its_age() {
    let start = Instant::now();
    let after = |seconds| start + Duration::from_secs(seconds);
    let table = LeaseTable::new(Duration::from_secs(60), 100);
    let (old, young) = (
        table.insert(lease(1, start)),
        table.insert(lease(1, after(30))),
    );
    let taken = table.take(old).unwrap();
    table.restore(old, taken);
    assert_eq!(table.expire(after(61)), 1);
    assert!(table.take(old).is_none(), "the old lease expired first");
    assert!(table.take(young).is_some());
}

#[test]
fn a_closed_connection_takes_only_its_own_leases() {
    let now = Instant::now();
    let table = LeaseTable::new(Duration::from_secs(60), 100);
    let mine = table.insert(lease(7, now));
    let theirs = table.insert(lease(8, now));
    let settled = table.insert(lease(7, now));
    assert!(table.take(settled).is_some());
    let taken = table.take_owned_by(7);
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].0, mine);
    assert!(table.take_owned_by(7).is_empty());
    assert!(table.take(theirs).is_some());
    assert!(table.is_empty());
}

#[test]
fn tags_outlive_a_retried_settlement_and_not_the_lease() {
    let table = LeaseTable::new(Duration::from_secs(60), 10);
    let id = table.insert(lease(1, Instant::now()));
    let tag = LeaseTag {
        limit: Arc::from("gpt"),
        tokens: 7,
        tenant: Arc::from(""),
    };
    table.tag(id, tag.clone());
    table.tag(12345, tag.clone());
    assert_eq!(table.tag_of(12345), None, "no lease, no tag");
    // A failed settlement puts the lease back: the tag is still there.
    let taken = table.take(id).unwrap();
    table.restore(id, taken);
    assert_eq!(table.tag_of(id), Some(tag.clone()));
    // Forgotten with its connection: so is the tag.
    assert_eq!(table.take_owned_by(1).len(), 1);
    assert_eq!(table.tag_of(id), None);
    // Evicted for room: the tag goes with the lease.
    let small = LeaseTable::new(Duration::from_secs(60), 1);
    let first = small.insert(lease(1, Instant::now()));
    small.tag(first, tag.clone());
    small.insert(lease(1, Instant::now()));
    assert_eq!(small.tag_of(first), None);
    // Settled elsewhere (taken, never restored): the next sweep drops it.
    let second = table.insert(lease(2, Instant::now()));
    table.tag(second, tag);
    table.take(second);
    table.expire(Instant::now());
    assert_eq!(table.tag_of(second), None);
}

#[test]
fn a_settled_burst_gives_its_memory_back_at_the_next_sweep() {
    let now = Instant::now();
    let table = LeaseTable::new(Duration::from_secs(60), 100_000);
    let ids: Vec<u64> = (0..50_000)
        .map(|owner| table.insert(lease(owner, now)))
        .collect();
    let peak = table.lock().slots.capacity();
    for id in &ids[10..] {
        table.take(*id).unwrap();
    }
    table.expire(now);
    let leases = table.lock();
    for capacity in [
        leases.slots.capacity(),
        leases.by_id.capacity(),
        leases.by_age.capacity(),
        leases.newest_of.capacity(),
    ] {
        assert!(capacity < peak / 100, "{capacity} of {peak}");
    }
    assert_eq!(leases.slots.len(), 10, "the open leases stay");
    drop(leases);
    for id in &ids[..10] {
        assert!(table.take(*id).is_some(), "moved, and still found by id");
    }
}

#[test]
fn settled_leases_leave_no_lasting_trace_in_the_age_queue() {
    let start = Instant::now();
    let table = LeaseTable::new(Duration::from_secs(3600), 1_000_000);
    let unreported = table.insert(lease(1, start));
    for i in 0..20_000 {
        let id = table.insert(lease(2, start + Duration::from_micros(i)));
        assert!(table.take(id).is_some());
    }
    let queued = table.lock().by_age.len();
    assert!(
        queued <= 2 + 1024,
        "{queued} queue entries for one open lease"
    );
    assert_eq!(table.len(), 1);
    assert_eq!(table.expire(start + Duration::from_secs(3601)), 1);
    assert!(table.take(unreported).is_none());
}

#[test]
fn a_lease_restored_after_its_queue_entry_was_dropped_keeps_its_age() {
    let start = Instant::now();
    let after = |seconds| start + Duration::from_secs(seconds);
    let table = LeaseTable::new(Duration::from_secs(60), 1_000_000);
    let old = table.insert(lease(1, start));
    let taken = table.take(old).unwrap();
    // Enough settled leases behind it that the queue is compacted.
    for _ in 0..5_000 {
        let id = table.insert(lease(2, after(10)));
        table.take(id);
    }
    let young = table.insert(lease(1, after(30)));
    assert!(!table.lock().by_age.iter().any(|queued| queued.id == old));
    table.restore(old, taken);
    assert_eq!(table.expire(after(61)), 1);
    assert!(table.take(old).is_none(), "the old lease expired first");
    assert!(table.take(young).is_some());
}

#[test]
fn a_full_table_grants_where_it_evicts() {
    let start = Instant::now();
    let table = LeaseTable::new(Duration::from_secs(3600), 1_000);
    for i in 0..6_000 {
        table.insert(lease(i % 7, start + Duration::from_micros(i)));
    }
    let leases = table.lock();
    let keys: Vec<usize> = leases.by_age.iter().map(|queued| queued.key).collect();
    assert_eq!(keys.len(), 1_000);
    // Oldest to newest, the leases sit one after another in the slab.
    let in_sequence = keys
        .windows(2)
        .filter(|pair| pair[1] == (pair[0] + 1) % 1_000)
        .count();
    assert_eq!(in_sequence, 999, "{keys:?}");
}

/// What the table must do, by a plain model: each open lease with its owner
/// and age; leases taken to be settled are kept aside to be restored.
mod against_a_model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Grant { owner: ConnectionId },
        Settle { pick: usize },
        SettleUnknown { id: u64 },
        Restore { pick: usize },
        Close { owner: ConnectionId },
        Expire { age_ms: u64 },
        Sweep,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..5u64).prop_map(|owner| Op::Grant { owner }),
            3 => any::<usize>().prop_map(|pick| Op::Settle { pick }),
            1 => any::<u64>().prop_map(|id| Op::SettleUnknown { id }),
            2 => any::<usize>().prop_map(|pick| Op::Restore { pick }),
            1 => (0..5u64).prop_map(|owner| Op::Close { owner }),
            1 => (0..300u64).prop_map(|age_ms| Op::Expire { age_ms }),
            1 => Just(Op::Sweep),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn the_table_does_what_the_model_does(
            max_open in 1..40usize,
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let start = Instant::now();
            let at = |ms: u64| start + Duration::from_millis(ms);
            let table = LeaseTable::new(Duration::from_secs(3600), max_open);
            // id → (owner, grant time in ms): open leases, and taken ones.
            let mut open: BTreeMap<u64, (ConnectionId, u64)> = BTreeMap::new();
            let mut taken: Vec<(u64, Lease)> = Vec::new();
            let mut clock_ms = 0;
            for op in ops {
                match op {
                    Op::Grant { owner } => {
                        clock_ms += 1;
                        // Restored leases may have filled it past max_open.
                        while open.len() >= max_open {
                            let oldest = open.iter().min_by_key(|(_, (_, ms))| *ms).map(|(id, _)| *id);
                            open.remove(&oldest.unwrap());
                        }
                        let id = table.insert(lease(owner, at(clock_ms)));
                        prop_assert!(open.insert(id, (owner, clock_ms)).is_none());
                    }
                    Op::Settle { pick } if !open.is_empty() => {
                        let id = *open.keys().nth(pick % open.len()).unwrap();
                        let (owner, ms) = open.remove(&id).unwrap();
                        let lease = table.take(id);
                        prop_assert!(lease.is_some(), "open lease {id} not found");
                        let lease = lease.unwrap();
                        prop_assert_eq!((lease.owner, lease.granted_at), (owner, at(ms)));
                        taken.push((id, lease));
                        prop_assert!(table.take(id).is_none(), "settled twice");
                    }
                    Op::Settle { .. } => {}
                    Op::SettleUnknown { id } => {
                        prop_assert_eq!(table.take(id).is_some(), open.remove(&id).is_some());
                    }
                    Op::Restore { pick } if !taken.is_empty() => {
                        let (id, lease) = taken.swap_remove(pick % taken.len());
                        open.insert(id, (lease.owner, lease.granted_at.duration_since(start).as_millis() as u64));
                        table.restore(id, lease);
                    }
                    Op::Restore { .. } => {}
                    Op::Close { owner } => {
                        let mut got: Vec<u64> = table.take_owned_by(owner).into_iter().map(|(id, lease)| {
                            assert_eq!(lease.owner, owner);
                            id
                        }).collect();
                        got.sort_unstable();
                        let expected: Vec<u64> = open.iter().filter(|(_, (o, _))| *o == owner).map(|(id, _)| *id).collect();
                        open.retain(|_, (o, _)| *o != owner);
                        prop_assert_eq!(got, expected);
                    }
                    Op::Expire { age_ms } => {
                        // Expire everything granted before `clock - age`.
                        let cutoff_ms = clock_ms.saturating_sub(age_ms);
                        let now = at(cutoff_ms) + Duration::from_secs(3600);
                        let before = open.len();
                        open.retain(|_, (_, ms)| *ms >= cutoff_ms);
                        prop_assert_eq!(table.expire(now), before - open.len());
                    }
                    Op::Sweep => {
                        let mut leases = table.lock();
                        leases.shrink_after_peak();
                    }
                }
                prop_assert_eq!(table.len(), open.len());
            }
            for (id, (owner, _)) in open {
                let lease = table.take(id);
                prop_assert!(lease.is_some());
                prop_assert_eq!(lease.unwrap().owner, owner);
            }
            prop_assert!(table.is_empty());
        }
    }
}

/// $3 a million input tokens, $0.30 cache reads, $3.75 cache writes, $15 output.
const SONNET: Price = Price {
    input: 3_000_000,
    cached_input: 300_000,
    cache_write: 3_750_000,
    output: 15_000_000,
};

#[test]
fn a_budget_settles_to_what_the_usage_costs_by_kind_of_token() {
    let budget = BucketRole::Budget(
        crate::limiter::BudgetOwner::Limit,
        crate::budget::spans::Span::RollingHour,
    );
    // Reserved: 1,000 input at the dearest input price, 500 output.
    let reservation = SONNET.most_for(1_000, 500);
    assert_eq!(reservation, 11_250);
    let mut calendar = reserved(budget, reservation, Settle::Price(SONNET));
    calendar.spent_counter = Some(BucketSpec::never_refilled("spent", 1_000_000, 1));
    let buckets = [reserved(BucketRole::Tokens, 1_500, Settle::Total), calendar];
    let billed = Reported::Billed(Usage {
        input: 100,
        cached_input: 800,
        cache_write: 100,
        output: 200,
    });
    // Anthropic: cache reads are not in the rate limit's count.
    let settlement = settle_usage(&buckets, billed, false);
    let cost = 300 + 240 + 375 + 3_000;
    let got: Vec<(&str, i64)> = settlement
        .adjustments
        .iter()
        .map(|a| (&*a.bucket.key, a.tokens))
        .collect();
    assert_eq!(
        got,
        [
            ("tokens", 1_500 - (100 + 100 + 200)),
            ("budget_rolling_hour", reservation as i64 - cost),
            // What was spent is counted apart from what was reserved.
            ("spent", -cost),
        ]
    );
    assert_eq!(settlement.tokens_returned, 1_100);
    // OpenAI: they are.
    let settlement = settle_usage(&buckets, billed, true);
    assert_eq!(settlement.tokens_returned, 1_500 - 1_200);
    // A Report carries no cache figures: its input at the full input price.
    let settlement = settle_usage(
        &buckets,
        Reported::Tokens {
            input: 1_000,
            output: 500,
        },
        true,
    );
    let got: Vec<(&str, i64)> = settlement
        .adjustments
        .iter()
        .map(|a| (&*a.bucket.key, a.tokens))
        .collect();
    let cost = 3_000 + 7_500;
    assert_eq!(
        got,
        [
            ("budget_rolling_hour", reservation as i64 - cost),
            ("spent", -cost)
        ]
    );
}

#[test]
fn a_calendar_budget_denial_can_be_retried_when_its_period_ends() {
    let mut budget = reserved(
        BucketRole::Budget(
            crate::limiter::BudgetOwner::Tenant,
            crate::budget::spans::Span::Calendar(crate::budget::period::Calendar::Day),
        ),
        10,
        Settle::Price(SONNET),
    );
    budget.draw.bucket = BucketSpec::never_refilled("b", 100, 90_000_000);
    budget.resets_at_ms = Some(86_400_000);
    assert_eq!(
        budget.retry_after_ms(crate::limiter::bucket::NEVER_MS, 86_000_000),
        400_000
    );
    // Never 0: a retry at the very end still waits for the next period.
    assert_eq!(
        budget.retry_after_ms(crate::limiter::bucket::NEVER_MS, 86_400_000),
        1
    );
    let tokens = reserved(BucketRole::Tokens, 10, Settle::Total);
    assert_eq!(tokens.retry_after_ms(250, 0), 250);
}
