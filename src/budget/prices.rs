//! The price table: what each model's tokens cost, by kind of token, so a
//! budget can turn a call's usage into money. The table ships in the binary
//! (`prices.toml` beside this file, parsed at first use); each entry names
//! the page its figures come from and the date they were read. A limit can
//! override the price in its config; a budget on a model with neither is a
//! config error that names the model.

use std::collections::HashSet;
use std::sync::OnceLock;

use serde::Deserialize;

use super::money::{MoneyError, Price, parse_amount};

/// The shipped table's text.
const SHIPPED: &str = include_str!("prices.toml");

/// One model's price and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PricedModel {
    /// The model id as the provider's API takes it (`gpt-4o`).
    pub name: String,
    /// Other ids billed the same (`claude-opus-4-0` for `claude-opus-4`).
    pub aliases: Vec<String>,
    /// Whose model it is.
    pub provider: PriceProvider,
    /// Micro-units per million tokens of each kind.
    pub price: Price,
    /// The https URL of the page or file the figures were read from.
    pub source: String,
    /// The day the source was read or committed, `YYYY-MM-DD`.
    pub as_of: String,
}

/// The provider a priced model belongs to; it decides how cache writes are
/// billed (Anthropic above input, OpenAI not at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PriceProvider {
    Openai,
    Anthropic,
}

/// Model prices, looked up by the model id a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceTable {
    models: Vec<PricedModel>,
}

/// One `[[model]]` as the file writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    aliases: Vec<String>,
    provider: PriceProvider,
    input: String,
    cached_input: String,
    cache_write: String,
    output: String,
    source: String,
    as_of: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    model: Vec<Entry>,
}

impl PriceTable {
    /// The table shipped in the binary, parsed on first use. Its validity is
    /// a unit test of this module, so a failure here is a build that skipped
    /// its tests, not a user's mistake.
    pub fn shipped() -> &'static PriceTable {
        static TABLE: OnceLock<PriceTable> = OnceLock::new();
        TABLE.get_or_init(|| {
            PriceTable::parse(SHIPPED)
                .unwrap_or_else(|error| panic!("src/budget/prices.toml: {error}"))
        })
    }

    /// Parses a table written as `prices.toml` is, checking every entry:
    /// amounts, an https source, an `as_of` date, unique names, and cache
    /// prices on the right side of the input price.
    pub fn parse(text: &str) -> Result<PriceTable, PriceTableError> {
        let file: File = toml::from_str(text).map_err(|error| PriceTableError::Toml {
            message: error.to_string(),
        })?;
        let mut seen = HashSet::new();
        let mut models = Vec::with_capacity(file.model.len());
        for entry in file.model {
            let model = entry.validate()?;
            for id in std::iter::once(&model.name).chain(&model.aliases) {
                if !seen.insert(id.clone()) {
                    return Err(PriceTableError::Duplicate { model: id.clone() });
                }
            }
            models.push(model);
        }
        Ok(PriceTable { models })
    }

    /// The price of `model`: the entry whose name or alias it is, ignoring
    /// case and surrounding blanks, or failing that the entry it is a dated
    /// snapshot of (`gpt-4o-2024-08-06`, `claude-sonnet-4-20250514`,
    /// `claude-3-5-haiku-latest`). Nothing looser: `gpt-4o-mini` is never
    /// priced as `gpt-4o`, nor `gpt-4o-audio-preview` at all.
    pub fn lookup(&self, model: &str) -> Option<&PricedModel> {
        let model = model.trim().to_ascii_lowercase();
        self.exact(&model)
            .or_else(|| snapshot_base(&model).and_then(|base| self.exact(base)))
    }

    /// Every entry, in the file's order.
    pub fn models(&self) -> &[PricedModel] {
        &self.models
    }

    fn exact(&self, id: &str) -> Option<&PricedModel> {
        self.models
            .iter()
            .find(|model| model.name == id || model.aliases.iter().any(|alias| alias == id))
    }
}

impl Entry {
    fn validate(self) -> Result<PricedModel, PriceTableError> {
        let name = self.name.trim().to_ascii_lowercase();
        if name.is_empty() || name != self.name {
            return Err(PriceTableError::Name { model: self.name });
        }
        let aliases = self.aliases;
        if let Some(alias) = aliases
            .iter()
            .find(|alias| alias.is_empty() || alias.trim().to_ascii_lowercase() != **alias)
        {
            return Err(PriceTableError::Name {
                model: alias.clone(),
            });
        }
        let amount = |field: &'static str, text: &str| {
            parse_amount(text).map_err(|error| PriceTableError::Amount {
                model: name.clone(),
                field,
                error,
            })
        };
        let price = Price {
            input: amount("input", &self.input)?,
            cached_input: amount("cached_input", &self.cached_input)?,
            cache_write: amount("cache_write", &self.cache_write)?,
            output: amount("output", &self.output)?,
        };
        if price.cached_input > price.input {
            return Err(PriceTableError::Inconsistent {
                model: name,
                rule: "cached_input must not exceed input",
            });
        }
        let write_rule = match self.provider {
            PriceProvider::Anthropic if price.cache_write < price.input => {
                Some("an Anthropic cache_write is at least input")
            }
            PriceProvider::Openai if price.cache_write != price.input => {
                Some("OpenAI bills no cache write: cache_write equals input")
            }
            _ => None,
        };
        if let Some(rule) = write_rule {
            return Err(PriceTableError::Inconsistent { model: name, rule });
        }
        let source_ok = self
            .source
            .strip_prefix("https://")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace));
        if !source_ok {
            return Err(PriceTableError::Source {
                model: name,
                source_url: self.source,
            });
        }
        if !is_date(&self.as_of) {
            return Err(PriceTableError::AsOf {
                model: name,
                as_of: self.as_of,
            });
        }
        Ok(PricedModel {
            name,
            aliases,
            provider: self.provider,
            price,
            source: self.source,
            as_of: self.as_of,
        })
    }
}

/// `model` without its dated-snapshot suffix (`-2024-08-06`, `-20250514`,
/// `-latest`), when it has one.
fn snapshot_base(model: &str) -> Option<&str> {
    if let Some(base) = model.strip_suffix("-latest") {
        return Some(base);
    }
    let (base, last) = model.rsplit_once('-')?;
    if last.len() == 8 && last.bytes().all(|byte| byte.is_ascii_digit()) {
        let dashed = format!("{}-{}-{}", &last[..4], &last[4..6], &last[6..]);
        return is_date(&dashed).then_some(base);
    }
    let date_start = model.len().checked_sub(11)?;
    if !model.is_char_boundary(date_start) {
        return None;
    }
    let (base, date) = model.split_at(date_start);
    is_date(date.strip_prefix('-')?).then_some(base)
}

/// `YYYY-MM-DD` with a month 01-12 and a day 01-31.
fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return false;
    }
    if !(digits(0..4) && digits(5..7) && digits(8..10)) {
        return false;
    }
    let month: u8 = text[5..7].parse().unwrap_or(0);
    let day: u8 = text[8..10].parse().unwrap_or(0);
    (1..=12).contains(&month) && (1..=31).contains(&day)
}

/// Why a price table was refused; each names the entry and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceTableError {
    #[error("the price table is not valid: {message}")]
    Toml { message: String },
    #[error("model {model:?}: a model id is written in lower case, without blanks")]
    Name { model: String },
    #[error("model {model:?} appears twice in the price table")]
    Duplicate { model: String },
    #[error("model {model:?}, field {field}: {error}")]
    Amount {
        model: String,
        field: &'static str,
        error: MoneyError,
    },
    #[error("model {model:?}: {rule}")]
    Inconsistent { model: String, rule: &'static str },
    #[error("model {model:?}, field source: {source_url:?} is not an https URL")]
    Source { model: String, source_url: String },
    #[error("model {model:?}, field as_of: {as_of:?} is not a date (YYYY-MM-DD)")]
    AsOf { model: String, as_of: String },
}

#[cfg(test)]
mod tests;
