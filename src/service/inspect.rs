//! `Health` and `Inspect`: readiness, and the store's state with every
//! bucket of the limits asked for — tenant buckets of recently seen tenants
//! included — in one store call. `Inspect` answers while the store is down:
//! from the `local` policy's buckets, or with the levels unknown.

use std::sync::atomic::Ordering;

use super::acquire::CONCURRENT;
use super::{Service, ServiceError};
use crate::config::LimitConfig;
use crate::limiter::health;
use crate::limiter::shapes::ELSEWHERE;
use crate::limiter::{BucketRole, BucketSpec, StoreOps};
use crate::plan::Planner;
use crate::proto::{BucketInspection, HealthStatus, Inspection, LimitInspection, Response};

/// Where the levels of an inspection came from.
const FROM_STORE: &str = "store";
const FROM_LOCAL: &str = "local";
const FROM_NOWHERE: &str = "none";

/// One bucket to inspect, before its level is known.
struct Wanted {
    limit: usize,
    name: &'static str,
    tenant: Option<String>,
    spec: BucketSpec,
}

impl Service {
    /// Readiness as `/readyz` and `Health` report it; `socket_bound` says
    /// whether the socket is listening (a caller of `Health` reached it).
    pub fn health(&self, socket_bound: bool) -> HealthStatus {
        health::judge(socket_bound, self.is_draining(), self.store_health.state())
    }

    /// The store's state and the buckets of `only` (every limit when
    /// `None`), tenant buckets of recently seen tenants included.
    pub async fn inspection(&self, only: Option<&str>) -> Result<Inspection, ServiceError> {
        let snapshot = self.snapshot();
        let planner = &snapshot.planner;
        let limits: Vec<&LimitConfig> = match only {
            Some(name) => vec![planner.find_limit(name)?],
            None => planner.config().limits.iter().collect(),
        };
        let mut wanted = Vec::new();
        for (index, limit) in limits.iter().enumerate() {
            for (role, spec) in planner.buckets(limit) {
                wanted.push(Wanted {
                    limit: index,
                    name: role.name(),
                    tenant: None,
                    spec: spec.clone(),
                });
            }
            for tenant in self.recent.of(&limit.name) {
                if let Some(spec) = tenant_bucket(planner, limit, &tenant) {
                    wanted.push(Wanted {
                        limit: index,
                        name: BucketRole::Tenant.name(),
                        tenant: Some(tenant),
                        spec,
                    });
                }
            }
        }
        let specs: Vec<BucketSpec> = wanted.iter().map(|w| w.spec.clone()).collect();
        let (levels_from, levels) = self.levels_anyhow(&specs).await;
        let local = self
            .store_health
            .fallback()
            .filter(|_| levels_from == FROM_LOCAL);
        let mut inspected: Vec<LimitInspection> = limits
            .iter()
            .map(|limit| LimitInspection {
                name: limit.name.clone(),
                waiters: snapshot.waiters[&limit.name].load(Ordering::Relaxed),
                buckets: Vec::new(),
            })
            .collect();
        let disagreements = self
            .store_health
            .shape_conflicts()
            .map(|shapes| shapes.current())
            .unwrap_or_default();
        for (index, want) in wanted.into_iter().enumerate() {
            let other = disagreements.iter().find(|d| d.key == want.spec.key);
            // While the local policy serves, its buckets are this
            // sidecar's share of each.
            let spec = match local {
                Some(fallback) => fallback.local_bucket(&want.spec),
                None => want.spec,
            };
            let level = levels.as_ref().map(|levels| levels[index]);
            let buckets = &mut inspected[want.limit].buckets;
            buckets.push(BucketInspection {
                name: want.name.to_string(),
                tenant: want.tenant.clone(),
                capacity: spec.capacity,
                per_minute: spec.refill.per_minute_rounded(),
                level,
            });
            // Another sidecar's shape of the same bucket, right after it.
            if let Some(other) = other {
                buckets.push(BucketInspection {
                    name: format!("{}{ELSEWHERE}", want.name),
                    tenant: want.tenant,
                    capacity: other.theirs.capacity,
                    per_minute: other.theirs.per_minute,
                    level,
                });
            }
        }
        for (limit, inspection) in limits.iter().zip(&mut inspected) {
            if let Some(spec) = planner.slots(limit) {
                let held = self.store.slots_held(spec).await.ok();
                inspection.buckets.push(BucketInspection {
                    name: CONCURRENT.to_string(),
                    tenant: None,
                    capacity: spec.max,
                    per_minute: 0,
                    level: held.map(|held| spec.max.saturating_sub(held) as i64),
                });
            }
        }
        Ok(Inspection {
            health: self.health(true),
            levels_from: levels_from.to_string(),
            limits: inspected,
        })
    }

    pub(super) async fn inspect(&self, only: Option<&str>) -> Result<Response, ServiceError> {
        Ok(Response::Inspection(self.inspection(only).await?))
    }

    /// The levels of `specs` from the store; while it fails, from the
    /// `local` policy's buckets, or none.
    async fn levels_anyhow(&self, specs: &[BucketSpec]) -> (&'static str, Option<Vec<i64>>) {
        let cause = match self.store.levels(specs).await {
            Ok(levels) => return (FROM_STORE, Some(levels)),
            Err(cause) => cause,
        };
        let local = self
            .store_health
            .fallback()
            .filter(|fallback| fallback.policy() == crate::limiter::FailurePolicy::Local);
        if let Some(fallback) = local {
            if let Ok(levels) = fallback.local_levels(specs).await {
                return (FROM_LOCAL, Some(levels));
            }
        }
        tracing::debug!(%cause, "bucket levels unknown while the store fails");
        (FROM_NOWHERE, None)
    }
}

/// The bucket of `tenant`'s share of `limit`, as an acquire would plan it
/// (under the first priority class that applies to the limit).
fn tenant_bucket(planner: &Planner, limit: &LimitConfig, tenant: &str) -> Option<BucketSpec> {
    limit.tenant_share?;
    planner.config().priorities.iter().find_map(|class| {
        let checked = planner
            .check_acquire(&limit.name, Some(tenant), Some(&class.name), Some(0))
            .ok()?;
        let plan = planner
            .plan_acquire(checked, Some(tenant), (1, 0), super::unix_ms())
            .ok()?;
        plan.reserved
            .into_iter()
            .find(|reserved| reserved.role == BucketRole::Tenant)
            .map(|reserved| reserved.draw.bucket)
    })
}
