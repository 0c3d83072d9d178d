//! The typed, validated configuration: what the rest of the daemon reads,
//! the defaults of every setting and the bounds validation holds them to.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::limiter::FailurePolicy;
use crate::limiter::{BucketRole, Refill, Window};
use crate::tokens::{CharEstimator, CostRule, Counter, Encoding, Provider, SettleRule, Tokenizer};

/// Socket the daemon listens on when neither the file nor the environment
/// names one.
pub const DEFAULT_SOCKET_PATH: &str = "/tmp/ratekeeper.sock";
/// First part of every Redis key when `redis.key_prefix` is not set.
pub const DEFAULT_KEY_PREFIX: &str = "ratekeeper";
/// Output tokens a messages cost reserves when it names no maximum and the
/// limit sets no `default_max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 1024;

/// How long, by default, a limit's bursts are held back from: the time
/// between a grant and the provider seeing the call (see
/// [`LimitConfig::usable_burst`]).
pub const DEFAULT_BURST_HEADROOM_MS: u64 = 200;
/// Largest `burst_headroom_ms`.
pub const MAX_BURST_HEADROOM_MS: u64 = 60_000;

/// Largest `max_concurrent`.
pub const MAX_CONCURRENT: u64 = 1_000_000;
/// Default `concurrent_timeout_ms`: ten minutes, the request timeout of the
/// OpenAI and Anthropic SDKs, so no call stays in flight longer.
pub const DEFAULT_CONCURRENT_TIMEOUT_MS: u64 = 600_000;
/// Largest `concurrent_timeout_ms` (one day).
pub const MAX_CONCURRENT_TIMEOUT_MS: u64 = 86_400_000;

/// Largest `tokens_per_minute` / `requests_per_minute`.
pub const MAX_RATE_PER_MINUTE: u64 = 1_000_000_000;
/// Largest `burst_tokens` / `burst_requests`.
pub const MAX_BURST: u64 = 10_000_000_000;
/// Longest wait anywhere: a priority class's `max_wait_ms`, an acquire's,
/// a lease's `disconnect_grace_ms` (one hour). Also bounds how far below
/// zero a level can go, which keeps the Lua arithmetic exact in doubles.
pub const MAX_WAIT_MS: u64 = 3_600_000;
/// Default `server.max_connections`: room for every worker of a large pod,
/// and with [`DEFAULT_MAX_BUFFERED_BYTES`] well inside the shipped 256 MiB
/// pod limit (`k8s/deployment.yaml`).
pub const DEFAULT_MAX_CONNECTIONS: u64 = 1024;
/// Default `server.max_buffered_bytes` (64 MiB): sixteen 4 MiB frames
/// arriving at once.
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 64 * 1024 * 1024;
/// Largest `server.max_connections` (file descriptors are the real bound).
pub const MAX_CONNECTIONS: u64 = 1_000_000;
/// Largest `server.max_buffered_bytes` (16 GiB).
pub const MAX_BUFFERED_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// Largest `server.socket_mode`.
pub const MAX_SOCKET_MODE: u32 = 0o777;
/// Longest socket path, in bytes (`sun_path` minus the terminating NUL).
#[cfg(target_os = "linux")]
pub const MAX_SOCKET_PATH_LEN: usize = 107;
/// Longest socket path, in bytes (`sun_path` minus the terminating NUL).
#[cfg(not(target_os = "linux"))]
pub const MAX_SOCKET_PATH_LEN: usize = 103;

/// The validated, effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub server: ServerConfig,
    /// `None`: the embedded per-process store.
    pub redis: Option<RedisConfig>,
    pub groups: Vec<GroupConfig>,
    pub limits: Vec<LimitConfig>,
    /// Never empty: an implicit `default` class when the file declares none.
    pub priorities: Vec<PriorityClass>,
    /// Name of the class used when an acquire names none.
    pub default_priority: String,
    /// What happens to leases nobody reports.
    pub leases: LeaseConfig,
    /// The metrics and health listener.
    pub metrics: MetricsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            redis: None,
            groups: Vec::new(),
            limits: Vec::new(),
            priorities: vec![PriorityClass::implicit_default()],
            default_priority: PriorityClass::DEFAULT_NAME.to_string(),
            leases: LeaseConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl Config {
    /// The limit called `name`.
    pub fn limit(&self, name: &str) -> Option<&LimitConfig> {
        self.limits.iter().find(|limit| limit.name == name)
    }

    /// The priority class called `name`.
    pub fn priority(&self, name: &str) -> Option<&PriorityClass> {
        self.priorities.iter().find(|class| class.name == name)
    }

    /// The group called `name`.
    pub fn group(&self, name: &str) -> Option<&GroupConfig> {
        self.groups.iter().find(|group| group.name == name)
    }

    /// The tiktoken encodings the limits count with: what to build at start.
    pub fn encodings(&self) -> BTreeSet<Encoding> {
        self.limits
            .iter()
            .filter_map(|limit| limit.tokenizer.encoding())
            .collect()
    }
}

/// Where and how the daemon listens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerConfig {
    pub socket: PathBuf,
    /// File mode of the socket, e.g. `0o660`.
    pub socket_mode: u32,
    /// When non-empty, only peers with one of these uids may connect.
    pub allowed_uids: Vec<u32>,
    /// When non-empty, only peers with one of these gids may connect.
    pub allowed_gids: Vec<u32>,
    /// How long `SIGTERM` waits for in-flight requests before exiting.
    pub drain_timeout_ms: u64,
    /// Most connections open at once; the next is refused `Overloaded`.
    pub max_connections: u64,
    /// Most bytes all connections together may buffer for frames that
    /// have not fully arrived, beyond each connection's first read chunk.
    pub max_buffered_bytes: u64,
    /// How long a new connection may take to send its `Hello`.
    pub hello_timeout_ms: u64,
    /// How long a frame may take to arrive, from its first byte to its last.
    pub frame_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: PathBuf::from(DEFAULT_SOCKET_PATH),
            socket_mode: 0o660,
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
            drain_timeout_ms: 10_000,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            hello_timeout_ms: 10_000,
            frame_timeout_ms: 10_000,
        }
    }
}

/// The shared store: one Redis node, or a Redis Cluster from seed nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisConfig {
    /// A single node (`redis://`, `rediss://`, `unix://`); `None` in cluster mode.
    pub url: Option<String>,
    /// Seed nodes of a Redis Cluster; empty for a single node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster_nodes: Vec<String>,
    /// Redis Sentinels that know the primary; empty without Sentinel.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sentinels: Vec<String>,
    /// With Sentinel: the name the Sentinels know the primary by, and how to
    /// log in to it (the Sentinels' own credentials are in their URLs).
    /// Written flat, as the file has it (`master_name`, …).
    #[serde(flatten)]
    pub master: Option<SentinelMaster>,
    /// Multiplexed connections every request is spread over.
    pub pool_size: u32,
    /// Deadline of one Redis call, after which the failure policy applies.
    pub timeout_ms: u64,
    /// Deadline of connecting to a node.
    pub connect_timeout_ms: u64,
    /// First part of every key, so several deployments can share one Redis.
    pub key_prefix: String,
    /// What acquires get while Redis fails.
    pub on_failure: FailurePolicy,
    /// Fraction of every limit the `local` policy grants this sidecar.
    pub local_share: Option<f64>,
    /// PEM file of the certificate authority that signed the server's TLS
    /// certificate (`rediss://`), when it is not in the system's trust store.
    pub tls_ca_file: Option<PathBuf>,
}

impl RedisConfig {
    /// Defaults for everything but the nodes.
    pub fn with_url(url: impl Into<String>) -> Self {
        RedisConfig {
            url: Some(url.into()),
            cluster_nodes: Vec::new(),
            sentinels: Vec::new(),
            master: None,
            pool_size: 4,
            timeout_ms: 250,
            connect_timeout_ms: 1_000,
            key_prefix: DEFAULT_KEY_PREFIX.to_string(),
            on_failure: FailurePolicy::FailClosed,
            local_share: None,
            tls_ca_file: None,
        }
    }

    /// Every node: the single `url`, or the cluster's seed nodes.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.url
            .iter()
            .chain(&self.cluster_nodes)
            .chain(&self.sentinels)
    }

    /// How the nodes are reached, for logs: `"single"`, `"cluster"`, `"sentinel"`.
    pub fn topology(&self) -> &'static str {
        if self.url.is_some() {
            "single"
        } else if self.sentinels.is_empty() {
            "cluster"
        } else {
            "sentinel"
        }
    }
}

/// The primary behind Redis Sentinel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SentinelMaster {
    /// The name the Sentinels monitor it by (`sentinel monitor NAME …`).
    #[serde(rename = "master_name")]
    pub name: String,
    #[serde(rename = "master_username", skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(rename = "master_password", skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Its database index.
    #[serde(rename = "master_db")]
    pub db: u64,
}

/// The life of unreported leases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseConfig {
    /// What a closed connection's unreported leases do to their reservation.
    pub on_disconnect: DisconnectRule,
    /// With `refund`: the fraction of each lease's tokens given back.
    pub disconnect_refund_fraction: f64,
    /// With `refund`: how long a lease may still be reported (from another
    /// connection) before the refund.
    pub disconnect_grace_ms: u64,
    /// Unreported leases are forgotten, reservation kept, after this long.
    pub expire_after_ms: u64,
    /// Most unreported leases kept; past it the oldest are forgotten.
    pub max_open: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            on_disconnect: DisconnectRule::Keep,
            disconnect_refund_fraction: 0.5,
            disconnect_grace_ms: 30_000,
            expire_after_ms: 3_600_000,
            max_open: 100_000,
        }
    }
}

/// The HTTP listener for Prometheus and probes, and which tenants get
/// labels of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MetricsConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None`: nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Tenants whose metrics carry their name; every other tenant is
    /// counted as `tenant="other"`, so the number of series stays bounded.
    pub tenants: Vec<String>,
}

impl MetricsConfig {
    /// The label every tenant not listed in `tenants` shares.
    pub const OTHER_TENANTS: &'static str = "other";
    /// Most tenants `tenants` may list.
    pub const MAX_TENANTS: usize = 100;
}

/// What a closed connection's unreported leases do to their reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisconnectRule {
    /// Keep the reservation: the provider was probably called.
    Keep,
    /// Give `disconnect_refund_fraction` back after the grace period.
    Refund,
}

/// Buckets shared by several limits, and the Redis Cluster hash tag they all
/// live under: an organisation cap over several models.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupConfig {
    pub name: String,
    pub tokens_per_minute: Option<u64>,
    pub requests_per_minute: Option<u64>,
    /// Defaults to one minute's worth.
    pub burst_tokens: Option<u64>,
    /// Defaults to one minute's worth.
    pub burst_requests: Option<u64>,
}

/// One provider limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitConfig {
    pub name: String,
    /// Refill rate of the combined token bucket; 0 when the limit has
    /// separate input and output buckets instead (see [`Self::token_buckets`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub tokens_per_minute: u64,
    pub requests_per_minute: Option<u64>,
    /// Combined token bucket capacity; defaults to one minute's worth; 0
    /// with separate input and output buckets.
    #[serde(skip_serializing_if = "is_zero")]
    pub burst_tokens: u64,
    /// Request bucket capacity; defaults to one minute's worth.
    pub burst_requests: Option<u64>,
    /// Refill rate of the separate input-token bucket (prompt tokens).
    pub input_tokens_per_minute: Option<u64>,
    /// Refill rate of the separate output-token bucket (completion tokens).
    pub output_tokens_per_minute: Option<u64>,
    /// Input bucket capacity; defaults to one minute's worth.
    pub burst_input_tokens: Option<u64>,
    /// Output bucket capacity; defaults to one minute's worth.
    pub burst_output_tokens: Option<u64>,
    /// Model whose tokenizer counts this limit's messages; also the key
    /// under which learned output sizes are kept.
    pub model: Option<String>,
    /// Fraction of the limit any one tenant may use, in (0, 1].
    pub tenant_share: Option<f64>,
    /// Largest cost one acquire may ask for; must fit in the burst.
    pub max_request_tokens: Option<u64>,
    /// The group whose buckets every acquire of this limit also draws from.
    pub group: Option<String>,
    /// Whose accounting the limit mirrors; sets the defaults of
    /// `tokenizer`, `cost_rule` and `settle`.
    pub provider: Provider,
    /// How messages are counted, resolved (never `"auto"`).
    pub tokenizer: Tokenizer,
    /// With the `chars` tokenizer: characters (UTF-8 bytes) per token.
    pub chars_per_token: Option<f64>,
    /// With the `chars` tokenizer: multiplier over the whole estimate.
    pub safety_factor: Option<f64>,
    /// Output tokens reserved when a messages cost names no maximum.
    pub default_max_output_tokens: u64,
    /// How input and output make the charge of the combined buckets.
    pub cost_rule: CostRule,
    /// Whether reports give back (or take) the difference to actual usage.
    pub settle: SettleRule,
    /// Replace `default_max_output_tokens` by a high percentile of the
    /// output tokens recently reported for the model.
    pub learn_max_output: bool,
    /// How much of each own bucket's burst is held back, in milliseconds
    /// of its refill (see [`LimitConfig::usable_burst`]).
    pub burst_headroom_ms: u64,
    /// Whether the limit holds acquires back (`enforce`), or only decides,
    /// counts and logs while granting every acquire at once (`shadow`).
    pub mode: LimitMode,
    /// At most this many of the limit's requests in flight (granted, not
    /// yet reported or released) across the fleet; `None`: no such limit.
    pub max_concurrent: Option<u64>,
    /// How long a request may hold its slot before it is presumed lost (a
    /// crashed sidecar never gives its slots back).
    pub concurrent_timeout_ms: u64,
    /// Tokens and requests over windows other than a minute; each is a
    /// bucket of its own whose burst is one window's worth.
    pub tokens_per_second: Option<u64>,
    pub tokens_per_hour: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub requests_per_second: Option<u64>,
    pub requests_per_hour: Option<u64>,
    pub requests_per_day: Option<u64>,
}

/// What a limit does with its decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitMode {
    /// Holds acquires back and denies them as the buckets say.
    #[default]
    Enforce,
    /// Decides, counts and logs as `enforce` would, but grants every
    /// acquire at once: a limit rolled out to be watched before it binds.
    Shadow,
}

/// A bucket of a limit over a window other than a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtherWindow {
    /// `TokensPer(window)` or `RequestsPer(window)`.
    pub role: BucketRole,
    /// Tokens or requests per window, and the burst.
    pub amount: u64,
}

/// What a bucket counts, for [`LimitConfig::usable_burst`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketKind {
    Tokens,
    Requests,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// A token bucket's rate and capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRate {
    pub per_minute: u64,
    pub burst: u64,
}

/// The token buckets of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenBuckets {
    /// One bucket for input and output together.
    Combined(TokenRate),
    /// Separate input (prompt) and output (completion) buckets.
    Split { input: TokenRate, output: TokenRate },
    /// No per-minute token bucket (requests only, or tokens over other
    /// windows only).
    None,
}

impl LimitConfig {
    /// The limit's token bucket or buckets.
    pub fn token_buckets(&self) -> TokenBuckets {
        match (
            self.input_tokens_per_minute,
            self.output_tokens_per_minute,
            self.tokens_per_minute,
        ) {
            (Some(input), Some(output), 0) => TokenBuckets::Split {
                input: TokenRate {
                    per_minute: input,
                    burst: self.burst_input_tokens.unwrap_or(input),
                },
                output: TokenRate {
                    per_minute: output,
                    burst: self.burst_output_tokens.unwrap_or(output),
                },
            },
            (_, _, 0) => TokenBuckets::None,
            _ => TokenBuckets::Combined(TokenRate {
                per_minute: self.tokens_per_minute,
                burst: self.burst_tokens,
            }),
        }
    }

    /// The limit's buckets over windows other than a minute, shortest first.
    pub fn other_windows(&self) -> Vec<OtherWindow> {
        let figures = [
            (
                BucketRole::TokensPer(Window::Second),
                self.tokens_per_second,
            ),
            (
                BucketRole::RequestsPer(Window::Second),
                self.requests_per_second,
            ),
            (BucketRole::TokensPer(Window::Hour), self.tokens_per_hour),
            (
                BucketRole::RequestsPer(Window::Hour),
                self.requests_per_hour,
            ),
            (BucketRole::TokensPer(Window::Day), self.tokens_per_day),
            (BucketRole::RequestsPer(Window::Day), self.requests_per_day),
        ];
        figures
            .into_iter()
            .filter_map(|(role, amount)| {
                Some(OtherWindow {
                    role,
                    amount: amount?,
                })
            })
            .collect()
    }

    /// Whether any of the limit's buckets counts tokens (else it counts
    /// requests only, and an acquire's cost does not matter).
    pub fn counts_tokens(&self) -> bool {
        !matches!(self.token_buckets(), TokenBuckets::None)
            || self.tokens_per_second.is_some()
            || self.tokens_per_hour.is_some()
            || self.tokens_per_day.is_some()
    }

    /// The rate and capacity of all token buckets together: what a tenant's
    /// share is a share of.
    pub fn total_token_rate(&self) -> TokenRate {
        match self.token_buckets() {
            TokenBuckets::Combined(rate) => rate,
            TokenBuckets::Split { input, output } => TokenRate {
                per_minute: input.per_minute.saturating_add(output.per_minute),
                burst: input.burst.saturating_add(output.burst),
            },
            // Config validation keeps tenant shares off such limits.
            TokenBuckets::None => TokenRate {
                per_minute: 0,
                burst: 0,
            },
        }
    }

    /// The capacity of one of the limit's own buckets (refilled by
    /// `refill`, `burst`): the burst less `burst_headroom_ms` of refill, but never
    /// less than half the burst nor, for a token bucket, less than
    /// `max_request_tokens` (which the config holds within the burst).
    ///
    /// A call granted now reaches the provider some milliseconds later
    /// (connection set-up, latency). While both buckets are full, the
    /// provider's cannot bank the refill of that delay, ours already spent
    /// it: a fleet that empties a full bucket at once runs ahead of the
    /// provider by `rate × delay`, which is the 429s at the burst edge. The
    /// headroom takes that off the burst and leaves the rate alone, so the
    /// steady state loses nothing.
    pub fn usable_burst(&self, role: BucketKind, refill: &Refill, burst: u64) -> u64 {
        let held = u128::from(refill.amount()) * u128::from(self.burst_headroom_ms)
            / u128::from(refill.window().ms());
        let floor = match (role, self.max_request_tokens) {
            (BucketKind::Tokens, Some(max_request)) => (burst / 2).max(max_request.min(burst)),
            _ => burst / 2,
        };
        burst - (held.min(u128::from(burst - floor)) as u64)
    }

    /// What counts this limit's messages.
    pub fn counter(&self) -> Counter {
        self.tokenizer
            .counter(self.chars_per_token, self.safety_factor)
            // Validated when the config was loaded.
            .unwrap_or(Counter::Chars(CharEstimator::default()))
    }
}

/// A priority class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PriorityClass {
    pub name: String,
    /// Fraction of every bucket this class must leave for the classes above it.
    pub reserved_fraction: f64,
    /// Wait used when an acquire gives no `max_wait_ms`.
    pub max_wait_ms: u64,
    /// Limits the class applies to; `None` means all.
    pub limits: Option<Vec<String>>,
}

impl PriorityClass {
    /// Name of the implicit class of a config that declares none.
    pub const DEFAULT_NAME: &'static str = "default";

    /// The implicit class, also the defaults of every declared one.
    pub(super) fn implicit_default() -> Self {
        PriorityClass {
            name: Self::DEFAULT_NAME.to_string(),
            reserved_fraction: 0.0,
            max_wait_ms: 10_000,
            limits: None,
        }
    }
}
