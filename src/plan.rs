//! Planning an acquire, purely: which buckets a limit has and their keys,
//! the names and waits a request may ask for, what each bucket is charged
//! under the limit's cost rule, the floors that priority classes keep, and
//! the one capacity check. No I/O and no clock: the service asks, a store
//! carries the plan out.

use std::collections::HashMap;
use std::sync::Arc;

use jiff::tz::TimeZone;

use crate::budget::money::format_amount;
use crate::budget::period::zone;
use crate::budget::spans::{Budget, Span};
use crate::config::{
    BucketKind, Config, DEFAULT_KEY_PREFIX, LimitConfig, MAX_WAIT_MS, PriorityClass, TokenBuckets,
    TokenRate,
};
use crate::leases::{Reserved, Settle};
use crate::limiter::keys::{BucketOwner, bucket_key, budget_key, slots_key, spent_key};
use crate::limiter::{BucketRole, BucketSpec, BudgetOwner, Draw, Refill, SlotSpec, Window};
use crate::proto::MAX_NAME_LEN;
use crate::tokens::SettleRule;

/// Why an acquire cannot be planned: the request's fault, each with the
/// message the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{what} name of {len} bytes exceeds the maximum of {MAX_NAME_LEN}")]
    NameTooLong { what: &'static str, len: usize },
    #[error("max_wait_ms {0} exceeds the maximum of {MAX_WAIT_MS}")]
    MaxWaitTooLong(u64),
    #[error("no limit named \"{name}\" is configured (configured: {configured})")]
    UnknownLimit { name: String, configured: String },
    #[error("no priority class named \"{0}\" is configured")]
    UnknownPriority(String),
    #[error("priority class \"{class}\" does not apply to limit \"{limit}\"")]
    PriorityNotForLimit { class: String, limit: String },
    /// The `[[clients]]` entry of the connection's uid does not allow it.
    #[error("{who} may not {what} (allowed by [[clients]]: {allowed})")]
    NotAllowed {
        who: String,
        what: String,
        allowed: String,
    },
    #[error("a cost must be at least one token")]
    ZeroCost,
    #[error(
        "a call that may cost {} can never be granted: the {bucket} budget of limit \"{limit}\" is {}{}",
        format_amount(*.cost),
        format_amount(*.budget),
        kept_note_money(*.floor, .class)
    )]
    AboveBudget {
        cost: u64,
        bucket: &'static str,
        limit: String,
        budget: u64,
        floor: u64,
        class: String,
    },
    #[error("input_tokens + output_tokens overflows 64 bits")]
    CostOverflow,
    #[error(
        "a cost of {tokens} tokens exceeds max_request_tokens = {largest} of limit \"{limit}\""
    )]
    AboveMaxRequestTokens {
        tokens: u64,
        largest: u64,
        limit: String,
    },
    #[error(
        "a cost of {cost} can never be granted: the {bucket} bucket of limit \"{limit}\" holds at most {capacity}{}",
        kept_note(*.floor, .class)
    )]
    NeverFits {
        cost: u64,
        bucket: &'static str,
        limit: String,
        capacity: u64,
        floor: u64,
        class: String,
    },
}

fn kept_note_money(floor: u64, class: &str) -> String {
    if floor > 0 {
        format!(
            " less {} kept for classes above \"{class}\"",
            format_amount(floor)
        )
    } else {
        String::new()
    }
}

fn kept_note(floor: u64, class: &str) -> String {
    if floor > 0 {
        format!(" less {floor} kept for classes above \"{class}\"")
    } else {
        String::new()
    }
}

/// Refuses a client-supplied name longer than the protocol allows.
pub fn check_name(what: &'static str, name: &str) -> Result<(), PlanError> {
    if name.len() > MAX_NAME_LEN {
        return Err(PlanError::NameTooLong {
            what,
            len: name.len(),
        });
    }
    Ok(())
}

/// The configuration in force, with every limit's buckets keyed once.
#[derive(Debug)]
pub struct Planner {
    config: Arc<Config>,
    prefix: String,
    buckets: HashMap<String, LimitBuckets>,
    /// Where calendar budgets' periods start (`[budgets] time_zone`).
    time_zone: TimeZone,
}

/// The buckets of one limit that do not depend on the request.
#[derive(Debug)]
struct LimitBuckets {
    /// Token, request and group buckets; the tenant bucket is per acquire.
    fixed: Vec<(BucketRole, BucketSpec)>,
    /// Its concurrency slots, with `max_concurrent`.
    slots: Option<SlotSpec>,
    /// Whether any budget applies to it (its own, its tenants', its
    /// group's): acquires of the others skip budgets at no cost.
    budgeted: bool,
}

/// An acquire whose names and wait are valid.
#[derive(Debug, Clone, Copy)]
pub struct CheckedAcquire<'a> {
    pub limit: &'a LimitConfig,
    pub class: &'a PriorityClass,
    /// The request's `max_wait_ms`, else its class's.
    pub max_wait_ms: u64,
}

/// What to reserve where.
#[derive(Debug, Clone)]
pub struct AcquirePlan {
    /// Reserved in the limit's own token buckets (`Granted.tokens`).
    pub tokens: u64,
    pub reserved: Vec<Reserved>,
}

impl AcquirePlan {
    /// The draws to hand to a store, in the order of `reserved`.
    pub fn draws(&self) -> Vec<Draw> {
        self.reserved.iter().map(|r| r.draw.clone()).collect()
    }

    /// A plan that reserves nothing: the lease of a shadow limit's grant
    /// that its buckets denied.
    pub const NOTHING: AcquirePlan = AcquirePlan {
        tokens: 0,
        reserved: Vec::new(),
    };
}

impl Planner {
    pub fn new(config: Arc<Config>) -> Self {
        let prefix = config
            .redis
            .as_ref()
            // Without Redis the embedded store keys its buckets the same way.
            .map_or(DEFAULT_KEY_PREFIX, |redis| redis.key_prefix.as_str())
            .to_string();
        let buckets = config
            .limits
            .iter()
            .map(|limit| {
                let buckets = LimitBuckets::new(&prefix, limit, &config);
                (limit.name.clone(), buckets)
            })
            .collect();
        // Validated when the config was read.
        let time_zone = zone(&config.budget_time_zone).unwrap_or(TimeZone::UTC);
        Planner {
            config,
            prefix,
            buckets,
            time_zone,
        }
    }

    /// The configuration this planner was built from.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// A limit's request-independent buckets, with their roles.
    pub fn buckets(&self, limit: &LimitConfig) -> &[(BucketRole, BucketSpec)] {
        &self.buckets[&limit.name].fixed
    }

    /// A limit's concurrency slots, if it has `max_concurrent`.
    pub fn slots(&self, limit: &LimitConfig) -> Option<&SlotSpec> {
        self.buckets[&limit.name].slots.as_ref()
    }

    /// Checks an acquire's names and wait: its limit, priority class and
    /// `max_wait_ms` (the class's default when it gives none).
    pub fn check_acquire(
        &self,
        limit: &str,
        tenant: Option<&str>,
        priority: Option<&str>,
        max_wait_ms: Option<u64>,
    ) -> Result<CheckedAcquire<'_>, PlanError> {
        check_name("limit", limit)?;
        if let Some(tenant) = tenant {
            check_name("tenant", tenant)?;
        }
        if let Some(priority) = priority {
            check_name("priority", priority)?;
        }
        let limit = self.find_limit(limit)?;
        let class = self.find_class(limit, priority)?;
        if let Some(asked) = max_wait_ms.filter(|&asked| asked > MAX_WAIT_MS) {
            return Err(PlanError::MaxWaitTooLong(asked));
        }
        // The class's wait is also the longest its acquires may ask for: a
        // worker cannot reserve further ahead than the operator allows
        // (issue 27: 60 pipelined hour-deep waits denied everyone for an
        // hour, whatever the class said).
        let max_wait_ms =
            max_wait_ms.map_or(class.max_wait_ms, |asked| asked.min(class.max_wait_ms));
        Ok(CheckedAcquire {
            limit,
            class,
            max_wait_ms,
        })
    }

    /// Checks that a peer of `uid` may name `tenant` (none counts as a
    /// name) and use `class`, by the `[[clients]]` entry that applies to it.
    pub fn check_client(
        &self,
        uid: Option<u32>,
        tenant: Option<&str>,
        class: &PriorityClass,
    ) -> Result<(), PlanError> {
        let Some(policy) = self.config.client_policy(uid) else {
            return Ok(());
        };
        let who = || {
            uid.map_or_else(
                || "a peer of unknown uid".to_string(),
                |u| format!("uid {u}"),
            )
        };
        let quoted = |names: &[String]| {
            let names: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            names.join(", ")
        };
        if let Some(tenants) = &policy.tenants {
            let what = match tenant {
                Some(tenant) if tenants.iter().any(|t| t == tenant) => None,
                Some(tenant) => Some(format!("name tenant {tenant:?}")),
                None => Some("acquire without naming a tenant".to_string()),
            };
            if let Some(what) = what {
                return Err(PlanError::NotAllowed {
                    who: who(),
                    what,
                    allowed: format!("tenants {}", quoted(tenants)),
                });
            }
        }
        match &policy.priorities {
            Some(classes) if !classes.contains(&class.name) => Err(PlanError::NotAllowed {
                who: who(),
                what: format!("use priority class {:?}", class.name),
                allowed: format!("classes {}", quoted(classes)),
            }),
            _ => Ok(()),
        }
    }

    /// The limit named `name`, which the client sent.
    pub fn find_limit(&self, name: &str) -> Result<&LimitConfig, PlanError> {
        check_name("limit", name)?;
        self.config.limit(name).ok_or_else(|| {
            let known: Vec<&str> = self.config.limits.iter().map(|l| l.name.as_str()).collect();
            PlanError::UnknownLimit {
                name: name.to_string(),
                configured: if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                },
            }
        })
    }

    fn find_class(
        &self,
        limit: &LimitConfig,
        name: Option<&str>,
    ) -> Result<&PriorityClass, PlanError> {
        let name = name.unwrap_or(&self.config.default_priority);
        let class = self
            .config
            .priority(name)
            .ok_or_else(|| PlanError::UnknownPriority(name.to_string()))?;
        match &class.limits {
            Some(limits) if !limits.contains(&limit.name) => Err(PlanError::PriorityNotForLimit {
                class: name.to_string(),
                limit: limit.name.clone(),
            }),
            _ => Ok(class),
        }
    }

    /// Turns `input` and `output` tokens into one draw per bucket: separate
    /// input and output buckets take their own figure; the combined, tenant
    /// and group token buckets take the charge of the limit's cost rule;
    /// request buckets take one.
    ///
    /// Spend budgets take the most the call can cost at the limit's price,
    /// each in the bucket of the period that `at_ms` (wall-clock Unix ms)
    /// falls in.
    pub fn plan_acquire(
        &self,
        checked: CheckedAcquire<'_>,
        tenant: Option<&str>,
        (input, output): (u64, u64),
        at_ms: i64,
    ) -> Result<AcquirePlan, PlanError> {
        let CheckedAcquire { limit, class, .. } = checked;
        let counts_tokens = limit.counts_tokens();
        let total = match input.checked_add(output) {
            // A limit of requests only takes any cost, even none.
            Some(0) if counts_tokens => return Err(PlanError::ZeroCost),
            Some(total) => total,
            None => return Err(PlanError::CostOverflow),
        };
        let charge = limit.cost_rule.charge(input, output).unwrap_or(total);
        // What the limit's own token buckets reserve: Granted.tokens.
        let tokens = match limit.token_buckets() {
            TokenBuckets::Combined(_) => charge,
            TokenBuckets::Split { .. } => total,
            TokenBuckets::None if counts_tokens => charge,
            TokenBuckets::None => 0,
        };
        if let Some(largest) = limit.max_request_tokens.filter(|&largest| tokens > largest) {
            return Err(PlanError::AboveMaxRequestTokens {
                tokens,
                largest,
                limit: limit.name.clone(),
            });
        }
        // Buckets that mirror the provider keep its charge under "none";
        // tenant buckets are ratekeeper's own accounting and always settle.
        let mirrors = |settle: Settle| match limit.settle {
            SettleRule::Refund => settle,
            SettleRule::NoRefund => Settle::Never,
        };
        let mut reserved: Vec<Reserved> = self
            .buckets(limit)
            .iter()
            .map(|(role, bucket)| {
                let (cost, settle) = match role {
                    BucketRole::Tokens | BucketRole::GroupTokens | BucketRole::TokensPer(_) => {
                        (charge, mirrors(Settle::Total))
                    }
                    BucketRole::RequestsPer(_) => (1, Settle::Never),
                    BucketRole::InputTokens => (input, mirrors(Settle::Input)),
                    BucketRole::OutputTokens => (output, mirrors(Settle::Output)),
                    BucketRole::Tenant => (charge, Settle::Total),
                    BucketRole::Requests | BucketRole::GroupRequests => (1, Settle::Never),
                    // Budgets are per acquire (below), never among the fixed buckets.
                    BucketRole::Budget(..) => (0, Settle::Never),
                };
                Reserved {
                    role: *role,
                    draw: draw(class, bucket.clone(), cost),
                    settle,
                    resets_at_ms: None,
                    spent_counter: None,
                }
            })
            .collect();
        // A tenant on a limit without a share is accepted and draws nothing
        // extra, so clients can always send their tenant.
        if let Some(bucket) = tenant.and_then(|tenant| self.tenant_bucket(limit, tenant)) {
            reserved.push(Reserved {
                role: BucketRole::Tenant,
                draw: draw(class, bucket, charge),
                settle: Settle::Total,
                resets_at_ms: None,
                spent_counter: None,
            });
        }
        for budget in self.budget_buckets(limit, tenant, at_ms) {
            let BudgetBucket {
                role,
                bucket,
                resets_at_ms,
                spent_counter,
                ..
            } = budget;
            // A budget always has a price: config validation sees to it.
            let price = limit.price.unwrap_or_default();
            let cost = price.most_for(input, output);
            let draw = draw(class, bucket, cost);
            if !draw.fits_capacity() {
                return Err(PlanError::AboveBudget {
                    cost,
                    bucket: role.name(),
                    limit: limit.name.clone(),
                    budget: draw.bucket.capacity,
                    floor: draw.floor,
                    class: class.name.clone(),
                });
            }
            reserved.push(Reserved {
                role,
                draw,
                settle: Settle::Price(price),
                resets_at_ms,
                spent_counter,
            });
        }
        if let Some(refused) = reserved.iter().find(|r| !r.draw.fits_capacity()) {
            return Err(PlanError::NeverFits {
                cost: refused.draw.cost,
                bucket: refused.role.name(),
                limit: limit.name.clone(),
                capacity: refused.draw.bucket.largest,
                floor: refused.draw.floor,
                class: class.name.clone(),
            });
        }
        Ok(AcquirePlan { tokens, reserved })
    }

    /// The tenant's own bucket: `tenant_share` of the limit's token bucket
    /// (of both together, with separate input and output buckets).
    fn tenant_bucket(&self, limit: &LimitConfig, tenant: &str) -> Option<BucketSpec> {
        let share = limit.tenant_share?;
        let scaled = |value: u64| ((value as f64 * share).floor() as u64).max(1);
        let total = limit.total_token_rate();
        let owner = BucketOwner::Tenant {
            limit: &limit.name,
            group: limit.group.as_deref(),
            tenant,
        };
        let capacity = scaled(total.burst);
        let bucket = BucketSpec::per_minute(
            bucket_key(&self.prefix, owner, BucketRole::Tenant),
            capacity,
            scaled(total.per_minute),
        );
        // A request the limit's own buckets grant, its tenant's share does
        // too, once full.
        Some(bucket.with_largest(scaled(limit.largest_cost(total.burst, total.per_minute))))
    }
}

impl Planner {
    /// The buckets of every budget an acquire of `limit` by `tenant` at
    /// `at_ms` draws from, each with its role and, for a calendar budget,
    /// when its period ends: the limit's, its tenant's, its group's and its
    /// tenant's on the group.
    pub fn budget_buckets(
        &self,
        limit: &LimitConfig,
        tenant: Option<&str>,
        at_ms: i64,
    ) -> Vec<BudgetBucket> {
        if !self.buckets[&limit.name].budgeted {
            return Vec::new();
        }
        let group = limit.group.as_deref();
        let group_budgets = group.and_then(|name| self.config.group(name));
        let mut budgets: Vec<(BudgetOwner, BucketOwner<'_>, &Budget)> = Vec::new();
        let own = &limit.budgets;
        if let Some(budget) = &own.budget {
            let owner = BucketOwner::Limit {
                limit: &limit.name,
                group,
            };
            budgets.push((BudgetOwner::Limit, owner, budget));
        }
        if let Some((tenant, budget)) = tenant.and_then(|t| Some((t, own.of_tenant(t)?))) {
            let owner = BucketOwner::Tenant {
                limit: &limit.name,
                group,
                tenant,
            };
            budgets.push((BudgetOwner::Tenant, owner, budget));
        }
        if let Some(group) = group_budgets {
            if let Some(budget) = &group.budgets.budget {
                let owner = BucketOwner::Group { group: &group.name };
                budgets.push((BudgetOwner::Group, owner, budget));
            }
            if let Some((tenant, budget)) =
                tenant.and_then(|t| Some((t, group.budgets.of_tenant(t)?)))
            {
                let owner = BucketOwner::GroupTenant {
                    group: &group.name,
                    tenant,
                };
                budgets.push((BudgetOwner::GroupTenant, owner, budget));
            }
        }
        let mut buckets = Vec::new();
        for (budget_owner, owner, budget) in budgets {
            for (span, amount) in budget.amounts() {
                let role = BucketRole::Budget(budget_owner, span);
                match span {
                    Span::Calendar(calendar) => {
                        // An instant no calendar can place (thousands of
                        // years away) has no period; nothing is drawn then.
                        let Ok(period) = calendar.period_at(at_ms, &self.time_zone) else {
                            continue;
                        };
                        let key = budget_key(&self.prefix, owner, span, Some(&period.label));
                        let keep_until = period.end_ms.saturating_add(KEEP_AFTER_PERIOD_MS);
                        let counter = spent_key(&key);
                        buckets.push(BudgetBucket {
                            role,
                            bucket: BucketSpec::never_refilled(key, amount, keep_until),
                            period: Some(period.label),
                            resets_at_ms: Some(period.end_ms),
                            spent_counter: Some(BucketSpec::never_refilled(
                                counter, amount, keep_until,
                            )),
                        });
                    }
                    Span::RollingHour | Span::RollingDay => {
                        let window = match span {
                            Span::RollingHour => Window::Hour,
                            _ => Window::Day,
                        };
                        let key = budget_key(&self.prefix, owner, span, None);
                        let refill = Refill::new(amount, window, amount);
                        buckets.push(BudgetBucket {
                            role,
                            bucket: BucketSpec::new(key, amount, refill),
                            period: None,
                            resets_at_ms: None,
                            spent_counter: None,
                        });
                    }
                }
            }
        }
        buckets
    }
}

/// One bucket of a budget that an acquire draws from.
#[derive(Debug, Clone)]
pub struct BudgetBucket {
    pub role: BucketRole,
    pub bucket: BucketSpec,
    /// Its calendar period's label (`2026-12-07`); `None` for a rolling budget.
    pub period: Option<String>,
    /// When its calendar period ends (Unix ms); `None` for a rolling budget.
    pub resets_at_ms: Option<i64>,
    /// A calendar budget's count of settled spend (see [`Reserved`]).
    pub spent_counter: Option<BucketSpec>,
}

/// How long a calendar budget's bucket is kept after its period ends: the
/// label of a period must never be reused once its key expired, so the key
/// outlives it by more than any clock difference between the sidecars and
/// Redis.
pub const KEEP_AFTER_PERIOD_MS: i64 = 3_600_000;

impl LimitBuckets {
    fn new(prefix: &str, limit: &LimitConfig, config: &Config) -> Self {
        let group = limit.group.as_deref();
        let own = BucketOwner::Limit {
            limit: &limit.name,
            group,
        };
        let bucket = |owner: BucketOwner, role: BucketRole, per_minute: u64, burst: u64| {
            let key = bucket_key(prefix, owner, role);
            (role, BucketSpec::per_minute(key, burst, per_minute))
        };
        // The limit's own buckets mirror the provider's: their bursts keep
        // the headroom for the delay before the provider sees a call.
        let own_bucket = |role: BucketRole, amount: u64, window: Window, burst: u64| {
            let kind = match role {
                BucketRole::Requests | BucketRole::RequestsPer(_) => BucketKind::Requests,
                _ => BucketKind::Tokens,
            };
            let refill = Refill::new(amount, window, burst);
            let capacity = limit.usable_burst(kind, &refill, burst);
            let key = bucket_key(prefix, own, role);
            let spec = BucketSpec::new(key, capacity, refill);
            // The per-minute figures are what the provider may enforce over
            // a shorter window; a window declared as such is its own.
            let spec = match window {
                Window::Minute => spec.with_largest(limit.largest_cost(capacity, amount)),
                _ => spec,
            };
            (role, spec)
        };
        let token_bucket = |role: BucketRole, rate: TokenRate| {
            own_bucket(role, rate.per_minute, Window::Minute, rate.burst)
        };
        let mut fixed = match limit.token_buckets() {
            TokenBuckets::Combined(rate) => vec![token_bucket(BucketRole::Tokens, rate)],
            TokenBuckets::Split { input, output } => vec![
                token_bucket(BucketRole::InputTokens, input),
                token_bucket(BucketRole::OutputTokens, output),
            ],
            TokenBuckets::None => Vec::new(),
        };
        if let Some(per_minute) = limit.requests_per_minute {
            let burst = limit.burst_requests.unwrap_or(per_minute);
            fixed.push(own_bucket(
                BucketRole::Requests,
                per_minute,
                Window::Minute,
                burst,
            ));
        }
        for other in limit.other_windows() {
            let (BucketRole::TokensPer(window) | BucketRole::RequestsPer(window)) = other.role
            else {
                continue;
            };
            fixed.push(own_bucket(other.role, other.amount, window, other.amount));
        }
        if let Some(group) = group.and_then(|name| config.group(name)) {
            let owner = BucketOwner::Group { group: &group.name };
            if let Some(per_minute) = group.tokens_per_minute {
                let burst = group.burst_tokens.unwrap_or(per_minute);
                fixed.push(bucket(owner, BucketRole::GroupTokens, per_minute, burst));
            }
            if let Some(per_minute) = group.requests_per_minute {
                let burst = group.burst_requests.unwrap_or(per_minute);
                fixed.push(bucket(owner, BucketRole::GroupRequests, per_minute, burst));
            }
        }
        let slots = limit.max_concurrent.map(|max| SlotSpec {
            key: Arc::from(slots_key(prefix, &limit.name, group)),
            max,
            timeout_ms: limit.concurrent_timeout_ms,
        });
        let budgeted = limit.budgets.any()
            || limit
                .group
                .as_deref()
                .and_then(|name| config.group(name))
                .is_some_and(|group| group.budgets.any());
        LimitBuckets {
            fixed,
            slots,
            budgeted,
        }
    }
}

/// A draw of `cost` that leaves the floor `class` keeps for the classes
/// above it.
fn draw(class: &PriorityClass, bucket: BucketSpec, cost: u64) -> Draw {
    let floor = (class.reserved_fraction * bucket.capacity as f64).ceil() as u64;
    Draw {
        bucket,
        cost,
        floor,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod budget_tests;
