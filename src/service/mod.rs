//! The request handlers: acquire (plan, reserve, wait), report and release
//! (settle a lease), estimate, status, health and inspect, against one
//! configuration and one store. No socket I/O: the connection decodes
//! frames, answers the connection-level requests (`Hello`, `Ping`,
//! `Cancel`) itself and hands the rest here as a [`Call`]. Every call is
//! observed on its way through [`Service::handle`]: metrics and, at DEBUG,
//! a decision line (`observe`).

mod acquire;
mod budgets;
mod counting;
mod due;
mod error;
mod feedback;
mod inspect;
mod observe;
mod settle;
mod status;

pub(crate) use counting::off_loop;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::leases::{LeaseCounters, LeaseTable};
use crate::limiter::health::StoreHealth;
use crate::limiter::{SlotKeeper, Store};
use crate::metrics::{Labels, Metrics};
use crate::plan::Planner;
use crate::proto::{Acquire, Cost, Feedback, Response};
use crate::tokens::OutputTokenLearner;
pub use error::ServiceError;

pub use crate::leases::{ConnectionId, Reported};

/// A request the service answers: every [`crate::proto::Request`] but the
/// connection's own (`Hello`, `Ping`, `Cancel`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// An acquire, and who sent it (its uid bounds what it may name).
    Acquire(Acquire, Caller),
    Report {
        lease: u64,
        usage: Reported,
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
    Health,
    Inspect {
        limit: Option<String>,
    },
    Budgets {
        limit: Option<String>,
    },
    /// Provider feedback, the lease of the call it answers when the
    /// client named it, and who sent it.
    Feedback(Feedback, Option<u64>, Caller),
}

/// The wall clock, Unix time in ms: what calendar budgets' periods are
/// counted in.
pub(crate) fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// Who sent a call, for the log of calls that act on the whole fleet (a
/// provider pause) and the `[[clients]]` policy of acquires: its `Hello`
/// name and the uid the kernel gave for the connection's peer
/// (`SO_PEERCRED`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// Shared: every call of a connection carries it.
    pub name: Arc<str>,
    pub uid: Option<u32>,
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
    metrics: Arc<Metrics>,
    /// Whether calls are counted into `metrics`: only when `[metrics]
    /// listen` serves them, so that a daemon without it pays nothing.
    metered: bool,
    /// Where the store's state (up, down since, policy) is read.
    store_health: StoreHealth,
    /// Tenants recently seen per limit, which `Inspect` shows.
    recent: observe::RecentTenants,
    /// Provider limits below a configured one, already warned about.
    warned: feedback::Warned,
    /// The provider pause in force per limit, so that 429s do not extend
    /// or stack it.
    pauses: feedback::Pauses,
    /// Takes and gives back the concurrency slots of limits with
    /// `max_concurrent`.
    slots: Arc<SlotKeeper>,
    /// Ends the waits of granted acquires at their due time to the µs.
    due_timer: OnceLock<Option<due::DueTimer>>,
}

/// The configuration in force, planned, its metric labels, and the waiters
/// of its limits.
struct Snapshot {
    planner: Planner,
    labels: Labels,
    /// Acquires currently held back until their reservation is due, per
    /// limit; carried over by a reload for limits that stay.
    waiters: HashMap<String, Arc<AtomicU64>>,
    /// What each limit granted lately, for provider feedback; carried over
    /// by a reload likewise.
    grants: HashMap<String, Arc<feedback::RecentGrants>>,
}

/// Why a new configuration was not taken by [`Service::reload`].
#[derive(Debug, thiserror::Error)]
#[error("{0} cannot change while the daemon runs; restart it to apply the new value")]
pub struct ReloadError(&'static str);

impl Service {
    /// A service answering from `store`, whose state `store_health` reads,
    /// counting into `metrics`.
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        store_health: StoreHealth,
        metrics: Arc<Metrics>,
    ) -> Self {
        let leases = LeaseTable::new(
            Duration::from_millis(config.leases.expire_after_ms),
            config.leases.max_open as usize,
        );
        Service {
            metered: config.metrics.listen.is_some(),
            snapshot: RwLock::new(Arc::new(Snapshot::first(config, &metrics))),
            slots: SlotKeeper::new(store.clone()),
            store,
            leases,
            draining: AtomicBool::new(false),
            counting: counting::Counting::new(),
            learner: Mutex::new(OutputTokenLearner::default()),
            metrics,
            store_health,
            recent: observe::RecentTenants::default(),
            warned: feedback::Warned::default(),
            pauses: feedback::Pauses::default(),
            due_timer: OnceLock::new(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.snapshot().planner.config().clone()
    }

    /// Takes a new configuration for limits, groups, priority classes and
    /// `[[clients]]`.
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
        if config.metrics.listen != old.metrics.listen {
            return Err(ReloadError("[metrics] listen"));
        }
        let next = Snapshot::new(Arc::new(config), &current, &self.metrics);
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

    /// Whether [`begin_drain`](Self::begin_drain) was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Leases not yet reported or released.
    pub fn open_leases(&self) -> usize {
        self.leases.len()
    }

    /// What the daemon counts as things happen.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
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
        let snapshot = self.snapshot();
        let observed = self.observe(&snapshot, &call);
        let answer = match call {
            Call::Acquire(acquire, caller) => {
                self.acquire(connection, acquire, &caller, cancel).await
            }
            Call::Report { lease, usage } => self.report(lease, usage).await,
            Call::Release { lease } => self.release(lease).await,
            Call::Estimate { limit, cost } => self.estimate(&limit, cost).await,
            Call::Status { limit } => self.status(limit.as_deref()).await,
            Call::Health => Ok(Response::Health(self.health(true))),
            Call::Inspect { limit } => self.inspect(limit.as_deref()).await,
            Call::Budgets { limit } => self.budgets(limit.as_deref()).await,
            Call::Feedback(feedback, lease, caller) => {
                self.feedback(feedback, lease, &caller).await
            }
        };
        self.record(&snapshot, observed, &answer);
        answer
    }
}

impl Snapshot {
    /// The snapshot of `config`, keeping `previous`'s waiters and recent
    /// grants of the limits that stay.
    fn new(config: Arc<Config>, previous: &Snapshot, metrics: &Metrics) -> Self {
        fn carried<T>(
            config: &Config,
            previous: &HashMap<String, Arc<T>>,
            fresh: impl Fn() -> T,
        ) -> HashMap<String, Arc<T>> {
            config
                .limits
                .iter()
                .map(|limit| {
                    let kept = previous.get(&limit.name).cloned();
                    (
                        limit.name.clone(),
                        kept.unwrap_or_else(|| Arc::new(fresh())),
                    )
                })
                .collect()
        }
        Snapshot {
            waiters: carried(&config, &previous.waiters, AtomicU64::default),
            grants: carried(&config, &previous.grants, feedback::RecentGrants::new),
            labels: Labels::new(
                config.limits.iter().map(|limit| limit.name.as_str()),
                &config.metrics.tenants,
                metrics,
            ),
            planner: Planner::new(config),
        }
    }

    /// The first snapshot.
    fn first(config: Arc<Config>, metrics: &Metrics) -> Self {
        let empty = Snapshot {
            planner: Planner::new(Arc::new(Config::default())),
            labels: Labels::new([], &[], metrics),
            waiters: HashMap::new(),
            grants: HashMap::new(),
        };
        Snapshot::new(config, &empty, metrics)
    }
}

#[cfg(test)]
mod tests;
