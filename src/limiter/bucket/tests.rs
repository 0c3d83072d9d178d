use super::*;

/// 60 000 tokens per minute: one token per millisecond, easy to read.
fn spec(capacity: u64) -> BucketSpec {
    BucketSpec::per_minute("k", capacity, 60_000)
}

fn at(level_tokens: i64) -> BucketState {
    BucketState {
        level: level_tokens * UNITS_PER_TOKEN,
        updated_ms: 0,
    }
}

#[test]
fn single_bucket_decisions() {
    let deny = |retry_after_ms| Plan::Deny {
        retry_after_ms,
        bucket: 0,
    };
    let grant = |wait_ms| Plan::Grant { wait_ms };
    let never = Plan::Impossible { bucket: 0 };
    // (level, cost, floor, max wait) → plan
    let cases: &[(i64, u64, u64, u64, Plan)] = &[
        (100, 40, 0, 0, grant(0)),
        (100, 100, 0, 0, grant(0)),
        (100, 101, 0, 0, deny(1)),
        (100, 101, 0, 1, grant(1)),
        (0, 50, 0, 50, grant(50)),
        (0, 50, 0, 49, deny(1)),
        (-30, 50, 0, 100, grant(80)),
        (-30, 50, 0, 20, deny(60)),
        // A floor of 20 held for higher classes: usable level is 80.
        (100, 80, 20, 0, grant(0)),
        (100, 81, 20, 0, deny(1)),
        // Cost above capacity (or above capacity less the floor) never fits.
        (1000, 1001, 0, u64::MAX, never),
        (1000, 900, 101, u64::MAX, never),
    ];
    for &(level, cost, floor, max_wait, expected) in cases {
        let draw = Draw {
            bucket: spec(1000),
            cost,
            floor,
        };
        assert_eq!(
            plan(&[draw], &[at(level)], max_wait),
            expected,
            "level {level}, cost {cost}, floor {floor}, max wait {max_wait}"
        );
    }
}

#[test]
fn a_cost_above_the_capacity_waits_for_a_full_bucket_up_to_the_largest() {
    let deny = |retry_after_ms| Plan::Deny {
        retry_after_ms,
        bucket: 0,
    };
    let grant = |wait_ms| Plan::Grant { wait_ms };
    let never = Plan::Impossible { bucket: 0 };
    // A bucket of 1000 that passes single costs up to 3000 once full.
    // (level, cost, floor, max wait) → plan
    let cases: &[(i64, u64, u64, u64, Plan)] = &[
        (1000, 1001, 0, 0, grant(0)),
        (1000, 3000, 0, 0, grant(0)),
        (1000, 3001, 0, u64::MAX, never),
        (1000, 2900, 101, u64::MAX, never),
        // Not yet full: it waits until the bucket is, not for its cost.
        (400, 2500, 0, 600, grant(600)),
        (400, 2500, 0, 599, deny(1)),
        // A reservation before it in debt: first that is paid back.
        (-1500, 3000, 0, 10_000, grant(2500)),
        // Its floor counts no further than a full bucket.
        (900, 950, 100, 0, deny(100)),
        (1000, 950, 100, 0, grant(0)),
        // Within the capacity nothing changes.
        (100, 101, 0, 0, deny(1)),
    ];
    for &(level, cost, floor, max_wait, expected) in cases {
        let draw = Draw {
            bucket: spec(1000).with_largest(3000),
            cost,
            floor,
        };
        assert_eq!(
            plan(std::slice::from_ref(&draw), &[at(level)], max_wait),
            expected,
            "level {level}, cost {cost}, floor {floor}, max wait {max_wait}"
        );
        if let Plan::Grant { .. } = expected {
            let after = commit(&[draw], &[at(level)]);
            assert_eq!(after[0], at(level - cost as i64), "the whole cost is taken");
        }
    }
    // The largest is never below the capacity.
    assert_eq!(spec(1000).with_largest(10).largest, 1000);
}

#[test]
fn waits_round_up_to_whole_milliseconds() {
    // 1 token per minute: one token takes 60 000 ms to refill.
    let slow = BucketSpec::per_minute("k", 10, 1);
    let draw = Draw {
        bucket: slow,
        cost: 1,
        floor: 0,
    };
    let almost = BucketState {
        level: UNITS_PER_TOKEN - 1,
        updated_ms: 0,
    };
    assert_eq!(plan(&[draw], &[almost], 1), Plan::Grant { wait_ms: 1 });
}

#[test]
fn multi_bucket_takes_the_longest_wait_and_names_the_refuser() {
    let draws = [
        Draw {
            bucket: spec(1000),
            cost: 10,
            floor: 0,
        },
        Draw {
            bucket: spec(1000),
            cost: 10,
            floor: 0,
        },
    ];
    assert_eq!(
        plan(&draws, &[at(5), at(-20)], 100),
        Plan::Grant { wait_ms: 30 }
    );
    assert_eq!(
        plan(&draws, &[at(5), at(-20)], 10),
        Plan::Deny {
            retry_after_ms: 20,
            bucket: 1
        }
    );
    let after = commit(&draws, &[at(5), at(-20)]);
    assert_eq!(after, vec![at(-5), at(-30)]);
}

#[test]
fn refill_is_continuous_and_capped() {
    let bucket = spec(1000);
    let state = at(-500);
    assert_eq!(state.refilled(&bucket, 200).tokens(&bucket), -300);
    assert_eq!(state.refilled(&bucket, 5_000).tokens(&bucket), 1000);
    assert_eq!(state.refilled(&bucket, 200).ms_until_full(&bucket), 1300);
    // A clock that steps back refills nothing.
    let later = state.refilled(&bucket, 200);
    assert_eq!(later.refilled(&bucket, 100), later);
}

/// Issue 27, item 10: after a failover to a node whose clock lags, refill
/// froze until the clock caught up with the stored time. A step back of
/// more than `CLOCK_STEP_BACK_MS` is followed from where the clock is.
#[test]
fn a_clock_that_steps_far_back_refills_from_where_it_is() {
    let bucket = spec(1000);
    let before = BucketState {
        level: -500 * UNITS_PER_TOKEN,
        updated_ms: 60_000,
    };
    let back = 60_000 - CLOCK_STEP_BACK_MS - 1;
    let stepped = before.refilled(&bucket, back);
    assert_eq!(
        stepped.level, before.level,
        "the step itself refills nothing"
    );
    assert_eq!(stepped.updated_ms, back);
    let after = stepped.refilled(&bucket, back + 300);
    assert_eq!(after.tokens(&bucket), -200);
    // A step within the bound keeps waiting for the stored time.
    let small = before.refilled(&bucket, 60_000 - CLOCK_STEP_BACK_MS);
    assert_eq!(small, before);
}

#[test]
fn adjustments_refund_and_debit_but_never_overfill() {
    let bucket = spec(1000);
    assert_eq!(at(900).adjusted(&bucket, 50), at(950));
    assert_eq!(at(900).adjusted(&bucket, 500), at(1000));
    assert_eq!(at(10).adjusted(&bucket, -40), at(-30));
}

#[test]
fn overruns_hold_a_bucket_at_most_one_capacity_below_its_reservations() {
    let bucket = spec(1000);
    let debt = |tokens: i64, at_ms: i64| OverrunDebt {
        units: tokens * UNITS_PER_TOKEN,
        at_ms,
    };
    let tokens = |units: i64| units / UNITS_PER_TOKEN;
    // (level, debt then, overrun, now) → (level, debt, clipped), in tokens;
    // one token refills (and pays back) per ms.
    type After = (i64, i64, i64);
    let cases: &[(i64, OverrunDebt, u64, i64, After)] = &[
        // No debt: the overrun is taken whole, up to one capacity.
        (500, debt(0, 0), 300, 0, (200, 300, 0)),
        (500, debt(0, 0), 1_500, 0, (-500, 1_000, 500)),
        // Reservations waiting deep below zero do not stop honest overruns.
        (-3_000, debt(0, 0), 400, 0, (-3_400, 400, 0)),
        // A full debt takes nothing more until refill pays some back.
        (-500, debt(1_000, 0), 10, 0, (-500, 1_000, 10)),
        (-400, debt(1_000, 0), 300, 100, (-500, 1_000, 200)),
        // A refund pays the debt too: never more than the bucket is below full.
        (900, debt(1_000, 0), 1_000, 0, (0, 1_000, 100)),
        // A clock that stepped back pays nothing back.
        (0, debt(600, 50), 500, 20, (-400, 1_000, 100)),
    ];
    for &(level, then, overrun, now, expected) in cases {
        let (state, debt, clipped) = at(level).overrun(&bucket, then, overrun, now);
        assert_eq!(
            (tokens(state.level), tokens(debt.units), tokens(clipped)),
            expected,
            "level {level}, debt {then:?}, overrun {overrun} at {now}"
        );
        assert_eq!(debt.at_ms, now);
    }
    // Usage at u64::MAX stays exact: one capacity, no overflow.
    let (state, debt, clipped) = at(0).overrun(&bucket, OverrunDebt::default(), u64::MAX, 0);
    assert_eq!((state, debt.units), (at(-1_000), 1_000 * UNITS_PER_TOKEN));
    assert!(clipped > 0);
}

#[test]
fn negative_levels_report_whole_tokens_rounded_down() {
    let state = BucketState {
        level: -1,
        updated_ms: 0,
    };
    assert_eq!(state.tokens(&spec(10)), -1);
}

#[test]
fn windows_refill_in_exact_units_where_they_can() {
    // (amount, window, capacity) → (units per token, units per ms)
    let cases: &[(u64, Window, u64, (i64, i64))] = &[
        // Per minute: 60 000 units a token, whatever the figures.
        (500, Window::Minute, 500, (60_000, 500)),
        (7, Window::Minute, 10_000_000_000, (60_000, 7)),
        // Per second: 10 a second is 1 token = 100 units, 1 unit a ms.
        (10, Window::Second, 10, (100, 1)),
        (3, Window::Second, 3, (1_000, 3)),
        // 10 000 a day: gcd 10 000, a token is 8 640 units.
        (10_000, Window::Day, 10_000, (8_640, 1)),
        // 1 000 003 a day (prime): exact, a token is a day of units.
        (1_000_003, Window::Day, 1_000_003, (86_400_000, 1_000_003)),
        // A burst whose exact units would pass 2^52: per-minute units, rate rounded down.
        (100_000_007, Window::Day, 100_000_007, (60_000, 69_444)),
    ];
    for &(amount, window, capacity, expected) in cases {
        let refill = Refill::new(amount, window, capacity);
        assert_eq!(
            (refill.units_per_token(), refill.units_per_ms()),
            expected,
            "{amount} per {window:?}"
        );
        assert_eq!(refill.amount(), amount);
    }
    // A day bucket refills a day's amount in a day, to the token.
    let day = BucketSpec::new("k", 10_000, Refill::new(10_000, Window::Day, 10_000));
    assert_eq!(day.refilled_in(Window::Day.ms()), 10_000);
    assert_eq!(day.refilled_in(Window::Hour.ms()), 416);
    let empty = BucketState {
        level: 0,
        updated_ms: 0,
    };
    assert_eq!(empty.ms_until_full(&day), 86_400_000);
    // Rounded down: never faster than the configured rate.
    let rounded = BucketSpec::new(
        "k",
        100_000_007,
        Refill::new(100_000_007, Window::Day, 100_000_007),
    );
    assert!(rounded.refilled_in(Window::Day.ms()) <= 100_000_007);
    assert!(rounded.refilled_in(Window::Day.ms()) > 100_000_007 - 1_440);
}

/// A budget of 1000 that never refills, kept until `KEEP`.
const KEEP: i64 = 1_800_000_000_000;

fn budget(capacity: u64) -> BucketSpec {
    BucketSpec::never_refilled("budget", capacity, KEEP)
}

/// `tokens` of a never-refilling bucket (one unit a token) at time 0.
fn budget_at(tokens: i64) -> BucketState {
    BucketState {
        level: tokens,
        updated_ms: 0,
    }
}

#[test]
fn a_never_refilling_bucket_counts_one_unit_a_token_and_refills_nothing() {
    let never = Refill::never();
    assert!(!never.refills());
    assert!(Refill::per_minute(1).refills());
    assert_eq!(
        (never.units_per_token(), never.units_per_ms()),
        (1, 0),
        "a token is a unit, none comes back"
    );
    assert_eq!((never.amount(), never.per_minute_rounded()), (0, 0));
    assert_eq!(never.scaled(0.5, 10), never, "a share never refills either");
    let bucket = budget(1000);
    assert_eq!((bucket.largest, bucket.keep_until_ms), (1000, Some(KEEP)));
    assert_eq!(bucket.capacity_units(), 1000);
    assert_eq!(bucket.refilled_in(86_400_000 * 365), 0);
    // Days later, still where it was; the time moves on.
    let days = 10 * 86_400_000;
    let later = budget_at(-50).refilled(&bucket, days);
    assert_eq!((later.level, later.updated_ms), (-50, days));
    assert_eq!(later.ms_until_full(&bucket), i64::MAX);
    assert_eq!(budget_at(1000).ms_until_full(&bucket), 0);
    // Existing constructors keep no instant.
    assert_eq!(spec(10).keep_until_ms, None);
}

/// A budget's amount changed by a reload holds for the current period at
/// once, and what was spent stays spent: read under another capacity than
/// it was written under, a budget moves by the change; a refilling bucket
/// fills up to a raised capacity by itself and is only capped.
#[test]
fn a_budget_read_under_another_amount_keeps_what_was_spent() {
    // (level, written under, capacity now) → level now
    let cases: &[(i64, Option<i64>, u64, i64)] = &[
        (1, Some(10), 20, 11),
        (1, Some(10), 5, -4),
        (10, Some(10), 20, 20),
        (-3, Some(10), 10, -3),
        // Written without one (before the rule): under the one in force.
        (1, None, 20, 1),
        (7, None, 5, 5),
    ];
    for &(level, written, capacity, expected) in cases {
        let bucket = budget(capacity);
        let now = budget_at(level)
            .rebased(&bucket, written)
            .refilled(&bucket, 0);
        assert_eq!(
            now.level, expected,
            "{level} of {written:?}, read under {capacity}"
        );
    }
    assert_eq!(budget(20).written_capacity(), Some(20));
    // A refilling bucket remembers nothing and moves nothing.
    let refilling = spec(20);
    assert_eq!(refilling.written_capacity(), None);
    let state = BucketState {
        level: 60_000,
        updated_ms: 0,
    };
    assert_eq!(state.rebased(&refilling, Some(600_000)), state);
}

#[test]
fn a_never_refilling_bucket_denies_what_it_cannot_cover_whatever_the_wait() {
    let deny = Plan::Deny {
        retry_after_ms: NEVER_MS,
        bucket: 0,
    };
    let grant = Plan::Grant { wait_ms: 0 };
    let impossible = Plan::Impossible { bucket: 0 };
    // (level, cost, floor, max wait) → plan
    let cases: &[(i64, u64, u64, u64, Plan)] = &[
        (1000, 1000, 0, 0, grant),
        (100, 100, 0, 0, grant),
        (100, 101, 0, 0, deny),
        (100, 101, 0, u64::MAX, deny),
        (0, 1, 0, NEVER_MS, deny),
        (-30, 1, 0, u64::MAX, deny),
        // A floor of 20 held for higher classes: usable level is 80.
        (100, 80, 20, 0, grant),
        (100, 81, 20, u64::MAX, deny),
        (1000, 1001, 0, u64::MAX, impossible),
        (1000, 900, 101, 0, impossible),
    ];
    for &(level, cost, floor, max_wait, expected) in cases {
        let draw = Draw {
            bucket: budget(1000),
            cost,
            floor,
        };
        assert_eq!(
            plan(&[draw], &[budget_at(level)], max_wait),
            expected,
            "level {level}, cost {cost}, floor {floor}, max wait {max_wait}"
        );
    }
}

#[test]
fn a_never_refilling_bucket_short_of_its_draw_is_the_one_named() {
    let tokens = Draw {
        bucket: spec(1000),
        cost: 10,
        floor: 0,
    };
    let money = |cost| Draw {
        bucket: budget(1000),
        cost,
        floor: 0,
    };
    // The tokens wait 30 ms; the budget has 5 and no wait helps.
    let draws = [tokens.clone(), money(10), money(20)];
    let states = [at(-20), budget_at(5), budget_at(5)];
    let denied = Plan::Deny {
        retry_after_ms: NEVER_MS,
        bucket: 1,
    };
    assert_eq!(plan(&draws, &states, u64::MAX), denied, "the first budget");
    // A refilling wait even longer than the sentinel does not hide it.
    let slow = Draw {
        bucket: BucketSpec::per_minute("slow", 1 << 40, 1),
        cost: 1 << 40,
        floor: 0,
    };
    let deep = BucketState {
        level: -(1 << 50),
        updated_ms: 0,
    };
    assert_eq!(
        plan(&[slow, money(10)], &[deep, budget_at(5)], 0),
        Plan::Deny {
            retry_after_ms: NEVER_MS,
            bucket: 1
        }
    );
    // An impossible cost after it still comes first.
    let oversized = Draw {
        cost: 1001,
        ..tokens.clone()
    };
    assert_eq!(
        plan(&[money(10), oversized], &[budget_at(5), at(1000)], 0),
        Plan::Impossible { bucket: 1 }
    );
    // Covered, the budget waits for no one: the tokens' wait is the grant's.
    assert_eq!(
        plan(&[tokens, money(5)], &[at(-20), budget_at(5)], 100),
        Plan::Grant { wait_ms: 30 }
    );
}

#[test]
fn a_never_refilling_bucket_takes_refunds_up_to_its_capacity_and_overruns_within_its_debt() {
    let bucket = budget(1000);
    assert_eq!(budget_at(900).adjusted(&bucket, 50), budget_at(950));
    assert_eq!(budget_at(900).adjusted(&bucket, 500), budget_at(1000));
    assert_eq!(budget_at(10).adjusted(&bucket, -40), budget_at(-30));
    // The debt never decays (nothing refills), and stays within one capacity.
    let no_debt = OverrunDebt::default();
    let (state, debt, clipped) = budget_at(500).overrun(&bucket, no_debt, 300, 0);
    assert_eq!((state, debt.units, clipped), (budget_at(200), 300, 0));
    let days = 30 * 86_400_000;
    assert_eq!(
        debt.now(&bucket, state, days),
        300,
        "no refill pays it back"
    );
    let (state, debt, clipped) = state.overrun(&bucket, debt, 1_000, days);
    assert_eq!((state, debt.units, clipped), (budget_at(-500), 1_000, 300));
    // A refund pays it back.
    let refunded = state.adjusted(&bucket, 1_000);
    assert_eq!(debt.now(&bucket, refunded, days), 500);
}

#[test]
fn a_never_refilling_bucket_is_kept_until_its_instant_and_a_full_one_not_at_all() {
    let bucket = budget(1000);
    let now = KEEP - 3_600_000;
    let drawn = budget_at(400);
    assert_eq!(drawn.forgettable_at_ms(&bucket, now), KEEP);
    // Written after its instant passed: kept a short while, never 0.
    assert_eq!(drawn.forgettable_at_ms(&bucket, KEEP), KEEP + KEPT_PAST_MS);
    let full = BucketState {
        level: 1000,
        updated_ms: now,
    };
    assert_eq!(full.forgettable_at_ms(&bucket, now), now);
    // Without an instant it is kept; a refilling bucket ignores one.
    let unkept = BucketSpec::new("b", 1000, Refill::never());
    assert_eq!(drawn.forgettable_at_ms(&unkept, now), i64::MAX);
    let refilling = BucketSpec {
        keep_until_ms: Some(KEEP),
        ..spec(1000)
    };
    assert_eq!(at(400).forgettable_at_ms(&refilling, now), 600);
    // The scripts' argument: 0 for none, an instant at or before 1970 as 1.
    assert_eq!(
        (unkept.keep_until_arg(), bucket.keep_until_arg()),
        (0, KEEP)
    );
    let ancient = BucketSpec::never_refilled("b", 1, -5);
    assert_eq!(ancient.keep_until_arg(), 1);
}
