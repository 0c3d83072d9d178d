//! Coalescing: the operations of one hash slot wait in that slot's lane
//! while a script call for the slot is in flight, and go together, in
//! arrival order, as the next call. A lone acquire goes out at once; a
//! settlement waits up to [`SETTLE_FLUSH`] for an acquire to ride along with.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::batch::{BatchOp, OpResult};
use crate::limiter::StoreError;

/// Most operations in one script call, so that no call holds Redis long.
pub(super) const MAX_BATCH: usize = 64;

/// How long a settlement waits for company when its lane is idle.
pub(super) const SETTLE_FLUSH: Duration = Duration::from_millis(2);

/// An operation waiting for its call, and where its result goes.
pub(super) struct Pending {
    pub op: BatchOp,
    pub result: oneshot::Sender<OpResult>,
    /// Names it to [`Lanes::withdraw`] (unique in the daemon).
    pub id: u64,
    /// When its answer is due: it is not sent later, and its call gives up then.
    pub deadline: Instant,
}

/// The answer of an operation whose deadline came while it was queued: it
/// never reached Redis, so nothing changed.
pub(super) fn queued_too_long(pending: Pending) {
    let _ = pending.result.send(Err(StoreError::Unavailable(
        "no answer from Redis in time: the call before it on its slot is still waiting".into(),
    )));
}

/// What the caller of [`Lanes::enqueue`] must do next, with the lane's
/// slot name where it needs one (made once per lane, not per operation).
pub(super) enum Next {
    /// Start a call with this batch now: the lane was idle.
    Send(Arc<str>, Vec<Pending>),
    /// Start the flush timer: only settlements are waiting.
    Arm(Arc<str>),
    /// Nothing: a call in flight (or an armed timer) takes it along.
    Wait,
}

struct Lane {
    slot: Arc<str>,
    queue: VecDeque<Pending>,
    state: State,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Idle,
    /// Settlements wait for the flush timer.
    Armed,
    /// A call is in flight; whoever runs it sends the next batch after it.
    Busy,
}

/// Every slot's lane.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: Mutex<HashMap<Arc<str>, Lane>>,
}

impl Lanes {
    /// Queues `pending` on `slot`'s lane.
    pub(super) fn enqueue(&self, slot: &str, pending: Pending) -> Next {
        let mut lanes = self.lock();
        let lane = match lanes.get_mut(slot) {
            Some(lane) => lane,
            None => {
                let slot: Arc<str> = Arc::from(slot);
                lanes.entry(slot.clone()).or_insert(Lane {
                    slot,
                    queue: VecDeque::new(),
                    state: State::Idle,
                })
            }
        };
        let acquire = pending.op.is_acquire();
        lane.queue.push_back(pending);
        match (lane.state, acquire) {
            (State::Busy, _) => Next::Wait,
            (State::Idle | State::Armed, true) => {
                let batch = take_batch(lane);
                if batch.is_empty() {
                    // All of it was due already (a zero timeout): answered.
                    lane.state = State::Idle;
                    return Next::Wait;
                }
                lane.state = State::Busy;
                Next::Send(lane.slot.clone(), batch)
            }
            (State::Idle, false) => {
                lane.state = State::Armed;
                Next::Arm(lane.slot.clone())
            }
            (State::Armed, false) => Next::Wait,
        }
    }

    /// Takes operation `id` off `slot`'s queue, if it is still there (not
    /// yet sent): the caller answers it, and it never goes out.
    pub(super) fn withdraw(&self, slot: &str, id: u64) -> Option<Pending> {
        let mut lanes = self.lock();
        let lane = lanes.get_mut(slot)?;
        let at = lane.queue.iter().position(|pending| pending.id == id)?;
        lane.queue.remove(at)
    }

    /// The flush timer fired: the batch to send, if the lane is still armed.
    pub(super) fn fire(&self, slot: &str) -> Option<Vec<Pending>> {
        let mut lanes = self.lock();
        let lane = lanes.get_mut(slot)?;
        if lane.state != State::Armed {
            return None;
        }
        let batch = take_batch(lane);
        if batch.is_empty() {
            lane.state = State::Idle;
            return None;
        }
        lane.state = State::Busy;
        Some(batch)
    }

    /// A call finished: the next batch to send, or `None` when the lane is
    /// empty (and idle again). Operations past their deadline are answered
    /// instead of sent.
    pub(super) fn next_batch(&self, slot: &str) -> Option<Vec<Pending>> {
        let mut lanes = self.lock();
        let lane = lanes.get_mut(slot)?;
        let batch = take_batch(lane);
        if batch.is_empty() {
            lane.state = State::Idle;
            return None;
        }
        Some(batch)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Lane>> {
        // Every change is a few field writes with no panic point between.
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Up to [`MAX_BATCH`] operations from the front of the queue that are not
/// yet due; those that are get their answer.
fn take_batch(lane: &mut Lane) -> Vec<Pending> {
    let now = Instant::now();
    let mut batch = Vec::new();
    while batch.len() < MAX_BATCH {
        let Some(pending) = lane.queue.pop_front() else {
            break;
        };
        if pending.deadline <= now {
            queued_too_long(pending);
        } else {
            batch.push(pending);
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(acquire: bool) -> Pending {
        let op = if acquire {
            BatchOp::Acquire {
                draws: Vec::new(),
                max_wait_ms: 0,
            }
        } else {
            BatchOp::Settle(Vec::new())
        };
        Pending {
            op,
            result: oneshot::channel().0,
            id: 0,
            deadline: Instant::now() + Duration::from_secs(60),
        }
    }

    #[test]
    fn a_lone_acquire_goes_at_once_and_later_ones_wait_for_the_next_call() {
        let lanes = Lanes::default();
        assert!(
            matches!(lanes.enqueue("{a}", pending(true)), Next::Send(_, batch) if batch.len() == 1)
        );
        for _ in 0..3 {
            assert!(matches!(lanes.enqueue("{a}", pending(true)), Next::Wait));
        }
        // Another slot is independent.
        assert!(matches!(
            lanes.enqueue("{b}", pending(true)),
            Next::Send(..)
        ));
        assert_eq!(lanes.next_batch("{a}").map(|batch| batch.len()), Some(3));
        assert!(lanes.next_batch("{a}").is_none(), "empty: idle again");
        assert!(matches!(
            lanes.enqueue("{a}", pending(true)),
            Next::Send(..)
        ));
    }

    #[test]
    fn settlements_wait_for_an_acquire_or_the_timer() {
        let lanes = Lanes::default();
        assert!(matches!(lanes.enqueue("{a}", pending(false)), Next::Arm(_)));
        assert!(matches!(lanes.enqueue("{a}", pending(false)), Next::Wait));
        // An acquire takes the settlements along, at once.
        assert!(
            matches!(lanes.enqueue("{a}", pending(true)), Next::Send(_, batch) if batch.len() == 3)
        );
        assert!(lanes.fire("{a}").is_none(), "the timer finds nothing to do");
        assert!(lanes.next_batch("{a}").is_none());
        assert!(matches!(lanes.enqueue("{a}", pending(false)), Next::Arm(_)));
        assert_eq!(lanes.fire("{a}").map(|batch| batch.len()), Some(1));
    }

    /// Issue 27: what queued behind a stalled call waited for it whatever
    /// its deadline. Now it is answered at its deadline, without going out.
    #[test]
    fn an_operation_past_its_deadline_is_answered_and_never_sent() {
        let lanes = Lanes::default();
        assert!(matches!(
            lanes.enqueue("{a}", pending(true)),
            Next::Send(..)
        ));
        let (result, mut answer) = oneshot::channel();
        let due = Pending {
            result,
            deadline: Instant::now(),
            ..pending(true)
        };
        assert!(matches!(lanes.enqueue("{a}", due), Next::Wait));
        lanes.enqueue("{a}", pending(true));
        assert_eq!(lanes.next_batch("{a}").map(|batch| batch.len()), Some(1));
        assert!(matches!(
            answer.try_recv(),
            Ok(Err(StoreError::Unavailable(_)))
        ));
        assert!(lanes.next_batch("{a}").is_none());
    }

    #[test]
    fn a_queued_operation_can_be_withdrawn_but_not_a_sent_one() {
        let lanes = Lanes::default();
        let with_id = |id| Pending {
            id,
            ..pending(true)
        };
        assert!(matches!(lanes.enqueue("{a}", with_id(1)), Next::Send(..)));
        lanes.enqueue("{a}", with_id(2));
        lanes.enqueue("{a}", with_id(3));
        assert!(lanes.withdraw("{a}", 1).is_none(), "in flight");
        assert_eq!(lanes.withdraw("{a}", 2).map(|pending| pending.id), Some(2));
        assert!(lanes.withdraw("{b}", 3).is_none(), "another slot");
        let next: Vec<u64> = lanes
            .next_batch("{a}")
            .unwrap()
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(next, [3]);
    }

    #[test]
    fn batches_are_bounded() {
        let lanes = Lanes::default();
        assert!(matches!(
            lanes.enqueue("{a}", pending(true)),
            Next::Send(..)
        ));
        for _ in 0..MAX_BATCH + 5 {
            lanes.enqueue("{a}", pending(true));
        }
        assert_eq!(lanes.next_batch("{a}").map(|b| b.len()), Some(MAX_BATCH));
        assert_eq!(lanes.next_batch("{a}").map(|b| b.len()), Some(5));
    }
}
