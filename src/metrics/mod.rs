//! What the daemon counts and how it is read: the Prometheus registry of
//! everything counted as it happens ([`Metrics`]), what is read at scrape
//! time ([`exporter`]: bucket levels, leases, the store's state), the HTTP
//! listener serving `/metrics`, `/healthz` and `/readyz`, readiness
//! ([`health`]), and the one-line summary logged at shutdown.
//!
//! Every metric is named `ratekeeper_…`; the README lists them all.

pub mod exporter;
pub mod health;
mod labels;
pub mod registry;

pub use labels::{Labels, LimitMeters, TenantLabel};
pub use registry::{Metrics, Name, OpenGuard, StoreCalls};

use std::sync::atomic::Ordering;

use crate::app::Stores;
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
        }
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
        "stopped"
    );
}
