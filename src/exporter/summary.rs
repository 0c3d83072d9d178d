//! What the daemon counted over its life, read from the service and its
//! stores: the counters the scrape exports as gauges, and the one-line
//! summary logged at shutdown.

use std::sync::atomic::Ordering;

use crate::limiter::Stores;
use crate::service::Service;

/// The counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Leases not yet reported or released.
    pub open_leases: u64,
    /// Leases forgotten with their connection, reservation kept.
    pub leases_kept_on_disconnect: u64,
    /// Leases partly refunded after their connection closed.
    pub leases_refunded_on_disconnect: u64,
    /// Leases forgotten for age or room.
    pub leases_expired: u64,
    /// Acquires the failure policy answered instead of Redis.
    pub policy_decisions: u64,
    /// Denials proven locally, without a Redis call.
    pub local_denials: u64,
    /// Log lines lost to a failing stderr.
    pub log_write_errors: u64,
    /// Store calls whose answer was lost, found to have run, and undone.
    pub calls_undone: u64,
    /// Store calls whose answer was lost that had not run (now never will).
    pub calls_prevented: u64,
    /// Cancels of such calls waiting for Redis.
    pub cancels_pending: u64,
    /// Cancels dropped for room during a long outage.
    pub cancels_evicted: u64,
    /// Settlements made during an outage, waiting to be replayed.
    pub settlements_pending: u64,
    /// Settlements replayed after an outage.
    pub settlements_replayed: u64,
    /// Settlements dropped for room during a long outage.
    pub settlements_evicted: u64,
}

impl Counters {
    /// Reads every counter of `service` and its `stores`.
    pub fn read(service: &Service, stores: &Stores) -> Counters {
        let leases = service.lease_counters();
        Counters {
            open_leases: service.open_leases() as u64,
            leases_kept_on_disconnect: leases.kept_on_disconnect.load(Ordering::Relaxed),
            leases_refunded_on_disconnect: leases.refunded_on_disconnect.load(Ordering::Relaxed),
            leases_expired: leases.expired.load(Ordering::Relaxed),
            policy_decisions: stores
                .fallback
                .as_ref()
                .map_or(0, |fallback| fallback.policy_decisions()),
            local_denials: stores
                .fail_fast
                .as_ref()
                .map_or(0, |fail_fast| fail_fast.local_denials()),
            log_write_errors: crate::logging::write_errors(),
            ..Counters::default()
        }
        .with_outage_work(stores)
    }

    /// The Redis store's reconciliation and the replay of settlements.
    fn with_outage_work(mut self, stores: &Stores) -> Counters {
        if let Some(redis) = &stores.redis {
            let calls = redis.counters();
            self.calls_undone = calls.calls_undone;
            self.calls_prevented = calls.calls_prevented;
            self.cancels_pending = calls.cancels_pending;
            self.cancels_evicted = calls.cancels_evicted;
        }
        if let Some(fallback) = &stores.fallback {
            let replay = fallback.replay();
            self.settlements_pending = replay.pending() as u64;
            self.settlements_replayed = replay.replayed.load(Ordering::Relaxed);
            self.settlements_evicted = replay.evicted();
        }
        self
    }
}

/// The daemon's last log line: what it counted over its life.
pub fn log_shutdown_summary(service: &Service, stores: &Stores) {
    let counters = Counters::read(service, stores);
    tracing::info!(
        open_leases = counters.open_leases,
        leases_kept_on_disconnect = counters.leases_kept_on_disconnect,
        leases_refunded_on_disconnect = counters.leases_refunded_on_disconnect,
        leases_expired = counters.leases_expired,
        policy_decisions = counters.policy_decisions,
        local_denials = counters.local_denials,
        log_write_errors = counters.log_write_errors,
        calls_undone = counters.calls_undone,
        cancels_evicted = counters.cancels_evicted,
        settlements_replayed = counters.settlements_replayed,
        settlements_pending = counters.settlements_pending,
        settlements_evicted = counters.settlements_evicted,
        "stopped"
    );
}
