//! The typed configuration: loading (TOML file + environment overrides) and
//! validation with messages that point at the place in the file.
//!
//! `serve` and `check-config` both go through [`load`], so a file that passes
//! `check-config` is exactly a file `serve` accepts.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::tokens::{self, CharEstimator, Counter, Encoding};

// The provider presets live next to token counting; re-exported here for the
// callers that still name them through `config`.
pub use crate::tokens::{CostRule, Provider, SettleRule, Tokenizer};

/// Environment variable overriding `server.socket`.
pub const ENV_SOCKET: &str = "RATEKEEPER_SOCKET";
/// Environment variable overriding `redis.url`.
pub const ENV_REDIS_URL: &str = "RATEKEEPER_REDIS_URL";

/// Longest limit or priority class name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Largest `tokens_per_minute` / `requests_per_minute`.
pub const MAX_RATE_PER_MINUTE: u64 = 1_000_000_000;
/// Largest `burst_tokens` / `burst_requests`.
pub const MAX_BURST: u64 = 10_000_000_000;
/// Output tokens a messages cost reserves when it names no maximum and the
/// limit sets no `default_max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 1024;
/// Largest `max_wait_ms` of a priority class (one hour).
pub const MAX_WAIT_MS: u64 = 3_600_000;
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

/// What a closed connection's unreported leases do to their reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisconnectRule {
    /// Keep the reservation: the provider was probably called.
    Keep,
    /// Give `disconnect_refund_fraction` back after the grace period.
    Refund,
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
}

/// The shared store: one Redis node, or a Redis Cluster from seed nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisConfig {
    /// A single node (`redis://`, `rediss://`, `unix://`); `None` in cluster mode.
    pub url: Option<String>,
    /// Seed nodes of a Redis Cluster; empty for a single node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster_nodes: Vec<String>,
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

/// What acquires get while Redis is failing or too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Refuse with `StoreUnavailable`: never exceed the limit.
    FailClosed,
    /// Grant without limiting, and count it: never block the app.
    FailOpen,
    /// Limit with in-memory buckets holding `local_share` of each limit.
    Local,
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

impl RedisConfig {
    /// Defaults for everything but the nodes.
    pub fn with_url(url: impl Into<String>) -> Self {
        RedisConfig {
            url: Some(url.into()),
            cluster_nodes: Vec::new(),
            pool_size: 4,
            timeout_ms: 250,
            connect_timeout_ms: 1_000,
            key_prefix: "ratekeeper".to_string(),
            on_failure: FailurePolicy::FailClosed,
            local_share: None,
            tls_ca_file: None,
        }
    }

    /// The nodes, passwords masked, for logs.
    pub fn masked_nodes(&self) -> String {
        let nodes: Vec<String> = self
            .url
            .iter()
            .chain(&self.cluster_nodes)
            .map(|url| mask_redis_url(url))
            .collect();
        nodes.join(", ")
    }
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
}

/// The `tokenizer` key as written: a counter, or `auto` (the preset's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawTokenizer {
    Auto,
    O200kBase,
    Cl100kBase,
    Chars,
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
            _ => TokenBuckets::Combined(TokenRate {
                per_minute: self.tokens_per_minute,
                burst: self.burst_tokens,
            }),
        }
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
        }
    }

    /// What counts this limit's messages.
    pub fn counter(&self) -> Counter {
        let estimator = CharEstimator::new(
            self.chars_per_token
                .unwrap_or(CharEstimator::DEFAULT_CHARS_PER_TOKEN),
            self.safety_factor
                .unwrap_or(CharEstimator::DEFAULT_SAFETY_FACTOR),
        )
        // Validated when the config was loaded.
        .unwrap_or_default();
        self.tokenizer.counter(estimator)
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
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

/// A configuration that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
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
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: PathBuf::from("/tmp/ratekeeper.sock"),
            socket_mode: 0o660,
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
            drain_timeout_ms: 10_000,
        }
    }
}

impl PriorityClass {
    /// Name of the implicit class of a config that declares none.
    pub const DEFAULT_NAME: &'static str = "default";

    fn implicit_default() -> Self {
        PriorityClass {
            name: Self::DEFAULT_NAME.to_string(),
            reserved_fraction: 0.0,
            max_wait_ms: 10_000,
            limits: None,
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
    pub fn encodings(&self) -> std::collections::BTreeSet<Encoding> {
        self.limits
            .iter()
            .filter_map(|limit| limit.tokenizer.encoding())
            .collect()
    }
}

/// Loads and validates the configuration: the file when given (defaults
/// otherwise), then the environment overrides read through `env`.
///
/// Every problem found is reported, one per line, each as
/// `FILE:LINE:COLUMN: CONTEXT: MESSAGE` (or `VARIABLE: MESSAGE` for a bad
/// environment override).
pub fn load(
    path: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let parsed = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            parse(&text, &path.display().to_string())
        }
        None => Ok(Config::default()),
    };
    match parsed {
        Ok(mut config) => {
            let errors = apply_env(&mut config, &env);
            if errors.is_empty() {
                Ok(config)
            } else {
                Err(ConfigError::Invalid(errors.join("\n")))
            }
        }
        Err(mut errors) => {
            // Still check the overrides, so one run shows every problem.
            errors.extend(apply_env(&mut Config::default(), &env));
            Err(ConfigError::Invalid(errors.join("\n")))
        }
    }
}

/// Parses and validates configuration text (no environment overrides).
/// `origin` names the source in messages, normally the file's path.
pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
    parse(text, origin).map_err(|errors| ConfigError::Invalid(errors.join("\n")))
}

/// `url` with its password (if any) replaced by `****`: in the userinfo
/// (`redis://user:pass@host` → `redis://user:****@host`) and in `pass=` /
/// `password=` query parameters. A URL without a password is returned
/// unchanged.
pub fn mask_redis_url(url: &str) -> String {
    const MASK: &str = "****";
    let (prefix, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_len = if prefix.is_empty() {
        0
    } else {
        rest.find(['/', '?', '#']).unwrap_or(rest.len())
    };
    let (authority, tail) = rest.split_at(authority_len);

    let mut out = String::with_capacity(url.len());
    out.push_str(prefix);
    match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, password)) if !password.is_empty() => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(MASK);
                }
                _ => out.push_str(userinfo),
            }
            out.push_str(host);
        }
        None => out.push_str(authority),
    }

    // Query parameters carrying a password (`unix:///run/redis.sock?pass=x`).
    let Some(q) = tail.find('?') else {
        out.push_str(tail);
        return out;
    };
    let (before_query, query_and_fragment) = tail.split_at(q + 1);
    out.push_str(before_query);
    let (query, fragment) = match query_and_fragment.find('#') {
        Some(f) => query_and_fragment.split_at(f),
        None => (query_and_fragment, ""),
    };
    for (i, param) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match param.split_once('=') {
            Some((key, value))
                if !value.is_empty()
                    && (key.eq_ignore_ascii_case("pass")
                        || key.eq_ignore_ascii_case("password")) =>
            {
                out.push_str(key);
                out.push('=');
                out.push_str(MASK);
            }
            _ => out.push_str(param),
        }
    }
    out.push_str(fragment);
    out
}

impl Config {
    /// The effective configuration (every default filled in) as TOML, in the
    /// file format [`load`] reads, with the Redis password masked. This is
    /// what `ratekeeper check-config` prints.
    pub fn to_effective_toml(&self) -> String {
        let view = EffectiveFile {
            default_priority: &self.default_priority,
            server: EffectiveServer {
                socket: self.server.socket.to_string_lossy().into_owned(),
                socket_mode: format!("{:04o}", self.server.socket_mode),
                allowed_uids: &self.server.allowed_uids,
                allowed_gids: &self.server.allowed_gids,
                drain_timeout_ms: self.server.drain_timeout_ms,
            },
            redis: self.redis.as_ref().map(|redis| RedisConfig {
                url: redis.url.as_deref().map(mask_redis_url),
                cluster_nodes: redis
                    .cluster_nodes
                    .iter()
                    .map(|url| mask_redis_url(url))
                    .collect(),
                ..redis.clone()
            }),
            groups: &self.groups,
            limits: &self.limits,
            leases: &self.leases,
            priorities: &self.priorities,
        };
        match toml::to_string(&view) {
            Ok(text) => text,
            // Only reachable for a hand-built `Config` with numbers TOML
            // cannot hold (above i64::MAX); `load` never produces one.
            Err(err) => format!("# cannot render the effective configuration: {err}\n"),
        }
    }
}

#[derive(Serialize)]
struct EffectiveFile<'a> {
    default_priority: &'a str,
    server: EffectiveServer<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<RedisConfig>,
    groups: &'a [GroupConfig],
    limits: &'a [LimitConfig],
    leases: &'a LeaseConfig,
    priorities: &'a [PriorityClass],
}

#[derive(Serialize)]
struct EffectiveServer<'a> {
    socket: String,
    socket_mode: String,
    allowed_uids: &'a [u32],
    allowed_gids: &'a [u32],
    drain_timeout_ms: u64,
}

// ---------------------------------------------------------------------------
// Raw file structure: everything optional and spanned, numbers signed, so
// that validation (not deserialization) reports bad values, all of them, with
// their place in the file.

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of ratekeeper settings")]
struct RawFile {
    default_priority: Option<Spanned<String>>,
    server: Option<RawServer>,
    redis: Option<Spanned<RawRedis>>,
    #[serde(default)]
    groups: Vec<Spanned<RawGroup>>,
    #[serde(default)]
    limits: Vec<Spanned<RawLimit>>,
    #[serde(default)]
    priorities: Vec<Spanned<RawPriority>>,
    leases: Option<Spanned<RawLeases>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [leases] table")]
struct RawLeases {
    on_disconnect: Option<Spanned<DisconnectRule>>,
    disconnect_refund_fraction: Option<Spanned<f64>>,
    disconnect_grace_ms: Option<Spanned<i64>>,
    expire_after_ms: Option<Spanned<i64>>,
    max_open: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server] table")]
struct RawServer {
    socket: Option<Spanned<String>>,
    socket_mode: Option<Spanned<String>>,
    allowed_uids: Option<Vec<Spanned<i64>>>,
    allowed_gids: Option<Vec<Spanned<i64>>>,
    drain_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [redis] table")]
struct RawRedis {
    url: Option<Spanned<String>>,
    cluster_nodes: Option<Spanned<Vec<Spanned<String>>>>,
    pool_size: Option<Spanned<i64>>,
    timeout_ms: Option<Spanned<i64>>,
    connect_timeout_ms: Option<Spanned<i64>>,
    key_prefix: Option<Spanned<String>>,
    on_failure: Option<Spanned<FailurePolicy>>,
    local_share: Option<Spanned<f64>>,
    tls_ca_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[groups]] table")]
struct RawGroup {
    name: Option<Spanned<String>>,
    tokens_per_minute: Option<Spanned<i64>>,
    requests_per_minute: Option<Spanned<i64>>,
    burst_tokens: Option<Spanned<i64>>,
    burst_requests: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[limits]] table")]
struct RawLimit {
    name: Option<Spanned<String>>,
    tokens_per_minute: Option<Spanned<i64>>,
    requests_per_minute: Option<Spanned<i64>>,
    burst_tokens: Option<Spanned<i64>>,
    burst_requests: Option<Spanned<i64>>,
    model: Option<Spanned<String>>,
    tenant_share: Option<Spanned<f64>>,
    max_request_tokens: Option<Spanned<i64>>,
    group: Option<Spanned<String>>,
    input_tokens_per_minute: Option<Spanned<i64>>,
    output_tokens_per_minute: Option<Spanned<i64>>,
    burst_input_tokens: Option<Spanned<i64>>,
    burst_output_tokens: Option<Spanned<i64>>,
    provider: Option<Spanned<Provider>>,
    tokenizer: Option<Spanned<RawTokenizer>>,
    chars_per_token: Option<Spanned<f64>>,
    safety_factor: Option<Spanned<f64>>,
    default_max_output_tokens: Option<Spanned<i64>>,
    cost_rule: Option<Spanned<CostRule>>,
    settle: Option<Spanned<SettleRule>>,
    learn_max_output: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[priorities]] table")]
struct RawPriority {
    name: Option<Spanned<String>>,
    reserved_fraction: Option<Spanned<f64>>,
    max_wait_ms: Option<Spanned<i64>>,
    limits: Option<Spanned<Vec<Spanned<String>>>>,
}

/// Collects located problems, then renders them `origin:line:col: message`
/// in file order.
struct Diagnostics<'a> {
    text: &'a str,
    origin: &'a str,
    errors: Vec<(usize, String)>,
}

impl<'a> Diagnostics<'a> {
    fn new(text: &'a str, origin: &'a str) -> Self {
        Diagnostics {
            text,
            origin,
            errors: Vec::new(),
        }
    }

    fn error(&mut self, offset: usize, message: String) {
        self.errors.push((offset, message));
    }

    fn line_of(&self, offset: usize) -> usize {
        line_col(self.text, offset).0
    }

    fn located(&self, offset: usize, message: &str) -> String {
        let (line, column) = line_col(self.text, offset);
        format!("{}:{line}:{column}: {message}", self.origin)
    }

    fn finish(mut self) -> Vec<String> {
        self.errors.sort_by_key(|(offset, _)| *offset);
        self.errors
            .iter()
            .map(|(offset, message)| self.located(*offset, message))
            .collect()
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// `limits[1] "gpt-4o"` / `limits[1]` when the entry has no usable name.
fn entry_context(section: &str, index: usize, name: Option<&Spanned<String>>) -> String {
    match name {
        Some(name) if !name.get_ref().is_empty() => {
            format!("{section}[{index}] {:?}", name.get_ref())
        }
        _ => format!("{section}[{index}]"),
    }
}

fn parse(text: &str, origin: &str) -> Result<Config, Vec<String>> {
    let raw: RawFile = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(err) => {
            // toml's messages may quote a value (`invalid type: string
            // "redis://:pw@host"`): mask anything that looks like a URL.
            let message: Vec<String> = err
                .message()
                .split_whitespace()
                .map(mask_redis_url)
                .collect();
            let message = message
                .join(" ")
                .replace("expected i64", "expected an integer")
                .replace("expected f64", "expected a number");
            let message = match toml_key_path(&err) {
                Some(keys) => format!("{keys}: {message}"),
                None => message,
            };
            return Err(vec![match err.span() {
                Some(span) => {
                    let (line, column) = line_col(text, span.start);
                    format!("{origin}:{line}:{column}: {message}")
                }
                None => format!("{origin}: {message}"),
            }]);
        }
    };
    let mut d = Diagnostics::new(text, origin);
    let config = resolve(raw, &mut d);
    let errors = d.finish();
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}

/// The dotted key path toml attaches to a deserialization error (e.g.
/// `server.socket_mode`); toml only renders it when the error carries no
/// input, so render a copy without.
fn toml_key_path(err: &toml::de::Error) -> Option<String> {
    let mut bare = err.clone();
    bare.set_input(None);
    let rendered = bare.to_string();
    let rendered = rendered.trim_end();
    if rendered == err.message().trim_end() {
        return None;
    }
    let keys = rendered
        .lines()
        .last()?
        .strip_prefix("in `")?
        .strip_suffix('`')?;
    (!keys.is_empty()).then(|| keys.to_string())
}

/// An integer in `min..=max`, or an error at its place.
fn check_int(
    d: &mut Diagnostics,
    context: &str,
    field: &str,
    value: &Spanned<i64>,
    min: i64,
    max: u64,
) -> Option<u64> {
    let v = *value.get_ref();
    let at = value.span().start;
    if min > 0 && v < min {
        d.error(
            at,
            format!("{context}: {field} must be greater than zero (got {v})"),
        );
        None
    } else if v < min {
        d.error(
            at,
            format!("{context}: {field} must not be negative (got {v})"),
        );
        None
    } else if v as u64 > max {
        d.error(
            at,
            format!("{context}: {field} must be at most {max} (got {v})"),
        );
        None
    } else {
        Some(v as u64)
    }
}

/// Checks a limit or class name; `None` when unusable.
fn check_name(
    d: &mut Diagnostics,
    context: &str,
    name: Option<&Spanned<String>>,
    entry_at: usize,
) -> Option<String> {
    let Some(name) = name else {
        d.error(entry_at, format!("{context}: name is required"));
        return None;
    };
    let value = name.get_ref();
    let at = name.span().start;
    if value.is_empty() {
        d.error(at, format!("{context}: name must not be empty"));
        None
    } else if value.len() > MAX_NAME_LEN {
        d.error(
            at,
            format!(
                "{context}: name is {} bytes long, longer than the maximum of {MAX_NAME_LEN}",
                value.len()
            ),
        );
        None
    } else {
        Some(value.clone())
    }
}

/// Problem with a socket path, if any.
fn socket_problem(socket: &str) -> Option<String> {
    if socket.is_empty() {
        Some("socket must not be empty".to_string())
    } else if socket.len() > MAX_SOCKET_PATH_LEN {
        Some(format!(
            "socket path is {} bytes long, longer than the {MAX_SOCKET_PATH_LEN} a Unix socket address can hold",
            socket.len()
        ))
    } else {
        None
    }
}

/// Problem with a Redis URL, if any; messages show the URL masked.
fn redis_url_problem(url: &str) -> Option<String> {
    let scheme_rest = ["redis://", "rediss://", "unix://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme).map(|rest| (*scheme, rest)));
    match scheme_rest {
        None => Some(format!(
            "url {:?} must start with redis://, rediss:// or unix://",
            mask_redis_url(url)
        )),
        Some(("unix://", rest)) => {
            let path = rest.split(['?', '#']).next().unwrap_or("");
            path.is_empty().then(|| {
                format!(
                    "url {:?} names no socket path (e.g. unix:///run/redis/redis.sock)",
                    mask_redis_url(url)
                )
            })
        }
        Some((_, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = authority.rsplit('@').next().unwrap_or("");
            host.is_empty().then(|| {
                format!(
                    "url {:?} names no host (e.g. redis://127.0.0.1:6379/0)",
                    mask_redis_url(url)
                )
            })
        }
    }
}

/// `"0660"` (or `"660"`, `"0o660"`) → `0o660`; `None` when not octal. A
/// value too large for a `u32` comes back as `u32::MAX` (above any mode).
fn parse_socket_mode(mode: &str) -> Option<u32> {
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    Some(u32::from_str_radix(digits, 8).unwrap_or(u32::MAX))
}

fn resolve(raw: RawFile, d: &mut Diagnostics) -> Config {
    let mut config = Config::default();

    if let Some(server) = raw.server {
        resolve_server(server, &mut config.server, d);
    }

    if let Some(redis) = &raw.redis {
        config.redis = resolve_redis(redis, d);
    }

    config.groups = resolve_groups(&raw.groups, d);
    if let Some(leases) = &raw.leases {
        config.leases = resolve_leases(leases.get_ref(), d);
    }

    // Limits.
    let mut limit_lines: Vec<(String, usize)> = Vec::new();
    for (index, entry) in raw.limits.iter().enumerate() {
        let limit = entry.get_ref();
        let context = entry_context("limits", index, limit.name.as_ref());
        let name = check_name(d, &context, limit.name.as_ref(), entry.span().start);
        if let (Some(name), Some(spanned)) = (&name, &limit.name) {
            let at = spanned.span().start;
            if let Some((_, first_at)) = limit_lines.iter().find(|(n, _)| n == name) {
                let first_line = d.line_of(*first_at);
                d.error(
                    at,
                    format!("{context}: duplicate limit name {name:?} (first declared at line {first_line})"),
                );
            } else {
                limit_lines.push((name.clone(), at));
            }
        }
        if let Some(group) = &limit.group {
            if !raw
                .groups
                .iter()
                .any(|g| g.get_ref().name.as_ref().map(|n| n.get_ref()) == Some(group.get_ref()))
            {
                d.error(
                    group.span().start,
                    format!(
                        "{context}: group {:?} is not a declared group ({})",
                        group.get_ref(),
                        declared_list(config.groups.iter().map(|g| g.name.as_str()), "[[groups]]")
                    ),
                );
            }
        }
        if let Some(resolved) = resolve_limit(limit, &context, entry.span().start, d) {
            config.limits.push(LimitConfig {
                name: name.unwrap_or_default(),
                ..resolved
            });
        }
    }

    // Priority classes.
    let mut class_lines: Vec<(String, usize)> = Vec::new();
    let mut classes = Vec::new();
    for (index, entry) in raw.priorities.iter().enumerate() {
        let class = entry.get_ref();
        let context = entry_context("priorities", index, class.name.as_ref());
        let name = check_name(d, &context, class.name.as_ref(), entry.span().start);
        if let (Some(name), Some(spanned)) = (&name, &class.name) {
            let at = spanned.span().start;
            if let Some((_, first_at)) = class_lines.iter().find(|(n, _)| n == name) {
                let first_line = d.line_of(*first_at);
                d.error(
                    at,
                    format!("{context}: duplicate priority class name {name:?} (first declared at line {first_line})"),
                );
            } else {
                class_lines.push((name.clone(), at));
            }
        }
        let mut resolved = PriorityClass {
            name: name.unwrap_or_default(),
            ..PriorityClass::implicit_default()
        };
        if let Some(fraction) = &class.reserved_fraction {
            let v = *fraction.get_ref();
            if (0.0..1.0).contains(&v) {
                resolved.reserved_fraction = v;
            } else {
                d.error(
                    fraction.span().start,
                    format!("{context}: reserved_fraction must be in [0, 1) (got {v})"),
                );
            }
        }
        if let Some(wait) = &class.max_wait_ms {
            if let Some(v) = check_int(d, &context, "max_wait_ms", wait, 0, MAX_WAIT_MS) {
                resolved.max_wait_ms = v;
            }
        }
        if let Some(list) = &class.limits {
            if list.get_ref().is_empty() {
                d.error(
                    list.span().start,
                    format!(
                        "{context}: limits is empty, so the class applies to no limit (omit it to apply the class to all limits)"
                    ),
                );
            }
            for limit in list.get_ref() {
                if !raw.limits.iter().any(|l| {
                    l.get_ref().name.as_ref().map(|n| n.get_ref()) == Some(limit.get_ref())
                }) {
                    d.error(
                        limit.span().start,
                        format!(
                            "{context}: limits names {:?}, which is not a declared limit ({})",
                            limit.get_ref(),
                            declared_list(
                                limit_lines.iter().map(|(n, _)| n.as_str()),
                                "[[limits]]"
                            )
                        ),
                    );
                }
            }
            resolved.limits = Some(list.get_ref().iter().map(|l| l.get_ref().clone()).collect());
        }
        classes.push(resolved);
    }
    if !classes.is_empty() {
        config.priorities = classes;
    }

    match &raw.default_priority {
        Some(default) => {
            let name = default.get_ref();
            let known = if raw.priorities.is_empty() {
                name == PriorityClass::DEFAULT_NAME
            } else {
                class_lines.iter().any(|(n, _)| n == name)
            };
            if known {
                config.default_priority = name.clone();
            } else if raw.priorities.is_empty() {
                d.error(
                    default.span().start,
                    format!(
                        "default_priority {name:?} is not a declared priority class (no [[priorities]] are declared; the only class is the implicit {:?})",
                        PriorityClass::DEFAULT_NAME
                    ),
                );
            } else {
                d.error(
                    default.span().start,
                    format!(
                        "default_priority {name:?} is not a declared priority class ({})",
                        declared_list(
                            class_lines.iter().map(|(n, _)| n.as_str()),
                            "[[priorities]]"
                        )
                    ),
                );
            }
        }
        None => config.default_priority = config.priorities[0].name.clone(),
    }

    config
}

/// The `[redis]` section, or `None` (with the problems reported) when unusable.
fn resolve_redis(redis: &Spanned<RawRedis>, d: &mut Diagnostics) -> Option<RedisConfig> {
    let at = redis.span().start;
    let raw = redis.get_ref();
    let context = "redis";
    let mut resolved = RedisConfig::with_url(String::new());
    let mut usable = true;
    let check_url =
        |d: &mut Diagnostics, url: &Spanned<String>| match redis_url_problem(url.get_ref()) {
            Some(problem) => {
                d.error(url.span().start, format!("{context}: {problem}"));
                false
            }
            None => true,
        };
    match (&raw.url, &raw.cluster_nodes) {
        (None, None) => {
            d.error(
                at,
                "redis: url (or cluster_nodes) is required in the [redis] section (remove the section to use the embedded store)"
                    .to_string(),
            );
            usable = false;
        }
        (Some(_), Some(nodes)) => {
            d.error(
                nodes.span().start,
                "redis: give either url (one node) or cluster_nodes (a Redis Cluster), not both"
                    .to_string(),
            );
            usable = false;
        }
        (Some(url), None) => {
            usable &= check_url(d, url);
            resolved.url = Some(url.get_ref().clone());
        }
        (None, Some(nodes)) => {
            resolved.url = None;
            if nodes.get_ref().is_empty() {
                d.error(
                    nodes.span().start,
                    "redis: cluster_nodes is empty; list at least one seed node".to_string(),
                );
                usable = false;
            }
            for node in nodes.get_ref() {
                if node.get_ref().starts_with("unix://") {
                    d.error(
                        node.span().start,
                        "redis: cluster nodes are reached over TCP (redis:// or rediss://), not unix://".to_string(),
                    );
                    usable = false;
                } else {
                    usable &= check_url(d, node);
                }
                resolved.cluster_nodes.push(node.get_ref().clone());
            }
        }
    }
    if let Some(pool) = &raw.pool_size {
        match check_int(d, context, "pool_size", pool, 1, 64) {
            Some(v) => resolved.pool_size = v as u32,
            None => usable = false,
        }
    }
    for (field, value, target) in [
        ("timeout_ms", &raw.timeout_ms, &mut resolved.timeout_ms),
        (
            "connect_timeout_ms",
            &raw.connect_timeout_ms,
            &mut resolved.connect_timeout_ms,
        ),
    ] {
        if let Some(value) = value {
            match check_int(d, context, field, value, 1, 60_000) {
                Some(v) => *target = v,
                None => usable = false,
            }
        }
    }
    if let Some(prefix) = &raw.key_prefix {
        let value = prefix.get_ref();
        if value.is_empty() || value.len() > MAX_NAME_LEN || value.contains(['{', '}']) {
            d.error(
                prefix.span().start,
                format!("{context}: key_prefix must be 1 to {MAX_NAME_LEN} bytes without braces (braces are Redis Cluster hash tags) (got {value:?})"),
            );
            usable = false;
        } else {
            resolved.key_prefix = value.clone();
        }
    }
    if let Some(policy) = &raw.on_failure {
        resolved.on_failure = *policy.get_ref();
    }
    if let Some(share) = &raw.local_share {
        let v = *share.get_ref();
        if v > 0.0 && v <= 1.0 {
            resolved.local_share = Some(v);
        } else {
            d.error(
                share.span().start,
                format!("{context}: local_share must be in (0, 1] (got {v})"),
            );
            usable = false;
        }
    }
    if let Some(ca) = &raw.tls_ca_file {
        let uses_tls = resolved
            .url
            .iter()
            .chain(&resolved.cluster_nodes)
            .any(|url| url.starts_with("rediss://"));
        if !uses_tls {
            d.error(
                ca.span().start,
                format!("{context}: tls_ca_file is set but no node uses TLS (rediss://)"),
            );
            usable = false;
        } else if let Err(problem) = std::fs::read(ca.get_ref()) {
            d.error(
                ca.span().start,
                format!(
                    "{context}: cannot read tls_ca_file {:?}: {problem}",
                    ca.get_ref()
                ),
            );
            usable = false;
        } else {
            resolved.tls_ca_file = Some(PathBuf::from(ca.get_ref()));
        }
    }
    match (resolved.on_failure, &raw.local_share) {
        (FailurePolicy::Local, None) => {
            let at = raw.on_failure.as_ref().map_or(at, |p| p.span().start);
            d.error(
                at,
                format!("{context}: on_failure = \"local\" needs local_share: the fraction of each limit this sidecar may use while Redis is down (e.g. 1 / number of sidecars)"),
            );
            usable = false;
        }
        (FailurePolicy::FailClosed | FailurePolicy::FailOpen, Some(share)) => {
            d.error(
                share.span().start,
                format!("{context}: local_share only applies with on_failure = \"local\""),
            );
            usable = false;
        }
        _ => {}
    }
    usable.then_some(resolved)
}

/// The `[leases]` section; bad values are reported and left at their defaults.
fn resolve_leases(raw: &RawLeases, d: &mut Diagnostics) -> LeaseConfig {
    let context = "leases";
    let mut resolved = LeaseConfig::default();
    if let Some(rule) = &raw.on_disconnect {
        resolved.on_disconnect = *rule.get_ref();
    }
    if let Some(fraction) = &raw.disconnect_refund_fraction {
        let v = *fraction.get_ref();
        if (0.0..=1.0).contains(&v) {
            resolved.disconnect_refund_fraction = v;
        } else {
            d.error(
                fraction.span().start,
                format!("{context}: disconnect_refund_fraction must be in [0, 1] (got {v})"),
            );
        }
    }
    if let Some(grace) = &raw.disconnect_grace_ms {
        if let Some(v) = check_int(d, context, "disconnect_grace_ms", grace, 0, MAX_WAIT_MS) {
            resolved.disconnect_grace_ms = v;
        }
    }
    if let Some(expire) = &raw.expire_after_ms {
        if let Some(v) = check_int(d, context, "expire_after_ms", expire, 1, 7 * 24 * 3_600_000) {
            resolved.expire_after_ms = v;
        }
    }
    if let Some(max_open) = &raw.max_open {
        if let Some(v) = check_int(d, context, "max_open", max_open, 1, 100_000_000) {
            resolved.max_open = v;
        }
    }
    resolved
}

/// The `[[groups]]`, each checked; duplicates and bad values reported.
fn resolve_groups(raw: &[Spanned<RawGroup>], d: &mut Diagnostics) -> Vec<GroupConfig> {
    let mut groups: Vec<GroupConfig> = Vec::new();
    let mut group_lines: Vec<(String, usize)> = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let group = entry.get_ref();
        let context = entry_context("groups", index, group.name.as_ref());
        let name = check_name(d, &context, group.name.as_ref(), entry.span().start);
        if let (Some(name), Some(spanned)) = (&name, &group.name) {
            let at = spanned.span().start;
            if let Some((_, first_at)) = group_lines.iter().find(|(n, _)| n == name) {
                let first_line = d.line_of(*first_at);
                d.error(
                    at,
                    format!("{context}: duplicate group name {name:?} (first declared at line {first_line})"),
                );
            } else {
                group_lines.push((name.clone(), at));
            }
        }
        let rate = |d: &mut Diagnostics, field: &str, value: &Option<Spanned<i64>>, max: u64| {
            value
                .as_ref()
                .map(|v| check_int(d, &context, field, v, 1, max))
        };
        let tpm = rate(
            d,
            "tokens_per_minute",
            &group.tokens_per_minute,
            MAX_RATE_PER_MINUTE,
        );
        let rpm = rate(
            d,
            "requests_per_minute",
            &group.requests_per_minute,
            MAX_RATE_PER_MINUTE,
        );
        let burst_tokens = rate(d, "burst_tokens", &group.burst_tokens, MAX_BURST);
        let burst_requests = rate(d, "burst_requests", &group.burst_requests, MAX_BURST);
        if group.tokens_per_minute.is_none() && group.requests_per_minute.is_none() {
            d.error(
                entry.span().start,
                format!("{context}: a group needs tokens_per_minute, requests_per_minute or both"),
            );
        }
        for (burst, rate_field, rate_value) in [
            (
                &group.burst_tokens,
                "tokens_per_minute",
                &group.tokens_per_minute,
            ),
            (
                &group.burst_requests,
                "requests_per_minute",
                &group.requests_per_minute,
            ),
        ] {
            if let (Some(burst), None) = (burst, rate_value) {
                d.error(
                    burst.span().start,
                    format!(
                        "{context}: a burst is set but {rate_field} is not (a bucket needs a rate)"
                    ),
                );
            }
        }
        let (Some(tpm), Some(rpm), Some(burst_tokens), Some(burst_requests)) = (
            valid(tpm),
            valid(rpm),
            valid(burst_tokens),
            valid(burst_requests),
        ) else {
            continue;
        };
        groups.push(GroupConfig {
            name: name.unwrap_or_default(),
            tokens_per_minute: tpm,
            requests_per_minute: rpm,
            burst_tokens: burst_tokens.or(tpm),
            burst_requests: burst_requests.or(rpm),
        });
    }
    groups
}

fn declared_list<'a>(names: impl Iterator<Item = &'a str>, section: &str) -> String {
    let names: Vec<String> = names.map(|n| format!("{n:?}")).collect();
    if names.is_empty() {
        format!("no {section} are declared")
    } else {
        format!("declared: {}", names.join(", "))
    }
}

fn resolve_server(server: RawServer, out: &mut ServerConfig, d: &mut Diagnostics) {
    if let Some(socket) = server.socket {
        match socket_problem(socket.get_ref()) {
            Some(problem) => d.error(socket.span().start, format!("server: {problem}")),
            None => out.socket = PathBuf::from(socket.into_inner()),
        }
    }
    if let Some(mode) = server.socket_mode {
        match parse_socket_mode(mode.get_ref()) {
            Some(m) if m <= MAX_SOCKET_MODE => out.socket_mode = m,
            Some(_) => d.error(
                mode.span().start,
                format!(
                    "server: socket_mode {:?} is above the largest file mode \"0777\"",
                    mode.get_ref()
                ),
            ),
            None => d.error(
                mode.span().start,
                format!(
                    "server: socket_mode {:?} is not an octal file mode (e.g. \"0660\")",
                    mode.get_ref()
                ),
            ),
        }
    }
    for (field, ids, target) in [
        ("allowed_uids", server.allowed_uids, &mut out.allowed_uids),
        ("allowed_gids", server.allowed_gids, &mut out.allowed_gids),
    ] {
        for (i, id) in ids.iter().flatten().enumerate() {
            let label = format!("{field}[{i}]");
            if let Some(v) = check_int(d, "server", &label, id, 0, u64::from(u32::MAX)) {
                target.push(v as u32);
            }
        }
    }
    if let Some(drain) = server.drain_timeout_ms {
        if let Some(v) = check_int(d, "server", "drain_timeout_ms", &drain, 0, i64::MAX as u64) {
            out.drain_timeout_ms = v;
        }
    }
}

/// The resolved limit (name left empty for the caller), or `None` when a
/// required value is missing or wrong.
fn resolve_limit(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<LimitConfig> {
    let checked = |d: &mut Diagnostics, field: &str, value: &Option<Spanned<i64>>, max: u64| {
        value
            .as_ref()
            .map(|v| check_int(d, context, field, v, 1, max))
    };
    let mut usable = true;

    // The token buckets: one combined bucket, or an input and an output one.
    match (
        &limit.tokens_per_minute,
        &limit.input_tokens_per_minute,
        &limit.output_tokens_per_minute,
    ) {
        (None, None, None) => {
            d.error(
                entry_at,
                format!(
                    "{context}: tokens_per_minute is required (or input_tokens_per_minute and output_tokens_per_minute, for separate input and output buckets)"
                ),
            );
            usable = false;
        }
        (Some(_), Some(split), _) | (Some(_), None, Some(split)) => {
            d.error(
                split.span().start,
                format!(
                    "{context}: give either tokens_per_minute (one token bucket) or input_tokens_per_minute and output_tokens_per_minute (separate buckets), not both"
                ),
            );
            usable = false;
        }
        (None, Some(given), None) => {
            d.error(
                given.span().start,
                format!(
                    "{context}: input_tokens_per_minute needs output_tokens_per_minute too (separate buckets come in pairs)"
                ),
            );
            usable = false;
        }
        (None, None, Some(given)) => {
            d.error(
                given.span().start,
                format!(
                    "{context}: output_tokens_per_minute needs input_tokens_per_minute too (separate buckets come in pairs)"
                ),
            );
            usable = false;
        }
        _ => {}
    }
    let split = limit.tokens_per_minute.is_none()
        && (limit.input_tokens_per_minute.is_some() || limit.output_tokens_per_minute.is_some());
    let tpm = checked(
        d,
        "tokens_per_minute",
        &limit.tokens_per_minute,
        MAX_RATE_PER_MINUTE,
    );
    let input_tpm = checked(
        d,
        "input_tokens_per_minute",
        &limit.input_tokens_per_minute,
        MAX_RATE_PER_MINUTE,
    );
    let output_tpm = checked(
        d,
        "output_tokens_per_minute",
        &limit.output_tokens_per_minute,
        MAX_RATE_PER_MINUTE,
    );
    let rpm = checked(
        d,
        "requests_per_minute",
        &limit.requests_per_minute,
        MAX_RATE_PER_MINUTE,
    );
    let burst_tokens = checked(d, "burst_tokens", &limit.burst_tokens, MAX_BURST);
    let burst_input = checked(
        d,
        "burst_input_tokens",
        &limit.burst_input_tokens,
        MAX_BURST,
    );
    let burst_output = checked(
        d,
        "burst_output_tokens",
        &limit.burst_output_tokens,
        MAX_BURST,
    );
    let burst_requests = checked(d, "burst_requests", &limit.burst_requests, MAX_BURST);
    if let (Some(burst), None) = (&limit.burst_requests, &limit.requests_per_minute) {
        d.error(
            burst.span().start,
            format!("{context}: burst_requests is set but requests_per_minute is not (a request bucket needs a rate)"),
        );
    }
    if let (Some(burst), true) = (&limit.burst_tokens, split) {
        d.error(
            burst.span().start,
            format!("{context}: burst_tokens is set but this limit has separate input and output buckets (use burst_input_tokens and burst_output_tokens)"),
        );
        usable = false;
    }
    for (burst, burst_field, rate, rate_field) in [
        (
            &limit.burst_input_tokens,
            "burst_input_tokens",
            &limit.input_tokens_per_minute,
            "input_tokens_per_minute",
        ),
        (
            &limit.burst_output_tokens,
            "burst_output_tokens",
            &limit.output_tokens_per_minute,
            "output_tokens_per_minute",
        ),
    ] {
        if let (Some(burst), None) = (burst, rate) {
            d.error(
                burst.span().start,
                format!("{context}: {burst_field} is set but {rate_field} is not (a bucket needs a rate)"),
            );
            usable = false;
        }
    }
    let max_request_tokens = checked(
        d,
        "max_request_tokens",
        &limit.max_request_tokens,
        MAX_BURST,
    );
    let tenant_share = limit.tenant_share.as_ref().map(|share| {
        let v = *share.get_ref();
        if v > 0.0 && v <= 1.0 {
            Some(v)
        } else {
            d.error(
                share.span().start,
                format!("{context}: tenant_share must be in (0, 1] (got {v})"),
            );
            None
        }
    });

    // The largest request must fit in the token buckets.
    let or_rate = |burst: Option<Option<u64>>, rate: Option<Option<u64>>| match burst {
        Some(explicit) => explicit,
        None => rate.flatten(),
    };
    let effective_burst = burst_tokens.unwrap_or(tpm.flatten());
    let (input_burst, output_burst) = (
        or_rate(burst_input, input_tpm),
        or_rate(burst_output, output_tpm),
    );
    let capacity = if split {
        input_burst.zip(output_burst).map(|(i, o)| i + o)
    } else {
        effective_burst
    };
    if let (Some(burst), Some(Some(max_request))) = (capacity, max_request_tokens) {
        if burst < max_request {
            let max_at = limit
                .max_request_tokens
                .as_ref()
                .map_or(entry_at, |m| m.span().start);
            let (at, burst_desc) = match (&limit.burst_tokens, split) {
                (_, true) => (
                    max_at,
                    format!("the input and output buckets together ({burst})"),
                ),
                (Some(b), false) => (b.span().start, format!("burst_tokens ({burst})")),
                (None, false) => (
                    max_at,
                    format!("burst_tokens (defaulted to tokens_per_minute = {burst})"),
                ),
            };
            d.error(
                at,
                format!(
                    "{context}: {burst_desc} is below max_request_tokens ({max_request}): a request that large could never be admitted"
                ),
            );
        }
    }

    // Counting and settlement: the provider's preset, then the overrides.
    let provider = limit
        .provider
        .as_ref()
        .map_or(Provider::Generic, |p| *p.get_ref());
    let model = limit.model.as_ref().map(|m| m.get_ref().as_str());
    let tokenizer = match limit.tokenizer.as_ref().map(|t| *t.get_ref()) {
        Some(RawTokenizer::O200kBase) => Some(Tokenizer::O200kBase),
        Some(RawTokenizer::Cl100kBase) => Some(Tokenizer::Cl100kBase),
        Some(RawTokenizer::Chars) => Some(Tokenizer::Chars),
        None | Some(RawTokenizer::Auto) => match provider.auto_tokenizer(model) {
            Ok(tokenizer) => Some(tokenizer),
            Err(problem) => {
                let at = match (&limit.model, &limit.provider) {
                    (Some(model), _) => model.span().start,
                    (None, Some(provider)) => provider.span().start,
                    (None, None) => entry_at,
                };
                d.error(at, format!("{context}: {problem}"));
                None
            }
        },
    };
    let (mut chars_per_token, mut safety_factor) = (None, None);
    match tokenizer {
        Some(Tokenizer::Chars) => {
            let given = |value: &Option<Spanned<f64>>, default: f64| {
                value.as_ref().map_or(default, |v| *v.get_ref())
            };
            let chars = given(
                &limit.chars_per_token,
                CharEstimator::DEFAULT_CHARS_PER_TOKEN,
            );
            let safety = given(&limit.safety_factor, CharEstimator::DEFAULT_SAFETY_FACTOR);
            match CharEstimator::new(chars, safety) {
                Ok(_) => (chars_per_token, safety_factor) = (Some(chars), Some(safety)),
                Err(tokens::TokenError::InvalidEstimator {
                    parameter,
                    value,
                    expected,
                }) => {
                    let spanned = match parameter {
                        "chars_per_token" => &limit.chars_per_token,
                        _ => &limit.safety_factor,
                    };
                    let at = spanned.as_ref().map_or(entry_at, |v| v.span().start);
                    d.error(
                        at,
                        format!("{context}: {parameter} must be {expected} (got {value})"),
                    );
                    usable = false;
                }
                Err(other) => {
                    d.error(entry_at, format!("{context}: {other}"));
                    usable = false;
                }
            }
        }
        Some(tiktoken) => {
            for (field, value) in [
                ("chars_per_token", &limit.chars_per_token),
                ("safety_factor", &limit.safety_factor),
            ] {
                if let Some(value) = value {
                    let encoding = tiktoken.encoding().map_or("tiktoken", Encoding::name);
                    d.error(
                        value.span().start,
                        format!(
                            "{context}: {field} only applies to the character estimate (tokenizer = \"chars\"), but this limit counts with {encoding}"
                        ),
                    );
                    usable = false;
                }
            }
        }
        None => usable = false,
    }
    let default_max_output_tokens = match &limit.default_max_output_tokens {
        Some(v) => check_int(d, context, "default_max_output_tokens", v, 0, MAX_BURST),
        None => Some(DEFAULT_MAX_OUTPUT_TOKENS),
    };

    let rpm = valid(rpm)?;
    if !usable {
        return None;
    }
    Some(LimitConfig {
        name: String::new(),
        tokens_per_minute: if split { 0 } else { tpm.flatten()? },
        requests_per_minute: rpm,
        burst_tokens: if split { 0 } else { effective_burst? },
        burst_requests: match burst_requests {
            Some(b) => Some(b?),
            None => rpm,
        },
        input_tokens_per_minute: if split {
            Some(input_tpm.flatten()?)
        } else {
            None
        },
        output_tokens_per_minute: if split {
            Some(output_tpm.flatten()?)
        } else {
            None
        },
        burst_input_tokens: if split { Some(input_burst?) } else { None },
        burst_output_tokens: if split { Some(output_burst?) } else { None },
        model: model.map(str::to_string),
        tenant_share: valid(tenant_share)?,
        max_request_tokens: valid(max_request_tokens)?,
        group: limit.group.as_ref().map(|g| g.get_ref().clone()),
        provider,
        tokenizer: tokenizer?,
        chars_per_token,
        safety_factor,
        default_max_output_tokens: default_max_output_tokens?,
        cost_rule: limit
            .cost_rule
            .as_ref()
            .map_or(provider.cost_rule(), |rule| *rule.get_ref()),
        settle: limit
            .settle
            .as_ref()
            .map_or(provider.settle_rule(), |rule| *rule.get_ref()),
        learn_max_output: limit
            .learn_max_output
            .as_ref()
            .is_some_and(|learn| *learn.get_ref()),
    })
}

/// An optional value that was checked: absent (`Some(None)`), valid
/// (`Some(Some(v))`) or invalid (`None`).
fn valid<T>(checked: Option<Option<T>>) -> Option<Option<T>> {
    match checked {
        None => Some(None),
        Some(Some(v)) => Some(Some(v)),
        Some(None) => None,
    }
}

/// Applies the environment overrides; returns the problems with them.
fn apply_env(config: &mut Config, env: &impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(socket) = env(ENV_SOCKET) {
        match socket_problem(&socket) {
            Some(problem) => errors.push(format!("{ENV_SOCKET}: {problem}")),
            None => config.server.socket = PathBuf::from(socket),
        }
    }
    if let Some(url) = env(ENV_REDIS_URL) {
        match redis_url_problem(&url) {
            Some(problem) => errors.push(format!("{ENV_REDIS_URL}: {problem}")),
            // The variable replaces the file's nodes (a cluster included)
            // and keeps its other settings.
            None => {
                let redis = config
                    .redis
                    .get_or_insert_with(|| RedisConfig::with_url(url.clone()));
                redis.url = Some(url);
                redis.cluster_nodes.clear();
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests;
