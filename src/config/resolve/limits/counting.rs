//! How a limit's requests are counted and charged: the provider's preset
//! first, then the limit's own `tokenizer`, character estimate,
//! `cost_rule` and `settle`.

use toml::Spanned;

use crate::config::diagnostics::{Diagnostics, check_int};
use crate::config::model::{DEFAULT_MAX_OUTPUT_TOKENS, MAX_BURST};
use crate::config::raw::RawLimit;
use crate::tokens::{CharEstimator, CostRule, Provider, SettleRule, TokenError, Tokenizer};

/// The counting and charging settings of a limit, resolved.
pub(super) struct Counting {
    pub provider: Provider,
    pub model: Option<String>,
    pub tokenizer: Tokenizer,
    pub chars_per_token: Option<f64>,
    pub safety_factor: Option<f64>,
    pub default_max_output_tokens: u64,
    pub cost_rule: CostRule,
    pub settle: SettleRule,
    pub learn_max_output: bool,
}

/// The parameters of the character estimate, resolved: both with the
/// `chars` tokenizer, neither with tiktoken.
struct Estimate {
    chars_per_token: Option<f64>,
    safety_factor: Option<f64>,
}

/// The limit's counting settings, or `None` (problems reported) when a
/// value is missing or wrong.
pub(super) fn resolve_counting(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<Counting> {
    let provider = limit
        .provider
        .as_ref()
        .map_or(Provider::Generic, |p| *p.get_ref());
    let model = limit.model.as_ref().map(|m| m.get_ref().as_str());
    let tokenizer = resolve_tokenizer(limit, provider, model, context, entry_at, d);
    let estimate =
        tokenizer.and_then(|tokenizer| check_estimate(limit, tokenizer, context, entry_at, d));
    let default_max_output_tokens = match &limit.default_max_output_tokens {
        Some(v) => check_int(d, context, "default_max_output_tokens", v, 0, MAX_BURST),
        None => Some(DEFAULT_MAX_OUTPUT_TOKENS),
    };
    let (tokenizer, estimate) = (tokenizer?, estimate?);
    Some(Counting {
        provider,
        model: model.map(str::to_string),
        tokenizer,
        chars_per_token: estimate.chars_per_token,
        safety_factor: estimate.safety_factor,
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

/// The `tokenizer` the limit names, else the preset's for its model.
fn resolve_tokenizer(
    limit: &RawLimit,
    provider: Provider,
    model: Option<&str>,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<Tokenizer> {
    if let Some(named) = limit.tokenizer.as_ref().and_then(|t| t.get_ref().named()) {
        return Some(named);
    }
    match provider.auto_tokenizer(model) {
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
    }
}

/// `chars_per_token` and `safety_factor`: in range with the `chars`
/// tokenizer (defaults filled in), absent with tiktoken.
fn check_estimate(
    limit: &RawLimit,
    tokenizer: Tokenizer,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<Estimate> {
    let Some(encoding) = tokenizer.encoding() else {
        return check_char_estimate(limit, context, entry_at, d);
    };
    let mut usable = true;
    for (field, value) in [
        ("chars_per_token", &limit.chars_per_token),
        ("safety_factor", &limit.safety_factor),
    ] {
        if let Some(value) = value {
            d.error(
                value.span().start,
                format!(
                    "{context}: {field} only applies to the character estimate (tokenizer = \"chars\"), but this limit counts with {}",
                    encoding.name()
                ),
            );
            usable = false;
        }
    }
    usable.then_some(Estimate {
        chars_per_token: None,
        safety_factor: None,
    })
}

/// The character estimate's parameters, defaults filled in, when in range.
fn check_char_estimate(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<Estimate> {
    let given = |value: &Option<Spanned<f64>>, default: f64| {
        value.as_ref().map_or(default, |v| *v.get_ref())
    };
    let chars = given(
        &limit.chars_per_token,
        CharEstimator::DEFAULT_CHARS_PER_TOKEN,
    );
    let safety = given(&limit.safety_factor, CharEstimator::DEFAULT_SAFETY_FACTOR);
    match CharEstimator::new(chars, safety) {
        Ok(_) => Some(Estimate {
            chars_per_token: Some(chars),
            safety_factor: Some(safety),
        }),
        Err(TokenError::InvalidEstimator {
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
            None
        }
        Err(other) => {
            d.error(entry_at, format!("{context}: {other}"));
            None
        }
    }
}
