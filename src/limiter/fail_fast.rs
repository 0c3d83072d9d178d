//! Local fail-fast: a sidecar that was just told a bucket cannot serve a
//! cost within some wait answers the next such request itself, without a
//! Redis round trip, until the bucket could have recovered.
//!
//! After a denial the store has said: this bucket needs `W` ms before it can
//! hold `cost` above `floor`. Until then any request for at least that cost
//! (and floor) on that bucket needs at least the rest of `W`, because the
//! only things that shorten it are refunds. Refunds made through this
//! sidecar clear the note at once; refunds from other sidecars can make a
//! local denial stale by at most the `retry_after` it carries, after which the
//! client's retry reaches Redis. Nothing is ever granted locally.
//!
//! A bucket that never refills (a spend budget) denies with [`NEVER_MS`]:
//! its note lasts [`NEVER_NOTE_MS`] only, since a refund from another
//! sidecar is the one thing that makes room, and its local denial repeats
//! the sentinel exactly, whatever the wait allowed.
//!
//! A note holds for the bucket's shape it was taken under: a reload that
//! gives the bucket another capacity or rate (a budget's raised amount
//! holds at once) lets the next request ask the store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::bucket::{Draw, NEVER_MS, Refill};
use super::{Answer, Decision, Lifecycle, Op, Store, StoreError};

/// Notes kept before expired ones are pruned.
const PRUNE_AT: usize = 1024;

/// How long a denial by a bucket that never refills is repeated locally:
/// the staleness a refund through another sidecar may see.
pub const NEVER_NOTE_MS: u64 = 1_000;

/// A store that remembers recent denials and repeats them locally.
pub struct FailFastStore {
    inner: Arc<dyn Store>,
    blocked: Mutex<HashMap<Arc<str>, Blocked>>,
    local_denials: AtomicU64,
}

/// What a denial taught about one bucket.
#[derive(Debug, Clone, Copy)]
struct Blocked {
    cost: u64,
    floor: u64,
    /// When a reservation of `cost` above `floor` stops needing any wait
    /// (for a bucket that never refills: when the note is dropped).
    clear_at: Instant,
    /// The bucket never refills: no wait helps ([`NEVER_MS`]).
    never: bool,
    /// The bucket's capacity and refill when it denied: under another
    /// shape (a reload) the note proves nothing.
    capacity: u64,
    refill: Refill,
}

impl FailFastStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FailFastStore {
            inner,
            blocked: Mutex::new(HashMap::new()),
            local_denials: AtomicU64::new(0),
        }
    }

    /// Denials answered without asking the store.
    pub fn local_denials(&self) -> u64 {
        self.local_denials.load(Ordering::Relaxed)
    }

    /// The denial the notes already imply for `draws`, if any: the draw
    /// whose bucket needs the longest, and how long past `max_wait_ms`.
    fn known_denial(&self, draws: &[Draw], max_wait_ms: u64, now: Instant) -> Option<Decision> {
        let blocked = self.lock();
        let known = draws.iter().enumerate().filter_map(|(index, draw)| {
            let note = blocked.get(&draw.bucket.key)?;
            let same_shape =
                draw.bucket.capacity == note.capacity && draw.bucket.refill == note.refill;
            let covered = same_shape && draw.cost >= note.cost && draw.floor >= note.floor;
            let needed = note.clear_at.checked_duration_since(now)?.as_millis() as u64;
            if note.never {
                // As `bucket::plan`: named first, whatever the wait.
                return covered.then_some((NEVER_MS, index));
            }
            (covered && needed > max_wait_ms).then(|| (needed - max_wait_ms, index))
        });
        // The longest wait; among equals (two budgets) the first, as `plan`.
        known
            .reduce(|longest, next| if next.0 > longest.0 { next } else { longest })
            .map(|(retry_after_ms, bucket)| Decision::Denied {
                retry_after_ms,
                bucket,
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Blocked>> {
        // Entries are only inserted or removed whole.
        self.blocked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn forget(&self, buckets: impl Iterator<Item = impl AsRef<str>>) {
        let mut blocked = self.lock();
        if blocked.is_empty() {
            return;
        }
        for key in buckets {
            blocked.remove(key.as_ref());
        }
    }

    /// Repeats a denial the notes prove, else asks the store and notes
    /// what its answer teaches.
    async fn acquire_or_repeat(
        &self,
        draws: &[Draw],
        max_wait_ms: u64,
    ) -> Result<Answer, StoreError> {
        let asked = Instant::now();
        if let Some(denial) = self.known_denial(draws, max_wait_ms, asked) {
            self.local_denials.fetch_add(1, Ordering::Relaxed);
            return Ok(Answer::Decision(denial));
        }
        let answer = self.inner.call(Op::Acquire { draws, max_wait_ms }).await;
        let decision = match answer {
            Ok(Answer::Decision(decision)) => decision,
            Ok(other) => return Ok(other),
            Err(failure) => {
                // What the store said before it failed may not hold after it
                // recovers (a restart empties it): start afresh.
                if matches!(failure, StoreError::Unavailable(_)) {
                    self.lock().clear();
                }
                return Err(failure);
            }
        };
        match decision {
            Decision::Denied {
                retry_after_ms,
                bucket,
            } => {
                let draw = &draws[bucket];
                let never = !draw.bucket.refill.refills();
                // Measured from when we asked: the store's answer is at least
                // that fresh, so the note never outlives the real shortage.
                let needed = Duration::from_millis(if never {
                    NEVER_NOTE_MS
                } else {
                    retry_after_ms.saturating_add(max_wait_ms)
                });
                let mut blocked = self.lock();
                if blocked.len() >= PRUNE_AT {
                    blocked.retain(|_, note| note.clear_at > asked);
                }
                blocked.insert(
                    draw.bucket.key.clone(),
                    Blocked {
                        cost: draw.cost,
                        floor: draw.floor,
                        clear_at: asked + needed,
                        never,
                        capacity: draw.bucket.capacity,
                        refill: draw.bucket.refill,
                    },
                );
            }
            Decision::Granted { .. } => self.forget(draws.iter().map(|draw| &draw.bucket.key)),
        }
        Ok(Answer::Decision(decision))
    }
}

#[async_trait]
impl Store for FailFastStore {
    /// A lower level only lengthens waits, so lowerings leave the notes
    /// true; a refund may make room, so it lets the next request ask.
    async fn call(&self, op: Op<'_>) -> Result<Answer, StoreError> {
        match op {
            Op::Acquire { draws, max_wait_ms } => self.acquire_or_repeat(draws, max_wait_ms).await,
            Op::Adjust { adjustments, .. } => {
                let answer = self.inner.call(op).await;
                self.forget(
                    adjustments
                        .iter()
                        .filter(|adjustment| adjustment.tokens > 0)
                        .map(|adjustment| &adjustment.bucket.key),
                );
                answer
            }
            _ => self.inner.call(op).await,
        }
    }
}

#[async_trait]
impl Lifecycle for FailFastStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn warm_up(&self) -> Result<(), StoreError> {
        self.inner.warm_up().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    async fn reconciled(&self) {
        self.inner.reconciled().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicI64;

    use super::*;
    use crate::limiter::bucket::BucketSpec;
    use crate::limiter::embedded::Clock;
    use crate::limiter::{Adjustment, EmbeddedStore, Origin, StoreOps};

    struct FrozenClock(AtomicI64);

    impl Clock for FrozenClock {
        fn now_ms(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn draw(cost: u64, floor: u64) -> Draw {
        Draw {
            bucket: BucketSpec::per_minute("tokens", 1000, 60),
            cost,
            floor,
        }
    }

    /// The inner store's clock stands still, so every answer the wrapper
    /// gives can be checked against the one the store would give.
    #[tokio::test]
    async fn repeats_denials_it_can_prove_and_asks_the_store_otherwise() {
        let clock = Arc::new(FrozenClock(AtomicI64::new(0)));
        let store = FailFastStore::new(Arc::new(EmbeddedStore::with_clock(clock)));
        assert!(matches!(
            store.acquire(&[draw(900, 0)], 0).await.unwrap(),
            Decision::Granted { .. }
        ));
        // 500 more need 400 tokens of refill: 400 s at one token per second.
        let denied = store.acquire(&[draw(500, 0)], 1000).await.unwrap();
        assert_eq!(
            denied,
            Decision::Denied {
                retry_after_ms: 399_000,
                bucket: 0
            }
        );
        assert_eq!(store.local_denials(), 0);
        // The same cost or more, with no more patience: answered locally.
        for (cost, max_wait) in [(500, 1000), (600, 0), (500, 398_000)] {
            let local = store.acquire(&[draw(cost, 0)], max_wait).await.unwrap();
            assert!(
                matches!(local, Decision::Denied { bucket: 0, .. }),
                "{local:?}"
            );
        }
        assert_eq!(store.local_denials(), 3);
        // A smaller cost, or enough patience, or a higher class: the store decides.
        assert!(matches!(
            store.acquire(&[draw(50, 0)], 0).await.unwrap(),
            Decision::Granted { .. }
        ));
        let patient = store.acquire(&[draw(500, 0)], 3_600_000).await.unwrap();
        assert!(matches!(patient, Decision::Granted { .. }), "{patient:?}");
        assert_eq!(store.local_denials(), 3);
    }

    #[tokio::test]
    async fn a_refund_through_this_sidecar_clears_the_note() {
        let clock = Arc::new(FrozenClock(AtomicI64::new(0)));
        let store = FailFastStore::new(Arc::new(EmbeddedStore::with_clock(clock)));
        store.acquire(&[draw(900, 0)], 0).await.unwrap();
        assert!(matches!(
            store.acquire(&[draw(500, 0)], 0).await.unwrap(),
            Decision::Denied { .. }
        ));
        let refund = Adjustment {
            bucket: draw(0, 0).bucket,
            tokens: 900,
        };
        store.adjust(&[refund], Origin::Store).await.unwrap();
        assert!(matches!(
            store.acquire(&[draw(500, 0)], 0).await.unwrap(),
            Decision::Granted { .. }
        ));
        assert_eq!(store.local_denials(), 0);
    }

    /// A budget's denial is repeated with the sentinel whatever the wait,
    /// naming the budget, and only for a short while (other sidecars'
    /// refunds may make room); a refund through this sidecar clears it.
    #[tokio::test]
    async fn a_budget_denial_is_repeated_with_the_sentinel_for_a_short_while() {
        let clock = Arc::new(FrozenClock(AtomicI64::new(0)));
        let store = FailFastStore::new(Arc::new(EmbeddedStore::with_clock(clock)));
        let budget = BucketSpec::never_refilled("budget", 100, 1_000_000);
        let spend = |cost| Draw {
            bucket: budget.clone(),
            cost,
            floor: 0,
        };
        let both = |cost| [draw(900, 0), spend(cost)];
        store.acquire(&both(90), 0).await.unwrap();
        let denied = Decision::Denied {
            retry_after_ms: NEVER_MS,
            bucket: 1,
        };
        let asked = Instant::now();
        assert_eq!(store.acquire(&both(20), 0).await.unwrap(), denied);
        // The tokens would wait too; the budget is named, whatever the wait.
        assert_eq!(store.acquire(&both(20), u64::MAX).await.unwrap(), denied);
        if asked.elapsed() < Duration::from_millis(NEVER_NOTE_MS) {
            assert_eq!(store.local_denials(), 1, "repeated locally");
        }
        let note = store.lock()["budget"];
        assert!(note.never);
        assert!(note.clear_at <= Instant::now() + Duration::from_millis(NEVER_NOTE_MS));
        let refund = Adjustment {
            bucket: budget.clone(),
            tokens: 50,
        };
        store.adjust(&[refund], Origin::Store).await.unwrap();
        assert!(matches!(
            store.acquire(&[spend(20)], 0).await.unwrap(),
            Decision::Granted { .. }
        ));
    }

    /// A reload that raises a budget's amount holds at once: the note of a
    /// denial under the old amount proves nothing under the new one.
    #[tokio::test]
    async fn a_note_holds_only_for_the_shape_it_was_taken_under() {
        let clock = Arc::new(FrozenClock(AtomicI64::new(0)));
        let store = FailFastStore::new(Arc::new(EmbeddedStore::with_clock(clock)));
        let amount = |capacity| BucketSpec::never_refilled("budget", capacity, 1_000_000);
        let spend = |capacity, cost| Draw {
            bucket: amount(capacity),
            cost,
            floor: 0,
        };
        store.acquire(&[spend(100, 90)], 0).await.unwrap();
        assert!(matches!(
            store.acquire(&[spend(100, 20)], 0).await.unwrap(),
            Decision::Denied { .. }
        ));
        // 90 spent of 200: 110 left.
        assert!(matches!(
            store.acquire(&[spend(200, 20)], 0).await.unwrap(),
            Decision::Granted { .. }
        ));
        assert_eq!(store.local_denials(), 0);
    }
}
