//! Spend budgets (issue 30): amounts of money per calendar period, reserved
//! before a provider call and settled to its real usage, in the same atomic
//! acquire as the rate buckets.
//!
//! This room holds what budgets are made of and nothing of the crate above
//! it: the calendar their periods follow ([`period`]) and the money they
//! count ([`money`]).

pub mod money;
pub mod period;
pub mod spans;
pub mod prices;
