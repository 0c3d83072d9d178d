//! Request → limiter → response. Owns the lease table and the waits; does no
//! socket I/O, so the server, tests and any future transport share it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Config, DisconnectRule, LimitConfig, PriorityClass};
use crate::leases::{Lease, LeaseTable, Reserved, adjust_usage_buckets, refund_all};
use crate::limiter::{BucketSpec, Decision, Draw, Store, StoreError};
use crate::proto::{
    Acquire, BucketStatus, Cost, ErrorCode, LimitStatus, MAX_NAME_LEN, Request, Response,
};

/// Longest `max_wait_ms` an acquire may ask for. Also bounds how far below
/// zero a level can go, which keeps the Lua arithmetic exact in doubles.
pub const MAX_WAIT_MS: u64 = 3_600_000;

pub use crate::leases::ConnectionId;

/// The role of a bucket within a limit; its name is what `Denied` and
/// `status` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BucketRole {
    Tokens,
    Requests,
    Tenant,
    GroupTokens,
    GroupRequests,
}

impl BucketRole {
    fn name(self) -> &'static str {
        match self {
            BucketRole::Tokens => "tokens",
            BucketRole::Requests => "requests",
            BucketRole::Tenant => "tenant",
            BucketRole::GroupTokens => "group_tokens",
            BucketRole::GroupRequests => "group_requests",
        }
    }

    /// Whether usage reports settle this bucket (requests are spent once
    /// the provider is called, whatever the usage).
    fn settles_with_usage(self) -> bool {
        !self.counts_requests()
    }

    /// Whether the bucket counts requests (cost 1) rather than tokens.
    fn counts_requests(self) -> bool {
        matches!(self, BucketRole::Requests | BucketRole::GroupRequests)
    }
}

/// The buckets of one limit, keyed once at startup.
///
/// Every key of a limit carries the same Redis Cluster hash tag — its group's
/// name, or its own when it has no group — so one acquire touches one slot.
#[derive(Debug)]
struct LimitBuckets {
    /// Token, request and group buckets; the tenant bucket is per acquire.
    fixed: Vec<(BucketRole, BucketSpec)>,
    /// `prefix:{tag}:limit`, to which `:tenant:NAME` is appended.
    tenant_key_base: String,
}

impl LimitBuckets {
    fn new(prefix: &str, limit: &LimitConfig, config: &Config) -> Self {
        let tag = match &limit.group {
            Some(group) => format!("{{g:{group}}}"),
            None => format!("{{l:{}}}", limit.name),
        };
        let limit_key = |suffix: &str| format!("{prefix}:{tag}:{}:{suffix}", limit.name);
        let mut fixed = vec![(
            BucketRole::Tokens,
            BucketSpec {
                key: limit_key("tokens"),
                capacity: limit.burst_tokens,
                per_minute: limit.tokens_per_minute,
            },
        )];
        if let Some(per_minute) = limit.requests_per_minute {
            fixed.push((
                BucketRole::Requests,
                BucketSpec {
                    key: limit_key("requests"),
                    capacity: limit.burst_requests.unwrap_or(per_minute),
                    per_minute,
                },
            ));
        }
        if let Some(group) = limit.group.as_deref().and_then(|name| config.group(name)) {
            let group_key = |suffix: &str| format!("{prefix}:{tag}:group:{suffix}");
            if let Some(per_minute) = group.tokens_per_minute {
                fixed.push((
                    BucketRole::GroupTokens,
                    BucketSpec {
                        key: group_key("tokens"),
                        capacity: group.burst_tokens.unwrap_or(per_minute),
                        per_minute,
                    },
                ));
            }
            if let Some(per_minute) = group.requests_per_minute {
                fixed.push((
                    BucketRole::GroupRequests,
                    BucketSpec {
                        key: group_key("requests"),
                        capacity: group.burst_requests.unwrap_or(per_minute),
                        per_minute,
                    },
                ));
            }
        }
        LimitBuckets {
            fixed,
            tenant_key_base: format!("{prefix}:{tag}:{}", limit.name),
        }
    }

    /// The tenant's own bucket: `tenant_share` of the limit's token bucket.
    fn tenant(&self, limit: &LimitConfig, tenant: &str) -> Option<BucketSpec> {
        let share = limit.tenant_share?;
        let scaled = |value: u64| ((value as f64 * share).floor() as u64).max(1);
        Some(BucketSpec {
            key: format!("{}:tenant:{tenant}", self.tenant_key_base),
            capacity: scaled(limit.burst_tokens),
            per_minute: scaled(limit.tokens_per_minute),
        })
    }
}

/// Key prefix when no Redis is configured (the embedded store ignores it).
const DEFAULT_KEY_PREFIX: &str = "ratekeeper";

/// Answers requests against one configuration and one store.
pub struct Dispatcher {
    /// Swapped whole by a config reload; requests keep the one they started with.
    limits: RwLock<Arc<Limits>>,
    store: Arc<dyn Store>,
    leases: LeaseTable,
    draining: AtomicBool,
}

/// The configuration in force and what is derived from it.
struct Limits {
    config: Arc<Config>,
    buckets: HashMap<String, LimitBuckets>,
    /// Acquires currently held back until their reservation is due, per
    /// limit; carried over by a reload for limits that stay.
    waiters: HashMap<String, Arc<AtomicU64>>,
}

/// Why a new configuration was not taken by [`Dispatcher::reload`].
#[derive(Debug, thiserror::Error)]
#[error("{0} cannot change while the daemon runs; restart it to apply the new value")]
pub struct ReloadError(&'static str);

/// The error response for `code`.
pub fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error {
        code: code.as_u16(),
        message: message.into(),
    }
}

impl Dispatcher {
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>) -> Self {
        let leases = LeaseTable::new(
            Duration::from_millis(config.leases.expire_after_ms),
            config.leases.max_open as usize,
        );
        Dispatcher {
            limits: RwLock::new(Arc::new(Limits::new(config, &HashMap::new()))),
            store,
            leases,
            draining: AtomicBool::new(false),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.limits().config.clone()
    }

    /// Takes a new configuration for limits, groups and priority classes.
    /// The socket, the store and the lease settings are fixed at start:
    /// a change to them refuses the whole reload, and the old config stays.
    pub fn reload(&self, config: Config) -> Result<(), ReloadError> {
        let current = self.limits();
        let old = &current.config;
        if config.server != old.server {
            return Err(ReloadError("[server]"));
        }
        if config.redis != old.redis {
            return Err(ReloadError("[redis]"));
        }
        if config.leases != old.leases {
            return Err(ReloadError("[leases]"));
        }
        let next = Limits::new(Arc::new(config), &current.waiters);
        *self
            .limits
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(next);
        Ok(())
    }

    fn limits(&self) -> Arc<Limits> {
        // Only ever replaced whole, so a poisoned lock still holds a whole value.
        self.limits
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// New acquires are refused with `ShuttingDown` from now on; reports and
    /// releases of leases already granted are still settled.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Leases not yet reported or released.
    pub fn open_leases(&self) -> usize {
        self.leases.len()
    }

    /// Counts of leases that ended without a report.
    pub fn lease_counters(&self) -> &crate::leases::LeaseCounters {
        &self.leases.counters
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
                let dispatcher = Arc::clone(self);
                let grace = Duration::from_millis(rules.disconnect_grace_ms);
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    dispatcher.refund_orphans(&ids).await;
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
            let refund = (lease.tokens as f64 * fraction).floor() as i64;
            let adjustments = adjust_usage_buckets(&lease.reserved, refund);
            match self.store.adjust(&adjustments, lease.origin).await {
                Ok(()) => {
                    self.leases
                        .counters
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

    /// Answers one request. `cancel` fires when the client cancels the
    /// request or its connection closes; a waiting acquire then returns its
    /// reservation. `Hello` and `Cancel` belong to the connection, not here.
    pub async fn handle(
        &self,
        connection: ConnectionId,
        request: Request,
        cancel: CancellationToken,
    ) -> Response {
        match request {
            Request::Acquire(acquire) => self.acquire(connection, acquire, cancel).await,
            Request::Report {
                lease,
                input_tokens,
                output_tokens,
            } => {
                self.report(lease, input_tokens.saturating_add(output_tokens))
                    .await
            }
            Request::Release { lease } => self.release(lease).await,
            Request::Estimate { limit, cost } => self.estimate(&limit, &cost),
            Request::Status { limit } => self.status(limit.as_deref()).await,
            Request::Ping => Response::Pong,
            Request::Hello { .. } => error(
                ErrorCode::InvalidRequest,
                "Hello is only valid as the first frame of a connection",
            ),
            Request::Cancel { .. } => error(
                ErrorCode::Internal,
                "Cancel must be handled by the connection",
            ),
        }
    }

    async fn acquire(
        &self,
        connection: ConnectionId,
        acquire: Acquire,
        cancel: CancellationToken,
    ) -> Response {
        if self.draining.load(Ordering::SeqCst) {
            return error(
                ErrorCode::ShuttingDown,
                "the daemon is shutting down and takes no new acquires",
            );
        }
        let limits = self.limits();
        let plan = match limits.plan_acquire(&acquire) {
            Ok(plan) => plan,
            Err(response) => return response,
        };
        let draws: Vec<Draw> = plan.reserved.iter().map(|r| r.draw.clone()).collect();
        let decision = match self.store.acquire(&draws, plan.max_wait_ms).await {
            Ok(decision) => decision,
            Err(store_error) => return store_error_response(&acquire.limit, store_error),
        };
        let (wait_ms, origin) = match decision {
            Decision::Granted { wait_ms, origin } => (wait_ms, origin),
            Decision::Denied {
                retry_after_ms,
                bucket,
            } => {
                return Response::Denied {
                    retry_after_ms,
                    bucket: plan.reserved[bucket].role.to_string(),
                };
            }
        };
        let started = Instant::now();
        let waiters = &limits.waiters[&acquire.limit];
        if !wait_until_due(waiters, wait_ms, &cancel).await {
            let refunds = refund_all(&plan.reserved);
            if let Err(store_error) = self.store.adjust(&refunds, origin).await {
                tracing::warn!(limit = %acquire.limit, %store_error, "could not return a cancelled reservation");
            }
            return if self.draining.load(Ordering::SeqCst) {
                error(
                    ErrorCode::ShuttingDown,
                    "the daemon shut down before the reservation was due; it was returned",
                )
            } else {
                error(
                    ErrorCode::Cancelled,
                    "the acquire was cancelled before it was granted; its reservation was returned",
                )
            };
        }
        let lease = self.leases.insert(Lease {
            owner: connection,
            origin,
            tokens: plan.tokens,
            reserved: plan.reserved,
            granted_at: Instant::now(),
        });
        Response::Granted {
            lease,
            tokens: plan.tokens,
            waited_ms: started.elapsed().as_millis() as u64,
        }
    }

    async fn report(&self, lease_id: u64, used_tokens: u64) -> Response {
        let Some(lease) = self.leases.take(lease_id) else {
            return unknown_lease(lease_id);
        };
        let returned = lease.tokens as i64 - used_tokens.min(i64::MAX as u64) as i64;
        if returned != 0 {
            let adjustments = adjust_usage_buckets(&lease.reserved, returned);
            if let Err(store_error) = self.store.adjust(&adjustments, lease.origin).await {
                // Keep the lease so that the report can be retried.
                self.leases.restore(lease_id, lease);
                return error(
                    ErrorCode::StoreUnavailable,
                    format!(
                        "lease {lease_id} could not be settled, retry the report: {store_error}"
                    ),
                );
            }
        }
        Response::Settled {
            tokens_returned: returned,
        }
    }

    async fn release(&self, lease_id: u64) -> Response {
        let Some(lease) = self.leases.take(lease_id) else {
            return unknown_lease(lease_id);
        };
        let adjustments = refund_all(&lease.reserved);
        if let Err(store_error) = self.store.adjust(&adjustments, lease.origin).await {
            self.leases.restore(lease_id, lease);
            return error(
                ErrorCode::StoreUnavailable,
                format!("lease {lease_id} could not be released, retry the release: {store_error}"),
            );
        }
        Response::Released {
            tokens_returned: lease.tokens,
        }
    }

    fn estimate(&self, limit: &str, cost: &Cost) -> Response {
        let limits = self.limits();
        if let Err(response) =
            check_name("limit", limit).and_then(|()| limits.find_limit(limit).map(|_| ()))
        {
            return response;
        }
        match cost {
            Cost::Tokens {
                input_tokens,
                output_tokens,
            } => Response::Estimated {
                input_tokens: *input_tokens,
                output_tokens: *output_tokens,
            },
            Cost::Messages(_) => messages_unsupported(),
        }
    }

    async fn status(&self, only: Option<&str>) -> Response {
        let snapshot = self.limits();
        let limits: Vec<&LimitConfig> = match only {
            Some(name) => match snapshot.find_limit(name) {
                Ok(limit) => vec![limit],
                Err(response) => return response,
            },
            None => snapshot.config.limits.iter().collect(),
        };
        let mut statuses = Vec::with_capacity(limits.len());
        for limit in limits {
            let buckets = snapshot.buckets[&limit.name].fixed.clone();
            let specs: Vec<BucketSpec> = buckets.iter().map(|(_, spec)| spec.clone()).collect();
            let levels = match self.store.levels(&specs).await {
                Ok(levels) => levels,
                Err(store_error) => return store_error_response(&limit.name, store_error),
            };
            statuses.push(LimitStatus {
                name: limit.name.clone(),
                waiters: snapshot.waiters[&limit.name].load(Ordering::Relaxed),
                buckets: buckets
                    .into_iter()
                    .zip(levels)
                    .map(|((role, spec), level)| BucketStatus {
                        name: role.name().to_string(),
                        capacity: spec.capacity,
                        level,
                        per_minute: spec.per_minute,
                    })
                    .collect(),
            });
        }
        Response::Status {
            store: self.store.kind().to_string(),
            limits: statuses,
        }
    }
}

impl Limits {
    fn new(config: Arc<Config>, previous_waiters: &HashMap<String, Arc<AtomicU64>>) -> Self {
        let prefix = config
            .redis
            .as_ref()
            .map_or(DEFAULT_KEY_PREFIX, |redis| redis.key_prefix.as_str());
        let buckets = config
            .limits
            .iter()
            .map(|limit| {
                (
                    limit.name.clone(),
                    LimitBuckets::new(prefix, limit, &config),
                )
            })
            .collect();
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
        Limits {
            config,
            buckets,
            waiters,
        }
    }

    /// Validates an acquire and turns it into one draw per bucket.
    fn plan_acquire(&self, acquire: &Acquire) -> Result<AcquirePlan, Response> {
        check_name("limit", &acquire.limit)?;
        if let Some(tenant) = &acquire.tenant {
            check_name("tenant", tenant)?;
        }
        if let Some(priority) = &acquire.priority {
            check_name("priority", priority)?;
        }
        let limit = self.find_limit(&acquire.limit)?;
        let class = self.find_class(limit, acquire.priority.as_deref())?;
        let tokens = token_cost(&acquire.cost)?;
        let max_wait_ms = acquire.max_wait_ms.unwrap_or(class.max_wait_ms);
        if max_wait_ms > MAX_WAIT_MS {
            return Err(error(
                ErrorCode::InvalidRequest,
                format!("max_wait_ms {max_wait_ms} exceeds the maximum of {MAX_WAIT_MS}"),
            ));
        }
        if let Some(largest) = limit.max_request_tokens.filter(|&largest| tokens > largest) {
            return Err(error(
                ErrorCode::CostExceedsCapacity,
                format!(
                    "a cost of {tokens} tokens exceeds max_request_tokens = {largest} of limit \"{}\"",
                    limit.name
                ),
            ));
        }
        let buckets = &self.buckets[&limit.name];
        let mut draws: Vec<(BucketRole, Draw)> = buckets
            .fixed
            .iter()
            .map(|(role, bucket)| {
                let cost = if role.counts_requests() { 1 } else { tokens };
                (*role, draw(class, bucket.clone(), cost))
            })
            .collect();
        // A tenant on a limit without a share is accepted and draws nothing
        // extra, so clients can always send their tenant.
        if let Some(bucket) = (acquire.tenant.as_deref()).and_then(|t| buckets.tenant(limit, t)) {
            draws.push((BucketRole::Tenant, draw(class, bucket, tokens)));
        }
        for (role, draw) in &draws {
            if draw.cost + draw.floor > draw.bucket.capacity {
                let reserved = if draw.floor > 0 {
                    format!(
                        " less {} kept for classes above \"{}\"",
                        draw.floor, class.name
                    )
                } else {
                    String::new()
                };
                return Err(error(
                    ErrorCode::CostExceedsCapacity,
                    format!(
                        "a cost of {} can never be granted: the {} bucket of limit \"{}\" holds at most {}{reserved}",
                        draw.cost,
                        role.name(),
                        limit.name,
                        draw.bucket.capacity
                    ),
                ));
            }
        }
        Ok(AcquirePlan {
            tokens,
            max_wait_ms,
            reserved: draws
                .into_iter()
                .map(|(role, draw)| Reserved {
                    role: role.name(),
                    draw,
                    settles_with_usage: role.settles_with_usage(),
                })
                .collect(),
        })
    }

    fn find_limit(&self, name: &str) -> Result<&LimitConfig, Response> {
        self.config.limit(name).ok_or_else(|| {
            let known: Vec<&str> = self.config.limits.iter().map(|l| l.name.as_str()).collect();
            error(
                ErrorCode::UnknownLimit,
                format!(
                    "no limit named \"{name}\" is configured (configured: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })
    }

    fn find_class(
        &self,
        limit: &LimitConfig,
        name: Option<&str>,
    ) -> Result<&PriorityClass, Response> {
        let name = name.unwrap_or(&self.config.default_priority);
        let class = self.config.priority(name).ok_or_else(|| {
            error(
                ErrorCode::UnknownPriority,
                format!("no priority class named \"{name}\" is configured"),
            )
        })?;
        match &class.limits {
            Some(limits) if !limits.contains(&limit.name) => Err(error(
                ErrorCode::UnknownPriority,
                format!(
                    "priority class \"{name}\" does not apply to limit \"{}\"",
                    limit.name
                ),
            )),
            _ => Ok(class),
        }
    }
}

/// Sleeps `wait_ms` unless cancelled first, counted in `waiters`; true
/// when the wait completed.
async fn wait_until_due(waiters: &AtomicU64, wait_ms: u64, cancel: &CancellationToken) -> bool {
    if cancel.is_cancelled() {
        return false;
    }
    if wait_ms == 0 {
        return true;
    }
    waiters.fetch_add(1, Ordering::Relaxed);
    let completed = tokio::select! {
        biased;
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => true,
    };
    waiters.fetch_sub(1, Ordering::Relaxed);
    completed
}

/// A validated acquire: what to reserve where.
struct AcquirePlan {
    tokens: u64,
    max_wait_ms: u64,
    reserved: Vec<Reserved>,
}

fn check_name(what: &str, name: &str) -> Result<(), Response> {
    if name.len() > MAX_NAME_LEN {
        return Err(error(
            ErrorCode::InvalidRequest,
            format!(
                "{what} name of {} bytes exceeds the maximum of {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    Ok(())
}

fn token_cost(cost: &Cost) -> Result<u64, Response> {
    match cost {
        Cost::Tokens {
            input_tokens,
            output_tokens,
        } => match input_tokens.checked_add(*output_tokens) {
            Some(0) => Err(error(
                ErrorCode::InvalidRequest,
                "a cost must be at least one token",
            )),
            Some(total) => Ok(total),
            None => Err(error(
                ErrorCode::CostExceedsCapacity,
                "input_tokens + output_tokens overflows 64 bits",
            )),
        },
        Cost::Messages(_) => Err(messages_unsupported()),
    }
}

fn messages_unsupported() -> Response {
    error(
        ErrorCode::Unsupported,
        "counting tokens from messages is not available in this release; send Cost::Tokens",
    )
}

fn unknown_lease(lease: u64) -> Response {
    error(
        ErrorCode::UnknownLease,
        format!(
            "lease {lease} is unknown: never granted, already reported or released, or its connection closed"
        ),
    )
}

fn store_error_response(limit: &str, store_error: StoreError) -> Response {
    match store_error {
        StoreError::CostExceedsCapacity { .. } => error(
            ErrorCode::CostExceedsCapacity,
            format!("limit \"{limit}\": {store_error}"),
        ),
        StoreError::Unavailable(_) => error(
            ErrorCode::StoreUnavailable,
            format!("limit \"{limit}\": {store_error}"),
        ),
    }
}

fn draw(class: &PriorityClass, bucket: BucketSpec, cost: u64) -> Draw {
    let floor = (class.reserved_fraction * bucket.capacity as f64).ceil() as u64;
    Draw {
        bucket,
        cost,
        floor,
    }
}
