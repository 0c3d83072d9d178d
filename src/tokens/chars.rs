//! A character-count estimate for models without a public tokenizer
//! (Anthropic, Gemini, local models).
//!
//! `tokens = ⌈(text / chars_per_token + framing) × safety_factor⌉`, where
//! `text` counts every role, name, content part, tool call and tool
//! definition, and framing is a fixed number of tokens per message and per
//! request. It is an estimate: it reserves, and where the provider's
//! accounting allows it the report settles the difference.
//!
//! "Characters" are counted as UTF-8 bytes: the same number for ASCII text,
//! and more for other scripts, which is what keeps the estimate on the high
//! side there. A CJK character is about one token but three bytes, so
//! counted as a character it would be underestimated two- to three-fold.
//!
//! How good is it? Against o200k_base (the nearest public proxy for a modern
//! tokenizer), the default reserves 1.0–3× the real count for prose in
//! English, German, Russian, Chinese, Japanese and Hindi, but symbol-dense
//! text tokenizes at 2–3 bytes per token: code and long numbers come out
//! about 12 % low, JSON full of numbers and ids about a third low
//! (`tests/it/tokens.rs` holds these floors). Limits whose prompts are mostly
//! JSON should lower `chars_per_token` (2.5 covers every sample we measured);
//! where the provider reconciles to actual usage, settlement corrects the
//! rest after the call.
//!
//! The arithmetic is exact: both parameters are kept in thousandths and the
//! quotient is rounded up in integers, so `35 bytes / 3.5 × 1.1` is 11, not
//! the 12 that floating point (`11.000000000000002`) would round up to.

use super::{PromptCount, TokenError, openai};
use crate::proto::ChatRequest;

/// Parameters of the character estimate, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CharEstimator {
    /// Characters per token, in thousandths.
    chars_per_token_milli: u32,
    /// Multiplier applied to the whole estimate, in thousandths.
    safety_factor_milli: u32,
    tokens_per_message: u32,
    tokens_per_request: u32,
}

impl CharEstimator {
    /// Characters (UTF-8 bytes) per token when a limit sets none: 3.5, the
    /// ratio Anthropic has given for Claude and below the 4 characters per
    /// token that OpenAI and Google state for English, so it errs towards
    /// reserving more.
    pub const DEFAULT_CHARS_PER_TOKEN: f64 = 3.5;
    /// Multiplier over the whole estimate when a limit sets none: 10 %
    /// headroom for text that tokenizes worse than prose (code, JSON, numbers).
    pub const DEFAULT_SAFETY_FACTOR: f64 = 1.1;
    /// Framing tokens per message, as in OpenAI's chat format.
    pub const DEFAULT_TOKENS_PER_MESSAGE: u32 = openai::TOKENS_PER_MESSAGE as u32;
    /// Framing tokens per request (the reply priming), as in OpenAI's format.
    pub const DEFAULT_TOKENS_PER_REQUEST: u32 = openai::REPLY_PRIMING as u32;

    /// Smallest and largest `chars_per_token` accepted.
    pub const CHARS_PER_TOKEN_RANGE: (f64, f64) = (0.5, 16.0);
    /// Smallest and largest `safety_factor` accepted: an estimate may only
    /// be raised.
    pub const SAFETY_FACTOR_RANGE: (f64, f64) = (1.0, 10.0);
    /// Largest framing per message or per request.
    pub const MAX_FRAMING_TOKENS: u32 = 1_000;

    /// An estimator with the default framing, or an error naming the
    /// parameter out of range. Parameters are kept to three decimals.
    pub fn new(chars_per_token: f64, safety_factor: f64) -> Result<CharEstimator, TokenError> {
        CharEstimator::with_framing(
            chars_per_token,
            safety_factor,
            Self::DEFAULT_TOKENS_PER_MESSAGE,
            Self::DEFAULT_TOKENS_PER_REQUEST,
        )
    }

    /// An estimator with explicit framing tokens per message and per request.
    pub fn with_framing(
        chars_per_token: f64,
        safety_factor: f64,
        tokens_per_message: u32,
        tokens_per_request: u32,
    ) -> Result<CharEstimator, TokenError> {
        let in_range = |value: f64, (low, high): (f64, f64)| {
            value.is_finite() && (low..=high).contains(&value)
        };
        let invalid = |parameter: &'static str, value: String, (low, high): (f64, f64)| {
            Err(TokenError::InvalidEstimator {
                parameter,
                value,
                expected: format!("from {low} to {high}"),
            })
        };
        if !in_range(chars_per_token, Self::CHARS_PER_TOKEN_RANGE) {
            return invalid(
                "chars_per_token",
                chars_per_token.to_string(),
                Self::CHARS_PER_TOKEN_RANGE,
            );
        }
        if !in_range(safety_factor, Self::SAFETY_FACTOR_RANGE) {
            return invalid(
                "safety_factor",
                safety_factor.to_string(),
                Self::SAFETY_FACTOR_RANGE,
            );
        }
        let framing_range = (0.0, f64::from(Self::MAX_FRAMING_TOKENS));
        if tokens_per_message > Self::MAX_FRAMING_TOKENS {
            return invalid(
                "tokens_per_message",
                tokens_per_message.to_string(),
                framing_range,
            );
        }
        if tokens_per_request > Self::MAX_FRAMING_TOKENS {
            return invalid(
                "tokens_per_request",
                tokens_per_request.to_string(),
                framing_range,
            );
        }
        Ok(CharEstimator {
            // In range, so both fit comfortably in u32.
            chars_per_token_milli: (chars_per_token * 1000.0).round() as u32,
            safety_factor_milli: (safety_factor * 1000.0).round() as u32,
            tokens_per_message,
            tokens_per_request,
        })
    }

    /// Characters (UTF-8 bytes) per token.
    pub fn chars_per_token(&self) -> f64 {
        f64::from(self.chars_per_token_milli) / 1000.0
    }

    /// Multiplier over the whole estimate.
    pub fn safety_factor(&self) -> f64 {
        f64::from(self.safety_factor_milli) / 1000.0
    }

    /// Framing tokens per message.
    pub fn tokens_per_message(&self) -> u32 {
        self.tokens_per_message
    }

    /// Framing tokens per request.
    pub fn tokens_per_request(&self) -> u32 {
        self.tokens_per_request
    }

    /// Estimated tokens of `text_bytes` of text plus `framing` tokens,
    /// rounded up: `⌈(text_bytes / chars_per_token + framing) × safety⌉`.
    pub fn estimate(&self, text_bytes: u64, framing: u64) -> u64 {
        let cpt = u128::from(self.chars_per_token_milli);
        let safety = u128::from(self.safety_factor_milli);
        // (bytes·1000/cpt + framing)·safety/1000 = (bytes·1000 + framing·cpt)·safety / (cpt·1000)
        let numerator = (u128::from(text_bytes) * 1000 + u128::from(framing) * cpt) * safety;
        let denominator = cpt * 1000;
        numerator
            .div_ceil(denominator)
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// Estimated prompt tokens of a chat request (already within bounds).
    pub(crate) fn count_request(&self, request: &ChatRequest) -> PromptCount {
        let message_bytes: u64 = request
            .messages
            .iter()
            .map(|message| {
                let parts: usize = message.content.iter().map(String::len).sum();
                (message.role.len()
                    + message.name.as_deref().map_or(0, str::len)
                    + parts
                    + message.tool_calls_json.as_deref().map_or(0, str::len)) as u64
            })
            .sum();
        let framing = request.messages.len() as u64 * u64::from(self.tokens_per_message)
            + u64::from(self.tokens_per_request);
        let messages = self.estimate(message_bytes, framing);
        let tools = request
            .tools_json
            .as_deref()
            .map_or(0, |json| self.estimate(json.len() as u64, 0));
        PromptCount {
            total: messages + tools,
            messages,
            tools,
        }
    }
}

impl Default for CharEstimator {
    fn default() -> Self {
        CharEstimator {
            chars_per_token_milli: 3_500,
            safety_factor_milli: 1_100,
            tokens_per_message: Self::DEFAULT_TOKENS_PER_MESSAGE,
            tokens_per_request: Self::DEFAULT_TOKENS_PER_REQUEST,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matches_the_documented_constants() {
        let default = CharEstimator::default();
        let built = CharEstimator::new(
            CharEstimator::DEFAULT_CHARS_PER_TOKEN,
            CharEstimator::DEFAULT_SAFETY_FACTOR,
        )
        .unwrap();
        assert_eq!(default, built);
        assert_eq!(default.chars_per_token(), 3.5);
        assert_eq!(default.safety_factor(), 1.1);
    }

    #[test]
    fn estimate_rounds_up_exactly() {
        // (bytes, framing, chars_per_token, safety) → tokens
        let cases: &[(u64, u64, f64, f64, u64)] = &[
            (0, 0, 3.5, 1.1, 0),
            (1, 0, 3.5, 1.0, 1),
            (35, 0, 3.5, 1.0, 10),
            (36, 0, 3.5, 1.0, 11),
            // 10 × 1.1 is 11 exactly, not 11.000000000000002 rounded up to 12.
            (35, 0, 3.5, 1.1, 11),
            (35, 3, 3.5, 1.1, 15), // (10 + 3) × 1.1 = 14.3
            (7, 0, 3.5, 1.25, 3),  // 2 × 1.25 = 2.5
            (4, 0, 4.0, 1.0, 1),
            (5, 0, 4.0, 1.0, 2),
            (1_000_000, 0, 3.5, 1.1, 314_286), // 285714.28… × 1.1 = 314285.71…
            (u64::MAX, 0, 0.5, 10.0, u64::MAX),
        ];
        for &(bytes, framing, cpt, safety, expected) in cases {
            let estimator = CharEstimator::new(cpt, safety).unwrap();
            assert_eq!(
                estimator.estimate(bytes, framing),
                expected,
                "{bytes} bytes + {framing} framing at {cpt} chars/token × {safety}"
            );
        }
    }

    #[test]
    fn parameters_out_of_range_are_refused_by_name() {
        let cases: &[(f64, f64, &str)] = &[
            (0.0, 1.1, "chars_per_token"),
            (-3.5, 1.1, "chars_per_token"),
            (f64::NAN, 1.1, "chars_per_token"),
            (f64::INFINITY, 1.1, "chars_per_token"),
            (16.5, 1.1, "chars_per_token"),
            (3.5, 0.9, "safety_factor"),
            (3.5, f64::NAN, "safety_factor"),
            (3.5, 10.5, "safety_factor"),
        ];
        for &(cpt, safety, name) in cases {
            match CharEstimator::new(cpt, safety) {
                Err(TokenError::InvalidEstimator { parameter, .. }) => {
                    assert_eq!(parameter, name, "{cpt} / {safety}")
                }
                other => panic!("{cpt} / {safety}: expected an error, got {other:?}"),
            }
        }
        assert!(matches!(
            CharEstimator::with_framing(3.5, 1.1, 1_001, 3),
            Err(TokenError::InvalidEstimator {
                parameter: "tokens_per_message",
                ..
            })
        ));
        assert!(CharEstimator::new(0.5, 1.0).is_ok());
        assert!(CharEstimator::new(16.0, 10.0).is_ok());
    }
}
