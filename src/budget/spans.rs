//! What a budget is as the config declares it: amounts of money, each over
//! a calendar period (reset when the next one starts) or a rolling window
//! (a bucket that refills its amount over the window, like the rate limits).

use std::collections::BTreeMap;

use serde::Serialize;

use super::money::format_amount;
use super::period::Calendar;

/// The span one amount of a budget covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Span {
    /// Every calendar day, week or month: spent until the period ends,
    /// then whole again.
    Calendar(Calendar),
    /// Any hour: refilled continuously, the amount an hour.
    RollingHour,
    /// Any 24 hours: refilled continuously, the amount a day.
    RollingDay,
}

impl Span {
    /// Every span, in the order the config and `status` list them.
    pub const ALL: [Span; 5] = [
        Span::Calendar(Calendar::Day),
        Span::Calendar(Calendar::Week),
        Span::Calendar(Calendar::Month),
        Span::RollingHour,
        Span::RollingDay,
    ];

    /// Its key in a budget table (`day`, `rolling_hour`), and the last part
    /// of its bucket's name.
    pub fn name(self) -> &'static str {
        match self {
            Span::Calendar(calendar) => calendar.name(),
            Span::RollingHour => "rolling_hour",
            Span::RollingDay => "rolling_day",
        }
    }

    /// The span named `name` in a budget table.
    pub fn named(name: &str) -> Option<Span> {
        Span::ALL.into_iter().find(|span| span.name() == name)
    }

    /// The length of a rolling window, in ms; `None` for a calendar period.
    pub fn rolling_ms(self) -> Option<u64> {
        match self {
            Span::Calendar(_) => None,
            Span::RollingHour => Some(3_600_000),
            Span::RollingDay => Some(86_400_000),
        }
    }
}

/// A budget: at most one amount (micro-units) per span, all of which an
/// acquire must fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budget {
    amounts: BTreeMap<Span, u64>,
}

impl Budget {
    /// A budget of these amounts; a span given twice keeps the last.
    pub fn new(amounts: impl IntoIterator<Item = (Span, u64)>) -> Budget {
        Budget {
            amounts: amounts.into_iter().collect(),
        }
    }

    /// Each span with its amount, in [`Span::ALL`]'s order.
    pub fn amounts(&self) -> impl Iterator<Item = (Span, u64)> + '_ {
        self.amounts.iter().map(|(span, micros)| (*span, *micros))
    }

    pub fn is_empty(&self) -> bool {
        self.amounts.is_empty()
    }
}

/// As the config writes it: `{ day = "1.00", rolling_hour = "0.20" }`.
impl Serialize for Budget {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.amounts
                .iter()
                .map(|(span, micros)| (span.name(), format_amount(*micros))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_named_as_the_config_writes_them() {
        for span in Span::ALL {
            assert_eq!(Span::named(span.name()), Some(span));
        }
        assert_eq!(Span::named("year"), None);
        assert_eq!(Span::RollingDay.rolling_ms(), Some(86_400_000));
        assert_eq!(Span::Calendar(Calendar::Month).rolling_ms(), None);
    }

    #[test]
    fn a_budget_lists_its_amounts_in_order_and_prints_as_written() {
        let budget = Budget::new([
            (Span::RollingHour, 200_000),
            (Span::Calendar(Calendar::Day), 1_000_000),
        ]);
        let listed: Vec<_> = budget.amounts().collect();
        assert_eq!(
            listed,
            [
                (Span::Calendar(Calendar::Day), 1_000_000),
                (Span::RollingHour, 200_000)
            ]
        );
        let written = toml::to_string(&BTreeMap::from([("budget", &budget)])).unwrap();
        assert_eq!(
            written,
            "[budget]\nday = \"1.00\"\nrolling_hour = \"0.20\"\n"
        );
    }
}
