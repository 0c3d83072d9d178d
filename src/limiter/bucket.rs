//! The bucket arithmetic of DESIGN.md, as pure functions of state and time.
//!
//! Levels are kept in integer *units*, chosen per bucket so that one
//! millisecond of refill adds a whole number of units and no fraction is
//! ever rounded away ([`Refill`]): a bucket of `R` tokens per minute counts
//! 60 000 units a token and refills `R` units a millisecond. `lua/` does the
//! same arithmetic on Redis, in the units this module hands it; property
//! tests hold the two to the same answers.
//!
//! A bucket may also never refill ([`Refill::never`]): a spend budget per
//! calendar period, whose key names the period, so that a new period is a
//! new key that starts full. Such a bucket counts one unit a token, a draw
//! that does not fit is denied whatever the wait allowed ([`NEVER_MS`]), and
//! its state is kept until [`BucketSpec::keep_until_ms`] instead of until it
//! would be full again (it never is, short of refunds). Nor can it fill up
//! to a capacity that a reload raised: a store remembers the capacity its
//! level was written under, and a read under another moves the level by the
//! change ([`BucketState::rebased`]), so that a budget's new amount holds
//! for the current period at once and what was spent stays spent.

use std::sync::Arc;

/// Units per token of a bucket refilled per minute: 60 000 makes a rate of
/// `R` per minute exactly `R` units per millisecond.
pub const UNITS_PER_TOKEN: i64 = 60_000;

/// The wait, in ms, of a draw that a bucket which never refills cannot
/// cover: the `retry_after_ms` of its denial ([`Plan::Deny`]). About 31 700
/// years, below 2^52 so that the Lua scripts (`NEVER` in `lua/batch.lua`)
/// hold it exactly; recognisable in logs as 10^15.
pub const NEVER_MS: u64 = 1_000_000_000_000_000;

/// How long, in ms, a store keeps a bucket that never refills when its
/// [`BucketSpec::keep_until_ms`] has already passed at a write
/// (`KEPT_PAST_MS` in `lua/bucket.lua`): an expiry must be positive, and a
/// key past its keep is one nobody should still be drawing from.
pub const KEPT_PAST_MS: i64 = 60_000;

/// Largest level, in units, that a bucket may hold: the Lua scripts count in
/// doubles, exact up to 2^53; half of it leaves room below zero.
const MAX_EXACT_UNITS: u128 = 1 << 52;

/// The span a rate is given over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    Second,
    Minute,
    Hour,
    Day,
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 4] = [Window::Second, Window::Minute, Window::Hour, Window::Day];

    /// The window in milliseconds.
    pub fn ms(self) -> u64 {
        match self {
            Window::Second => 1_000,
            Window::Minute => 60_000,
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
        }
    }

    /// Its name in settings and bucket names (`tokens_per_day`).
    pub fn name(self) -> &'static str {
        match self {
            Window::Second => "second",
            Window::Minute => "minute",
            Window::Hour => "hour",
            Window::Day => "day",
        }
    }
}

/// A refill rate, `amount` tokens every `window`, as whole units: one
/// token is `units_per_token` units and `units_per_ms` units come back
/// each millisecond.
///
/// The units are exact when they can be (`units_per_token = window /
/// gcd(amount, window)`): always per minute (60 000 a token, as before
/// windows existed, so stored levels keep their meaning) and per second, and
/// per hour or day unless the burst is so large that its units would pass
/// 2^52. Then a token is 60 000 units and the rate is rounded down, by less
/// than a token per minute: the bucket refills a hair slow, never fast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Refill {
    amount: u64,
    window: Window,
    units_per_token: u64,
    units_per_ms: u64,
}

impl Refill {
    /// A bucket that never refills (a spend budget per calendar period): one
    /// unit a token and none back each millisecond, so that only refunds
    /// raise its level. Its window means nothing ([`Self::amount`] is 0).
    pub fn never() -> Refill {
        Refill {
            amount: 0,
            window: Window::Day,
            units_per_token: 1,
            units_per_ms: 0,
        }
    }

    /// Whether the bucket refills at all (false only for [`Self::never`]).
    pub fn refills(&self) -> bool {
        self.units_per_ms > 0
    }

    /// `per_minute` tokens a minute.
    pub fn per_minute(per_minute: u64) -> Refill {
        Refill::new(per_minute, Window::Minute, 0)
    }

    /// `amount` tokens every `window`, for a bucket of `capacity` tokens.
    pub fn new(amount: u64, window: Window, capacity: u64) -> Refill {
        let window_ms = window.ms();
        let exact_units_per_token = window_ms / gcd(amount, window_ms);
        let fits =
            u128::from(capacity.max(amount)) * u128::from(exact_units_per_token) <= MAX_EXACT_UNITS;
        let units_per_token = if window == Window::Minute || !fits {
            UNITS_PER_TOKEN as u64
        } else {
            exact_units_per_token
        };
        let units_per_ms = u128::from(amount) * u128::from(units_per_token) / u128::from(window_ms);
        Refill {
            amount,
            window,
            units_per_token,
            // A bucket that refills must refill something each millisecond.
            units_per_ms: (units_per_ms as u64).max(1),
        }
    }

    /// Tokens per window.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// The rate in tokens per minute, rounded down (for display).
    pub fn per_minute_rounded(&self) -> u64 {
        (u128::from(self.amount) * 60_000 / u128::from(self.window.ms())) as u64
    }

    /// Units per token.
    pub fn units_per_token(&self) -> i64 {
        self.units_per_token as i64
    }

    /// Units refilled per millisecond.
    pub fn units_per_ms(&self) -> i64 {
        self.units_per_ms as i64
    }

    /// The same window with `amount` scaled by `share` (rounded down, at
    /// least 1), for a bucket of `capacity` tokens; a bucket that never
    /// refills still never does.
    pub fn scaled(&self, share: f64, capacity: u64) -> Refill {
        if !self.refills() {
            return *self;
        }
        let amount = ((self.amount as f64 * share).floor() as u64).max(1);
        Refill::new(amount, self.window, capacity)
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// A bucket's identity and shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketSpec {
    /// Store key; buckets acquired together share a hash tag (see `keys`).
    /// Shared, so that the many copies a request makes cost no allocation.
    pub key: Arc<str>,
    /// Most tokens the bucket holds (the burst).
    pub capacity: u64,
    /// How fast it refills.
    pub refill: Refill,
    /// The largest cost (with its floor) one acquire may take, at least
    /// `capacity`. Above the capacity a draw waits until the bucket is
    /// full and then takes it below zero: a provider that enforces its
    /// minute per second still passes a request larger than a second's
    /// worth once its bucket is full.
    pub largest: u64,
    /// For a bucket that never refills: the wall-clock instant (Unix ms)
    /// after which its state may be forgotten, when its period's label can
    /// no longer be in use. Such a bucket is never full again by itself, so
    /// time-to-full cannot bound its key's life. `None` for a refilling
    /// bucket (it is forgotten when full), and a never-refilling bucket
    /// without it is kept until a refund fills it: every budget sets it.
    pub keep_until_ms: Option<i64>,
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
    ///
    /// A draw that a bucket which never refills cannot cover is denied
    /// whatever the wait allowed, and that bucket is the one named (the
    /// first such, if several), with `retry_after_ms` exactly [`NEVER_MS`]:
    /// waiting brings it nothing, only its next period (a new key) or a
    /// refund does. Callers recognise it by the named bucket's
    /// `refill.refills()` being false and replace the sentinel with the
    /// time to the period's end.
    Deny { retry_after_ms: u64, bucket: usize },
    /// Bucket `bucket` can never hold `cost` above its floor.
    Impossible { bucket: usize },
}

impl Draw {
    /// Whether the bucket can ever grant this cost above the floor: the one
    /// capacity rule (`lua/batch.lua` applies it again on Redis).
    pub fn fits_capacity(&self) -> bool {
        self.cost.saturating_add(self.floor) <= self.bucket.largest
    }

    /// The level, in units, the bucket must reach before the draw is due:
    /// its cost above the floor, or a full bucket for a draw larger than
    /// the capacity.
    fn needed_units(&self) -> i64 {
        let needed = self
            .cost
            .saturating_add(self.floor)
            .min(self.bucket.capacity);
        self.bucket.units(needed)
    }
}

impl BucketSpec {
    /// A bucket of `capacity` tokens refilled by `refill`.
    pub fn new(key: impl Into<Arc<str>>, capacity: u64, refill: Refill) -> BucketSpec {
        BucketSpec {
            key: key.into(),
            capacity,
            refill,
            largest: capacity,
            keep_until_ms: None,
        }
    }

    /// A bucket of `capacity` that never refills (a spend budget for one
    /// calendar period, named in its key), kept until `keep_until_ms`
    /// (wall-clock Unix ms: the period's end and a margin for clock skew).
    pub fn never_refilled(
        key: impl Into<Arc<str>>,
        capacity: u64,
        keep_until_ms: i64,
    ) -> BucketSpec {
        BucketSpec {
            keep_until_ms: Some(keep_until_ms),
            ..BucketSpec::new(key, capacity, Refill::never())
        }
    }

    /// [`Self::keep_until_ms`] as the scripts take it: 0 for none; an instant
    /// at or before the epoch is one long past (1).
    pub fn keep_until_arg(&self) -> i64 {
        self.keep_until_ms.map_or(0, |keep| keep.max(1))
    }

    /// The same bucket granting single costs up to `largest` (never below
    /// its capacity) once it is full.
    pub fn with_largest(self, largest: u64) -> BucketSpec {
        BucketSpec {
            largest: largest.max(self.capacity),
            ..self
        }
    }

    /// [`Self::largest`] in units.
    pub fn largest_units(&self) -> i64 {
        self.units(self.largest)
    }

    /// A bucket of `capacity` tokens refilled by `per_minute` a minute.
    pub fn per_minute(key: impl Into<Arc<str>>, capacity: u64, per_minute: u64) -> BucketSpec {
        BucketSpec::new(key, capacity, Refill::per_minute(per_minute))
    }

    /// Capacity in units.
    pub fn capacity_units(&self) -> i64 {
        self.units(self.capacity)
    }

    /// The capacity, in units, a store remembers with a level it writes
    /// under this spec, for [`BucketState::rebased`]: only for a bucket that
    /// never refills (`None` for a refilling one, which fills up to a
    /// raised capacity by itself; Redis writes no field `k` for it).
    pub fn written_capacity(&self) -> Option<i64> {
        (!self.refill.refills()).then(|| self.capacity_units())
    }

    /// Refill rate in units per millisecond.
    pub fn units_per_ms(&self) -> i64 {
        self.refill.units_per_ms()
    }

    /// `tokens` in this bucket's units.
    pub fn units(&self, tokens: u64) -> i64 {
        i64::try_from(tokens)
            .unwrap_or(i64::MAX)
            .saturating_mul(self.refill.units_per_token())
    }

    /// A signed number of tokens in this bucket's units.
    pub fn signed_units(&self, tokens: i64) -> i64 {
        tokens.saturating_mul(self.refill.units_per_token())
    }

    /// Whole tokens of `units`, rounded down (so negative levels round
    /// away from zero).
    pub fn whole_tokens(&self, units: i64) -> i64 {
        units.div_euclid(self.refill.units_per_token())
    }

    /// Whole tokens that refill in `ms` milliseconds, rounded down.
    pub fn refilled_in(&self, ms: u64) -> u64 {
        let units = u128::from(ms) * u128::from(self.refill.units_per_ms);
        (units / u128::from(self.refill.units_per_token)).min(u128::from(u64::MAX)) as u64
    }
}

/// How far back a clock may step and still be waited for, ms (as
/// `CLOCK_STEP_BACK` in `lua/bucket.lua`).
pub const CLOCK_STEP_BACK_MS: i64 = 1000;

impl BucketState {
    /// A bucket seen for the first time (or whose key expired) is full.
    pub fn full(spec: &BucketSpec, now_ms: i64) -> Self {
        BucketState {
            level: spec.capacity_units(),
            updated_ms: now_ms,
        }
    }

    /// The state of a bucket read under `spec` whose level was written
    /// under a capacity of `written` units ([`BucketSpec::written_capacity`]
    /// then). A bucket that never refills cannot fill up to a capacity a
    /// reload raised, nor should a cut one leave what was spent above it
    /// uncounted: its level moves by the change, so that capacity less
    /// level (what was spent and reserved) stays what it was. Comes before
    /// [`Self::refilled`], whose cap then binds nothing. A refilling
    /// bucket, or one written with no capacity remembered (before this
    /// rule; a missing one is full), is as written. `refill` in
    /// `lua/bucket.lua` is the same rule, with the capacity in field `k`.
    pub fn rebased(self, spec: &BucketSpec, written: Option<i64>) -> Self {
        match written {
            Some(written) if !spec.refill.refills() => BucketState {
                level: self
                    .level
                    .saturating_add(spec.capacity_units().saturating_sub(written)),
                updated_ms: self.updated_ms,
            },
            _ => self,
        }
    }

    /// The state at `now_ms` after continuous refill, capped at capacity.
    /// A clock that went backwards refills nothing and keeps the later time,
    /// unless it went back more than [`CLOCK_STEP_BACK_MS`]: then refill
    /// goes on from `now_ms` (a failover to a Redis whose clock lags would
    /// otherwise freeze the bucket until the clock caught up; issue 27).
    pub fn refilled(self, spec: &BucketSpec, now_ms: i64) -> Self {
        let elapsed = (now_ms - self.updated_ms).max(0);
        let refill = elapsed.saturating_mul(spec.units_per_ms());
        let stepped_back = self.updated_ms.saturating_sub(now_ms) > CLOCK_STEP_BACK_MS;
        BucketState {
            level: self.level.saturating_add(refill).min(spec.capacity_units()),
            updated_ms: if stepped_back {
                now_ms
            } else {
                self.updated_ms.max(now_ms)
            },
        }
    }

    /// Milliseconds until the bucket is full again: when its key may expire.
    /// `i64::MAX` for a bucket that never refills and is not full.
    pub fn ms_until_full(self, spec: &BucketSpec) -> i64 {
        let missing = spec.capacity_units() - self.level;
        if missing <= 0 {
            return 0;
        }
        match spec.units_per_ms() {
            0 => i64::MAX,
            rate => ceil_div(missing, rate),
        }
    }

    /// When the state, written at `now_ms`, may be forgotten (a Redis key's
    /// expiry, as `write_bucket` in `lua/bucket.lua` sets it): when the
    /// bucket is full again; for one that never refills and is not full,
    /// its keep-until instant, or [`KEPT_PAST_MS`] from now once that has
    /// passed, or never without one.
    pub fn forgettable_at_ms(self, spec: &BucketSpec, now_ms: i64) -> i64 {
        if spec.refill.refills() || self.level >= spec.capacity_units() {
            return self.updated_ms.saturating_add(self.ms_until_full(spec));
        }
        match spec.keep_until_arg() {
            0 => i64::MAX,
            keep if keep > now_ms => keep,
            _ => now_ms.saturating_add(KEPT_PAST_MS),
        }
    }

    /// Whole tokens available (rounded down, so negative levels round away from zero).
    pub fn tokens(self, spec: &BucketSpec) -> i64 {
        spec.whole_tokens(self.level)
    }

    /// The state lowered to `tokens` if it holds more (never raised).
    pub fn lowered_to(self, spec: &BucketSpec, tokens: i64) -> Self {
        BucketState {
            level: self.level.min(spec.signed_units(tokens)),
            updated_ms: self.updated_ms,
        }
    }

    /// Adds `tokens` (a refund, or a debit when negative), capped at capacity.
    pub fn adjusted(self, spec: &BucketSpec, tokens: i64) -> Self {
        self.adjusted_units(spec, spec.signed_units(tokens))
    }

    /// Adds `units`, capped at capacity.
    fn adjusted_units(self, spec: &BucketSpec, units: i64) -> Self {
        BucketState {
            level: self.level.saturating_add(units).min(spec.capacity_units()),
            updated_ms: self.updated_ms,
        }
    }

    /// Takes an overrun of `tokens` (a report above its reservation) from
    /// the state, as far as the bucket's overrun debt allows: the debt,
    /// what overruns took that refill has not yet paid back, stays within
    /// one capacity, so reports can never push the bucket more than one
    /// capacity below where its reservations put it (issue 27). Returns
    /// the new state and debt, and the units left untaken (clipped).
    /// `settle` in `lua/batch.lua` is the same rule.
    pub fn overrun(
        self,
        spec: &BucketSpec,
        debt: OverrunDebt,
        tokens: u64,
        now_ms: i64,
    ) -> (BucketState, OverrunDebt, i64) {
        let owed = spec.units(tokens);
        let debt = debt.now(spec, self, now_ms);
        let taken = owed.min((spec.capacity_units() - debt).max(0));
        let state = self.adjusted_units(spec, -taken);
        let debt = OverrunDebt {
            units: debt + taken,
            at_ms: now_ms,
        };
        (state, debt, owed - taken)
    }
}

/// What overruns took from a bucket that refill has not yet paid back, in
/// units, as of `at_ms` (field `o` of a Redis bucket, `"units:ms"`).
///
/// Refill pays it back at the bucket's rate, and it is never more than the
/// bucket is below full (a refund pays it back too), so it is zero whenever
/// the bucket is full, and forgetting a full bucket forgets nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverrunDebt {
    pub units: i64,
    pub at_ms: i64,
}

impl OverrunDebt {
    /// The debt at `now_ms` of a bucket at `state` (already refilled).
    pub fn now(self, spec: &BucketSpec, state: BucketState, now_ms: i64) -> i64 {
        let mut units = self.units;
        if now_ms > self.at_ms {
            units = units.saturating_sub((now_ms - self.at_ms).saturating_mul(spec.units_per_ms()));
        }
        units
            .min(spec.capacity_units().saturating_sub(state.level))
            .max(0)
    }
}

/// Milliseconds until `state` (already refilled) can cover `draw`; `None`
/// when it never can (a bucket that never refills, short of the draw).
fn wait_for(draw: &Draw, state: BucketState) -> Option<u64> {
    let missing = draw.needed_units() - state.level;
    if missing <= 0 {
        return Some(0);
    }
    let rate = draw.bucket.units_per_ms();
    (rate > 0).then(|| ceil_div(missing, rate) as u64)
}

/// Decides one acquire over refilled `states` (one per draw, same order).
///
/// Grants when every bucket can cover its cost within `max_wait_ms`, with the
/// longest of the waits; otherwise denies with the earliest time a retry can
/// succeed, or with [`NEVER_MS`] when a bucket that never refills cannot
/// cover its draw. Applying a grant is [`commit`]; a denial changes nothing.
pub fn plan(draws: &[Draw], states: &[BucketState], max_wait_ms: u64) -> Plan {
    let mut longest = (0, 0);
    // The first draw that no wait can cover; a later impossible cost still
    // comes first, as it would have without it.
    let mut never = None;
    for (index, (draw, state)) in draws.iter().zip(states).enumerate() {
        if !draw.fits_capacity() {
            return Plan::Impossible { bucket: index };
        }
        match wait_for(draw, *state) {
            Some(wait) if wait > longest.0 => longest = (wait, index),
            Some(_) => {}
            None => {
                never.get_or_insert(index);
            }
        }
    }
    if let Some(bucket) = never {
        return Plan::Deny {
            retry_after_ms: NEVER_MS,
            bucket,
        };
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
            level: state.level - draw.bucket.units(draw.cost),
            updated_ms: state.updated_ms,
        })
        .collect()
}

fn ceil_div(numerator: i64, denominator: i64) -> i64 {
    debug_assert!(numerator >= 0 && denominator > 0);
    (numerator + denominator - 1) / denominator
}

#[cfg(test)]
mod tests;
