//! Spend budgets (issue 30): amounts of money per calendar period, reserved
//! before a provider call and settled to its real usage, in the same atomic
//! acquire as the rate buckets.
//!
//! This room holds what budgets are made of and nothing of the crate above
//! it: the calendar their periods follow ([`period`]), the money they
//! count ([`money`]) and what each model's tokens cost ([`prices`]: the
//! table shipped in the binary, with the page and date each price was read
//! from; see docs/prices.md).

pub mod money;
pub mod period;
pub mod prices;
pub mod spans;
