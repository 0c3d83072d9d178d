//! The HTTP listener of `[metrics] listen`: `/metrics` in the Prometheus
//! text format, `/healthz` (the process answers) and `/readyz` (it can
//! serve acquires, see [`crate::limiter::health`]). What is read at scrape
//! time — bucket levels from the store, waiters, leases, the store's state
//! — is gathered here into a registry built for that one scrape, next to
//! what the daemon counted over its life ([`summary`]). A room above the
//! service: it reads the service and the store stack; nothing below imports
//! it.

mod summary;

pub use summary::{Counters, log_shutdown_summary};

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::budget::money::MICROS_PER_UNIT;
use crate::limiter::shapes::ELSEWHERE;
use crate::limiter::{FailurePolicy, Stores};
use crate::metrics::Name;
use crate::proto::{BudgetStatus, Inspection};
use crate::service::Service;

/// Connections the listener serves at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send its request headers (and how long an
/// idle keep-alive connection is kept).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may hold a slot, however it behaves: a peer that
/// never reads its answer would otherwise block the write, and its slot,
/// for ever (issue 27: 32 such peers held every slot and the kubelet's
/// probes failed). A scraper reconnects at its next scrape.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// How long a scrape's reading of the bucket levels (and waiters) serves
/// the scrapes after it: however many scrapers ask, the store is read at
/// most once in this time (issue 27: each scrape was a Redis call).
pub const LEVELS_FRESH: Duration = Duration::from_secs(1);

/// `limit`, `bucket` and `tenant` (empty but for tenant buckets).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    limit: Name,
    bucket: String,
    tenant: String,
}

/// One gauge of money per budget.
type MoneyGauges = Family<BudgetLabels, Gauge<f64, AtomicU64>>;

/// A spend budget: its `owner` (a limit, or a group when `scope` is
/// `group`), its `tenant` (empty for the owner's own) and its `budget`
/// (the bucket's name, `budget_day`, `tenant_budget_month`, …).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    owner: String,
    scope: &'static str,
    tenant: String,
    budget: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    limit: Name,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: &'static str,
}

/// Answers the listener's requests for one daemon.
pub struct Exporter {
    service: Arc<Service>,
    stores: Stores,
    /// Set once the Unix socket listens.
    socket_bound: Arc<AtomicBool>,
    /// The latest reading of the buckets from the store.
    inspected: SharedReading<Inspection>,
    /// The same for the spend budgets.
    budgets: SharedReading<Vec<BudgetStatus>>,
}

/// The latest reading from the store and when it was taken, which scrapes
/// within [`LEVELS_FRESH`] share; held while a scrape reads, so scrapes
/// that arrive meanwhile wait for that reading instead of making their own.
struct SharedReading<T>(tokio::sync::Mutex<Option<(Instant, T)>>);

impl<T: Clone> SharedReading<T> {
    fn new() -> Self {
        SharedReading(tokio::sync::Mutex::new(None))
    }

    /// The reading within [`LEVELS_FRESH`] if `fresh_serves`, else a new
    /// one from `read` (none if it fails), kept for the next scrapes only
    /// when `keep` says so.
    async fn get<F>(&self, fresh_serves: bool, read: F, keep: impl Fn(&T) -> bool) -> Option<T>
    where
        F: Future<Output = Option<T>>,
    {
        let mut latest = self.0.lock().await;
        if let Some((at, reading)) = latest.as_ref()
            && fresh_serves
            && at.elapsed() < LEVELS_FRESH
        {
            return Some(reading.clone());
        }
        let reading = read.await?;
        *latest = keep(&reading).then(|| (Instant::now(), reading.clone()));
        Some(reading)
    }
}

impl Exporter {
    pub fn new(service: Arc<Service>, stores: Stores, socket_bound: Arc<AtomicBool>) -> Self {
        Exporter {
            service,
            stores,
            socket_bound,
            inspected: SharedReading::new(),
            budgets: SharedReading::new(),
        }
    }

    /// The buckets as the store answered within [`LEVELS_FRESH`], read now
    /// if no scrape did. Only an answer while the store is up is kept: the
    /// levels vanish from the scrape as soon as the store fails.
    async fn inspection(&self, store_up: bool) -> Option<Inspection> {
        let read = async { self.service.inspection(None).await.ok() };
        self.inspected
            .get(store_up, read, |inspection| {
                store_up && inspection.levels_from == "store"
            })
            .await
    }

    /// Every metric, in the Prometheus text format (version 0.0.4).
    pub async fn render(&self) -> String {
        let mut text = String::new();
        let scraped = self.scrape().await;
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut text, self.service.metrics().registry());
        let _ = prometheus_text::encode(&mut text, &scraped);
        text
    }

    /// What is read at scrape time, as a registry of its own.
    async fn scrape(&self) -> Registry {
        let mut r = Registry::with_prefix("ratekeeper");
        let counters = Counters::read(&self.service, &self.stores);
        let health = self
            .service
            .health(self.socket_bound.load(Ordering::SeqCst));
        let gauge = |value: bool| ConstGauge::new(i64::from(value));
        r.register("ready", "1 when /readyz answers 200", gauge(health.ready));
        r.register(
            "store_up",
            "1 while the bucket store answers, 0 while it fails",
            gauge(health.store_up),
        );
        r.register(
            "store_down_seconds",
            "How long the store has been failing; 0 while it answers",
            ConstGauge::new(health.store_down_ms as f64 / 1000.0),
        );
        if let Some(fallback) = &self.stores.fallback {
            let policies: Family<PolicyLabel, Gauge> = Family::default();
            for policy in [
                FailurePolicy::FailClosed,
                FailurePolicy::FailOpen,
                FailurePolicy::Local,
            ] {
                let configured = policy == fallback.policy();
                policies
                    .get_or_create(&PolicyLabel {
                        policy: policy.name(),
                    })
                    .set(i64::from(configured));
            }
            r.register(
                "failure_policy",
                "1 for the configured redis.on_failure policy",
                policies,
            );
            r.register(
                "failure_policy_active",
                "1 while the store fails and the failure policy answers acquires",
                gauge(!health.store_up),
            );
        }
        let count = ConstCounter::new;
        r.register("leases_open", "Leases not yet reported or released", {
            ConstGauge::new(counters.open_leases as i64)
        });
        r.register(
            "leases_expired",
            "Leases forgotten for age or room, reservation kept",
            count(counters.leases_expired),
        );
        r.register(
            "leases_kept_on_disconnect",
            "Leases forgotten with their connection, reservation kept",
            count(counters.leases_kept_on_disconnect),
        );
        r.register(
            "leases_refunded_on_disconnect",
            "Leases partly refunded after their connection closed",
            count(counters.leases_refunded_on_disconnect),
        );
        r.register(
            "policy_decisions",
            "Acquires the failure policy answered instead of the store",
            count(counters.policy_decisions),
        );
        r.register(
            "local_denials",
            "Denials proven from the store's last answer, without a store call",
            count(counters.local_denials),
        );
        r.register(
            "log_write_errors",
            "Log lines lost to a failing stderr",
            count(counters.log_write_errors),
        );
        r.register(
            "overrun_clipped_tokens",
            "Tokens of overruns (reports above their reservation) not debited: overruns hold a bucket at most one capacity below its reservations",
            count(crate::limiter::overrun::clipped_tokens()),
        );
        if self.stores.redis.is_some() {
            register_outage_work(&mut r, &counters);
        }
        self.scrape_buckets(&mut r, health.store_up).await;
        if health.store_up {
            self.scrape_budgets(&mut r).await;
        }
        r
    }

    /// Each spend budget's amount, spent, reserved and remaining money, in
    /// units of the currency, from the store's answer within the last
    /// [`LEVELS_FRESH`]; nothing while the store fails.
    async fn scrape_budgets(&self, r: &mut Registry) {
        let read = async { self.service.budget_statuses(None).await.ok() };
        let Some(budgets) = self.budgets.get(true, read, |_| true).await else {
            return;
        };
        if budgets.is_empty() {
            return;
        }
        let money = |micros: f64| micros / MICROS_PER_UNIT as f64;
        let families: [(&str, &str, MoneyGauges); 5] = [
            (
                "budget_amount",
                "The spend budget for its period or window, in units of the currency",
                Family::default(),
            ),
            (
                "budget_spent",
                "What reported calls cost in the budget's period (a rolling budget: all its window holds)",
                Family::default(),
            ),
            (
                "budget_reserved",
                "What calls not yet reported hold in the budget",
                Family::default(),
            ),
            (
                "budget_remaining",
                "What acquires may still take from the budget (negative after overruns)",
                Family::default(),
            ),
            (
                "budget_resets_at_seconds",
                "When the budget's calendar period ends, Unix time (0 for a rolling budget)",
                Family::default(),
            ),
        ];
        for budget in budgets {
            let labels = BudgetLabels {
                owner: budget.owner,
                scope: if budget.group { "group" } else { "limit" },
                tenant: budget.tenant.unwrap_or_default(),
                budget: budget.name,
            };
            let values = [
                money(budget.amount as f64),
                money(budget.spent as f64),
                money(budget.reserved as f64),
                money(budget.remaining as f64),
                budget.resets_at_ms as f64 / 1000.0,
            ];
            for ((_, _, family), value) in families.iter().zip(values) {
                family.get_or_create(&labels).set(value);
            }
        }
        for (name, help, family) in families {
            r.register(name, help, family);
        }
    }

    /// Waiters per limit, and each bucket's level, capacity and rate from
    /// the store's answer within the last [`LEVELS_FRESH`] (levels only
    /// while the store answers).
    async fn scrape_buckets(&self, r: &mut Registry, store_up: bool) {
        let Some(inspection) = self.inspection(store_up).await else {
            return;
        };
        let config = self.service.config();
        let waiters: Family<LimitLabel, Gauge> = Family::default();
        let levels: Family<BucketLabels, Gauge> = Family::default();
        let capacities: Family<BucketLabels, Gauge> = Family::default();
        let rates: Family<BucketLabels, Gauge> = Family::default();
        let disagreements: Family<BucketLabels, Gauge> = Family::default();
        let from_store = inspection.levels_from == "store";
        for limit in inspection.limits {
            let name = Name::from(limit.name.as_str());
            waiters
                .get_or_create(&LimitLabel {
                    limit: name.clone(),
                })
                .set(limit.waiters as i64);
            for bucket in limit.buckets {
                let tenant = bucket.tenant.unwrap_or_default();
                if !tenant.is_empty() && !config.metrics.tenants.contains(&tenant) {
                    continue;
                }
                // A row of another sidecar's shape of the bucket before it.
                if let Some(own) = bucket.name.strip_suffix(ELSEWHERE) {
                    let labels = BucketLabels {
                        limit: name.clone(),
                        bucket: own.to_string(),
                        tenant,
                    };
                    disagreements.get_or_create(&labels).set(1);
                    continue;
                }
                let labels = BucketLabels {
                    limit: name.clone(),
                    bucket: bucket.name,
                    tenant,
                };
                // 0 until the bucket's ":elsewhere" row, right after it, says 1.
                disagreements.get_or_create(&labels).set(0);
                let as_i64 = |value: u64| value.min(i64::MAX as u64) as i64;
                capacities
                    .get_or_create(&labels)
                    .set(as_i64(bucket.capacity));
                rates.get_or_create(&labels).set(as_i64(bucket.per_minute));
                if let Some(level) = bucket.level.filter(|_| from_store) {
                    levels.get_or_create(&labels).set(level);
                }
            }
        }
        r.register(
            "waiters",
            "Acquires this daemon holds back until their reservation is due",
            waiters,
        );
        r.register(
            "bucket_level",
            "Whole units available in the bucket, as the store answered within the last second (negative while reservations wait)",
            levels,
        );
        r.register(
            "bucket_capacity",
            "The bucket's capacity (its burst)",
            capacities,
        );
        r.register(
            "bucket_refill_per_minute",
            "The bucket's refill rate, units per minute",
            rates,
        );
        if let Some(redis) = &self.stores.redis {
            let shapes = redis.shape_conflicts();
            r.register(
                "bucket_shape_conflict",
                "1 while another sidecar draws the bucket with another capacity or rate (configs differ); both draw with the smaller of each",
                disagreements,
            );
            r.register(
                "shape_conflict_calls",
                "Store calls that drew a bucket with another sidecar's shape as well",
                ConstCounter::new(shapes.calls()),
            );
        }
    }

    /// Answers one HTTP request.
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        }
        match request.uri().path() {
            "/metrics" => {
                let mut answer = text(StatusCode::OK, self.render().await);
                answer.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(prometheus_text::CONTENT_TYPE),
                );
                answer
            }
            "/healthz" => text(StatusCode::OK, "alive\n".into()),
            "/readyz" => {
                let health = self
                    .service
                    .health(self.socket_bound.load(Ordering::SeqCst));
                let status = if health.ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let verdict = if health.ready { "ready" } else { "not ready" };
                text(status, format!("{verdict}: {}\n", health.reason))
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: /metrics, /healthz and /readyz are served\n".into(),
            ),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// Serves `listener` until `stop` fires: HTTP/1.1, at most
/// [`MAX_CONNECTIONS`] connections at once.
pub async fn serve(listener: TcpListener, exporter: Arc<Exporter>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(accept_error) => {
                    tracing::warn!(%accept_error, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let exporter = exporter.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let exporter = exporter.clone();
                async move { Ok::<_, Infallible>(exporter.answer(request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// What reconciles the store after calls whose answer was lost, and the
/// settlements replayed after an outage.
fn register_outage_work(r: &mut Registry, counters: &Counters) {
    let count = ConstCounter::new;
    r.register(
        "store_calls_undone",
        "Store calls whose answer was lost, found to have run, and undone",
        count(counters.calls_undone),
    );
    r.register(
        "store_calls_prevented",
        "Store calls whose answer was lost that had not run, kept from running late",
        count(counters.calls_prevented),
    );
    r.register(
        "store_cancels_pending",
        "Cancels of store calls waiting for Redis to answer",
        ConstGauge::new(counters.cancels_pending as i64),
    );
    r.register(
        "store_cancels_evicted",
        "Cancels dropped for room in a long outage; their calls, if they ran, stay",
        count(counters.cancels_evicted),
    );
    r.register(
        "settlements_pending",
        "Reports and releases made during an outage, waiting to be replayed",
        ConstGauge::new(counters.settlements_pending as i64),
    );
    r.register(
        "settlements_replayed",
        "Reports and releases applied after an outage",
        count(counters.settlements_replayed),
    );
    r.register(
        "settlements_evicted",
        "Reports and releases dropped for room in a long outage",
        count(counters.settlements_evicted),
    );
}
