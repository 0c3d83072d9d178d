//! Request → limiter → response. Owns the lease table, the waits and the
//! turning of a cost into reservations (counting messages off the socket
//! loop); does no socket I/O, so the server, tests and any future transport
//! share it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{
    Config, DisconnectRule, LimitConfig, PriorityClass, SettleRule, TokenBuckets, TokenRate,
};
use crate::leases::{
    BucketRole, Lease, LeaseTable, Reserved, Settle, refund_all, refund_fraction, settle_usage,
};
use crate::limiter::{BucketSpec, Decision, Draw, Store, StoreError};
use crate::proto::{
    Acquire, BucketStatus, ChatRequest, Cost, ErrorCode, LimitStatus, MAX_NAME_LEN, Request,
    Response,
};
use crate::tokens::{self, Bounds, Counter, OutputTokenLearner, PromptCount, TokenError};

/// Longest `max_wait_ms` an acquire may ask for. Also bounds how far below
/// zero a level can go, which keeps the Lua arithmetic exact in doubles.
pub const MAX_WAIT_MS: u64 = 3_600_000;

pub use crate::leases::ConnectionId;

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
        let token_bucket = |role: BucketRole, rate: TokenRate| {
            (
                role,
                BucketSpec {
                    key: limit_key(role.name()),
                    capacity: rate.burst,
                    per_minute: rate.per_minute,
                },
            )
        };
        let mut fixed = match limit.token_buckets() {
            TokenBuckets::Combined(rate) => vec![token_bucket(BucketRole::Tokens, rate)],
            TokenBuckets::Split { input, output } => vec![
                token_bucket(BucketRole::InputTokens, input),
                token_bucket(BucketRole::OutputTokens, output),
            ],
        };
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

    /// The tenant's own bucket: `tenant_share` of the limit's token
    /// bucket (of both together, with separate input and output buckets).
    fn tenant(&self, limit: &LimitConfig, tenant: &str) -> Option<BucketSpec> {
        let share = limit.tenant_share?;
        let scaled = |value: u64| ((value as f64 * share).floor() as u64).max(1);
        let total = limit.total_token_rate();
        Some(BucketSpec {
            key: format!("{}:tenant:{tenant}", self.tenant_key_base),
            capacity: scaled(total.burst),
            per_minute: scaled(total.per_minute),
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
    /// Counting slots, one per CPU: counts run on tokio's blocking pool, and
    /// this keeps a burst of large prompts from taking every blocking thread.
    counting: Semaphore,
    /// Output tokens recently reported, per model, for limits that learn
    /// their default max output.
    learner: Mutex<OutputTokenLearner>,
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
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Dispatcher {
            limits: RwLock::new(Arc::new(Limits::new(config, &HashMap::new()))),
            store,
            leases,
            draining: AtomicBool::new(false),
            counting: Semaphore::new(cpus),
            learner: Mutex::new(OutputTokenLearner::default()),
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
            let adjustments = refund_fraction(&lease.reserved, fraction);
            if adjustments.is_empty() {
                // Only buckets that keep the charge: nothing to give back.
                self.leases
                    .counters
                    .kept_on_disconnect
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
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
            } => self.report(lease, input_tokens, output_tokens).await,
            Request::Release { lease } => self.release(lease).await,
            Request::Estimate { limit, cost } => self.estimate(&limit, cost).await,
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
        let Acquire {
            limit,
            tenant,
            priority,
            cost,
            max_wait_ms,
        } = acquire;
        let checked =
            limits.check_acquire(&limit, tenant.as_deref(), priority.as_deref(), max_wait_ms);
        let (limit, class, max_wait_ms) = match checked {
            Ok(checked) => checked,
            Err(response) => return response,
        };
        let (input, output) = match self.reservation(limit, cost).await {
            Ok(figures) => figures,
            Err(response) => return response,
        };
        if cancel.is_cancelled() {
            return error(
                ErrorCode::Cancelled,
                "the acquire was cancelled before it was granted; nothing was reserved",
            );
        }
        let plan = match limits.plan_acquire(limit, class, tenant.as_deref(), input, output) {
            Ok(plan) => plan,
            Err(response) => return response,
        };
        let acquire_limit = &limit.name;
        let draws: Vec<Draw> = plan.reserved.iter().map(|r| r.draw.clone()).collect();
        let decision = match self.store.acquire(&draws, max_wait_ms).await {
            Ok(decision) => decision,
            Err(store_error) => return store_error_response(acquire_limit, store_error),
        };
        let (wait_ms, origin) = match decision {
            Decision::Granted { wait_ms, origin } => (wait_ms, origin),
            Decision::Denied {
                retry_after_ms,
                bucket,
            } => {
                return Response::Denied {
                    retry_after_ms,
                    bucket: plan.reserved[bucket].role.name().to_string(),
                };
            }
        };
        let started = Instant::now();
        let waiters = &limits.waiters[acquire_limit];
        if !wait_until_due(waiters, wait_ms, &cancel).await {
            let refunds = refund_all(&plan.reserved);
            if let Err(store_error) = self.store.adjust(&refunds, origin).await {
                tracing::warn!(limit = %acquire_limit, %store_error, "could not return a cancelled reservation");
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
            learn_as: limit
                .learn_max_output
                .then(|| Arc::from(learning_key(limit))),
        });
        Response::Granted {
            lease,
            tokens: plan.tokens,
            waited_ms: started.elapsed().as_millis() as u64,
        }
    }

    /// Settles a lease: each bucket that settles gets back what it reserved
    /// less its matching usage figure (see [`settle_usage`]).
    async fn report(&self, lease_id: u64, input_tokens: u64, output_tokens: u64) -> Response {
        let Some(lease) = self.leases.take(lease_id) else {
            return unknown_lease(lease_id);
        };
        let settlement = settle_usage(&lease.reserved, input_tokens, output_tokens);
        if !settlement.adjustments.is_empty() {
            if let Err(store_error) = self
                .store
                .adjust(&settlement.adjustments, lease.origin)
                .await
            {
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
        // A report without output tokens (a total reported as input) says
        // nothing about completion sizes.
        if let Some(key) = lease.learn_as.as_ref().filter(|_| output_tokens > 0) {
            self.learner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .record(key, output_tokens);
        }
        Response::Settled {
            tokens_returned: settlement.tokens_returned,
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

    /// What an acquire of `cost` would reserve, counted the same way.
    async fn estimate(&self, limit: &str, cost: Cost) -> Response {
        let limits = self.limits();
        let limit = match check_name("limit", limit).and_then(|()| limits.find_limit(limit)) {
            Ok(limit) => limit,
            Err(response) => return response,
        };
        match self.reservation(limit, cost).await {
            Ok((input_tokens, output_tokens)) => Response::Estimated {
                input_tokens,
                output_tokens,
            },
            Err(response) => response,
        }
    }

    /// The input and output figures `cost` reserves on `limit`: the counts
    /// given, or the counted prompt and the output maximum (the request's,
    /// else the learned one, else the limit's default).
    async fn reservation(&self, limit: &LimitConfig, cost: Cost) -> Result<(u64, u64), Response> {
        match cost {
            Cost::Tokens {
                input_tokens,
                output_tokens,
            } => Ok((input_tokens, output_tokens)),
            Cost::Messages(request) => {
                let output = match request.max_output_tokens {
                    Some(given) => given,
                    None => self.default_max_output(limit),
                };
                let prompt = self.count_prompt(limit.counter(), request).await?;
                Ok((prompt.total, output))
            }
        }
    }

    /// Output tokens reserved when a messages cost names no maximum.
    fn default_max_output(&self, limit: &LimitConfig) -> u64 {
        let learned = if limit.learn_max_output {
            self.learner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .estimate(learning_key(limit))
        } else {
            None
        };
        match learned {
            Some(learned) => limit
                .max_request_tokens
                .map_or(learned, |largest| learned.min(largest)),
            None => limit.default_max_output_tokens,
        }
    }

    /// Counts a prompt: with tiktoken on the blocking pool, at most one
    /// count per CPU at a time; requests beyond [`Bounds::DEFAULT`] are
    /// refused before they wait for a slot.
    async fn count_prompt(
        &self,
        counter: Counter,
        request: ChatRequest,
    ) -> Result<PromptCount, Response> {
        for message in &request.messages {
            check_name("role", &message.role)?;
        }
        Bounds::DEFAULT.check(&request).map_err(token_error)?;
        if let Counter::Chars(_) = counter {
            // The estimate only adds up string lengths (a few µs within the
            // bounds): the hop to a blocking thread would cost more.
            return tokens::count_messages(counter, &request).map_err(token_error);
        }
        let _slot = self
            .counting
            .acquire()
            .await
            .map_err(|closed| error(ErrorCode::Internal, closed.to_string()))?;
        let counted =
            tokio::task::spawn_blocking(move || tokens::count_messages(counter, &request)).await;
        match counted {
            Ok(count) => count.map_err(token_error),
            Err(failed) => Err(error(
                ErrorCode::Internal,
                format!("counting the prompt failed: {failed}"),
            )),
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

    /// Checks an acquire's names and wait: its limit, priority class and
    /// `max_wait_ms` (the class's default when it gives none).
    fn check_acquire(
        &self,
        limit: &str,
        tenant: Option<&str>,
        priority: Option<&str>,
        max_wait_ms: Option<u64>,
    ) -> Result<(&LimitConfig, &PriorityClass, u64), Response> {
        check_name("limit", limit)?;
        if let Some(tenant) = tenant {
            check_name("tenant", tenant)?;
        }
        if let Some(priority) = priority {
            check_name("priority", priority)?;
        }
        let limit = self.find_limit(limit)?;
        let class = self.find_class(limit, priority)?;
        let max_wait_ms = max_wait_ms.unwrap_or(class.max_wait_ms);
        if max_wait_ms > MAX_WAIT_MS {
            return Err(error(
                ErrorCode::InvalidRequest,
                format!("max_wait_ms {max_wait_ms} exceeds the maximum of {MAX_WAIT_MS}"),
            ));
        }
        Ok((limit, class, max_wait_ms))
    }

    /// Turns `input` and `output` tokens into one draw per bucket: separate
    /// input and output buckets take their own figure; the combined, tenant
    /// and group token buckets take the charge of the limit's cost rule.
    fn plan_acquire(
        &self,
        limit: &LimitConfig,
        class: &PriorityClass,
        tenant: Option<&str>,
        input: u64,
        output: u64,
    ) -> Result<AcquirePlan, Response> {
        let total = match input.checked_add(output) {
            Some(0) => {
                return Err(error(
                    ErrorCode::InvalidRequest,
                    "a cost must be at least one token",
                ));
            }
            Some(total) => total,
            None => {
                return Err(error(
                    ErrorCode::CostExceedsCapacity,
                    "input_tokens + output_tokens overflows 64 bits",
                ));
            }
        };
        let charge = limit.cost_rule.charge(input, output).unwrap_or(total);
        // What the limit's own token buckets reserve: Granted.tokens.
        let tokens = match limit.token_buckets() {
            TokenBuckets::Combined(_) => charge,
            TokenBuckets::Split { .. } => total,
        };
        if let Some(largest) = limit.max_request_tokens.filter(|&largest| tokens > largest) {
            return Err(error(
                ErrorCode::CostExceedsCapacity,
                format!(
                    "a cost of {tokens} tokens exceeds max_request_tokens = {largest} of limit \"{}\"",
                    limit.name
                ),
            ));
        }
        // Buckets that mirror the provider keep its charge under "none";
        // tenant buckets are ratekeeper's own accounting and always settle.
        let mirrors = |settle: Settle| match limit.settle {
            SettleRule::Refund => settle,
            SettleRule::NoRefund => Settle::Never,
        };
        let buckets = &self.buckets[&limit.name];
        let mut draws: Vec<(BucketRole, Draw, Settle)> = buckets
            .fixed
            .iter()
            .map(|(role, bucket)| {
                let (cost, settle) = match role {
                    BucketRole::Tokens | BucketRole::GroupTokens => {
                        (charge, mirrors(Settle::Total))
                    }
                    BucketRole::InputTokens => (input, mirrors(Settle::Input)),
                    BucketRole::OutputTokens => (output, mirrors(Settle::Output)),
                    BucketRole::Tenant => (charge, Settle::Total),
                    BucketRole::Requests | BucketRole::GroupRequests => (1, Settle::Never),
                };
                (*role, draw(class, bucket.clone(), cost), settle)
            })
            .collect();
        // A tenant on a limit without a share is accepted and draws nothing
        // extra, so clients can always send their tenant.
        if let Some(bucket) = tenant.and_then(|t| buckets.tenant(limit, t)) {
            draws.push((
                BucketRole::Tenant,
                draw(class, bucket, charge),
                Settle::Total,
            ));
        }
        for (role, draw, _) in &draws {
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
            reserved: draws
                .into_iter()
                .map(|(role, draw, settle)| Reserved { role, draw, settle })
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
    /// Reserved in the limit's own token buckets (`Granted.tokens`).
    tokens: u64,
    reserved: Vec<Reserved>,
}

/// The key of a limit's learned max output: its model, else its name.
fn learning_key(limit: &LimitConfig) -> &str {
    limit.model.as_deref().unwrap_or(&limit.name)
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

/// The answer for a prompt that could not be counted: too large for the
/// bounds is the client's mistake, anything else the daemon's.
fn token_error(token_error: TokenError) -> Response {
    let code = match token_error {
        TokenError::TextTooLarge { .. }
        | TokenError::TooManyMessages { .. }
        | TokenError::TooManyParts { .. } => ErrorCode::InvalidRequest,
        TokenError::EncoderUnavailable { .. } | TokenError::InvalidEstimator { .. } => {
            ErrorCode::Internal
        }
    };
    error(code, token_error.to_string())
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
