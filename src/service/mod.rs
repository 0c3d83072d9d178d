//! The request handlers: acquire (plan, reserve, wait), report and release
//! (settle a lease), estimate and status, against one configuration and one
//! store. No socket I/O: the connection decodes frames, answers the
//! connection-level requests (`Hello`, `Ping`, `Cancel`) itself and hands
//! the rest here as a [`Call`].

mod acquire;
mod counting;
mod error;
mod settle;
mod status;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::leases::{LeaseCounters, LeaseTable};
use crate::limiter::Store;
use crate::plan::Planner;
use crate::proto::{Acquire, Cost, Response};
use crate::tokens::OutputTokenLearner;
pub use error::ServiceError;

pub use crate::leases::ConnectionId;

/// A request the service answers: every [`crate::proto::Request`] but the
/// connection's own (`Hello`, `Ping`, `Cancel`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Acquire(Acquire),
    Report {
        lease: u64,
        input_tokens: u64,
        output_tokens: u64,
    },
    Release {
        lease: u64,
    },
    Estimate {
        limit: String,
        cost: Cost,
    },
    Status {
        limit: Option<String>,
    },
}

/// Answers calls against one configuration and one store.
pub struct Service {
    /// Swapped whole by a config reload; requests keep the one they started with.
    snapshot: RwLock<Arc<Snapshot>>,
    store: Arc<dyn Store>,
    leases: LeaseTable,
    draining: AtomicBool,
    /// Where prompts are counted, off the socket loop.
    counting: counting::Counting,
    /// Output tokens recently reported, per model, for limits that learn
    /// their default max output.
    learner: Mutex<OutputTokenLearner>,
}

/// The configuration in force, planned, and the waiters of its limits.
struct Snapshot {
    planner: Planner,
    /// Acquires currently held back until their reservation is due, per
    /// limit; carried over by a reload for limits that stay.
    waiters: HashMap<String, Arc<AtomicU64>>,
}

/// Why a new configuration was not taken by [`Service::reload`].
#[derive(Debug, thiserror::Error)]
#[error("{0} cannot change while the daemon runs; restart it to apply the new value")]
pub struct ReloadError(&'static str);

impl Service {
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>) -> Self {
        let leases = LeaseTable::new(
            Duration::from_millis(config.leases.expire_after_ms),
            config.leases.max_open as usize,
        );
        Service {
            snapshot: RwLock::new(Arc::new(Snapshot::new(config, &HashMap::new()))),
            store,
            leases,
            draining: AtomicBool::new(false),
            counting: counting::Counting::new(),
            learner: Mutex::new(OutputTokenLearner::default()),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.snapshot().planner.config().clone()
    }

    /// Takes a new configuration for limits, groups and priority classes.
    /// The socket, the store and the lease settings are fixed at start:
    /// a change to them refuses the whole reload, and the old config stays.
    pub fn reload(&self, config: Config) -> Result<(), ReloadError> {
        let current = self.snapshot();
        let old = current.planner.config();
        if config.server != old.server {
            return Err(ReloadError("[server]"));
        }
        if config.redis != old.redis {
            return Err(ReloadError("[redis]"));
        }
        if config.leases != old.leases {
            return Err(ReloadError("[leases]"));
        }
        let next = Snapshot::new(Arc::new(config), &current.waiters);
        *self
            .snapshot
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(next);
        Ok(())
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        // Only ever replaced whole, so a poisoned lock still holds a whole value.
        self.snapshot
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// New acquires are refused with `ShuttingDown` from now on; reports and
    /// releases of leases already granted are still settled.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Leases not yet reported or released.
    pub fn open_leases(&self) -> usize {
        self.leases.len()
    }

    /// Counts of leases that ended without a report.
    pub fn lease_counters(&self) -> &LeaseCounters {
        &self.leases.counters
    }

    /// Answers one call. `cancel` fires when the client cancels the request
    /// or its connection closes; a waiting acquire then returns its
    /// reservation.
    pub async fn handle(
        &self,
        connection: ConnectionId,
        call: Call,
        cancel: CancellationToken,
    ) -> Result<Response, ServiceError> {
        match call {
            Call::Acquire(acquire) => self.acquire(connection, acquire, cancel).await,
            Call::Report {
                lease,
                input_tokens,
                output_tokens,
            } => self.report(lease, input_tokens, output_tokens).await,
            Call::Release { lease } => self.release(lease).await,
            Call::Estimate { limit, cost } => self.estimate(&limit, cost).await,
            Call::Status { limit } => self.status(limit.as_deref()).await,
        }
    }
}

impl Snapshot {
    fn new(config: Arc<Config>, previous_waiters: &HashMap<String, Arc<AtomicU64>>) -> Self {
        let waiters = config
            .limits
            .iter()
            .map(|limit| {
                let count = previous_waiters
                    .get(&limit.name)
                    .cloned()
                    .unwrap_or_default();
                (limit.name.clone(), count)
            })
            .collect();
        Snapshot {
            planner: Planner::new(config),
            waiters,
        }
    }
}
