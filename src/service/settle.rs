//! The end of a lease: a report settles it to the usage, a release gives
//! it all back, a closed connection applies `leases.on_disconnect`, and age
//! or room forgets it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{ConnectionId, Reported, Service, ServiceError};
use crate::config::DisconnectRule;
use crate::leases::{refund_all, refund_fraction, settle_usage};
use crate::limiter::StoreOps;
use crate::metrics::TenantLabels;
use crate::proto::Response;

impl Service {
    /// Settles a lease: each bucket that settles gets back what it reserved
    /// less its matching usage figure (see [`settle_usage`]).
    pub(super) async fn report(
        &self,
        lease_id: u64,
        usage: Reported,
    ) -> Result<Response, ServiceError> {
        let lease = self
            .leases
            .take(lease_id)
            .ok_or(ServiceError::UnknownLease(lease_id))?;
        let settlement = settle_usage(&lease.reserved, usage, lease.cache_reads_count);
        let (_, output_tokens) = usage.rate_tokens(lease.cache_reads_count);
        if !settlement.adjustments.is_empty() {
            if let Err(source) = self
                .store
                .adjust(&settlement.adjustments, lease.origin)
                .await
            {
                // Keep the lease so that the report can be retried.
                self.leases.restore(lease_id, lease);
                return Err(ServiceError::ReportNotSettled {
                    lease: lease_id,
                    source,
                });
            }
        }
        if settlement.spent > 0
            && self.metered
            && let Some(tag) = self.leases.tag_of(lease_id)
        {
            let labels = TenantLabels {
                limit: tag.limit,
                tenant: tag.tenant,
            };
            self.metrics
                .spent
                .get_or_create(&labels)
                .inc_by(settlement.spent);
        }
        // A report without output tokens (a total reported as input) says
        // nothing about completion sizes.
        if let Some(key) = lease.learn_as.as_ref().filter(|_| output_tokens > 0) {
            self.learn_output(key, output_tokens);
        }
        Ok(Response::Settled {
            tokens_returned: settlement.tokens_returned,
        })
    }

    /// Gives a lease's whole reservation back.
    pub(super) async fn release(&self, lease_id: u64) -> Result<Response, ServiceError> {
        let lease = self
            .leases
            .take(lease_id)
            .ok_or(ServiceError::UnknownLease(lease_id))?;
        let adjustments = refund_all(&lease.reserved);
        if let Err(source) = self.store.adjust(&adjustments, lease.origin).await {
            self.leases.restore(lease_id, lease);
            return Err(ServiceError::ReleaseNotSettled {
                lease: lease_id,
                source,
            });
        }
        Ok(Response::Released {
            tokens_returned: lease.tokens,
        })
    }

    /// Applies `leases.on_disconnect` to the unreported leases of a closed
    /// connection: `keep` forgets them with their reservation (the provider
    /// was probably called); `refund` gives a fraction of their tokens back
    /// after a grace period in which another connection may still report
    /// them. Returns how many leases the connection left unreported.
    pub fn connection_closed(self: &Arc<Self>, connection: ConnectionId) -> usize {
        let orphans = self.leases.take_owned_by(connection);
        let count = orphans.len();
        if count == 0 {
            return 0;
        }
        let config = self.config();
        let rules = &config.leases;
        match rules.on_disconnect {
            DisconnectRule::Keep => {
                self.leases
                    .counters
                    .kept_on_disconnect
                    .fetch_add(count as u64, Ordering::Relaxed);
            }
            DisconnectRule::Refund => {
                // Keep them reportable during the grace period.
                let ids: Vec<u64> = orphans
                    .into_iter()
                    .map(|(id, lease)| {
                        self.leases.restore(id, lease);
                        id
                    })
                    .collect();
                let service = Arc::clone(self);
                let grace = Duration::from_millis(rules.disconnect_grace_ms);
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    service.refund_orphans(&ids).await;
                });
            }
        }
        count
    }

    /// After the grace period: refunds the configured fraction of the
    /// orphaned leases that are still unreported.
    async fn refund_orphans(&self, ids: &[u64]) {
        let fraction = self.config().leases.disconnect_refund_fraction;
        for id in ids {
            let Some(lease) = self.leases.take(*id) else {
                continue; // reported meanwhile, or expired
            };
            let adjustments = refund_fraction(&lease.reserved, fraction);
            let counters = &self.leases.counters;
            if adjustments.is_empty() {
                // Only buckets that keep the charge: nothing to give back.
                counters.kept_on_disconnect.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match self.store.adjust(&adjustments, lease.origin).await {
                Ok(()) => {
                    counters
                        .refunded_on_disconnect
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(store_error) => {
                    tracing::warn!(lease = id, %store_error, "could not refund an orphaned lease")
                }
            }
        }
    }

    /// Forgets expired leases every so often, forever; the server aborts it.
    pub async fn expire_leases_periodically(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.leases.sweep_interval());
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let expired = self.leases.expire(Instant::now());
            if expired > 0 {
                tracing::info!(
                    expired,
                    expire_after_ms = self.config().leases.expire_after_ms,
                    "forgot unreported leases, keeping their reservations"
                );
            }
        }
    }
}
