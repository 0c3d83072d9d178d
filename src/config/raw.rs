//! The file as written: the serde schema of the TOML file.
//!
//! Everything is optional and spanned, and numbers are signed, so that
//! validation (not deserialization) reports bad values, all of them, with
//! their place in the file. Only unknown keys and values of the wrong type
//! stop deserialization. Resolution (`super::resolve`) turns this into the
//! typed [`Config`](super::Config).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::model::{DisconnectRule, EnforcementWindow, FailurePolicy, LimitMode};
use crate::budget::period::Calendar;
use crate::budget::spans::Span;
use crate::limiter::Window;
use crate::tokens::{CostRule, Provider, SettleRule, Tokenizer};

/// The whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of ratekeeper settings")]
pub(super) struct RawFile {
    pub default_priority: Option<Spanned<String>>,
    pub server: Option<RawServer>,
    pub redis: Option<Spanned<RawRedis>>,
    #[serde(default)]
    pub groups: Vec<Spanned<RawGroup>>,
    #[serde(default)]
    pub limits: Vec<Spanned<RawLimit>>,
    #[serde(default)]
    pub priorities: Vec<Spanned<RawPriority>>,
    pub leases: Option<Spanned<RawLeases>>,
    pub metrics: Option<Spanned<RawMetrics>>,
    #[serde(default)]
    pub clients: Vec<Spanned<RawClient>>,
    pub budgets: Option<Spanned<RawBudgets>>,
}

/// `[budgets]`: what every spend budget shares.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [budgets] table")]
pub(super) struct RawBudgets {
    pub time_zone: Option<Spanned<String>>,
}

/// A budget table: `{ day = "1.00", rolling_hour = "0.20" }`.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a budget table of amounts by day, week, month, rolling_hour or rolling_day"
)]
pub(super) struct RawBudget {
    pub day: Option<Spanned<String>>,
    pub week: Option<Spanned<String>>,
    pub month: Option<Spanned<String>>,
    pub rolling_hour: Option<Spanned<String>>,
    pub rolling_day: Option<Spanned<String>>,
}

impl RawBudget {
    /// Each span with its amount as written, in [`Span::ALL`]'s order.
    pub fn amounts(&self) -> [(Span, &Option<Spanned<String>>); 5] {
        [
            (Span::Calendar(Calendar::Day), &self.day),
            (Span::Calendar(Calendar::Week), &self.week),
            (Span::Calendar(Calendar::Month), &self.month),
            (Span::RollingHour, &self.rolling_hour),
            (Span::RollingDay, &self.rolling_day),
        ]
    }
}

/// A limit's `price`, in the currency's units per million tokens.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a price table: input, cached_input, cache_write and output per million tokens"
)]
pub(super) struct RawPrice {
    pub input: Option<Spanned<String>>,
    pub cached_input: Option<Spanned<String>>,
    pub cache_write: Option<Spanned<String>>,
    pub output: Option<Spanned<String>>,
}

/// One `[[clients]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[clients]] table")]
pub(super) struct RawClient {
    pub uids: Option<Spanned<Vec<Spanned<i64>>>>,
    pub other_uids: Option<Spanned<bool>>,
    pub tenants: Option<Spanned<Vec<Spanned<String>>>>,
    pub priorities: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[metrics]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [metrics] table")]
pub(super) struct RawMetrics {
    pub listen: Option<Spanned<String>>,
    pub tenants: Option<Vec<Spanned<String>>>,
}

/// `[server]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server] table")]
pub(super) struct RawServer {
    pub socket: Option<Spanned<String>>,
    pub socket_mode: Option<Spanned<String>>,
    pub allow_world_writable_dir: Option<bool>,
    pub allowed_uids: Option<Vec<Spanned<i64>>>,
    pub allowed_gids: Option<Vec<Spanned<i64>>>,
    pub drain_timeout_ms: Option<Spanned<i64>>,
    pub max_connections: Option<Spanned<i64>>,
    pub max_connections_per_uid: Option<Spanned<i64>>,
    pub max_buffered_bytes: Option<Spanned<i64>>,
    pub hello_timeout_ms: Option<Spanned<i64>>,
    pub frame_timeout_ms: Option<Spanned<i64>>,
    pub threads: Option<Spanned<i64>>,
}

/// `[redis]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [redis] table")]
pub(super) struct RawRedis {
    pub url: Option<Spanned<String>>,
    pub cluster_nodes: Option<Spanned<Vec<Spanned<String>>>>,
    pub sentinels: Option<Spanned<Vec<Spanned<String>>>>,
    pub master_name: Option<Spanned<String>>,
    pub master_username: Option<Spanned<String>>,
    pub master_password: Option<Spanned<String>>,
    pub master_db: Option<Spanned<i64>>,
    pub pool_size: Option<Spanned<i64>>,
    pub timeout_ms: Option<Spanned<i64>>,
    pub connect_timeout_ms: Option<Spanned<i64>>,
    pub key_prefix: Option<Spanned<String>>,
    pub on_failure: Option<Spanned<FailurePolicy>>,
    pub local_share: Option<Spanned<f64>>,
    pub tls_ca_file: Option<Spanned<String>>,
}

/// `[leases]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [leases] table")]
pub(super) struct RawLeases {
    pub on_disconnect: Option<Spanned<DisconnectRule>>,
    pub disconnect_refund_fraction: Option<Spanned<f64>>,
    pub disconnect_grace_ms: Option<Spanned<i64>>,
    pub expire_after_ms: Option<Spanned<i64>>,
    pub max_open: Option<Spanned<i64>>,
}

/// One `[[groups]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[groups]] table")]
pub(super) struct RawGroup {
    pub name: Option<Spanned<String>>,
    pub tokens_per_minute: Option<Spanned<i64>>,
    pub requests_per_minute: Option<Spanned<i64>>,
    pub burst_tokens: Option<Spanned<i64>>,
    pub burst_requests: Option<Spanned<i64>>,
    pub budget: Option<Spanned<RawBudget>>,
    pub tenant_budget: Option<Spanned<RawBudget>>,
    pub tenant_budgets: Option<Spanned<BTreeMap<String, Spanned<RawBudget>>>>,
}

/// One `[[limits]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[limits]] table")]
pub(super) struct RawLimit {
    pub name: Option<Spanned<String>>,
    pub tokens_per_minute: Option<Spanned<i64>>,
    pub requests_per_minute: Option<Spanned<i64>>,
    pub burst_tokens: Option<Spanned<i64>>,
    pub burst_requests: Option<Spanned<i64>>,
    pub model: Option<Spanned<String>>,
    pub tenant_share: Option<Spanned<f64>>,
    pub max_request_tokens: Option<Spanned<i64>>,
    pub group: Option<Spanned<String>>,
    pub input_tokens_per_minute: Option<Spanned<i64>>,
    pub output_tokens_per_minute: Option<Spanned<i64>>,
    pub burst_input_tokens: Option<Spanned<i64>>,
    pub burst_output_tokens: Option<Spanned<i64>>,
    pub provider: Option<Spanned<Provider>>,
    pub tokenizer: Option<Spanned<RawTokenizer>>,
    pub chars_per_token: Option<Spanned<f64>>,
    pub safety_factor: Option<Spanned<f64>>,
    pub default_max_output_tokens: Option<Spanned<i64>>,
    pub cost_rule: Option<Spanned<CostRule>>,
    pub settle: Option<Spanned<SettleRule>>,
    pub learn_max_output: Option<Spanned<bool>>,
    pub burst_headroom_ms: Option<Spanned<i64>>,
    pub max_pause_ms: Option<Spanned<i64>>,
    pub enforcement_window: Option<Spanned<EnforcementWindow>>,
    pub mode: Option<Spanned<LimitMode>>,
    pub max_concurrent: Option<Spanned<i64>>,
    pub concurrent_timeout_ms: Option<Spanned<i64>>,
    pub tokens_per_second: Option<Spanned<i64>>,
    pub tokens_per_hour: Option<Spanned<i64>>,
    pub tokens_per_day: Option<Spanned<i64>>,
    pub requests_per_second: Option<Spanned<i64>>,
    pub requests_per_hour: Option<Spanned<i64>>,
    pub requests_per_day: Option<Spanned<i64>>,
    pub budget: Option<Spanned<RawBudget>>,
    pub tenant_budget: Option<Spanned<RawBudget>>,
    pub tenant_budgets: Option<Spanned<BTreeMap<String, Spanned<RawBudget>>>>,
    pub price: Option<Spanned<RawPrice>>,
}

impl RawLimit {
    /// The windows other than a minute the limit sets, as written:
    /// (counts requests, window, figure).
    pub fn other_windows(&self) -> [(bool, Window, &Option<Spanned<i64>>); 6] {
        [
            (false, Window::Second, &self.tokens_per_second),
            (false, Window::Hour, &self.tokens_per_hour),
            (false, Window::Day, &self.tokens_per_day),
            (true, Window::Second, &self.requests_per_second),
            (true, Window::Hour, &self.requests_per_hour),
            (true, Window::Day, &self.requests_per_day),
        ]
    }
}

/// One `[[priorities]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[priorities]] table")]
pub(super) struct RawPriority {
    pub name: Option<Spanned<String>>,
    pub reserved_fraction: Option<Spanned<f64>>,
    pub max_wait_ms: Option<Spanned<i64>>,
    pub limits: Option<Spanned<Vec<Spanned<String>>>>,
}

/// The `tokenizer` key as written: a counter, or `auto` (the preset's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawTokenizer {
    Auto,
    O200kBase,
    Cl100kBase,
    Chars,
    OpenaiChars,
}

impl RawTokenizer {
    /// The counter named, or `None` for `auto`.
    pub fn named(self) -> Option<Tokenizer> {
        match self {
            RawTokenizer::Auto => None,
            RawTokenizer::O200kBase => Some(Tokenizer::O200kBase),
            RawTokenizer::Cl100kBase => Some(Tokenizer::Cl100kBase),
            RawTokenizer::Chars => Some(Tokenizer::Chars),
            RawTokenizer::OpenaiChars => Some(Tokenizer::OpenaiChars),
        }
    }
}
