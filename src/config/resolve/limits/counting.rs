//! How a limit counts its prompts: the `tokenizer` it names, else its
//! provider preset's for its model, and the parameters of a character
//! count, which only a `chars` or `openai_chars` limit may set.

use toml::Spanned;

use crate::config::diagnostics::Diagnostics;
use crate::config::raw::RawLimit;
use crate::tokens::{Counter, Provider, TokenError, Tokenizer};

/// How a limit counts its prompts, resolved.
pub(super) struct Counting {
    pub tokenizer: Tokenizer,
    /// With a character count: characters per token; else `None`.
    pub chars_per_token: Option<f64>,
    /// With the `chars` tokenizer: the multiplier; else `None`.
    pub safety_factor: Option<f64>,
}

/// The limit's counter for `provider`'s preset and the limit's own
/// `tokenizer` and parameters, or `None` (problems reported) when a value
/// is wrong or does not apply to the counter.
pub(super) fn resolve_counting(
    limit: &RawLimit,
    provider: Provider,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<Counting> {
    let model = limit.model.as_ref().map(|m| m.get_ref().as_str());
    let tokenizer = limit
        .tokenizer
        .as_ref()
        .and_then(|t| t.get_ref().named())
        .unwrap_or_else(|| provider.auto_tokenizer(model));
    let counts_characters = tokenizer.encoding().is_none();
    let mut usable = true;
    for (field, value, applies, applies_to) in [
        (
            "chars_per_token",
            &limit.chars_per_token,
            counts_characters,
            "a character count (tokenizer = \"chars\" or \"openai_chars\")",
        ),
        (
            "safety_factor",
            &limit.safety_factor,
            tokenizer.takes_safety_factor(),
            "the character estimate (tokenizer = \"chars\")",
        ),
    ] {
        if let (Some(value), false) = (value, applies) {
            d.error(
                value.span().start,
                format!(
                    "{context}: {field} only applies to {applies_to}, but this limit counts with {}",
                    tokenizer.name()
                ),
            );
            usable = false;
        }
    }
    if !usable {
        return None;
    }
    let given = |value: &Option<Spanned<f64>>| value.as_ref().map(|v| *v.get_ref());
    let (chars_per_token, safety_factor) =
        (given(&limit.chars_per_token), given(&limit.safety_factor));
    match tokenizer.counter(chars_per_token, safety_factor) {
        Ok(Counter::Chars(estimator)) => Some(Counting {
            tokenizer,
            chars_per_token: Some(estimator.chars_per_token()),
            safety_factor: Some(estimator.safety_factor()),
        }),
        Ok(Counter::OpenaiChars(rule)) => Some(Counting {
            tokenizer,
            chars_per_token: Some(rule.chars_per_token()),
            safety_factor: None,
        }),
        Ok(Counter::Tiktoken(_)) => Some(Counting {
            tokenizer,
            chars_per_token: None,
            safety_factor: None,
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
