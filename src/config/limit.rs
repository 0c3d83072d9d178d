//! One `[[limits]]` entry as the daemon reads it: its buckets, windows,
//! counting and charging, and the arithmetic of its usable bursts.

use serde::{Deserialize, Serialize};

use super::model::Budgets;
use crate::budget::money::Price;
use crate::limiter::{BucketRole, Refill, Window};
use crate::tokens::{CharEstimator, CostRule, Counter, Provider, SettleRule, Tokenizer};

/// One provider limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitConfig {
    pub name: String,
    /// Refill rate of the combined token bucket; 0 when the limit has
    /// separate input and output buckets instead (see [`Self::token_buckets`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub tokens_per_minute: u64,
    pub requests_per_minute: Option<u64>,
    /// Combined token bucket capacity; defaults to one enforcement window's
    /// worth; 0
    /// with separate input and output buckets.
    #[serde(skip_serializing_if = "is_zero")]
    pub burst_tokens: u64,
    /// Request bucket capacity; defaults to one enforcement window's worth.
    pub burst_requests: Option<u64>,
    /// Refill rate of the separate input-token bucket (prompt tokens).
    pub input_tokens_per_minute: Option<u64>,
    /// Refill rate of the separate output-token bucket (completion tokens).
    pub output_tokens_per_minute: Option<u64>,
    /// Input bucket capacity; defaults to one enforcement window's worth.
    pub burst_input_tokens: Option<u64>,
    /// Output bucket capacity; defaults to one enforcement window's worth.
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
    /// The longest pause a provider's 429 (`retry-after`, through
    /// feedback) sets on the limit, in ms; 0: a 429 pauses nothing (its
    /// counts still apply).
    pub max_pause_ms: u64,
    /// The shortest window over which the provider may enforce the
    /// per-minute figures: the default bursts hold one of it, and a single
    /// request larger than that still passes once its bucket is full (see
    /// [`LimitConfig::largest_cost`]).
    pub enforcement_window: EnforcementWindow,
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
    /// Its spend budgets.
    #[serde(flatten)]
    pub budgets: Budgets,
    /// What its calls cost: `price`, else the price table's for `model`;
    /// required when any budget applies to the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
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

/// The shortest window over which a provider may enforce a limit's
/// per-minute figures. OpenAI ("60,000 requests/minute may be enforced as
/// 1,000 requests/second") and Anthropic ("60 RPM may be enforced as 1
/// request per second") both document one second; a bucket holding a
/// minute's worth would spend it in the first second of a cold start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnforcementWindow {
    /// Bursts default to one second of the rate; a request larger than that
    /// waits until its bucket is full, then passes (as a provider that
    /// quantizes its minute into seconds lets it).
    Second,
    /// Bursts default to a minute's worth: a provider that keeps one bucket
    /// per minute figure.
    Minute,
}

impl EnforcementWindow {
    /// The window a preset assumes: one second for the providers that
    /// document enforcing per second, a minute otherwise (a provider that
    /// keeps one bucket per minute figure).
    pub fn of_provider(provider: Provider) -> EnforcementWindow {
        match provider {
            Provider::Openai | Provider::Anthropic => EnforcementWindow::Second,
            Provider::Generic => EnforcementWindow::Minute,
        }
    }

    /// The window's length.
    pub fn ms(self) -> u64 {
        match self {
            EnforcementWindow::Second => 1_000,
            EnforcementWindow::Minute => 60_000,
        }
    }

    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            EnforcementWindow::Second => "second",
            EnforcementWindow::Minute => "minute",
        }
    }

    /// The default burst of a bucket of `per_minute`: one window's worth,
    /// rounded down (so never above what the provider's window holds), at
    /// least one.
    pub fn default_burst(self, per_minute: u64) -> u64 {
        (u128::from(per_minute) * u128::from(self.ms()) / 60_000).max(1) as u64
    }
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
    ///
    /// With a one-second enforcement window a large request does not need
    /// the burst to hold it ([`Self::largest_cost`]), so `max_request_tokens`
    /// does not limit the headroom.
    pub fn usable_burst(&self, role: BucketKind, refill: &Refill, burst: u64) -> u64 {
        let held = u128::from(refill.amount()) * u128::from(self.burst_headroom_ms)
            / u128::from(refill.window().ms());
        let floor = match (role, self.max_request_tokens, self.enforcement_window) {
            (BucketKind::Tokens, Some(max_request), EnforcementWindow::Minute) => {
                (burst / 2).max(max_request.min(burst))
            }
            _ => burst / 2,
        };
        burst - (held.min(u128::from(burst - floor)) as u64)
    }

    /// The largest cost one acquire may take from one of the limit's own
    /// per-minute buckets of `capacity` (its usable burst) and `per_minute`.
    ///
    /// Under a minute's enforcement that is the capacity: more can never be
    /// granted. Under a second's, a provider still accepts a request larger
    /// than one second's worth (a long prompt on a small limit) once its
    /// bucket is full, up to the per-minute figure itself: such a request
    /// waits until the bucket is full, then takes it below zero
    /// ([`crate::limiter::bucket`]).
    pub fn largest_cost(&self, capacity: u64, per_minute: u64) -> u64 {
        match self.enforcement_window {
            EnforcementWindow::Second => capacity.max(per_minute),
            EnforcementWindow::Minute => capacity,
        }
    }

    /// What counts this limit's messages.
    pub fn counter(&self) -> Counter {
        self.tokenizer
            .counter(self.chars_per_token, self.safety_factor)
            // Validated when the config was loaded.
            .unwrap_or(Counter::Chars(CharEstimator::default()))
    }
}
