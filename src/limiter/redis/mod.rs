//! The shared store: buckets in Redis, changed only by the scripts in `lua/`.
//!
//! This is the only module that touches redis types. Acquires and
//! settlements of one hash slot that meet while a call for the slot is in
//! flight go together as the next `EVALSHA` of `lua/batch.lua` ([`lanes`]),
//! in arrival order. Every call carries an id that Redis records for a
//! while, so a call can be retried on a fresh connection after its
//! connection broke without running twice, and a call whose outcome is
//! unknown is cancelled ([`reconcile`]): a failed call never changes a
//! bucket. `redis::Script` reloads a script after `NOSCRIPT` (a flush, a
//! restart, a failover), so callers never see it.

mod batch;
mod lanes;
mod pool;
mod reconcile;
mod slots;

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use redis::Script;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::bucket::BucketSpec;
use super::keys::slot_of;
use super::lowered::LoweredTotals;
use super::shapes::ShapeConflicts;
use super::{Answer, Lifecycle, Op, Origin, SlotSpec, Store, StoreError};
pub use batch::{BatchOp, OpResult};
use batch::{Call, CallReply};
use lanes::{Lanes, Next, Pending};
use pool::{Failure, Pool};
pub use pool::{PrimaryAuth, RedisNodes, RedisSettings, RedisSetupError};
use reconcile::Reconciler;
use slots::SlotOp;

/// Each script is the shared bucket library followed by its own body (the
/// batch and cancel scripts are public for the tests that drive them
/// directly).
pub const BATCH_LUA: &str = concat!(
    include_str!("../../../lua/bucket.lua"),
    include_str!("../../../lua/batch.lua")
);
pub const CANCEL_LUA: &str = concat!(
    include_str!("../../../lua/bucket.lua"),
    include_str!("../../../lua/cancel.lua")
);
const LEVELS_LUA: &str = concat!(
    include_str!("../../../lua/bucket.lua"),
    include_str!("../../../lua/levels.lua")
);

/// The script argument that makes a script read Redis `TIME`.
const REDIS_CLOCK: &str = "";

/// How long Redis keeps a call's record: the window in which a retry is
/// recognised and an unknown outcome can be undone.
const RECORD_TTL_MS: u64 = 10_000;

/// How long a cancelled call's tombstone keeps it from running late.
const TOMBSTONE_TTL_MS: u64 = 60_000;

/// Pauses between attempts to send cancels while Redis does not answer.
const CANCEL_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// Buckets in Redis (one node or a cluster), shared by every sidecar using it.
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    batch: Script,
    cancel: Script,
    levels: Script,
    slots: Script,
    lanes: Lanes,
    /// The id of the next operation queued on a lane.
    next_op: AtomicU64,
    reconciler: Reconciler,
    /// Names this daemon to the batch script, which tells its bucket
    /// shapes from other sidecars'.
    sidecar: String,
    /// Buckets other sidecars lately drew with another shape.
    shapes: Arc<ShapeConflicts>,
    /// How far feedback lowered each bucket, as the latest reply said.
    lowered: Arc<LoweredTotals>,
}

/// What the Redis store has counted since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RedisCounters {
    /// Calls found to have run after their answer was lost, and undone.
    pub calls_undone: u64,
    /// Calls whose answer was lost and that had not run (now they never will).
    pub calls_prevented: u64,
    /// Cancels dropped for room in a long outage.
    pub cancels_evicted: u64,
    /// Cancels waiting for Redis to answer.
    pub cancels_pending: u64,
}

impl RedisStore {
    /// Builds the pool; connections open in [`Lifecycle::warm_up`] or on first use.
    pub fn new(settings: &RedisSettings) -> Result<Self, RedisSetupError> {
        Ok(RedisStore {
            inner: Arc::new(Inner {
                pool: Pool::new(settings)?,
                batch: Script::new(BATCH_LUA),
                cancel: Script::new(CANCEL_LUA),
                levels: Script::new(LEVELS_LUA),
                slots: slots::script(),
                lanes: Lanes::default(),
                next_op: AtomicU64::new(0),
                reconciler: Reconciler::default(),
                sidecar: format!("{:016x}", rand::random::<u64>()),
                shapes: Arc::default(),
                lowered: Arc::default(),
            }),
        })
    }

    /// The buckets other sidecars lately drew with another shape.
    pub fn shape_conflicts(&self) -> Arc<ShapeConflicts> {
        self.inner.shapes.clone()
    }

    /// What the store has counted since start.
    pub fn counters(&self) -> RedisCounters {
        let reconciler = &self.inner.reconciler;
        RedisCounters {
            calls_undone: reconciler.undone.load(Ordering::Relaxed),
            calls_prevented: reconciler.prevented.load(Ordering::Relaxed),
            cancels_evicted: reconciler.evicted(),
            cancels_pending: reconciler.len() as u64,
        }
    }

    /// Runs `ops` as one call at a given script time instead of Redis
    /// `TIME`, without waiting for other operations: lets tests drive the
    /// script and the embedded store in lockstep.
    pub async fn batch_at(&self, ops: Vec<BatchOp>, now_ms: i64) -> Vec<OpResult> {
        let count = ops.len();
        let call = Call::new(ops, rand::random());
        let deadline = self.inner.pool.deadline();
        match self
            .inner
            .execute(&call, &now_ms.to_string(), deadline)
            .await
        {
            Ok(results) => results,
            Err(error) => vec![Err(error); count],
        }
    }

    /// Takes a slot at a given script time (tests; see [`Self::batch_at`]):
    /// whether it was taken.
    pub async fn take_slot_at(
        &self,
        slots: &SlotSpec,
        holder: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let taken = self
            .inner
            .slots(slots, SlotOp::Take(holder), &now_ms.to_string())
            .await?;
        Ok(taken == 1)
    }

    /// [`super::StoreOps::levels`] at a given script time (tests; see [`Self::batch_at`]).
    pub async fn levels_at(
        &self,
        buckets: &[BucketSpec],
        now_ms: Option<i64>,
    ) -> Result<Vec<i64>, StoreError> {
        if buckets.is_empty() {
            return Ok(Vec::new());
        }
        let clock = now_ms.map_or_else(|| REDIS_CLOCK.to_string(), |now| now.to_string());
        let keys: Vec<&str> = buckets.iter().map(|bucket| &*bucket.key).collect();
        let mut cmd = batch::evalsha(&self.inner.levels, &keys);
        cmd.arg(clock);
        for bucket in buckets {
            cmd.arg(bucket.capacity_units()).arg(bucket.units_per_ms());
        }
        let units: Vec<i64> = self
            .inner
            .pool
            .run(&cmd, &self.inner.levels, false, self.inner.pool.deadline())
            .await
            .map_err(Failure::into_error)?;
        if units.len() != buckets.len() {
            return Err(batch::unexpected_reply(&units));
        }
        Ok(buckets
            .iter()
            .zip(units)
            .map(|(bucket, units)| bucket.whole_tokens(units))
            .collect())
    }
}

/// Where each answer of a call goes, and the answers.
type BatchOutcome = (Vec<oneshot::Sender<OpResult>>, Vec<OpResult>);

/// A call on its way.
type InFlight = Pin<Box<dyn Future<Output = BatchOutcome> + Send>>;

impl Inner {
    /// Queues `op` on its slot's lane and waits for its call's answer.
    /// Its answer comes by its deadline, `redis.timeout_ms` from now,
    /// however long the call before it takes: one still queued then is
    /// taken off the queue and answered; one already sent is answered when
    /// its call gives up, at the deadline of the call's oldest operation.
    async fn submit(self: &Arc<Self>, op: BatchOp) -> OpResult {
        let (result, mut answer) = oneshot::channel();
        let key = op.slot_key();
        let slot = slot_of(key.as_deref().unwrap_or(""));
        let id = self.next_op.fetch_add(1, Ordering::Relaxed);
        let deadline = self.pool.deadline();
        let pending = Pending {
            op,
            result,
            id,
            deadline,
        };
        match self.lanes.enqueue(slot, pending) {
            // Calls run on their own task: a caller that goes away must not
            // take the other operations of its batch with it.
            Next::Send(slot, batch) => {
                tokio::spawn(self.clone().drive(slot, batch));
            }
            Next::Arm(slot) => {
                let inner = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(lanes::SETTLE_FLUSH).await;
                    if let Some(batch) = inner.lanes.fire(&slot) {
                        inner.drive(slot, batch).await;
                    }
                });
            }
            Next::Wait => {}
        }
        let answered = match tokio::time::timeout_at(deadline, &mut answer).await {
            Ok(answered) => answered,
            Err(_) => {
                if let Some(pending) = self.lanes.withdraw(slot, id) {
                    lanes::queued_too_long(pending);
                }
                answer.await
            }
        };
        answered.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the Redis call of this request failed inside the daemon".into(),
            ))
        })
    }

    /// Sends `batch`, then whatever queued on the slot meanwhile, until the
    /// lane is empty; the lane has one call in flight at a time.
    ///
    /// The next call is handed to its connection before the answers of the
    /// call before it go out, so Redis runs it while the daemon's thread
    /// writes them, instead of waiting for them: a round trip is shorter
    /// (`bench/redis/run.sh`: p50 at 8 connections 207 against 263 µs).
    /// Batches are smaller for it, so near saturation the calls cost more
    /// per acquire (64 connections: 0.87-0.94x the acquires/s, which the
    /// packed arguments of `Call::command` more than won back; see
    /// bench/PROFILE.md).
    async fn drive(self: Arc<Self>, slot: Arc<str>, batch: Vec<Pending>) {
        let mut in_flight: InFlight = Box::pin(self.clone().run_batch(batch));
        loop {
            let (senders, results) = in_flight.as_mut().await;
            let next = match self.lanes.next_batch(&slot) {
                Some(next) => {
                    let mut call: InFlight = Box::pin(self.clone().run_batch(next));
                    // Polled once, with this task's waker: its command is
                    // queued on the connection, whose task is then woken
                    // before any caller's is.
                    let polled = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
                    if let Poll::Ready(outcome) = polled {
                        call = Box::pin(std::future::ready(outcome));
                    }
                    Some(call)
                }
                None => None,
            };
            for (sender, result) in senders.into_iter().zip(results) {
                let _ = sender.send(result);
            }
            match next {
                Some(call) => in_flight = call,
                None => return,
            }
        }
    }

    /// One call of `batch`: where each answer goes, and the answers.
    async fn run_batch(self: Arc<Self>, batch: Vec<Pending>) -> BatchOutcome {
        // The call gives up when its oldest operation's answer is due.
        let deadline = batch.iter().map(|pending| pending.deadline).min();
        let deadline = deadline.unwrap_or_else(|| self.pool.deadline());
        let (ops, senders): (Vec<BatchOp>, Vec<_>) =
            batch.into_iter().map(|p| (p.op, p.result)).unzip();
        let call = Call::new(ops, rand::random());
        // A bug must cost this batch an error, never stall the lane.
        let results = std::panic::AssertUnwindSafe(self.execute(&call, REDIS_CLOCK, deadline))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                tracing::error!("a Redis batch failed inside the daemon (a bug)");
                Err(StoreError::Unavailable("internal error".into()))
            });
        let results = match results {
            Ok(results) => results,
            Err(error) => vec![Err(error); senders.len()],
        };
        (senders, results)
    }

    /// Runs one call, giving up at `deadline`. A call whose connection
    /// failed is tried once more on a fresh connection, by the same
    /// deadline (the record makes a second run return the first answer); a
    /// call whose outcome stays unknown is cancelled, so an error always
    /// means "nothing changed".
    async fn execute(
        self: &Arc<Self>,
        call: &Call,
        clock: &str,
        deadline: Instant,
    ) -> Result<Vec<OpResult>, StoreError> {
        let cmd = call.command(&self.batch, clock, RECORD_TTL_MS, &self.sidecar);
        let run = |fresh| self.pool.run(&cmd, &self.batch, fresh, deadline);
        let reply: Vec<Vec<i64>> = match run(false).await {
            Ok(reply) => reply,
            // Redis refused it, or is too slow: another attempt now would
            // meet the same.
            Err(first @ (Failure::Refused(_) | Failure::TimedOut(_))) => {
                return Err(self.fail(call, clock, first));
            }
            Err(first) => match run(true).await {
                Ok(reply) => reply,
                Err(second) if first.may_have_run() => {
                    drop(second);
                    return Err(self.fail(call, clock, first));
                }
                Err(second) => return Err(self.fail(call, clock, second)),
            },
        };
        match call.read_reply(&reply, &self.lowered)? {
            CallReply::Ran(results, disagreements) => {
                for disagreement in disagreements {
                    self.shapes.note(disagreement);
                }
                Ok(results)
            }
            CallReply::Cancelled => Err(StoreError::Unavailable(
                "the call was cancelled before it ran".into(),
            )),
        }
    }

    /// The error of a failed call, after queueing its cancel if it may
    /// have run.
    fn fail(self: &Arc<Self>, call: &Call, clock: &str, failure: Failure) -> StoreError {
        if failure.may_have_run() && clock == REDIS_CLOCK && self.reconciler.push(call.clone()) {
            tokio::spawn(self.clone().send_cancels());
        }
        failure.into_error()
    }

    /// Sends the queued cancels, oldest first, until none is left; while
    /// Redis does not answer, waits and tries again.
    async fn send_cancels(self: Arc<Self>) {
        let (mut pause, longest) = CANCEL_RETRY;
        let (mut undone, mut prevented) = (0u64, 0u64);
        while let Some(call) = self.reconciler.pop() {
            let cmd = call.cancel_command(&self.cancel, REDIS_CLOCK, TOMBSTONE_TTL_MS);
            let deadline = self.pool.deadline();
            match self
                .pool
                .run::<i64>(&cmd, &self.cancel, false, deadline)
                .await
            {
                Ok(outcome) => {
                    self.reconciler.answered(outcome == 1);
                    match outcome {
                        1 => undone += 1,
                        _ => prevented += 1,
                    }
                    pause = CANCEL_RETRY.0;
                }
                Err(failure) => {
                    tracing::debug!(error = %failure.into_error(), "a cancel waits for Redis");
                    self.reconciler.retry_later(call);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(longest);
                }
            }
        }
        tracing::info!(
            undone,
            prevented,
            "calls whose answer was lost are settled: those that ran are undone"
        );
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn call(&self, op: Op<'_>) -> Result<Answer, StoreError> {
        let inner = &self.inner;
        Ok(match op {
            Op::Acquire { draws, max_wait_ms } => {
                let op = BatchOp::Acquire {
                    draws: draws.to_vec(),
                    max_wait_ms,
                };
                match inner.submit(op).await? {
                    Some(decision) => Answer::Decision(decision),
                    None => return Err(batch::unexpected_reply(&[])),
                }
            }
            Op::Adjust { adjustments, .. } => {
                if !adjustments.is_empty() {
                    inner.submit(BatchOp::Settle(adjustments.to_vec())).await?;
                }
                Answer::Done
            }
            Op::Lower(lowerings) => {
                if !lowerings.is_empty() {
                    inner.submit(BatchOp::Lower(lowerings.to_vec())).await?;
                }
                Answer::Done
            }
            Op::Levels(buckets) => Answer::Levels(self.levels_at(buckets, None).await?),
            Op::TakeSlot { slots, holder } => {
                let taken = inner
                    .slots(slots, SlotOp::Take(holder), REDIS_CLOCK)
                    .await?;
                Answer::Slot((taken == 1).then_some(Origin::Store))
            }
            Op::GiveSlot { slots, holder, .. } => {
                inner
                    .slots(slots, SlotOp::Give(holder), REDIS_CLOCK)
                    .await?;
                Answer::Done
            }
            Op::SlotsHeld(slots) => {
                Answer::Held(inner.slots(slots, SlotOp::Held, REDIS_CLOCK).await?)
            }
        })
    }
}

#[async_trait]
impl Lifecycle for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn warm_up(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        inner
            .pool
            .warm_up(&[&inner.batch, &inner.cancel, &inner.levels, &inner.slots])
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.pool.ping().await
    }

    async fn reconciled(&self) {
        self.inner.reconciler.settled().await
    }
}
