//! `Status`: each limit's buckets as the store sees them now.

use std::sync::atomic::Ordering;

use super::acquire::CONCURRENT;
use super::{Service, ServiceError};
use crate::config::LimitConfig;
use crate::limiter::shapes::ELSEWHERE;
use crate::limiter::{BucketSpec, StoreOps};
use crate::proto::{BucketStatus, LimitStatus, Response};

impl Service {
    pub(super) async fn status(&self, only: Option<&str>) -> Result<Response, ServiceError> {
        let snapshot = self.snapshot();
        let planner = &snapshot.planner;
        let limits: Vec<&LimitConfig> = match only {
            Some(name) => vec![planner.find_limit(name)?],
            None => planner.config().limits.iter().collect(),
        };
        let mut statuses = Vec::with_capacity(limits.len());
        for limit in limits {
            let buckets = planner.buckets(limit);
            let specs: Vec<BucketSpec> = buckets.iter().map(|(_, spec)| spec.clone()).collect();
            let levels = self
                .store
                .levels(&specs)
                .await
                .map_err(|source| ServiceError::Store {
                    limit: limit.name.clone(),
                    source,
                })?;
            let disagreements = self
                .store_health
                .shape_conflicts()
                .map(|shapes| shapes.current())
                .unwrap_or_default();
            let mut statuses_of_buckets: Vec<BucketStatus> = Vec::with_capacity(buckets.len());
            for ((role, spec), level) in buckets.iter().zip(levels) {
                statuses_of_buckets.push(BucketStatus {
                    name: role.name().to_string(),
                    capacity: spec.capacity,
                    level,
                    per_minute: spec.refill.per_minute_rounded(),
                });
                // Another sidecar's shape of the same bucket, right after it
                // (PROTOCOL.md, Status).
                if let Some(other) = disagreements.iter().find(|d| d.key == spec.key) {
                    statuses_of_buckets.push(BucketStatus {
                        name: format!("{}{ELSEWHERE}", role.name()),
                        capacity: other.theirs.capacity,
                        level,
                        per_minute: other.theirs.per_minute,
                    });
                }
            }
            if let Some(spec) = planner.slots(limit) {
                let held =
                    self.store
                        .slots_held(spec)
                        .await
                        .map_err(|source| ServiceError::Store {
                            limit: limit.name.clone(),
                            source,
                        })?;
                // Slots free now; a concurrency limit does not refill.
                statuses_of_buckets.push(BucketStatus {
                    name: CONCURRENT.to_string(),
                    capacity: spec.max,
                    level: spec.max.saturating_sub(held) as i64,
                    per_minute: 0,
                });
            }
            statuses.push(LimitStatus {
                name: limit.name.clone(),
                waiters: snapshot.waiters[&limit.name].load(Ordering::Relaxed),
                buckets: statuses_of_buckets,
            });
        }
        Ok(Response::Status {
            store: self.store.kind().to_string(),
            limits: statuses,
        })
    }
}
