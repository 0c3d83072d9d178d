//! Settlements the shared store could not take during an outage wait here
//! and are replayed, oldest first, once it answers again: a report or a
//! release is never lost to an outage. The queue is bounded; past the bound
//! the oldest settlement goes, and is counted.
//!
//! Replaying is exact because a failed call to the shared store changed
//! nothing (the Redis store cancels calls whose outcome it does not know).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::backlog::Backlog;
use super::{Adjustment, Origin, Store, StoreOps};

/// Settlements kept while the shared store fails.
const MAX_PENDING: usize = 100_000;

/// Pauses between attempts while the store still fails.
const RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// Settlements waiting for the shared store.
pub struct Replay {
    store: Arc<dyn Store>,
    pending: Backlog<Vec<Adjustment>>,
    /// Settlements applied late, after the store came back.
    pub replayed: AtomicU64,
}

impl Replay {
    pub fn new(store: Arc<dyn Store>) -> Arc<Replay> {
        Arc::new(Replay {
            store,
            pending: Backlog::new(MAX_PENDING),
            replayed: AtomicU64::new(0),
        })
    }

    /// Keeps `adjustments` for later, and starts replaying if nobody is.
    pub fn push(self: &Arc<Self>, adjustments: Vec<Adjustment>) {
        if self.pending.push(adjustments) {
            tokio::spawn(self.clone().replay());
        }
    }

    /// Settlements waiting now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Settlements dropped for room during a long outage.
    pub fn evicted(&self) -> u64 {
        self.pending.evicted.load(Ordering::Relaxed)
    }

    async fn replay(self: Arc<Self>) {
        let mut replayed = 0u64;
        loop {
            let Some(adjustments) = self.pending.pop() else {
                tracing::info!(replayed, "settlements made during the outage are applied");
                return;
            };
            match self.store.adjust(&adjustments, Origin::Store).await {
                Ok(()) => {
                    self.replayed.fetch_add(1, Ordering::Relaxed);
                    replayed += 1;
                }
                Err(_) => {
                    self.pending.retry_later(adjustments);
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
}
