//! The in-memory store: the zero-config default, where limits hold for this
//! process only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::bucket::{self, BucketSpec, BucketState, Draw, OverrunDebt};
use super::drain::Drain;
use super::slots::{Holders, SlotSpec};
use super::{
    Adjustment, Answer, Decision, DrawMark, DrawMarks, Lifecycle, LoweredTotals, Lowering, Op,
    Origin, Store, StoreError, decision_from_plan,
};

/// Milliseconds on some monotonic clock. A bucket's keep-until instant
/// ([`BucketSpec::keep_until_ms`]) is read on it as Unix time, so a clock
/// for production reads as Unix ms (tests drive their own).
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

/// Unix time in ms when the store was created, then monotonic from there:
/// a step of the wall clock moves no bucket, and keep-until instants (wall
/// clock) still fall when they should, give or take the steps since.
#[derive(Debug)]
pub struct MonotonicClock {
    started: Instant,
    started_unix_ms: i64,
}

impl MonotonicClock {
    pub fn new() -> Self {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64);
        MonotonicClock {
            started: Instant::now(),
            started_unix_ms: unix_ms,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> i64 {
        self.started_unix_ms + self.started.elapsed().as_millis() as i64
    }
}

/// Fewest entries before the store looks for full buckets to forget.
const SWEEP_MIN_ENTRIES: usize = 1024;

/// A remembered bucket and the time it may be forgotten (its "expiry"):
/// when it will be full again, or a never-refilling bucket's keep-until.
#[derive(Clone, Copy)]
struct Entry {
    state: BucketState,
    forgettable_at_ms: i64,
    /// What drains the provider unseen, learnt from provider corrections.
    drain: Drain,
    /// What overruns took that refill has not yet paid back.
    overrun: OverrunDebt,
    /// The units lowerings took, as far as the provider had room (see
    /// [`super::lowered`]).
    lowered: i64,
    /// For a bucket that never refills, the capacity (units) `state` was
    /// written under: a read under another moves it ([`BucketState::rebased`]),
    /// as Redis does with the bucket's field `k`.
    capacity: Option<i64>,
}

/// Buckets in a map under one mutex; no await happens while it is held.
pub struct EmbeddedStore {
    clock: Arc<dyn Clock>,
    buckets: Mutex<Buckets>,
    /// Holders of each limit's concurrency slots (one entry per limit
    /// with `max_concurrent` at most, each at most `max` holders).
    slots: Mutex<HashMap<Arc<str>, Holders>>,
    /// Each bucket's latest count of lowered units, for grants to compare.
    lowered: Arc<LoweredTotals>,
}

struct Buckets {
    states: HashMap<Arc<str>, Entry>,
    /// Size at which the next sweep runs; doubling keeps sweeps amortised O(1).
    sweep_at: usize,
}

impl EmbeddedStore {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(MonotonicClock::new()))
    }

    /// A store driven by `clock`; tests step a manual clock.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        EmbeddedStore {
            clock,
            buckets: Mutex::new(Buckets {
                states: HashMap::new(),
                sweep_at: SWEEP_MIN_ENTRIES,
            }),
            slots: Mutex::new(HashMap::new()),
            lowered: Arc::default(),
        }
    }

    /// Buckets currently remembered (full ones are forgotten over time, as
    /// Redis expires their keys).
    pub fn bucket_count(&self) -> usize {
        self.lock().states.len()
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Holders>> {
        // Every update is one insert or removal: a panic leaves no half state.
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        // A panic while holding the lock cannot leave a half-written state:
        // every update is a single insert of a computed value.
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Default for EmbeddedStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Buckets {
    /// The bucket at `now_ms`. A never-refilling bucket past its keep is
    /// forgotten first, debt and all, as Redis expires its key (a
    /// refilling one past its expiry is full anyway); one remembered under
    /// another capacity moves by the change.
    fn current(&mut self, spec: &BucketSpec, now_ms: i64) -> BucketState {
        if !spec.refill.refills()
            && self
                .states
                .get(&spec.key)
                .is_some_and(|entry| entry.forgettable_at_ms < now_ms)
        {
            self.states.remove(&spec.key);
        }
        match self.states.get(&spec.key) {
            Some(entry) => entry
                .state
                .rebased(spec, entry.capacity)
                .refilled(spec, now_ms),
            None => BucketState::full(spec, now_ms),
        }
    }

    /// Writes `state` at `now_ms`, under `spec`'s capacity.
    fn store(&mut self, spec: &BucketSpec, state: BucketState, now_ms: i64) {
        let forgettable_at_ms = state.forgettable_at_ms(spec, now_ms);
        let capacity = spec.written_capacity();
        self.states
            .entry(spec.key.clone())
            .and_modify(|entry| {
                entry.state = state;
                entry.forgettable_at_ms = forgettable_at_ms;
                entry.capacity = capacity;
                // A full bucket owes nothing (Redis deletes it, debt and all).
                if state.level >= spec.capacity_units() {
                    entry.overrun = OverrunDebt::default();
                }
            })
            .or_insert(Entry {
                state,
                forgettable_at_ms,
                drain: Drain::default(),
                overrun: OverrunDebt::default(),
                lowered: 0,
                capacity,
            });
    }

    /// The units lowerings took from a bucket, as far as the provider had room.
    fn lowered(&self, spec: &BucketSpec) -> i64 {
        self.states.get(&spec.key).map_or(0, |entry| entry.lowered)
    }

    /// Forgets buckets that are full by `now_ms`, and never-refilling ones
    /// past their keep, once the map has doubled: an absent bucket is full,
    /// so this loses nothing and bounds memory under any tenant churn and
    /// one budget key per period.
    fn sweep_if_large(&mut self, now_ms: i64) {
        if self.states.len() < self.sweep_at {
            return;
        }
        // Kept through its last ms, as Redis keeps a key until past it.
        self.states
            .retain(|_, entry| entry.forgettable_at_ms >= now_ms);
        self.sweep_at = (self.states.len() * 2).max(SWEEP_MIN_ENTRIES);
    }
}

impl EmbeddedStore {
    fn reserve(&self, draws: &[Draw], max_wait_ms: u64) -> Result<Decision, StoreError> {
        let now = self.clock.now_ms();
        let mut buckets = self.lock();
        let states: Vec<BucketState> = draws
            .iter()
            .map(|draw| buckets.current(&draw.bucket, now))
            .collect();
        let plan = bucket::plan(draws, &states, max_wait_ms);
        if let bucket::Plan::Grant { .. } = plan {
            for (draw, state) in draws.iter().zip(bucket::commit(draws, &states)) {
                buckets.store(&draw.bucket, state, now);
            }
            buckets.sweep_if_large(now);
        }
        let decision = decision_from_plan(draws, plan)?;
        let Decision::Granted {
            wait_ms, origin, ..
        } = decision
        else {
            return Ok(decision);
        };
        // Where each bucket's count of lowered units stands, as a Redis
        // grant's reply says (a bucket forgotten when full starts again).
        let marks: Arc<[DrawMark]> = draws
            .iter()
            .map(|draw| {
                let lowered = buckets.lowered(&draw.bucket);
                self.lowered.note(&draw.bucket.key, lowered);
                DrawMark {
                    key: draw.bucket.key.clone(),
                    drawn: None,
                    lowered,
                    units_per_ms: draw.bucket.units_per_ms(),
                }
            })
            .collect();
        Ok(Decision::Granted {
            wait_ms,
            origin,
            marks: Some(DrawMarks {
                draws: marks,
                lowered: self.lowered.clone(),
            }),
        })
    }

    fn adjust_levels(&self, adjustments: &[Adjustment]) {
        let now = self.clock.now_ms();
        let mut buckets = self.lock();
        for adjustment in adjustments {
            let spec = &adjustment.bucket;
            let state = buckets.current(spec, now);
            if adjustment.tokens >= 0 {
                buckets.store(spec, state.adjusted(spec, adjustment.tokens), now);
                continue;
            }
            // An overrun: taken within the bucket's overrun debt.
            let debt = buckets
                .states
                .get(&spec.key)
                .map_or_else(OverrunDebt::default, |entry| entry.overrun);
            let (state, debt, clipped) =
                state.overrun(spec, debt, adjustment.tokens.unsigned_abs(), now);
            buckets.store(spec, state, now);
            if let Some(entry) = buckets.states.get_mut(&spec.key) {
                entry.overrun = debt;
            }
            if clipped > 0 {
                super::overrun::clipped(spec, clipped);
            }
        }
    }

    fn lower_levels(&self, lowerings: &[Lowering]) {
        let now = self.clock.now_ms();
        let mut buckets = self.lock();
        for lowering in lowerings {
            let spec = &lowering.bucket;
            let current = buckets.current(spec, now);
            if lowering.fleet.is_none() {
                // A pause, or a count without a provider's view to learn from.
                let lowered = current.lowered_to(spec, lowering.level);
                if lowered != current {
                    buckets.store(spec, lowered, now);
                }
                continue;
            }
            // A count: a margin below it for what drains the provider unseen
            // (lua/batch.lua does the same for the Redis store).
            buckets.store(spec, current, now);
            let seen = spec.signed_units(lowering.level);
            let counted_ms_ago = lowering
                .fleet
                .map_or(0, |fleet| fleet.counted_ms_ago.min(i64::MAX as u64) as i64);
            let refused = lowering.fleet.map_or(0, |fleet| spec.units(fleet.refused));
            // The provider's room when it counted: its capacity less its
            // count, without the refill credited since.
            let room = lowering.fleet.map_or(0, |fleet| {
                let counted = spec
                    .signed_units(fleet.remaining)
                    .saturating_sub(counted_ms_ago.saturating_mul(spec.units_per_ms()));
                spec.capacity_units().saturating_sub(counted).max(0)
            });
            if let Some(entry) = buckets.states.get_mut(&spec.key) {
                let level = entry
                    .drain
                    .correct(seen, current.level, now, counted_ms_ago, refused);
                // As lua/batch.lua: the reservations waiting are postponed
                // by the lowering, as far as the provider had room.
                let postponed = current.level.saturating_sub(level).min(room);
                if postponed > 0 {
                    entry.lowered = entry.lowered.saturating_add(postponed);
                    self.lowered.note(&spec.key, entry.lowered);
                }
                buckets.store(spec, BucketState { level, ..current }, now);
            }
        }
    }

    fn levels_now(&self, specs: &[BucketSpec]) -> Vec<i64> {
        let now = self.clock.now_ms();
        let mut buckets = self.lock();
        specs
            .iter()
            .map(|spec| buckets.current(spec, now).tokens(spec))
            .collect()
    }

    fn take_slot_for(&self, slots: &SlotSpec, holder: &str) -> bool {
        let now = self.clock.now_ms();
        let mut all = self.lock_slots();
        let holders = all.entry(slots.key.clone()).or_default();
        holders.take(slots, holder, now)
    }

    fn give_slot_of(&self, slots: &SlotSpec, holder: &str) {
        let mut all = self.lock_slots();
        if let Some(holders) = all.get_mut(&slots.key) {
            holders.give(holder);
            if holders.is_empty() {
                all.remove(&slots.key);
            }
        }
    }

    fn slots_held_now(&self, slots: &SlotSpec) -> u64 {
        let now = self.clock.now_ms();
        let mut all = self.lock_slots();
        all.get_mut(&slots.key)
            .map_or(0, |holders| holders.held(now))
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn call(&self, op: Op<'_>) -> Result<Answer, StoreError> {
        Ok(match op {
            Op::Acquire { draws, max_wait_ms } => {
                Answer::Decision(self.reserve(draws, max_wait_ms)?)
            }
            Op::Adjust { adjustments, .. } => {
                self.adjust_levels(adjustments);
                Answer::Done
            }
            Op::Lower(lowerings) => {
                self.lower_levels(lowerings);
                Answer::Done
            }
            Op::Levels(buckets) => Answer::Levels(self.levels_now(buckets)),
            Op::TakeSlot { slots, holder } => {
                Answer::Slot(self.take_slot_for(slots, holder).then_some(Origin::Store))
            }
            Op::GiveSlot { slots, holder, .. } => {
                self.give_slot_of(slots, holder);
                Answer::Done
            }
            Op::SlotsHeld(slots) => Answer::Held(self.slots_held_now(slots)),
        })
    }
}

#[async_trait]
impl Lifecycle for EmbeddedStore {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    /// Nothing to prepare: the buckets are in this process.
    async fn warm_up(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Every call's outcome is known at once.
    async fn reconciled(&self) {}
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;
    use crate::limiter::{FleetView, StoreOps};

    #[derive(Default)]
    struct ManualClock(AtomicI64);

    impl Clock for ManualClock {
        fn now_ms(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn bucket(key: &str, capacity: u64) -> BucketSpec {
        BucketSpec::per_minute(key, capacity, 60_000)
    }

    fn draw(key: &str, capacity: u64, cost: u64) -> Draw {
        Draw {
            bucket: bucket(key, capacity),
            cost,
            floor: 0,
        }
    }

    #[tokio::test]
    async fn a_refused_bucket_leaves_the_others_untouched() {
        let store = EmbeddedStore::with_clock(Arc::new(ManualClock::default()));
        let tokens = draw("tokens", 1000, 100);
        let requests = draw("requests", 1, 1);
        let both = [tokens.clone(), requests.clone()];
        assert!(matches!(
            store.acquire(&both, 0).await.unwrap(),
            Decision::Granted {
                wait_ms: 0,
                origin: Origin::Store,
                ..
            }
        ));
        // The request bucket is empty: refused, and tokens keep 900.
        assert!(matches!(
            store.acquire(&both, 0).await.unwrap(),
            Decision::Denied { bucket: 1, .. }
        ));
        let levels = store
            .levels(&[tokens.bucket, requests.bucket])
            .await
            .unwrap();
        assert_eq!(levels, vec![900, 0]);
    }

    /// The embedded store keeps the same margin as `lua/batch.lua` below a
    /// provider drained unseen (`tests/it/redis_store.rs` walks the Lua).
    #[tokio::test]
    async fn provider_counts_that_drain_unseen_leave_a_margin() {
        // 200 a step: a second of drain and the fluctuation margin of its
        // shrinks (see `drain.rs`'s walk).
        for (unseen_per_step, margins) in [(200, 1_800..=2_150), (0, 0..=0)] {
            let clock = Arc::new(ManualClock::default());
            let store = EmbeddedStore::with_clock(clock.clone());
            // 10 tokens a ms, all drawn: 1,000 every 100 ms.
            let tokens = BucketSpec::per_minute("tokens", 60_000, 600_000);
            let mut provider = 60_000i64;
            for step in 1..=60 {
                clock.0.store(step * 100, Ordering::SeqCst);
                let draws = [Draw {
                    bucket: tokens.clone(),
                    cost: 1_000,
                    floor: 0,
                }];
                store.acquire(&draws, 60_000).await.unwrap();
                // The provider refilled, counted this call, and lost what
                // drains it unseen.
                provider = (provider + 1_000).min(60_000) - 1_000 - unseen_per_step;
                let count = Lowering {
                    bucket: tokens.clone(),
                    level: provider,
                    fleet: Some(super::super::FleetView {
                        remaining: provider,
                        reserved_ms_ago: Some(0),
                        counted_ms_ago: 0,
                        drawn: None,
                        refused: 0,
                    }),
                };
                store.lower(&[count]).await.unwrap();
            }
            let level = store.levels(std::slice::from_ref(&tokens)).await.unwrap()[0];
            let margin = provider - level;
            assert!(
                margins.contains(&margin),
                "{unseen_per_step}: margin {margin}"
            );
        }
    }

    #[tokio::test]
    async fn full_buckets_are_forgotten_when_the_map_grows() {
        let clock = Arc::new(ManualClock::default());
        let store = EmbeddedStore::with_clock(clock.clone());
        for tenant in 1..SWEEP_MIN_ENTRIES {
            let key = format!("tenant:{tenant}");
            store.acquire(&[draw(&key, 1000, 10)], 0).await.unwrap();
        }
        // 10 tokens refill in 10 ms; after that every bucket is full again.
        clock.0.store(11, Ordering::SeqCst);
        store.acquire(&[draw("fresh", 1000, 10)], 0).await.unwrap();
        assert_eq!(store.bucket_count(), 1);
    }

    /// One budget key per period must not stay for ever: a never-refilling
    /// bucket is forgotten after its keep-until instant, by the sweep and
    /// on its next use (full again, as an expired Redis key), and a full
    /// one any time.
    #[tokio::test]
    async fn never_refilling_buckets_are_forgotten_after_their_keep() {
        let clock = Arc::new(ManualClock::default());
        let store = EmbeddedStore::with_clock(clock.clone());
        let keep = 1_000_000;
        let budget = |key: &str| BucketSpec::never_refilled(key, 100, keep);
        let spend = |key: &str, cost| Draw {
            bucket: budget(key),
            cost,
            floor: 0,
        };
        // Short of a sweep until after the keep.
        for day in 1..SWEEP_MIN_ENTRIES - 2 {
            let key = format!("budget:{day}");
            store.acquire(&[spend(&key, 10)], 0).await.unwrap();
        }
        store.acquire(&[spend("kept", 60)], 0).await.unwrap();
        // Just before the keep, nothing has refilled or gone.
        clock.0.store(keep, Ordering::SeqCst);
        store.acquire(&[draw("fresh", 1000, 10)], 0).await.unwrap();
        assert_eq!(store.bucket_count(), SWEEP_MIN_ENTRIES - 1);
        let kept = budget("kept");
        let levels = store.levels(std::slice::from_ref(&kept)).await.unwrap();
        assert_eq!(levels, [40], "no refill in all that time");
        assert!(matches!(
            store.acquire(&[spend("kept", 41)], u64::MAX).await.unwrap(),
            Decision::Denied {
                retry_after_ms: bucket::NEVER_MS,
                bucket: 0
            }
        ));
        // After it: forgotten by the sweep, and full on the next use.
        clock.0.store(keep + 1, Ordering::SeqCst);
        let levels = store.levels(std::slice::from_ref(&kept)).await.unwrap();
        assert_eq!(levels, [100]);
        assert_eq!(store.bucket_count(), SWEEP_MIN_ENTRIES - 2);
        store.acquire(&[draw("fresh2", 1000, 10)], 0).await.unwrap();
        store.acquire(&[draw("fresh3", 1000, 10)], 0).await.unwrap();
        assert_eq!(store.bucket_count(), 3, "only the refilling ones");
        // A budget refunded to full is forgotten like any full bucket.
        store.acquire(&[spend("refunded", 10)], 0).await.unwrap();
        let refund = Adjustment {
            bucket: budget("refunded"),
            tokens: 10,
        };
        store.adjust(&[refund], Origin::Store).await.unwrap();
        clock.0.store(keep + 2, Ordering::SeqCst);
        let levels = store.levels(&[budget("refunded")]).await.unwrap();
        assert_eq!(levels, [100]);
    }

    #[test]
    fn the_production_clock_reads_as_unix_time() {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let clock = MonotonicClock::new();
        // Monotonic from then on; no more than the test's own runtime apart.
        assert!((clock.now_ms() - unix_ms).abs() < 60_000);
    }

    #[tokio::test]
    async fn impossible_costs_are_errors() {
        let store = EmbeddedStore::new();
        let result = store.acquire(&[draw("tokens", 100, 101)], u64::MAX).await;
        assert!(matches!(
            result,
            Err(StoreError::CostExceedsCapacity {
                cost: 101,
                capacity: 100,
                ..
            })
        ));
    }

    /// A reservation already waiting when feedback lowers its bucket is due
    /// later by what was lowered, as far as the provider had room to refill
    /// when it counted: with 200 of its 1,000 free, by 200; a full provider
    /// passes it anyway, and it is not postponed. A count of 1,000 that
    /// credits 500 ms of refill was 500 when the provider counted: room
    /// for all 500.
    #[tokio::test]
    async fn a_lowering_postpones_the_waiting_reservations_as_far_as_the_provider_has_room() {
        for (provider_count, counted_ms_ago, postponed) in [
            (0, 0, Some((500, 0))),
            (800, 0, Some((200, 0))),
            (1000, 0, None),
            (1000, 500, Some((500, 0))),
        ] {
            let clock = Arc::new(ManualClock::default());
            let store = EmbeddedStore::with_clock(clock.clone());
            // 1,000 tokens, 1 a ms: the second grant waits 1 s.
            let tokens = draw("tokens", 1000, 1000);
            store
                .acquire(std::slice::from_ref(&tokens), 0)
                .await
                .unwrap();
            let Decision::Granted {
                wait_ms: 1000,
                marks: Some(waiting),
                ..
            } = store
                .acquire(std::slice::from_ref(&tokens), 5_000)
                .await
                .unwrap()
            else {
                panic!("the second grant waits a second");
            };
            // The provider's view: 500 below the bucket's.
            let lowering = Lowering {
                bucket: tokens.bucket.clone(),
                level: -1500,
                fleet: Some(FleetView {
                    remaining: provider_count,
                    reserved_ms_ago: Some(0),
                    counted_ms_ago,
                    drawn: None,
                    refused: 0,
                }),
            };
            store.lower(&[lowering]).await.unwrap();
            assert_eq!(
                waiting.postponement(),
                postponed,
                "provider count {provider_count}"
            );
            let levels = store
                .levels(std::slice::from_ref(&tokens.bucket))
                .await
                .unwrap();
            assert_eq!(levels, [-1500], "lowered either way");
        }
    }
}
