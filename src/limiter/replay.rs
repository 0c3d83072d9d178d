//! Settlements the shared store could not take during an outage wait here
//! and are replayed, oldest first, once it answers again: a report or a
//! release is never lost to an outage. The queue is bounded; past the bound
//! the oldest settlement goes, and is counted.
//!
//! Replaying is exact because a failed call to the shared store changed
//! nothing (the Redis store cancels calls whose outcome it does not know).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Adjustment, Origin, Store};

/// Settlements kept while the shared store fails.
const MAX_PENDING: usize = 100_000;

/// Pauses between attempts while the store still fails.
const RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// Settlements waiting for the shared store.
pub struct Replay {
    store: Arc<dyn Store>,
    pending: Mutex<VecDeque<Vec<Adjustment>>>,
    /// Whether a task is replaying now.
    replaying: AtomicBool,
    /// Settlements applied late, after the store came back.
    pub replayed: AtomicU64,
    /// Settlements dropped for room during a long outage.
    pub evicted: AtomicU64,
}

impl Replay {
    pub fn new(store: Arc<dyn Store>) -> Arc<Replay> {
        Arc::new(Replay {
            store,
            pending: Mutex::default(),
            replaying: AtomicBool::new(false),
            replayed: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// Keeps `adjustments` for later, and starts replaying if nobody is.
    pub fn push(self: &Arc<Self>, adjustments: Vec<Adjustment>) {
        let start = {
            let mut pending = self.lock();
            if pending.len() >= MAX_PENDING {
                pending.pop_front();
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
            pending.push_back(adjustments);
            !self.replaying.swap(true, Ordering::AcqRel)
        };
        if start {
            tokio::spawn(self.clone().replay());
        }
    }

    /// Settlements waiting now.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    async fn replay(self: Arc<Self>) {
        let mut replayed = 0u64;
        loop {
            let next = {
                let mut pending = self.lock();
                let next = pending.pop_front();
                if next.is_none() {
                    self.replaying.store(false, Ordering::Release);
                }
                next
            };
            let Some(adjustments) = next else {
                tracing::info!(replayed, "settlements made during the outage are applied");
                return;
            };
            match self.store.adjust(&adjustments, Origin::Store).await {
                Ok(()) => {
                    self.replayed.fetch_add(1, Ordering::Relaxed);
                    replayed += 1;
                }
                Err(_) => {
                    self.lock().push_front(adjustments);
                    self.until_the_store_answers().await;
                }
            }
        }
    }

    /// Waits until a ping succeeds (retrying settlements blindly would only
    /// add calls for the store to cancel) and the store has settled the
    /// calls whose answer it lost.
    async fn until_the_store_answers(&self) {
        let (mut pause, longest) = RETRY;
        loop {
            tokio::time::sleep(pause).await;
            if self.store.ping().await.is_ok() {
                break;
            }
            pause = (pause * 2).min(longest);
        }
        self.store.reconciled().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Vec<Adjustment>>> {
        // Only whole pushes and pops happen under the lock.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
