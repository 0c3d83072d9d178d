//! Provider presets: whose rate-limit accounting a limit mirrors.
//!
//! A preset ([`Provider`]) picks three things a limit may also set one by
//! one: the counter of its prompts ([`Tokenizer`]), how input and output
//! tokens make the charge ([`CostRule`]), and whether a usage report gives
//! back the difference ([`SettleRule`]). The presets mirror what each
//! provider documents (docs/token-counting.md).

use serde::{Deserialize, Serialize};

use super::{CharEstimator, Counter, Encoding, OpenaiChars, TokenError, encoding_for_model};

/// Whose rate-limit accounting a limit mirrors: a preset of tokenizer, cost
/// rule and settlement rule (docs/token-counting.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// OpenAI's character rule; charge `max(input, output)`; the charge is kept.
    Openai,
    /// Character estimate; charge `input + output`; settled to usage.
    Anthropic,
    /// tiktoken when the model has an encoding, else the estimate; charge
    /// `input + output`; settled to usage.
    Generic,
}

impl Provider {
    /// The provider whose model `model` is, when its name says so: OpenAI's
    /// (every family tiktoken's model map knows, `gpt-*`, `o<digits>`,
    /// fine-tunes) or Anthropic's (`claude*`).
    pub fn of_model(model: &str) -> Option<Provider> {
        if encoding_for_model(model).is_some() {
            Some(Provider::Openai)
        } else if model.trim().to_ascii_lowercase().starts_with("claude") {
            Some(Provider::Anthropic)
        } else {
            None
        }
    }

    /// The provider's name in prose.
    pub fn display_name(self) -> &'static str {
        match self {
            Provider::Openai => "OpenAI",
            Provider::Anthropic => "Anthropic",
            Provider::Generic => "no single provider",
        }
    }

    /// The preset's name in the config (`provider = "openai"`).
    pub fn name(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Generic => "generic",
        }
    }
}

impl Provider {
    /// The preset's cost rule.
    pub fn cost_rule(self) -> CostRule {
        match self {
            Provider::Openai => CostRule::Max,
            Provider::Anthropic | Provider::Generic => CostRule::Sum,
        }
    }

    /// Whether the provider's rate limits count input read from its prompt
    /// cache: OpenAI's do; Anthropic's input limits leave cache reads out
    /// for current models. Without a provider, they are counted: settling
    /// more never causes a 429.
    pub fn counts_cache_reads(self) -> bool {
        match self {
            Provider::Openai | Provider::Generic => true,
            Provider::Anthropic => false,
        }
    }

    /// The preset's settlement rule.
    pub fn settle_rule(self) -> SettleRule {
        match self {
            Provider::Openai => SettleRule::NoRefund,
            Provider::Anthropic | Provider::Generic => SettleRule::Refund,
        }
    }

    /// The counter of `tokenizer = "auto"` for `model`.
    pub fn auto_tokenizer(self, model: Option<&str>) -> Tokenizer {
        match (self, model.and_then(encoding_for_model)) {
            // OpenAI charges its rate limits by characters, not by tiktoken.
            (Provider::Openai, _) => Tokenizer::OpenaiChars,
            (Provider::Anthropic, _) => Tokenizer::Chars,
            (Provider::Generic, Some(encoding)) => Tokenizer::from(encoding),
            (Provider::Generic, None) => Tokenizer::Chars,
        }
    }
}

/// How a limit counts prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// tiktoken's o200k_base (gpt-4o, gpt-4.1, gpt-5, o-series).
    O200kBase,
    /// tiktoken's cl100k_base (gpt-4, gpt-3.5-turbo).
    Cl100kBase,
    /// The character estimate (`chars_per_token`, `safety_factor`).
    Chars,
    /// OpenAI's rate-limit rule: characters ÷ `chars_per_token` (4).
    OpenaiChars,
}

impl From<Encoding> for Tokenizer {
    fn from(encoding: Encoding) -> Self {
        match encoding {
            Encoding::O200kBase => Tokenizer::O200kBase,
            Encoding::Cl100kBase => Tokenizer::Cl100kBase,
        }
    }
}

impl Tokenizer {
    /// The counter of this tokenizer with `chars_per_token` and
    /// `safety_factor` where it takes them (the defaults where `None`), or
    /// why a parameter is out of range.
    pub fn counter(
        self,
        chars_per_token: Option<f64>,
        safety_factor: Option<f64>,
    ) -> Result<Counter, TokenError> {
        Ok(match self {
            Tokenizer::O200kBase => Counter::Tiktoken(Encoding::O200kBase),
            Tokenizer::Cl100kBase => Counter::Tiktoken(Encoding::Cl100kBase),
            Tokenizer::Chars => Counter::Chars(CharEstimator::new(
                chars_per_token.unwrap_or(CharEstimator::DEFAULT_CHARS_PER_TOKEN),
                safety_factor.unwrap_or(CharEstimator::DEFAULT_SAFETY_FACTOR),
            )?),
            Tokenizer::OpenaiChars => Counter::OpenaiChars(OpenaiChars::new(
                chars_per_token.unwrap_or(OpenaiChars::DEFAULT_CHARS_PER_TOKEN),
            )?),
        })
    }

    /// The tiktoken encoding, or `None` for a character count.
    pub fn encoding(self) -> Option<Encoding> {
        match self {
            Tokenizer::O200kBase => Some(Encoding::O200kBase),
            Tokenizer::Cl100kBase => Some(Encoding::Cl100kBase),
            Tokenizer::Chars | Tokenizer::OpenaiChars => None,
        }
    }

    /// Whether `safety_factor` applies (only the character estimate's).
    pub fn takes_safety_factor(self) -> bool {
        self == Tokenizer::Chars
    }

    /// The config's name (`tokenizer = "openai_chars"`).
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::O200kBase => "o200k_base",
            Tokenizer::Cl100kBase => "cl100k_base",
            Tokenizer::Chars => "chars",
            Tokenizer::OpenaiChars => "openai_chars",
        }
    }
}

/// How a request's input and output tokens make the charge of the limit's
/// combined token bucket (and its tenant and group buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostRule {
    /// `input + output`.
    Sum,
    /// `max(input, output)`: OpenAI's documented per-request charge.
    Max,
}

impl CostRule {
    /// The charge of `input` and `output` tokens; `None` on overflow.
    pub fn charge(self, input: u64, output: u64) -> Option<u64> {
        match self {
            CostRule::Sum => input.checked_add(output),
            CostRule::Max => Some(input.max(output)),
        }
    }
}

/// What a usage report does to the limit's own and group token buckets
/// (tenant buckets always settle: per-tenant accounting is ratekeeper's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleRule {
    /// Give back reserved − used, or take the overrun.
    Refund,
    /// Keep the up-front charge, as a provider that never adjusts it does.
    #[serde(rename = "none")]
    NoRefund,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_rules_charge() {
        assert_eq!(CostRule::Sum.charge(500, 1000), Some(1500));
        assert_eq!(CostRule::Max.charge(500, 1000), Some(1000));
        assert_eq!(CostRule::Max.charge(1500, 1000), Some(1500));
        assert_eq!(CostRule::Sum.charge(u64::MAX, 1), None);
        assert_eq!(CostRule::Max.charge(u64::MAX, 1), Some(u64::MAX));
    }
}
