//! `Budgets`: each spend budget as the store holds it now: what reported
//! calls cost, what unreported ones hold, what remains, and when it resets.

use std::collections::HashSet;

use super::{Service, ServiceError, unix_ms};
use crate::config::LimitConfig;
use crate::limiter::{BucketRole, BucketSpec, BudgetOwner, StoreOps};
use crate::plan::BudgetBucket;
use crate::proto::{BudgetStatus, Response};

impl Service {
    pub(super) async fn budgets(&self, only: Option<&str>) -> Result<Response, ServiceError> {
        Ok(Response::Budgets {
            budgets: self.budget_statuses(only).await?,
        })
    }

    /// The budgets of one limit or of every limit, each once (a group's
    /// under the group): the limits' and groups' own, and those of the
    /// tenants the config names (in `tenant_budgets` or `[metrics]
    /// tenants`; other tenants' budgets are only read when they acquire).
    pub async fn budget_statuses(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<BudgetStatus>, ServiceError> {
        let snapshot = self.snapshot();
        let planner = &snapshot.planner;
        let config = planner.config();
        let limits: Vec<&LimitConfig> = match only {
            Some(name) => vec![planner.find_limit(name)?],
            None => config.limits.iter().collect(),
        };
        let now_ms = unix_ms();
        let mut seen = HashSet::new();
        let mut rows = Vec::new();
        for limit in limits {
            let group = limit.group.as_deref().and_then(|name| config.group(name));
            let mut tenants: Vec<&str> =
                config.metrics.tenants.iter().map(String::as_str).collect();
            tenants.extend(limit.budgets.tenant_budgets.keys().map(String::as_str));
            if let Some(group) = group {
                tenants.extend(group.budgets.tenant_budgets.keys().map(String::as_str));
            }
            let mut found: Vec<(Option<&str>, BudgetBucket)> = planner
                .budget_buckets(limit, None, now_ms)
                .into_iter()
                .map(|bucket| (None, bucket))
                .collect();
            for tenant in tenants {
                for bucket in planner.budget_buckets(limit, Some(tenant), now_ms) {
                    if let BucketRole::Budget(BudgetOwner::Tenant | BudgetOwner::GroupTenant, _) =
                        bucket.role
                    {
                        found.push((Some(tenant), bucket));
                    }
                }
            }
            found.retain(|(_, bucket)| seen.insert(bucket.bucket.key.clone()));
            if found.is_empty() {
                continue;
            }
            // One store call a limit: every budget's bucket, then the
            // spent counters of those that keep one.
            let mut specs: Vec<BucketSpec> = found.iter().map(|(_, b)| b.bucket.clone()).collect();
            specs.extend(found.iter().filter_map(|(_, b)| b.spent_counter.clone()));
            let levels = self
                .store
                .levels(&specs)
                .await
                .map_err(|source| ServiceError::Store {
                    limit: limit.name.clone(),
                    source,
                })?;
            let mut counters = levels[found.len()..].iter();
            for ((tenant, bucket), remaining) in found.iter().zip(&levels) {
                let amount = bucket.bucket.capacity;
                let used = (amount as i64).saturating_sub(*remaining).max(0) as u64;
                let spent = match &bucket.spent_counter {
                    Some(counter) => {
                        let left = counters.next().copied().unwrap_or(counter.capacity as i64);
                        (counter.capacity as i64).saturating_sub(left).max(0) as u64
                    }
                    None => used,
                };
                let (owner, is_group) = match bucket.role {
                    BucketRole::Budget(BudgetOwner::Group | BudgetOwner::GroupTenant, _) => {
                        (limit.group.clone().unwrap_or_default(), true)
                    }
                    _ => (limit.name.clone(), false),
                };
                rows.push(BudgetStatus {
                    owner,
                    group: is_group,
                    tenant: tenant.map(str::to_string),
                    name: bucket.role.name().to_string(),
                    period: bucket.period.clone().unwrap_or_default(),
                    amount,
                    spent,
                    // Overruns can take more than was reserved: never below 0.
                    reserved: used.saturating_sub(spent),
                    remaining: *remaining,
                    resets_at_ms: bucket.resets_at_ms.unwrap_or(0).max(0) as u64,
                });
            }
        }
        Ok(rows)
    }
}
