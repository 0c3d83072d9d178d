//! Calls whose outcome is unknown — a timeout, or a connection that broke
//! after the call was written — are cancelled: `lua/cancel.lua` undoes them
//! if they ran, or leaves a tombstone that keeps them from running late. So
//! a failed store call never burns capacity that nobody will use. Cancels
//! wait here until Redis answers them, oldest first, in a bounded queue.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use super::batch::Call;
use crate::limiter::backlog::Backlog;

/// Cancels kept while Redis does not answer; beyond it the oldest go.
const MAX_PENDING: usize = 10_000;

/// Cancels not sent yet, and what became of earlier ones.
pub(super) struct Reconciler {
    pending: Backlog<Call>,
    /// Woken when the queue has been sent to the end.
    drained: Notify,
    /// Calls found to have run, and undone.
    pub undone: AtomicU64,
    /// Calls found not to have run, now kept from running.
    pub prevented: AtomicU64,
}

impl Default for Reconciler {
    fn default() -> Self {
        Reconciler {
            pending: Backlog::new(MAX_PENDING),
            drained: Notify::new(),
            undone: AtomicU64::new(0),
            prevented: AtomicU64::new(0),
        }
    }
}

impl Reconciler {
    /// Queues the cancel of `call`; true when the caller must start a task
    /// to send the queue.
    pub(super) fn push(&self, call: Call) -> bool {
        self.pending.push(call)
    }

    /// The oldest cancel to send; `None` when there is none, and then the
    /// sending task must stop.
    pub(super) fn pop(&self) -> Option<Call> {
        let call = self.pending.pop();
        if call.is_none() {
            self.drained.notify_waiters();
        }
        call
    }

    /// Puts back a cancel Redis did not answer, to be sent first next time.
    pub(super) fn retry_later(&self, call: Call) {
        self.pending.retry_later(call);
    }

    /// Returns once no cancel is waiting: every call whose answer was lost
    /// is undone or kept from running.
    pub(super) async fn settled(&self) {
        loop {
            let drained = self.drained.notified();
            if self.pending.is_idle() {
                return;
            }
            drained.await;
        }
    }

    /// Counts a cancel Redis answered.
    pub(super) fn answered(&self, undone: bool) {
        let counter = if undone {
            &self.undone
        } else {
            &self.prevented
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Cancels waiting for Redis.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Cancels dropped for room: their calls, if they ran, stay.
    pub(super) fn evicted(&self) -> u64 {
        self.pending.evicted.load(Ordering::Relaxed)
    }
}
