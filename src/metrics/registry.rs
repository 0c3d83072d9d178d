//! The metrics the daemon counts as things happen, every name in one place:
//! acquires, settlements, waits, connections, store calls, reloads. What is
//! read at scrape time instead (levels, leases, the store's state) is in
//! [`super::scrape`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// A label value that clones without allocating: a name from the config.
pub type Name = Arc<str>;

/// `limit` and `tenant`: the labels of acquired tokens.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub limit: Name,
    pub tenant: Name,
}

/// One acquire's answer: `outcome` is `granted`, `denied` or `error`;
/// `reason` the denying bucket or the error code (empty for a grant).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcquireLabels {
    pub limit: Name,
    pub tenant: Name,
    pub outcome: &'static str,
    pub reason: &'static str,
}

/// A report's or release's answer: `settled` or an error code.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettleLabels {
    pub limit: Name,
    pub outcome: &'static str,
}

/// A shadow limit's decision: `granted`, `would_wait`, `would_deny`,
/// `would_refuse` (a cost that could never fit) or `store_unavailable`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowLabels {
    pub limit: Name,
    pub decision: &'static str,
}

/// Just the limit.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: Name,
}

/// One kind of store call: `acquire`, `adjust`, `levels`, `ping`, `warm_up`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: &'static str,
}

/// A failed store call: `kind` is `timeout`, `unavailable` or
/// `cost_exceeds_capacity`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    pub operation: &'static str,
    pub kind: &'static str,
}

/// A reload's `outcome`: `applied` or `refused`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// `version`, on `ratekeeper_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Upper bounds of the wait histogram, in seconds: a grant at once up to
/// the longest wait a class may allow.
const WAIT_BUCKETS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Upper bounds of the store latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Upper bounds of reserved − used, in tokens: negative for an overrun.
const ESTIMATION_BUCKETS: [f64; 15] = [
    -16384.0, -4096.0, -1024.0, -256.0, -64.0, -16.0, -1.0, 0.0, 16.0, 64.0, 256.0, 1024.0, 4096.0,
    16384.0, 65536.0,
];

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

fn estimation_histogram() -> Histogram {
    Histogram::new(ESTIMATION_BUCKETS)
}

/// Everything counted as it happens, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub(crate) acquires: Family<AcquireLabels, Counter>,
    pub(crate) acquired_tokens: Family<TenantLabels, Counter>,
    pub(crate) waits: Histograms<LimitLabel>,
    pub(crate) reports: Family<SettleLabels, Counter>,
    pub(crate) releases: Family<SettleLabels, Counter>,
    pub(crate) estimation_error: Histograms<LimitLabel>,
    pub(crate) refunded_tokens: Family<LimitLabel, Counter>,
    pub(crate) spent: Family<TenantLabels, Counter>,
    pub(crate) connections: Counter,
    pub(crate) connections_open: Gauge,
    pub(crate) connections_evicted: Counter,
    pub(crate) in_flight: Gauge,
    pub(crate) reloads: Family<OutcomeLabel, Counter>,
    pub(crate) shadow_decisions: Family<ShadowLabels, Counter>,
    pub(crate) acquires_postponed: Counter,
    /// Store calls, shared with the instrumented store.
    pub store: Arc<StoreCalls>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric at zero, registered under its `ratekeeper_` name.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ratekeeper");
        let metrics = Metrics {
            acquires: Family::default(),
            acquired_tokens: Family::default(),
            waits: Family::new_with_constructor(wait_histogram),
            reports: Family::default(),
            releases: Family::default(),
            estimation_error: Family::new_with_constructor(estimation_histogram),
            refunded_tokens: Family::default(),
            spent: Family::default(),
            connections: Counter::default(),
            connections_open: Gauge::default(),
            connections_evicted: Counter::default(),
            in_flight: Gauge::default(),
            reloads: Family::default(),
            shadow_decisions: Family::default(),
            acquires_postponed: Counter::default(),
            store: Arc::new(StoreCalls::default()),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "acquires",
            "Acquires answered, by limit, tenant, outcome (granted, denied, error) and reason (the denying bucket or the error code)",
            metrics.acquires.clone(),
        );
        r.register(
            "acquired_tokens",
            "Tokens granted in the limit's own token buckets (Granted.tokens)",
            metrics.acquired_tokens.clone(),
        );
        r.register(
            "acquire_wait_seconds",
            "How long granted acquires were held back until their reservation was due",
            metrics.waits.clone(),
        );
        r.register(
            "reports",
            "Reports answered, by limit and outcome (settled, or the error code)",
            metrics.reports.clone(),
        );
        r.register(
            "releases",
            "Releases answered, by limit and outcome (settled, or the error code)",
            metrics.releases.clone(),
        );
        r.register(
            "estimation_error_tokens",
            "Reserved minus used tokens per report (negative: the request used more than it reserved)",
            metrics.estimation_error.clone(),
        );
        r.register(
            "refunded_tokens",
            "Tokens given back to the limit's own token buckets by reports and releases",
            metrics.refunded_tokens.clone(),
        );
        r.register(
            "spent_micros",
            "What reported calls cost at the limit's price, in micro-units of the currency (limits with a spend budget; by limit and tenant)",
            metrics.spent.clone(),
        );
        r.register(
            "connections",
            "Socket connections accepted",
            metrics.connections.clone(),
        );
        r.register(
            "connections_open",
            "Socket connections open now",
            metrics.connections_open.clone(),
        );
        r.register(
            "connections_evicted",
            "Idle connections closed to admit a new one at server.max_connections or a uid's server.max_connections_per_uid (the one idle the longest)",
            metrics.connections_evicted.clone(),
        );
        r.register(
            "requests_in_flight",
            "Requests the service is answering now (waiting acquires included)",
            metrics.in_flight.clone(),
        );
        r.register(
            "shadow_decisions",
            "What shadow limits would have done with the acquires they granted at once, by decision (granted, would_wait, would_deny, would_refuse, store_unavailable)",
            metrics.shadow_decisions.clone(),
        );
        r.register(
            "acquires_postponed",
            "Granted acquires that waited longer than their reservation first said, because provider feedback lowered their buckets meanwhile (a denial when that passed their max_wait)",
            metrics.acquires_postponed.clone(),
        );
        r.register(
            "reloads",
            "Configuration reloads, by outcome (applied, refused)",
            metrics.reloads.clone(),
        );
        r.register(
            "store_call_duration_seconds",
            "Latency of calls to the bucket store (Redis, or the embedded store), by operation",
            metrics.store.latency.clone(),
        );
        r.register(
            "store_errors",
            "Failed store calls, by operation and kind (timeout, unavailable, cost_exceeds_capacity)",
            metrics.store.errors.clone(),
        );
        r.register(
            "build",
            "The daemon's version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The registry of everything counted as it happens.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts an answered reload.
    pub fn reloaded(&self, applied: bool) {
        let outcome = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Counts a connection accepted; the guard counts it closed when dropped.
    pub fn connection_opened(self: &Arc<Self>) -> OpenGuard {
        self.connections.inc();
        self.connections_open.inc();
        OpenGuard {
            metrics: self.clone(),
            gauge: Which::Connections,
        }
    }

    /// Counts an idle connection closed to make room for a new one.
    pub fn connection_evicted(&self) {
        self.connections_evicted.inc();
    }

    /// Counts a request in flight until the guard is dropped.
    pub fn request_started(self: &Arc<Self>) -> OpenGuard {
        self.in_flight.inc();
        OpenGuard {
            metrics: self.clone(),
            gauge: Which::InFlight,
        }
    }
}

enum Which {
    Connections,
    InFlight,
}

/// Keeps a gauge raised while it lives (a panic or a cancellation included).
pub struct OpenGuard {
    metrics: Arc<Metrics>,
    gauge: Which,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        match self.gauge {
            Which::Connections => self.metrics.connections_open.dec(),
            Which::InFlight => self.metrics.in_flight.dec(),
        };
    }
}

/// Store call latencies and errors, and when a call last succeeded.
#[derive(Debug)]
pub struct StoreCalls {
    latency: Histograms<OperationLabel>,
    errors: Family<StoreErrorLabels, Counter>,
    origin: Instant,
    /// Milliseconds after `origin` of the last successful call; 0: none yet.
    last_success_ms: AtomicU64,
}

impl Default for StoreCalls {
    fn default() -> Self {
        StoreCalls {
            latency: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
            origin: Instant::now(),
            last_success_ms: AtomicU64::new(0),
        }
    }
}

impl StoreCalls {
    /// Records one call of `operation` that took `elapsed`; `failure` is the
    /// kind of error it ended with, if any.
    pub fn observe(
        &self,
        operation: &'static str,
        elapsed: Duration,
        failure: Option<&'static str>,
    ) {
        self.latency
            .get_or_create(&OperationLabel { operation })
            .observe(elapsed.as_secs_f64());
        match failure {
            Some(kind) => {
                self.errors
                    .get_or_create(&StoreErrorLabels { operation, kind })
                    .inc();
            }
            None => {
                let now = self.origin.elapsed().as_millis() as u64;
                self.last_success_ms
                    .fetch_max(now.max(1), Ordering::Relaxed);
            }
        }
    }

    /// How long ago a store call last succeeded; `None` if none has.
    pub fn since_last_success(&self) -> Option<Duration> {
        match self.last_success_ms.load(Ordering::Relaxed) {
            0 => None,
            at => {
                let now = self.origin.elapsed().as_millis() as u64;
                Some(Duration::from_millis(now.saturating_sub(at)))
            }
        }
    }
}
