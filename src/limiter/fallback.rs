//! The failure policy: what acquires get while the shared store fails.
//!
//! `fail_closed` denies with `StoreUnavailable`, `fail_open` grants without
//! limiting, `local` limits with in-memory buckets holding this sidecar's
//! share of each limit. Settlements of leases the shared store granted are
//! replayed when it answers again ([`super::replay`]), so a report made
//! during an outage is not lost. Every switch between the shared store and
//! the policy is logged, and recovery is automatic: each call tries the
//! shared store first, so the first success ends the outage.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;

use super::bucket::{BucketSpec, Draw};
use super::replay::Replay;
use super::{
    Adjustment, Answer, Decision, EmbeddedStore, Lifecycle, Op, SlotSpec, Store, StoreError,
    StoreOps,
};
use serde::{Deserialize, Serialize};

/// Which buckets a grant was reserved in, so that settling it adjusts the
/// same buckets (a lease granted locally during a Redis outage must not be
/// refunded into Redis): the failure policy's mark on a grant or a slot,
/// which the service keeps with the lease and hands back with
/// [`Op::Adjust`] and [`Op::GiveSlot`]. Every other store grants from its
/// own buckets ([`Origin::Store`]) and ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The store's own buckets.
    Store,
    /// The in-memory fallback buckets of the `local` failure policy.
    Local,
    /// Nothing was reserved: the `fail_open` policy let it through.
    Unlimited,
}

/// What acquires get while the shared store is failing or too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Refuse with `StoreUnavailable`: never exceed the limit.
    FailClosed,
    /// Grant without limiting, and count it: never block the app.
    FailOpen,
    /// Limit with in-memory buckets holding `local_share` of each limit.
    Local,
}

impl FailurePolicy {
    /// The policy as the config file spells it (`fail_closed`, …).
    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::Local => "local",
        }
    }
}

/// A shared store with a policy for its failures.
pub struct FallbackStore {
    shared: Arc<dyn Store>,
    policy: FailurePolicy,
    /// Settlements of shared-store leases made during an outage.
    replay: Arc<Replay>,
    /// Buckets for the `local` policy, each `local_share` of the real one.
    local: EmbeddedStore,
    local_share: f64,
    failing: AtomicBool,
    /// When the current outage began; `None` while the store answers.
    failing_since: Mutex<Option<Instant>>,
    /// Acquires answered by the policy instead of the shared store.
    policy_decisions: AtomicU64,
}

impl FallbackStore {
    /// `local_share` only matters for [`FailurePolicy::Local`].
    pub fn new(shared: Arc<dyn Store>, policy: FailurePolicy, local_share: f64) -> Self {
        FallbackStore {
            replay: Replay::new(shared.clone()),
            shared,
            policy,
            local: EmbeddedStore::new(),
            local_share,
            failing: AtomicBool::new(false),
            failing_since: Mutex::new(None),
            policy_decisions: AtomicU64::new(0),
        }
    }

    /// Settlements waiting for the shared store, and what became of others.
    pub fn replay(&self) -> &Replay {
        &self.replay
    }

    /// The policy that answers while the shared store fails.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// Since when the shared store has been failing, if it is.
    pub fn failing_since(&self) -> Option<Instant> {
        *self
            .failing_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Acquires the failure policy has answered since start.
    pub fn policy_decisions(&self) -> u64 {
        self.policy_decisions.load(Ordering::Relaxed)
    }

    /// Whether the last call to the shared store failed.
    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    fn note_failure(&self, cause: &StoreError) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            *self
                .failing_since
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
            tracing::warn!(
                store = self.shared.kind(),
                policy = self.policy.name(),
                %cause,
                "shared store unavailable; applying the failure policy until it recovers"
            );
        }
    }

    /// Notes what a call to the shared store said about its health.
    fn note<T>(&self, outcome: Result<T, StoreError>) -> Result<T, StoreError> {
        match &outcome {
            Ok(_) => self.note_success(),
            Err(cause) => self.note_failure(cause),
        }
        outcome
    }

    fn note_success(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            *self
                .failing_since
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
            tracing::info!(
                store = self.shared.kind(),
                policy_decisions = self.policy_decisions(),
                "shared store reachable again; the failure policy no longer applies"
            );
        }
    }

    /// Levels of the `local` policy's buckets (this sidecar's share of
    /// each): what it grants from while the shared store is down.
    pub async fn local_levels(&self, buckets: &[BucketSpec]) -> Result<Vec<i64>, StoreError> {
        let local: Vec<BucketSpec> = buckets
            .iter()
            .map(|bucket| self.local_bucket(bucket))
            .collect();
        self.local.levels(&local).await
    }

    /// This sidecar's share of `bucket`.
    pub fn local_bucket(&self, bucket: &BucketSpec) -> BucketSpec {
        self.local_draw(&Draw {
            bucket: bucket.clone(),
            cost: 0,
            floor: 0,
        })
        .bucket
    }

    /// This sidecar's share of a limit's slots, at least one.
    fn local_slots(&self, slots: &SlotSpec) -> SlotSpec {
        SlotSpec {
            max: ((slots.max as f64 * self.local_share).floor() as u64).max(1),
            ..slots.clone()
        }
    }

    /// The draw against this sidecar's share of the bucket.
    fn local_draw(&self, draw: &Draw) -> Draw {
        let scaled = |value: u64| ((value as f64 * self.local_share).floor() as u64).max(1);
        let capacity = scaled(draw.bucket.capacity);
        let local = BucketSpec {
            // A budget's share is kept as long as the budget.
            keep_until_ms: draw.bucket.keep_until_ms,
            ..BucketSpec::new(
                draw.bucket.key.clone(),
                capacity,
                draw.bucket.refill.scaled(self.local_share, capacity),
            )
        };
        // A bucket that grants a cost above its capacity once full (a
        // second's enforcement) does so with this sidecar's share too.
        let local = if draw.bucket.largest > draw.bucket.capacity {
            local.with_largest(draw.bucket.largest)
        } else {
            local
        };
        Draw {
            bucket: local,
            cost: draw.cost,
            floor: scaled(draw.floor).min(draw.floor),
        }
    }

    /// Asks the shared store, and the policy while it fails.
    async fn acquire_or_apply_policy(
        &self,
        draws: &[Draw],
        max_wait_ms: u64,
    ) -> Result<Answer, StoreError> {
        let cause = match self.shared.call(Op::Acquire { draws, max_wait_ms }).await {
            Err(cause @ StoreError::Unavailable(_)) => cause,
            answer => {
                self.note_success();
                return answer;
            }
        };
        self.note_failure(&cause);
        self.policy_decisions.fetch_add(1, Ordering::Relaxed);
        let decision = match self.policy {
            FailurePolicy::FailClosed => return Err(cause),
            FailurePolicy::FailOpen => Decision::Granted {
                wait_ms: 0,
                origin: Origin::Unlimited,
                marks: None,
            },
            FailurePolicy::Local => {
                let local: Vec<Draw> = draws.iter().map(|draw| self.local_draw(draw)).collect();
                match self.local.acquire(&local, max_wait_ms).await {
                    Ok(Decision::Granted { wait_ms, .. }) => Decision::Granted {
                        wait_ms,
                        origin: Origin::Local,
                        marks: None,
                    },
                    Ok(denied) => denied,
                    // Fits the real limit but not this sidecar's share of it:
                    // an outage problem, not the client's.
                    Err(StoreError::CostExceedsCapacity { .. }) => {
                        return Err(StoreError::Unavailable(format!(
                            "{cause}; the cost exceeds this sidecar's local share"
                        )));
                    }
                    Err(other) => return Err(other),
                }
            }
        };
        Ok(Answer::Decision(decision))
    }

    /// Settles where the grant was made; a settlement the shared store
    /// cannot take now is replayed when it answers again.
    async fn adjust_where_granted(
        &self,
        adjustments: &[Adjustment],
        origin: Origin,
    ) -> Result<Answer, StoreError> {
        match origin {
            Origin::Store => match self.shared.adjust(adjustments, origin).await {
                Err(cause @ StoreError::Unavailable(_)) => {
                    // Settled later: the failed call changed nothing.
                    self.note_failure(&cause);
                    self.replay.push(adjustments.to_vec());
                    Ok(Answer::Done)
                }
                answer => {
                    self.note_success();
                    answer.map(|()| Answer::Done)
                }
            },
            Origin::Local => {
                let local: Vec<Adjustment> = adjustments
                    .iter()
                    .map(|adjustment| Adjustment {
                        bucket: self.local_bucket(&adjustment.bucket),
                        tokens: adjustment.tokens,
                    })
                    .collect();
                self.local.adjust(&local, Origin::Store).await?;
                Ok(Answer::Done)
            }
            Origin::Unlimited => Ok(Answer::Done),
        }
    }

    /// While the shared store fails, the policy answers as for acquires;
    /// `local` holds this sidecar's share of the slots (at least one).
    async fn take_slot_or_apply_policy(
        &self,
        slots: &SlotSpec,
        holder: &str,
    ) -> Result<Answer, StoreError> {
        let cause = match self.shared.call(Op::TakeSlot { slots, holder }).await {
            Err(cause @ StoreError::Unavailable(_)) => cause,
            answer => {
                self.note_success();
                return answer;
            }
        };
        self.note_failure(&cause);
        let taken = match self.policy {
            FailurePolicy::FailClosed => return Err(cause),
            FailurePolicy::FailOpen => Some(Origin::Unlimited),
            FailurePolicy::Local => {
                let local = self.local_slots(slots);
                let taken = self.local.take_slot(&local, holder).await?;
                taken.map(|_| Origin::Local)
            }
        };
        Ok(Answer::Slot(taken))
    }

    /// A slot the shared store could not take back now stays held there
    /// until its timeout; the caller may try again.
    async fn give_slot_where_taken(
        &self,
        slots: &SlotSpec,
        holder: &str,
        origin: Origin,
    ) -> Result<Answer, StoreError> {
        match origin {
            Origin::Store => {
                let op = Op::GiveSlot {
                    slots,
                    holder,
                    origin,
                };
                self.note(self.shared.call(op).await)
            }
            Origin::Local => {
                let local = self.local_slots(slots);
                self.local.give_slot(&local, holder, origin).await?;
                Ok(Answer::Done)
            }
            Origin::Unlimited => Ok(Answer::Done),
        }
    }
}

#[async_trait]
impl Store for FallbackStore {
    async fn call(&self, op: Op<'_>) -> Result<Answer, StoreError> {
        match op {
            Op::Acquire { draws, max_wait_ms } => {
                self.acquire_or_apply_policy(draws, max_wait_ms).await
            }
            Op::Adjust {
                adjustments,
                origin,
            } => self.adjust_where_granted(adjustments, origin).await,
            Op::TakeSlot { slots, holder } => self.take_slot_or_apply_policy(slots, holder).await,
            Op::GiveSlot {
                slots,
                holder,
                origin,
            } => self.give_slot_where_taken(slots, holder, origin).await,
            // Feedback is advice: while the shared store fails it is dropped
            // (the local buckets hold only this sidecar's share anyway).
            Op::Lower(_) => self.note(self.shared.call(op).await),
            _ => self.shared.call(op).await,
        }
    }
}

#[async_trait]
impl Lifecycle for FallbackStore {
    fn kind(&self) -> &'static str {
        self.shared.kind()
    }

    async fn warm_up(&self) -> Result<(), StoreError> {
        self.note(self.shared.warm_up().await)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.note(self.shared.ping().await)
    }

    async fn reconciled(&self) {
        self.shared.reconciled().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::RedisStore;
    use crate::limiter::redis::{RedisNodes, RedisSettings};

    /// A real Redis store pointed at a port nobody listens on: the outage
    /// every policy is about.
    fn down() -> Arc<dyn Store> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let url = format!("redis://127.0.0.1:{port}");
        let settings = RedisSettings {
            nodes: RedisNodes::Single(url.clone()),
            display: url,
            tls_ca_file: None,
            pool_size: 1,
            timeout: std::time::Duration::from_millis(250),
            connect_timeout: std::time::Duration::from_secs(1),
        };
        Arc::new(RedisStore::new(&settings).unwrap())
    }

    fn draw(cost: u64) -> Draw {
        Draw {
            bucket: BucketSpec::per_minute("k", 1000, 60),
            cost,
            floor: 0,
        }
    }

    #[tokio::test]
    async fn each_policy_answers_an_outage_its_own_way() {
        let closed = FallbackStore::new(down(), FailurePolicy::FailClosed, 1.0);
        assert!(closed.failing_since().is_none());
        assert!(matches!(
            closed.acquire(&[draw(10)], 0).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(closed.is_failing());
        let since = closed.failing_since().expect("an outage began");
        assert!(closed.ping().await.is_err(), "a health check sees it too");
        assert_eq!(closed.failing_since(), Some(since), "the same outage");

        let open = FallbackStore::new(down(), FailurePolicy::FailOpen, 1.0);
        for _ in 0..3 {
            assert_eq!(
                open.acquire(&[draw(1000)], 0).await.unwrap(),
                Decision::Granted {
                    wait_ms: 0,
                    origin: Origin::Unlimited,
                    marks: None,
                }
            );
        }
        assert_eq!(open.policy_decisions(), 3);

        // A quarter of 1000 tokens: 250 now, then nothing without waiting.
        let local = FallbackStore::new(down(), FailurePolicy::Local, 0.25);
        assert_eq!(
            local.acquire(&[draw(250)], 0).await.unwrap(),
            Decision::Granted {
                wait_ms: 0,
                origin: Origin::Local,
                marks: None,
            }
        );
        assert!(matches!(
            local.acquire(&[draw(1)], 0).await.unwrap(),
            Decision::Denied { .. }
        ));
        // Settling a local lease refunds the local bucket, not the shared one.
        let refund = Adjustment {
            bucket: draw(0).bucket,
            tokens: 100,
        };
        local.adjust(&[refund], Origin::Local).await.unwrap();
        assert!(matches!(
            local.acquire(&[draw(100)], 0).await.unwrap(),
            Decision::Granted { .. }
        ));
        // A cost that fits the real limit but not the share is an outage error.
        assert!(matches!(
            local.acquire(&[draw(900)], 0).await,
            Err(StoreError::Unavailable(_))
        ));
    }
}
