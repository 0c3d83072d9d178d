//! Calls whose outcome is unknown — a timeout, or a connection that broke
//! after the call was written — are cancelled: `lua/cancel.lua` undoes them
//! if they ran, or leaves a tombstone that keeps them from running late. So
//! a failed store call never burns capacity that nobody will use. Cancels
//! wait here until Redis answers them, oldest first, in a bounded queue.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;

use super::batch::Call;

/// Cancels kept while Redis does not answer; beyond it the oldest go.
const MAX_PENDING: usize = 10_000;

/// Cancels not sent yet, and what became of earlier ones.
#[derive(Default)]
pub(super) struct Reconciler {
    pending: Mutex<VecDeque<Call>>,
    /// Whether a task is sending cancels now.
    sending: AtomicBool,
    /// Woken when the queue has been sent to the end.
    drained: Notify,
    /// Calls found to have run, and undone.
    pub undone: AtomicU64,
    /// Calls found not to have run, now kept from running.
    pub prevented: AtomicU64,
    /// Cancels dropped for room: their calls, if they ran, stay.
    pub evicted: AtomicU64,
}

impl Reconciler {
    /// Queues the cancel of `call`; true when the caller must start a task
    /// to send the queue.
    pub(super) fn push(&self, call: Call) -> bool {
        let mut pending = self.lock();
        if pending.len() >= MAX_PENDING {
            pending.pop_front();
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        pending.push_back(call);
        // Under the lock, so that a task finding the queue empty and a push
        // never miss each other.
        !self.sending.swap(true, Ordering::AcqRel)
    }

    /// The oldest cancel to send; `None` when there is none, and then the
    /// sending task must stop.
    pub(super) fn pop(&self) -> Option<Call> {
        let mut pending = self.lock();
        let call = pending.pop_front();
        if call.is_none() {
            self.sending.store(false, Ordering::Release);
            self.drained.notify_waiters();
        }
        call
    }

    /// Returns once no cancel is waiting: every call whose answer was lost
    /// is undone or kept from running.
    pub(super) async fn settled(&self) {
        loop {
            let drained = self.drained.notified();
            if !self.sending.load(Ordering::Acquire) && self.lock().is_empty() {
                return;
            }
            drained.await;
        }
    }

    /// Puts back a cancel Redis did not answer, to be sent first next time.
    pub(super) fn retry_later(&self, call: Call) {
        self.lock().push_front(call);
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
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Call>> {
        // Only whole pushes and pops happen under the lock.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
