//! The bucket arithmetic of DESIGN.md, as pure functions of state and time.
//!
//! Levels are kept in integer *units*: one token is [`UNITS_PER_TOKEN`] units,
//! so one millisecond of refill adds exactly `per_minute` units and no
//! fraction is ever rounded away. `lua/` does the same arithmetic on Redis;
//! property tests hold the two to the same answers.

use std::sync::Arc;

/// Units per token: 60 000 makes a rate of `R` per minute exactly `R` units
/// per millisecond.
pub const UNITS_PER_TOKEN: i64 = 60_000;

/// A bucket's identity and shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketSpec {
    /// Store key; buckets acquired together share a hash tag (see `keys`).
    /// Shared, so that the many copies a request makes cost no allocation.
    pub key: Arc<str>,
    /// Most tokens the bucket holds (the burst).
    pub capacity: u64,
    /// Refill rate in tokens per minute.
    pub per_minute: u64,
}

/// One bucket's level at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Units available; negative while reservations wait for refill.
    pub level: i64,
    /// Store clock time of `level`, in milliseconds.
    pub updated_ms: i64,
}

/// What one acquire takes from one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    pub bucket: BucketSpec,
    /// Tokens to reserve.
    pub cost: u64,
    /// Tokens this request must leave in the bucket for higher priority classes.
    pub floor: u64,
}

/// The outcome of planning one acquire over its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Reserve in every bucket; the reservation is due after `wait_ms`.
    Grant { wait_ms: u64 },
    /// Reserve nothing; bucket `bucket` (an index into the draws) needs the
    /// longest wait, and no retry can succeed before `retry_after_ms`.
    Deny { retry_after_ms: u64, bucket: usize },
    /// Bucket `bucket` can never hold `cost` above its floor.
    Impossible { bucket: usize },
}

impl Draw {
    /// Whether the bucket can ever hold this cost above the floor: the one
    /// capacity rule (`lua/batch.lua` applies it again on Redis).
    pub fn fits_capacity(&self) -> bool {
        self.cost.saturating_add(self.floor) <= self.bucket.capacity
    }
}

impl BucketSpec {
    /// Capacity in units.
    pub fn capacity_units(&self) -> i64 {
        tokens_to_units(self.capacity)
    }

    /// Refill rate in units per millisecond.
    pub fn units_per_ms(&self) -> i64 {
        self.per_minute as i64
    }
}

impl BucketState {
    /// A bucket seen for the first time (or whose key expired) is full.
    pub fn full(spec: &BucketSpec, now_ms: i64) -> Self {
        BucketState {
            level: spec.capacity_units(),
            updated_ms: now_ms,
        }
    }

    /// The state at `now_ms` after continuous refill, capped at capacity.
    /// A clock that went backwards refills nothing and keeps the later time.
    pub fn refilled(self, spec: &BucketSpec, now_ms: i64) -> Self {
        let elapsed = (now_ms - self.updated_ms).max(0);
        let refill = elapsed.saturating_mul(spec.units_per_ms());
        BucketState {
            level: self.level.saturating_add(refill).min(spec.capacity_units()),
            updated_ms: self.updated_ms.max(now_ms),
        }
    }

    /// Milliseconds until the bucket is full again: when its key may expire.
    pub fn ms_until_full(self, spec: &BucketSpec) -> i64 {
        let missing = spec.capacity_units() - self.level;
        ceil_div(missing.max(0), spec.units_per_ms())
    }

    /// Whole tokens available (rounded down, so negative levels round away from zero).
    pub fn tokens(self) -> i64 {
        self.level.div_euclid(UNITS_PER_TOKEN)
    }

    /// The state lowered to `tokens` if it holds more (never raised).
    pub fn lowered_to(self, tokens: i64) -> Self {
        BucketState {
            level: self.level.min(tokens.saturating_mul(UNITS_PER_TOKEN)),
            updated_ms: self.updated_ms,
        }
    }

    /// Adds `tokens` (a refund, or a debit when negative), capped at capacity.
    pub fn adjusted(self, spec: &BucketSpec, tokens: i64) -> Self {
        BucketState {
            level: self
                .level
                .saturating_add(tokens.saturating_mul(UNITS_PER_TOKEN))
                .min(spec.capacity_units()),
            updated_ms: self.updated_ms,
        }
    }
}

/// Milliseconds until `state` (already refilled) can cover `draw`.
fn wait_for(draw: &Draw, state: BucketState) -> u64 {
    let needed = tokens_to_units(draw.cost) + tokens_to_units(draw.floor);
    let missing = needed - state.level;
    ceil_div(missing.max(0), draw.bucket.units_per_ms()) as u64
}

/// Decides one acquire over refilled `states` (one per draw, same order).
///
/// Grants when every bucket can cover its cost within `max_wait_ms`, with the
/// longest of the waits; otherwise denies with the earliest time a retry can
/// succeed. Applying a grant is [`commit`]; a denial changes nothing.
pub fn plan(draws: &[Draw], states: &[BucketState], max_wait_ms: u64) -> Plan {
    let mut longest = (0, 0);
    for (index, (draw, state)) in draws.iter().zip(states).enumerate() {
        if !draw.fits_capacity() {
            return Plan::Impossible { bucket: index };
        }
        let wait = wait_for(draw, *state);
        if wait > longest.0 {
            longest = (wait, index);
        }
    }
    let (wait_ms, bucket) = longest;
    if wait_ms <= max_wait_ms {
        Plan::Grant { wait_ms }
    } else {
        Plan::Deny {
            retry_after_ms: wait_ms - max_wait_ms,
            bucket,
        }
    }
}

/// The states after reserving every draw's cost.
pub fn commit(draws: &[Draw], states: &[BucketState]) -> Vec<BucketState> {
    draws
        .iter()
        .zip(states)
        .map(|(draw, state)| BucketState {
            level: state.level - tokens_to_units(draw.cost),
            updated_ms: state.updated_ms,
        })
        .collect()
}

fn tokens_to_units(tokens: u64) -> i64 {
    i64::try_from(tokens)
        .unwrap_or(i64::MAX)
        .saturating_mul(UNITS_PER_TOKEN)
}

fn ceil_div(numerator: i64, denominator: i64) -> i64 {
    debug_assert!(numerator >= 0 && denominator > 0);
    (numerator + denominator - 1) / denominator
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 60 000 tokens per minute: one token per millisecond, easy to read.
    fn spec(capacity: u64) -> BucketSpec {
        BucketSpec {
            key: "k".into(),
            capacity,
            per_minute: 60_000,
        }
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
    fn waits_round_up_to_whole_milliseconds() {
        // 1 token per minute: one token takes 60 000 ms to refill.
        let slow = BucketSpec {
            key: "k".into(),
            capacity: 10,
            per_minute: 1,
        };
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
        assert_eq!(state.refilled(&bucket, 200).tokens(), -300);
        assert_eq!(state.refilled(&bucket, 5_000).tokens(), 1000);
        assert_eq!(state.refilled(&bucket, 200).ms_until_full(&bucket), 1300);
        // A clock that steps back refills nothing.
        let later = state.refilled(&bucket, 200);
        assert_eq!(later.refilled(&bucket, 100), later);
    }

    #[test]
    fn adjustments_refund_and_debit_but_never_overfill() {
        let bucket = spec(1000);
        assert_eq!(at(900).adjusted(&bucket, 50), at(950));
        assert_eq!(at(900).adjusted(&bucket, 500), at(1000));
        assert_eq!(at(10).adjusted(&bucket, -40), at(-30));
    }

    #[test]
    fn negative_levels_report_whole_tokens_rounded_down() {
        let state = BucketState {
            level: -1,
            updated_ms: 0,
        };
        assert_eq!(state.tokens(), -1);
    }
}
