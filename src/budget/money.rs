//! Money as spend budgets count it: whole micro-units of the currency (a
//! dollar is 1,000,000), so that sums are exact and a budget is a bucket of
//! integers like any other. Amounts are written in the config as decimals
//! (`"1.50"`) and shown the same way.

/// Micro-units in one unit of the currency.
pub const MICROS_PER_UNIT: u64 = 1_000_000;

/// Tokens a price is quoted for, as the providers quote them.
const TOKENS_PER_QUOTE: u128 = 1_000_000;

/// One model's prices, in micro-units per million tokens (`$2.50` per
/// million tokens is 2,500,000), for each kind of token a provider bills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Price {
    /// Input read at the full price: neither read from nor written to a
    /// prompt cache.
    pub input: u64,
    /// Input read from the provider's prompt cache.
    pub cached_input: u64,
    /// Input written to the prompt cache (Anthropic bills it above `input`).
    pub cache_write: u64,
    pub output: u64,
}

/// What a call used, split as [`Price`] bills it. The providers count it
/// differently: OpenAI's `prompt_tokens` include the cached tokens
/// (`prompt_tokens_details.cached_tokens`), so `input` is their difference;
/// Anthropic's `input_tokens` leave out `cache_read_input_tokens` and
/// `cache_creation_input_tokens`, so they map one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input: u64,
    pub cached_input: u64,
    pub cache_write: u64,
    pub output: u64,
}

impl Price {
    /// The most a call of `input` and `output` tokens can cost, whatever
    /// part of its input the provider then reads from or writes to its
    /// cache: every input token at the dearest input price. This is what an
    /// acquire reserves, so that settling can only give back.
    pub fn most_for(&self, input: u64, output: u64) -> u64 {
        let dearest_input = self.input.max(self.cached_input).max(self.cache_write);
        let price = Price {
            input: dearest_input,
            ..*self
        };
        price.cost(&Usage {
            input,
            output,
            ..Usage::default()
        })
    }

    /// What `usage` costs, in micro-units, rounded up: a budget never
    /// reserves or settles less than the provider bills. Saturates at
    /// `u64::MAX` rather than wrapping.
    pub fn cost(&self, usage: &Usage) -> u64 {
        let billed = [
            (usage.input, self.input),
            (usage.cached_input, self.cached_input),
            (usage.cache_write, self.cache_write),
            (usage.output, self.output),
        ]
        .iter()
        .map(|&(tokens, price)| u128::from(tokens) * u128::from(price))
        .sum::<u128>();
        u64::try_from(billed.div_ceil(TOKENS_PER_QUOTE)).unwrap_or(u64::MAX)
    }
}

/// As the config writes it: `{ input = "2.50", cached_input = "1.25",
/// cache_write = "2.50", output = "10.00" }`.
impl serde::Serialize for Price {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut price = serializer.serialize_struct("Price", 4)?;
        price.serialize_field("input", &format_amount(self.input))?;
        price.serialize_field("cached_input", &format_amount(self.cached_input))?;
        price.serialize_field("cache_write", &format_amount(self.cache_write))?;
        price.serialize_field("output", &format_amount(self.output))?;
        price.end()
    }
}

/// An amount of money as the config writes it: digits, optionally a point
/// and up to six more digits (`"250"`, `"1.5"`, `"0.000001"`), in
/// micro-units. No sign, exponent, separator or currency symbol.
pub fn parse_amount(text: &str) -> Result<u64, MoneyError> {
    let invalid = || MoneyError::Invalid(text.to_string());
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) {
        return Err(invalid());
    }
    if text.contains('.') && fraction.is_empty() {
        return Err(invalid());
    }
    if fraction.len() > 6 {
        return Err(MoneyError::TooPrecise(text.to_string()));
    }
    let whole: u64 = whole
        .parse()
        .map_err(|_| MoneyError::TooLarge(text.to_string()))?;
    let fraction: u64 = format!("{fraction:0<6}").parse().map_err(|_| invalid())?;
    whole
        .checked_mul(MICROS_PER_UNIT)
        .and_then(|micros| micros.checked_add(fraction))
        .ok_or_else(|| MoneyError::TooLarge(text.to_string()))
}

/// An amount in micro-units as a decimal: at least two decimals, and more
/// only where they are not zero (`1.50`, `0.000250`, `12.00`).
pub fn format_amount(micros: u64) -> String {
    let whole = micros / MICROS_PER_UNIT;
    let fraction = format!("{:06}", micros % MICROS_PER_UNIT);
    let kept = fraction.trim_end_matches('0').len().max(2);
    format!("{whole}.{}", &fraction[..kept])
}

/// Why an amount of money was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("{0:?} is not an amount of money: write digits with an optional point, as \"1.50\"")]
    Invalid(String),
    #[error("{0:?} has more than six decimals (a millionth is the smallest amount)")]
    TooPrecise(String),
    #[error("{0:?} is too large an amount")]
    TooLarge(String),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `$input`, `$cached`, `$write`, `$output` per million tokens.
    fn price(input: &str, cached: &str, write: &str, output: &str) -> Price {
        Price {
            input: parse_amount(input).unwrap(),
            cached_input: parse_amount(cached).unwrap(),
            cache_write: parse_amount(write).unwrap(),
            output: parse_amount(output).unwrap(),
        }
    }

    #[test]
    fn a_call_costs_each_kind_of_token_at_its_price_rounded_up() {
        // $3 input, $0.30 cache reads, $3.75 cache writes, $15 output.
        let sonnet = price("3", "0.30", "3.75", "15");
        let usage = Usage {
            input: 1_000,
            cached_input: 10_000,
            cache_write: 2_000,
            output: 500,
        };
        // 3,000 + 3,000 + 7,500 + 7,500 micro-units: $0.021.
        assert_eq!(sonnet.cost(&usage), 21_000);
        assert_eq!(format_amount(sonnet.cost(&usage)), "0.021");
        // One token at $0.15 a million is 0.15 micro-units: billed as 1.
        let mini = price("0.15", "0.075", "0", "0.60");
        let one = Usage {
            input: 1,
            ..Usage::default()
        };
        assert_eq!(mini.cost(&one), 1);
        assert_eq!(mini.cost(&Usage::default()), 0);
        let huge = Usage {
            output: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(sonnet.cost(&huge), u64::MAX, "saturates");
    }

    #[test]
    fn a_reservation_prices_every_input_token_at_the_dearest_input_price() {
        let sonnet = price("3", "0.30", "3.75", "15");
        // 1,000 input tokens at $3.75 (a cache write) and 500 output at $15.
        assert_eq!(sonnet.most_for(1_000, 500), 3_750 + 7_500);
        for usage in [
            Usage {
                input: 1_000,
                output: 500,
                ..Usage::default()
            },
            Usage {
                cached_input: 1_000,
                output: 500,
                ..Usage::default()
            },
            Usage {
                input: 200,
                cached_input: 300,
                cache_write: 500,
                output: 500,
            },
        ] {
            assert!(
                sonnet.cost(&usage) <= sonnet.most_for(1_000, 500),
                "{usage:?}"
            );
        }
    }

    #[test]
    fn amounts_parse_to_micro_units_and_print_back() {
        for (text, micros, shown) in [
            ("0", 0, "0.00"),
            ("1", 1_000_000, "1.00"),
            ("1.5", 1_500_000, "1.50"),
            ("0.10", 100_000, "0.10"),
            ("0.000001", 1, "0.000001"),
            ("250.25", 250_250_000, "250.25"),
            ("12.345600", 12_345_600, "12.3456"),
        ] {
            assert_eq!(parse_amount(text), Ok(micros), "{text}");
            assert_eq!(format_amount(micros), shown, "{text}");
        }
    }

    #[test]
    fn what_is_not_an_amount_is_refused_with_a_reason() {
        for text in [
            "", "-1", "+1", "1e3", "$1", "1,000", " 1", "1.", ".5", "1.2.3", "NaN",
        ] {
            assert!(
                matches!(parse_amount(text), Err(MoneyError::Invalid(_))),
                "{text:?}: {:?}",
                parse_amount(text)
            );
        }
        assert!(matches!(
            parse_amount("0.0000001"),
            Err(MoneyError::TooPrecise(_))
        ));
        assert!(matches!(
            parse_amount("99999999999999999999"),
            Err(MoneyError::TooLarge(_))
        ));
        assert!(matches!(
            parse_amount("18446744073709.551616"),
            Err(MoneyError::TooLarge(_))
        ));
        let message = parse_amount("1,000").unwrap_err().to_string();
        assert!(message.contains("\"1,000\""), "{message}");
    }

    proptest! {
        /// Every amount prints as a decimal that parses back to it.
        #[test]
        fn an_amount_survives_printing(micros in any::<u64>()) {
            prop_assert_eq!(parse_amount(&format_amount(micros)), Ok(micros));
        }

        /// A cost is never below the exact price and less than a
        /// micro-unit above it, and adding tokens never lowers it.
        #[test]
        fn a_cost_is_the_exact_price_rounded_up(
            tokens in 0..10_000_000u64,
            more in 0..1_000u64,
            per_million in 0..100_000_000u64,
        ) {
            let price = Price { output: per_million, ..Price::default() };
            let usage = |output| Usage { output, ..Usage::default() };
            let exact = u128::from(tokens) * u128::from(per_million);
            let cost = u128::from(price.cost(&usage(tokens)));
            prop_assert!(cost * 1_000_000 >= exact && cost * 1_000_000 < exact + 1_000_000);
            prop_assert!(price.cost(&usage(tokens + more)) >= price.cost(&usage(tokens)));
        }
    }
}
