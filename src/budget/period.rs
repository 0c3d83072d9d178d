//! The calendar a spend budget follows: the day, week or month an instant
//! falls in, in a configured time zone. A budget resets when its period
//! starts (it does not refill), so each period is its own bucket, named by
//! the period's label.
//!
//! Periods start at local midnight (weeks on Monday, as ISO 8601 counts
//! them). Daylight saving makes some days 23 or 25 hours long; where a zone
//! skips midnight, the day starts at the first instant after the gap. The
//! time zone database is built into the binary (`jiff`'s bundled tzdb).

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// How long a budget's period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Calendar {
    Day,
    /// Monday to Sunday.
    Week,
    Month,
}

impl Calendar {
    /// The name the config uses.
    pub fn name(self) -> &'static str {
        match self {
            Calendar::Day => "day",
            Calendar::Week => "week",
            Calendar::Month => "month",
        }
    }

    /// The period `at_ms` (Unix time in ms) falls in, in `zone`.
    pub fn period_at(self, at_ms: i64, zone: &TimeZone) -> Result<Period, PeriodError> {
        let at = Timestamp::from_millisecond(at_ms).map_err(|_| PeriodError::OutOfRange(at_ms))?;
        let today = at.to_zoned_datetime(zone.clone()).date();
        let (first, next, label) = match self {
            Calendar::Day => (today, today.tomorrow().ok(), today.to_string()),
            Calendar::Week => {
                let monday = today
                    .checked_sub(i64::from(today.weekday().to_monday_zero_offset()).days())
                    .ok();
                let week = today.iso_week_date();
                let label = format!("{:04}-W{:02}", week.year(), week.week());
                (
                    monday.ok_or(PeriodError::OutOfRange(at_ms))?,
                    monday.and_then(|monday| monday.checked_add(1.week()).ok()),
                    label,
                )
            }
            Calendar::Month => {
                let first = today.first_of_month();
                let label = format!("{:04}-{:02}", first.year(), first.month());
                (first, first.checked_add(1.month()).ok(), label)
            }
        };
        let next = next.ok_or(PeriodError::OutOfRange(at_ms))?;
        Ok(Period {
            start_ms: start_of(first, zone).ok_or(PeriodError::OutOfRange(at_ms))?,
            end_ms: start_of(next, zone).ok_or(PeriodError::OutOfRange(at_ms))?,
            label,
        })
    }
}

/// The first instant of `date` in `zone`, in Unix ms: its midnight, or the
/// end of the gap where the zone skips midnight.
fn start_of(date: Date, zone: &TimeZone) -> Option<i64> {
    let zoned = date.to_zoned_datetime(zone.clone()).ok()?;
    Some(zoned.timestamp().as_millisecond())
}

/// One period of a budget's calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// Its first instant, Unix time in ms.
    pub start_ms: i64,
    /// The first instant of the next period: when the budget resets.
    pub end_ms: i64,
    /// Its name in bucket keys and `status`: `2026-12-07`, `2026-W49` (the
    /// ISO week-numbering year) or `2026-12`.
    pub label: String,
}

/// The time zone a budget's periods follow, by its IANA name (`UTC`,
/// `Europe/Berlin`, `America/New_York`).
pub fn zone(name: &str) -> Result<TimeZone, PeriodError> {
    TimeZone::get(name).map_err(|_| PeriodError::UnknownZone(name.to_string()))
}

/// Why no period could be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// Not a time zone of the IANA database.
    #[error("unknown time zone {0:?}: use an IANA name such as \"UTC\" or \"Europe/Berlin\"")]
    UnknownZone(String),
    /// An instant so far from now that its period cannot be represented.
    #[error("no calendar period for the instant {0} ms")]
    OutOfRange(i64),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const HOUR_MS: i64 = 3_600_000;

    fn ms(instant: &str) -> i64 {
        instant
            .parse::<Timestamp>()
            .expect("an RFC 3339 instant")
            .as_millisecond()
    }

    fn period(calendar: Calendar, instant: &str, zone_name: &str) -> Period {
        calendar
            .period_at(ms(instant), &zone(zone_name).unwrap())
            .unwrap()
    }

    #[test]
    fn a_utc_day_week_and_month_start_at_midnight() {
        let cases = [
            // 2026-12-07 is a Monday, in ISO week 50.
            (
                Calendar::Day,
                "2026-12-07T12:00:00Z",
                "2026-12-07T00:00:00Z",
                "2026-12-08T00:00:00Z",
                "2026-12-07",
            ),
            (
                Calendar::Day,
                "2026-12-07T23:59:59.999Z",
                "2026-12-07T00:00:00Z",
                "2026-12-08T00:00:00Z",
                "2026-12-07",
            ),
            (
                Calendar::Day,
                "2026-12-08T00:00:00Z",
                "2026-12-08T00:00:00Z",
                "2026-12-09T00:00:00Z",
                "2026-12-08",
            ),
            (
                Calendar::Week,
                "2026-12-13T23:59:59.999Z",
                "2026-12-07T00:00:00Z",
                "2026-12-14T00:00:00Z",
                "2026-W50",
            ),
            (
                Calendar::Week,
                "2026-12-14T00:00:00Z",
                "2026-12-14T00:00:00Z",
                "2026-12-21T00:00:00Z",
                "2026-W51",
            ),
            (
                Calendar::Month,
                "2026-01-31T23:59:59.999Z",
                "2026-01-01T00:00:00Z",
                "2026-02-01T00:00:00Z",
                "2026-01",
            ),
            (
                Calendar::Month,
                "2026-02-01T00:00:00Z",
                "2026-02-01T00:00:00Z",
                "2026-03-01T00:00:00Z",
                "2026-02",
            ),
            (
                Calendar::Month,
                "2028-02-29T08:00:00Z",
                "2028-02-01T00:00:00Z",
                "2028-03-01T00:00:00Z",
                "2028-02",
            ),
            (
                Calendar::Month,
                "2026-12-31T23:59:59.999Z",
                "2026-12-01T00:00:00Z",
                "2027-01-01T00:00:00Z",
                "2026-12",
            ),
        ];
        for (calendar, at, start, end, label) in cases {
            let found = period(calendar, at, "UTC");
            let expected = Period {
                start_ms: ms(start),
                end_ms: ms(end),
                label: label.to_string(),
            };
            assert_eq!(found, expected, "{} at {at}", calendar.name());
        }
    }

    #[test]
    fn weeks_across_a_new_year_keep_their_iso_week_and_year() {
        // 2026-01-01 is a Thursday: its week began on Monday 2025-12-29 and
        // is the first of 2026. 2027-01-01, a Friday, ends week 53 of 2026.
        let first = period(Calendar::Week, "2026-01-01T10:00:00Z", "UTC");
        assert_eq!(first.label, "2026-W01");
        assert_eq!(first.start_ms, ms("2025-12-29T00:00:00Z"));
        let last = period(Calendar::Week, "2027-01-01T10:00:00Z", "UTC");
        assert_eq!(last.label, "2026-W53");
        assert_eq!(last.end_ms, ms("2027-01-04T00:00:00Z"));
    }

    #[test]
    fn a_zone_moves_midnight_and_daylight_saving_changes_the_day_length() {
        // 08:00 UTC is still the day before in New York (UTC-5 in winter).
        let day = period(Calendar::Day, "2026-01-15T03:00:00Z", "America/New_York");
        assert_eq!(day.label, "2026-01-14");
        assert_eq!(day.start_ms, ms("2026-01-14T05:00:00Z"));
        // New York springs forward on 2026-03-08 and falls back on
        // 2026-11-01; Berlin springs forward on 2026-03-29.
        for (at, zone_name, hours) in [
            ("2026-03-08T12:00:00Z", "America/New_York", 23),
            ("2026-11-01T12:00:00Z", "America/New_York", 25),
            ("2026-03-29T12:00:00Z", "Europe/Berlin", 23),
            ("2026-06-01T12:00:00Z", "Europe/Berlin", 24),
        ] {
            let day = period(Calendar::Day, at, zone_name);
            assert_eq!(
                day.end_ms - day.start_ms,
                hours * HOUR_MS,
                "{zone_name} at {at}"
            );
        }
        // A month in Berlin starts at its local midnight: 23:00 UTC in winter.
        let march = period(Calendar::Month, "2026-03-15T12:00:00Z", "Europe/Berlin");
        assert_eq!(march.start_ms, ms("2026-02-28T23:00:00Z"));
        assert_eq!(
            march.end_ms,
            ms("2026-03-31T22:00:00Z"),
            "summer time by April"
        );
    }

    #[test]
    fn an_unknown_zone_is_named() {
        let error = zone("Mars/Olympus_Mons").unwrap_err();
        assert_eq!(error, PeriodError::UnknownZone("Mars/Olympus_Mons".into()));
        assert!(error.to_string().contains("Mars/Olympus_Mons"), "{error}");
    }

    /// Zones with daylight saving at midnight, half-hour saving and odd
    /// offsets, and UTC.
    const ZONES: &[&str] = &[
        "UTC",
        "America/New_York",
        "Europe/Berlin",
        "America/Santiago",
        "America/Havana",
        "Asia/Beirut",
        "Australia/Lord_Howe",
        "Asia/Kathmandu",
        "Pacific/Chatham",
    ];

    proptest! {
        /// Every instant of 2000–2100 lies in exactly one period of each
        /// calendar: at or after its start and before its end, the period of
        /// its end starts there, and the instant before its start is in the
        /// period before. So the periods tile time with no gap or overlap,
        /// whatever the zone does at midnight.
        #[test]
        fn periods_tile_time_in_every_zone(
            at_ms in ms("2000-01-01T00:00:00Z")..ms("2100-01-01T00:00:00Z"),
            zone_index in 0..ZONES.len(),
            calendar in prop_oneof![
                Just(Calendar::Day),
                Just(Calendar::Week),
                Just(Calendar::Month),
            ],
        ) {
            let zone = zone(ZONES[zone_index]).unwrap();
            let found = calendar.period_at(at_ms, &zone).unwrap();
            prop_assert!(found.start_ms <= at_ms && at_ms < found.end_ms, "{found:?}");
            let next = calendar.period_at(found.end_ms, &zone).unwrap();
            prop_assert_eq!(next.start_ms, found.end_ms);
            prop_assert_ne!(&next.label, &found.label);
            let before = calendar.period_at(found.start_ms - 1, &zone).unwrap();
            prop_assert_eq!(before.end_ms, found.start_ms);
            let longest_hours = match calendar {
                Calendar::Day => 26,
                Calendar::Week => 7 * 24 + 2,
                Calendar::Month => 31 * 24 + 2,
            };
            prop_assert!(found.end_ms - found.start_ms <= longest_hours * HOUR_MS);
        }
    }
}
