//! Provider presets: whose rate-limit accounting a limit mirrors.
//!
//! A preset ([`Provider`]) picks three things a limit may also set one by
//! one: the counter of its prompts ([`Tokenizer`]), how input and output
//! tokens make the charge ([`CostRule`]), and whether a usage report gives
//! back the difference ([`SettleRule`]). The presets mirror what each
//! provider documents (README, "Token counting and cost").

use serde::{Deserialize, Serialize};

use super::{CharEstimator, Counter, Encoding, encoding_for_model};

/// Whose rate-limit accounting a limit mirrors: a preset of tokenizer, cost
/// rule and settlement rule (README, "Token counting and cost").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// tiktoken by model; charge `max(input, output)`; the charge is kept.
    Openai,
    /// Character estimate; charge `input + output`; settled to usage.
    Anthropic,
    /// tiktoken when the model has an encoding, else the estimate; charge
    /// `input + output`; settled to usage.
    Generic,
}

impl Provider {
    /// The preset's name in the config (`provider = "openai"`).
    pub fn name(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Generic => "generic",
        }
    }
}

/// Why a preset has no counter for a model (`tokenizer = "auto"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PresetError {
    /// The OpenAI preset counts with tiktoken, and the model has no encoding.
    #[error(
        "provider = \"openai\" counts with tiktoken, but model {model:?} has no known encoding; set tokenizer = \"o200k_base\" or \"cl100k_base\" (or \"chars\" for an estimate)"
    )]
    NoEncodingForModel { model: String },
    /// The OpenAI preset counts with the model's encoding, and no model is named.
    #[error(
        "provider = \"openai\" counts with the model's tiktoken encoding: set model (e.g. \"gpt-4o-mini\") or tokenizer"
    )]
    NoModel,
}

impl Provider {
    /// The preset's cost rule.
    pub fn cost_rule(self) -> CostRule {
        match self {
            Provider::Openai => CostRule::Max,
            Provider::Anthropic | Provider::Generic => CostRule::Sum,
        }
    }

    /// The preset's settlement rule.
    pub fn settle_rule(self) -> SettleRule {
        match self {
            Provider::Openai => SettleRule::NoRefund,
            Provider::Anthropic | Provider::Generic => SettleRule::Refund,
        }
    }

    /// The counter of `tokenizer = "auto"` for `model`, or why there is none.
    pub fn auto_tokenizer(self, model: Option<&str>) -> Result<Tokenizer, PresetError> {
        let encoding = model.and_then(encoding_for_model);
        match (self, encoding) {
            (Provider::Anthropic, _) => Ok(Tokenizer::Chars),
            (_, Some(encoding)) => Ok(Tokenizer::from(encoding)),
            (Provider::Generic, None) => Ok(Tokenizer::Chars),
            (Provider::Openai, None) => Err(match model {
                Some(model) => PresetError::NoEncodingForModel {
                    model: model.to_string(),
                },
                None => PresetError::NoModel,
            }),
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
    /// The counter of this tokenizer, with `estimator` for `chars`.
    pub fn counter(self, estimator: CharEstimator) -> Counter {
        match self.encoding() {
            Some(encoding) => Counter::Tiktoken(encoding),
            None => Counter::Chars(estimator),
        }
    }

    /// The tiktoken encoding, or `None` for the estimate.
    pub fn encoding(self) -> Option<Encoding> {
        match self {
            Tokenizer::O200kBase => Some(Encoding::O200kBase),
            Tokenizer::Cl100kBase => Some(Encoding::Cl100kBase),
            Tokenizer::Chars => None,
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
