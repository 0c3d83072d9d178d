//! How a limit counts its prompts: the `tokenizer` it names, else its
//! provider preset's for its model, and the character estimate's
//! parameters, which only a `chars` limit may set.

use toml::Spanned;

use crate::config::diagnostics::Diagnostics;
use crate::config::raw::RawLimit;
use crate::tokens::{CharEstimator, Encoding, Provider, TokenError, Tokenizer};

/// How a limit counts its prompts, resolved.
pub(super) struct Counting {
    pub tokenizer: Tokenizer,
    /// With the `chars` tokenizer: characters per token; else `None`.
    pub chars_per_token: Option<f64>,
    /// With the `chars` tokenizer: the multiplier; else `None`.
    pub safety_factor: Option<f64>,
}

/// The limit's counter for `provider`'s preset and the limit's own
/// `tokenizer` and estimate, or `None` (problems reported) when a value is
/// missing or wrong.
pub(super) fn resolve_counting(
    limit: &RawLimit,
    provider: Provider,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<Counting> {
    let model = limit.model.as_ref().map(|m| m.get_ref().as_str());
    let tokenizer = resolve_tokenizer(limit, provider, model, context, entry_at, d)?;
    let (chars_per_token, safety_factor) = match tokenizer.encoding() {
        Some(encoding) => {
            if !check_no_estimate(limit, encoding, context, d) {
                return None;
            }
            (None, None)
        }
        None => {
            let (chars, safety) = check_char_estimate(limit, context, entry_at, d)?;
            (Some(chars), Some(safety))
        }
    };
    Some(Counting {
        tokenizer,
        chars_per_token,
        safety_factor,
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

/// Whether neither `chars_per_token` nor `safety_factor` stands beside a
/// tiktoken `encoding`; reports each that does.
fn check_no_estimate(
    limit: &RawLimit,
    encoding: Encoding,
    context: &str,
    d: &mut Diagnostics,
) -> bool {
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
    usable
}

/// The character estimate's parameters, defaults filled in, when in range.
fn check_char_estimate(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<(f64, f64)> {
    let given = |value: &Option<Spanned<f64>>, default: f64| {
        value.as_ref().map_or(default, |v| *v.get_ref())
    };
    let chars = given(
        &limit.chars_per_token,
        CharEstimator::DEFAULT_CHARS_PER_TOKEN,
    );
    let safety = given(&limit.safety_factor, CharEstimator::DEFAULT_SAFETY_FACTOR);
    match CharEstimator::new(chars, safety) {
        Ok(_) => Some((chars, safety)),
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
