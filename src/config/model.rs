//! The typed, validated configuration: what the rest of the daemon reads,
//! the defaults of every setting and the bounds validation holds them to.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::budget::spans::Budget;
pub use crate::limiter::FailurePolicy;
use crate::tokens::Encoding;

/// Socket of a daemon run as a system service (systemd's
/// `RuntimeDirectory=ratekeeper`, the Kubernetes manifests) when neither the
/// file nor the environment names one, and no `$XDG_RUNTIME_DIR` is set.
pub const SYSTEM_SOCKET_PATH: &str = "/run/ratekeeper/ratekeeper.sock";
/// The socket's name in a login session's `$XDG_RUNTIME_DIR`.
pub const SESSION_SOCKET_NAME: &str = "ratekeeper.sock";

/// The socket the daemon listens on, and its clients connect to, when
/// neither the file nor the environment names one: in the user's own
/// runtime directory (`$XDG_RUNTIME_DIR`, private to its user) when the
/// session has one, else [`SYSTEM_SOCKET_PATH`]. Never in a directory every
/// user can write, such as `/tmp`: another local user could bind the path
/// first and receive every worker's prompts (issue 27). The Python client
/// computes the same path.
pub fn default_socket_path() -> PathBuf {
    default_socket_path_in(std::env::var_os("XDG_RUNTIME_DIR").as_deref())
}

/// [`default_socket_path`] for a given `$XDG_RUNTIME_DIR` (ignored unless
/// it is an absolute path, as the XDG specification says).
pub fn default_socket_path_in(runtime_dir: Option<&std::ffi::OsStr>) -> PathBuf {
    match runtime_dir.map(std::path::Path::new) {
        Some(dir) if dir.is_absolute() => dir.join(SESSION_SOCKET_NAME),
        _ => PathBuf::from(SYSTEM_SOCKET_PATH),
    }
}
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
/// The longest a 429's `retry-after` pauses a limit by default: a minute,
/// in which a per-minute limit refills completely (see `crate::feedback`).
pub const DEFAULT_MAX_PAUSE_MS: u64 = 60_000;
/// Largest `max_pause_ms`: an hour.
pub const MAX_MAX_PAUSE_MS: u64 = 3_600_000;

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
/// Largest `server.threads`: more than a sidecar's cores only adds wake-ups.
pub const MAX_THREADS: u64 = 64;

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
    /// What each uid may name in an acquire (`[[clients]]`); empty: any
    /// connected client may name any tenant and class.
    pub clients: Vec<ClientPolicy>,
    /// The IANA time zone whose midnights start calendar budgets' periods.
    pub budget_time_zone: String,
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
            clients: Vec::new(),
            budget_time_zone: DEFAULT_BUDGET_TIME_ZONE.to_string(),
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

    /// The `[[clients]]` entry that applies to a peer of `uid`: the one
    /// listing it, else the one for `other_uids`; `None`: unrestricted. A
    /// peer whose uid could not be read counts as one no entry lists.
    pub fn client_policy(&self, uid: Option<u32>) -> Option<&ClientPolicy> {
        let listed = uid.and_then(|uid| {
            self.clients
                .iter()
                .find(|policy| policy.uids.contains(&uid))
        });
        listed.or_else(|| self.clients.iter().find(|policy| policy.other_uids))
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
    /// Whether the socket may be in a directory every user can write
    /// (`/tmp`): off, since another user could bind the path first.
    pub allow_world_writable_dir: bool,
    /// When non-empty, only peers with one of these uids may connect.
    pub allowed_uids: Vec<u32>,
    /// When non-empty, only peers with one of these gids may connect.
    pub allowed_gids: Vec<u32>,
    /// How long `SIGTERM` waits for in-flight requests before exiting.
    pub drain_timeout_ms: u64,
    /// Most connections open at once. At the cap a new connection closes
    /// the one idle the longest; it is refused `Overloaded` only when
    /// every open connection has a request in flight.
    pub max_connections: u64,
    /// Most connections one uid may hold open at once, by the same rule
    /// among its own connections; `None`: only `max_connections` bounds it.
    pub max_connections_per_uid: Option<u64>,
    /// Most bytes all connections together may buffer for frames that
    /// have not fully arrived, beyond each connection's first read chunk.
    pub max_buffered_bytes: u64,
    /// How long a new connection may take to send its `Hello`.
    pub hello_timeout_ms: u64,
    /// How long a frame may take to arrive, from its first byte to its last.
    pub frame_timeout_ms: u64,
    /// Threads of the async runtime; 1 runs the whole daemon on one thread.
    pub threads: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: default_socket_path(),
            socket_mode: 0o660,
            allow_world_writable_dir: false,
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
            drain_timeout_ms: 10_000,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_uid: None,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            hello_timeout_ms: 10_000,
            frame_timeout_ms: 10_000,
            threads: 1,
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
    pub const OTHER_TENANTS: &'static str = crate::metrics::OTHER_TENANTS;
    /// Most tenants `tenants` may list.
    pub const MAX_TENANTS: usize = 100;
}

/// What the peers of some uids may name in an acquire: one `[[clients]]`
/// entry. A connected client is otherwise taken at its word for the tenant
/// it names (whose share it then draws) and for its priority class (issue
/// 27); the kernel's peer uid is not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientPolicy {
    /// The uids the entry applies to; empty for the `other_uids` entry.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uids: Vec<u32>,
    /// Whether the entry applies to every uid no entry lists.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub other_uids: bool,
    /// Tenants the acquires may name; when set, an acquire must name one
    /// of them (naming none would escape the tenants' shares). `None`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    /// Priority classes the acquires may use, `default_priority` included
    /// when they name none. `None`: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priorities: Option<Vec<String>>,
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
    /// What every limit of the group may spend together.
    #[serde(flatten)]
    pub budgets: Budgets,
}

/// The spend budgets of a limit or a group (docs/budgets.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Budgets {
    /// What all its calls may spend together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// What each tenant's calls may spend, unless `tenant_budgets` names
    /// the tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_budget: Option<Budget>,
    /// Named tenants' own budgets, in place of `tenant_budget`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tenant_budgets: BTreeMap<String, Budget>,
}

impl Budgets {
    /// Whether any budget is declared.
    pub fn any(&self) -> bool {
        self.budget.is_some() || self.tenant_budget.is_some() || !self.tenant_budgets.is_empty()
    }

    /// The budget of `tenant`: its own if named, else the default one.
    pub fn of_tenant(&self, tenant: &str) -> Option<&Budget> {
        self.tenant_budgets
            .get(tenant)
            .or(self.tenant_budget.as_ref())
    }
}

/// Largest amount of a calendar budget, in micro-units (a billion): a
/// bucket that never refills counts one unit a micro-unit, well inside the
/// Lua scripts' exact range.
pub const MAX_BUDGET: u64 = 1_000_000_000 * crate::budget::money::MICROS_PER_UNIT;
/// Largest amount of a rolling budget, in micro-units (fifty thousand): a
/// refilling bucket may count 60,000 units a micro-unit.
pub const MAX_ROLLING_BUDGET: u64 = 50_000 * crate::budget::money::MICROS_PER_UNIT;

/// Where calendar budgets' periods start when `[budgets] time_zone` is not set.
pub const DEFAULT_BUDGET_TIME_ZONE: &str = "UTC";

pub use super::limit::{
    BucketKind, EnforcementWindow, LimitConfig, LimitMode, TokenBuckets, TokenRate,
};

/// A priority class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PriorityClass {
    pub name: String,
    /// Fraction of every bucket this class must leave for the classes above it.
    pub reserved_fraction: f64,
    /// Wait used when an acquire gives no `max_wait_ms`, and the longest
    /// one an acquire of the class may ask for.
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
