//! A limit's buckets: one combined token bucket or separate input and
//! output ones, the request bucket, the tenant share, and the largest
//! request, which must fit in the token buckets. Bursts not given hold one
//! enforcement window's worth of their rate.

use crate::config::diagnostics::{Checked, Diagnostics, Fraction, check_fraction, check_positive};
use crate::config::model::{EnforcementWindow, MAX_BURST, MAX_RATE_PER_MINUTE, TokenRate};
use crate::config::raw::RawLimit;

/// The bucket settings of a limit, resolved.
pub(super) struct BucketSettings {
    /// The combined token bucket; zero with separate buckets.
    pub combined: TokenRate,
    /// The separate input bucket, if any.
    pub input: Option<TokenRate>,
    /// The separate output bucket, if any.
    pub output: Option<TokenRate>,
    pub requests_per_minute: Option<u64>,
    pub burst_requests: Option<u64>,
    pub tenant_share: Option<f64>,
    pub max_request_tokens: Option<u64>,
    /// Figures over windows other than a minute, in the order of
    /// [`RawLimit::other_windows`].
    pub other_windows: [Option<u64>; 6],
}

/// The limit's bucket settings, or `None` (problems reported) when a value
/// is missing or wrong.
pub(super) fn resolve_buckets(
    limit: &RawLimit,
    window: EnforcementWindow,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<BucketSettings> {
    let mut usable = check_token_bucket_kind(limit, context, entry_at, d);
    let rates = CheckedRates::check(limit, window, context, d);
    let other_windows = limit.other_windows().map(|(requests, window, figure)| {
        let unit = if requests { "requests" } else { "tokens" };
        let field = format!("{unit}_per_{}", window.name());
        check_positive(d, context, &field, figure, MAX_BURST)
    });
    usable &= check_bursts_have_rates(limit, rates.split, context, d);
    let max_request_tokens = check_positive(
        d,
        context,
        "max_request_tokens",
        &limit.max_request_tokens,
        MAX_BURST,
    );
    let tenant_share = check_tenant_share(limit, context, d);
    if let (Some(share), None, false) = (&limit.tenant_share, &limit.tokens_per_minute, rates.split)
    {
        d.error(
            share.span().start,
            format!("{context}: tenant_share is a share of the per-minute token bucket, and this limit has none (set tokens_per_minute)"),
        );
        usable = false;
    }
    if let (Some(capacity), Checked::Valid(max_request)) =
        (rates.largest_token_cost(), max_request_tokens)
    {
        check_max_request_fits(limit, &rates, capacity, max_request, context, entry_at, d);
    }

    let requests_per_minute = rates.requests_per_minute.resolved()?;
    if !usable {
        return None;
    }
    let none = TokenRate {
        per_minute: 0,
        burst: 0,
    };
    let (combined, input, output) = if rates.split {
        (none, Some(rates.input()?), Some(rates.output()?))
    } else if limit.tokens_per_minute.is_none() {
        (none, None, None)
    } else {
        (rates.combined()?, None, None)
    };
    let mut resolved_windows = [None; 6];
    for (resolved, checked) in resolved_windows.iter_mut().zip(other_windows) {
        *resolved = checked.resolved()?;
    }
    Some(BucketSettings {
        combined,
        input,
        output,
        requests_per_minute,
        burst_requests: rates
            .burst_requests
            .resolved()?
            .or(requests_per_minute.map(|per_minute| window.default_burst(per_minute))),
        tenant_share: tenant_share.resolved()?,
        max_request_tokens: max_request_tokens.resolved()?,
        other_windows: resolved_windows,
    })
}

/// A limit's rates and bursts, each checked.
struct CheckedRates {
    /// What the default bursts hold one of.
    window: EnforcementWindow,
    /// Separate input and output token buckets rather than one combined.
    split: bool,
    tokens_per_minute: Checked<u64>,
    input_tokens_per_minute: Checked<u64>,
    output_tokens_per_minute: Checked<u64>,
    requests_per_minute: Checked<u64>,
    burst_tokens: Checked<u64>,
    burst_input_tokens: Checked<u64>,
    burst_output_tokens: Checked<u64>,
    burst_requests: Checked<u64>,
}

impl CheckedRates {
    /// Checks every rate and burst the limit sets against its bound.
    fn check(
        limit: &RawLimit,
        window: EnforcementWindow,
        context: &str,
        d: &mut Diagnostics,
    ) -> Self {
        let mut rate =
            |field: &str, value| check_positive(d, context, field, value, MAX_RATE_PER_MINUTE);
        let tokens_per_minute = rate("tokens_per_minute", &limit.tokens_per_minute);
        let input_tokens_per_minute =
            rate("input_tokens_per_minute", &limit.input_tokens_per_minute);
        let output_tokens_per_minute =
            rate("output_tokens_per_minute", &limit.output_tokens_per_minute);
        let requests_per_minute = rate("requests_per_minute", &limit.requests_per_minute);
        let mut burst = |field: &str, value| check_positive(d, context, field, value, MAX_BURST);
        CheckedRates {
            window,
            split: limit.tokens_per_minute.is_none()
                && (limit.input_tokens_per_minute.is_some()
                    || limit.output_tokens_per_minute.is_some()),
            tokens_per_minute,
            input_tokens_per_minute,
            output_tokens_per_minute,
            requests_per_minute,
            burst_tokens: burst("burst_tokens", &limit.burst_tokens),
            burst_input_tokens: burst("burst_input_tokens", &limit.burst_input_tokens),
            burst_output_tokens: burst("burst_output_tokens", &limit.burst_output_tokens),
            burst_requests: burst("burst_requests", &limit.burst_requests),
        }
    }

    /// One enforcement window's worth of a rate, when known.
    fn window_burst(&self, per_minute: &Checked<u64>) -> Option<u64> {
        per_minute
            .value()
            .map(|per_minute| self.window.default_burst(per_minute))
    }

    /// Capacity of the combined bucket: `burst_tokens`, else one
    /// enforcement window's worth; `None` when unknown (absent or invalid).
    fn combined_burst(&self) -> Option<u64> {
        self.burst_tokens
            .or_default(self.window_burst(&self.tokens_per_minute))
    }

    /// Capacity of the input bucket, likewise.
    fn input_burst(&self) -> Option<u64> {
        self.burst_input_tokens
            .or_default(self.window_burst(&self.input_tokens_per_minute))
    }

    /// Capacity of the output bucket, likewise.
    fn output_burst(&self) -> Option<u64> {
        self.burst_output_tokens
            .or_default(self.window_burst(&self.output_tokens_per_minute))
    }

    /// The combined bucket, when its rate and capacity are valid.
    fn combined(&self) -> Option<TokenRate> {
        Some(TokenRate {
            per_minute: self.tokens_per_minute.value()?,
            burst: self.combined_burst()?,
        })
    }

    /// The input bucket, likewise.
    fn input(&self) -> Option<TokenRate> {
        Some(TokenRate {
            per_minute: self.input_tokens_per_minute.value()?,
            burst: self.input_burst()?,
        })
    }

    /// The output bucket, likewise.
    fn output(&self) -> Option<TokenRate> {
        Some(TokenRate {
            per_minute: self.output_tokens_per_minute.value()?,
            burst: self.output_burst()?,
        })
    }

    /// Capacity of the token buckets together, when known.
    fn token_capacity(&self) -> Option<u64> {
        if self.split {
            self.input_burst()
                .zip(self.output_burst())
                .map(|(input, output)| input + output)
        } else {
            self.combined_burst()
        }
    }

    /// The largest request the token buckets together can ever grant, when
    /// known: their capacity; under a second's enforcement, up to their
    /// per-minute figure (a request larger than a second's worth passes
    /// once the buckets are full, `LimitConfig::largest_cost`).
    fn largest_token_cost(&self) -> Option<u64> {
        let capacity = self.token_capacity()?;
        if self.window == EnforcementWindow::Minute {
            return Some(capacity);
        }
        let per_minute = if self.split {
            self.input_tokens_per_minute
                .value()
                .zip(self.output_tokens_per_minute.value())
                .map(|(input, output)| input + output)
        } else {
            self.tokens_per_minute.value()
        };
        Some(per_minute.map_or(capacity, |per_minute| capacity.max(per_minute)))
    }
}

/// At most one kind of token bucket: `tokens_per_minute`, or both
/// `input_tokens_per_minute` and `output_tokens_per_minute`; and some
/// bucket, of tokens or of requests. Whether it is so.
fn check_token_bucket_kind(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> bool {
    let any_other_bucket = limit.requests_per_minute.is_some()
        || limit.max_concurrent.is_some()
        || limit
            .other_windows()
            .iter()
            .any(|(_, _, figure)| figure.is_some());
    let (at, problem) = match (
        &limit.tokens_per_minute,
        &limit.input_tokens_per_minute,
        &limit.output_tokens_per_minute,
    ) {
        (None, None, None) if !any_other_bucket => (
            entry_at,
            "a limit needs a bucket: tokens_per_minute (or input_tokens_per_minute and output_tokens_per_minute, for separate input and output buckets), requests_per_minute, tokens or requests per second, hour or day, or max_concurrent",
        ),
        (Some(_), Some(split), _) | (Some(_), None, Some(split)) => (
            split.span().start,
            "give either tokens_per_minute (one token bucket) or input_tokens_per_minute and output_tokens_per_minute (separate buckets), not both",
        ),
        (None, Some(given), None) => (
            given.span().start,
            "input_tokens_per_minute needs output_tokens_per_minute too (separate buckets come in pairs)",
        ),
        (None, None, Some(given)) => (
            given.span().start,
            "output_tokens_per_minute needs input_tokens_per_minute too (separate buckets come in pairs)",
        ),
        _ => return true,
    };
    d.error(at, format!("{context}: {problem}"));
    false
}

/// Every burst set has its rate, and `burst_tokens` is not set beside
/// separate buckets. Whether the token bursts are usable (a request burst
/// without its rate is reported but does not make the limit unusable).
fn check_bursts_have_rates(
    limit: &RawLimit,
    split: bool,
    context: &str,
    d: &mut Diagnostics,
) -> bool {
    let mut usable = true;
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
    usable
}

/// `tenant_share` in (0, 1].
fn check_tenant_share(limit: &RawLimit, context: &str, d: &mut Diagnostics) -> Checked<f64> {
    Checked::given(limit.tenant_share.as_ref(), |share| {
        check_fraction(d, context, "tenant_share", share, Fraction::AboveZero)
    })
}

/// Reports a `max_request_tokens` above `capacity`, the largest request the
/// token buckets can grant: a request that large could never be admitted.
fn check_max_request_fits(
    limit: &RawLimit,
    rates: &CheckedRates,
    capacity: u64,
    max_request: u64,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) {
    if capacity >= max_request {
        return;
    }
    let max_at = limit
        .max_request_tokens
        .as_ref()
        .map_or(entry_at, |m| m.span().start);
    let (at, capacity_desc) = match (&limit.burst_tokens, rates.split, rates.window) {
        (_, true, EnforcementWindow::Minute) => (
            max_at,
            format!("the input and output buckets together ({capacity})"),
        ),
        (_, true, EnforcementWindow::Second) => (
            max_at,
            format!("the input and output tokens per minute together ({capacity})"),
        ),
        (Some(b), false, EnforcementWindow::Minute) => {
            (b.span().start, format!("burst_tokens ({capacity})"))
        }
        (Some(_), false, EnforcementWindow::Second) => (
            max_at,
            format!("the larger of burst_tokens and tokens_per_minute ({capacity})"),
        ),
        (None, false, EnforcementWindow::Minute) => (
            max_at,
            format!("burst_tokens (defaulted to tokens_per_minute = {capacity})"),
        ),
        (None, false, EnforcementWindow::Second) => {
            (max_at, format!("tokens_per_minute ({capacity})"))
        }
    };
    d.error(
        at,
        format!(
            "{context}: {capacity_desc} is below max_request_tokens ({max_request}): a request that large could never be admitted"
        ),
    );
}
