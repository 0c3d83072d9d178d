//! What a provider's answer says about its rate limits, read from its
//! headers: how long to pause after a 429, and how many requests and tokens
//! it still has for this API key. Pure: the service decides what to do.
//!
//! OpenAI: `x-ratelimit-remaining-requests`, `x-ratelimit-remaining-tokens`
//! (and `-limit-`, `-reset-`); Anthropic:
//! `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining`;
//! both: `retry-after` (seconds, or an HTTP date) and OpenAI's
//! `retry-after-ms`.

use std::time::{Duration, SystemTime};

use crate::proto::Header;

/// How long a 429 without any retry header pauses the limit.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause a provider's header is read as: an hour, the most a
/// limit's `max_pause_ms` allows. Each limit then caps it at its own
/// `max_pause_ms`, a minute by default: the limits ratekeeper keeps are
/// per-minute figures, which refill completely within a minute; a longer
/// `retry-after` speaks of a limit it does not keep (a daily quota), and
/// from a hostile or buggy client one `Feedback` frame would pause the
/// limit for the whole fleet that long (issue 27: ten minutes, repeatably).
pub const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// What a provider counts, as its headers name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    Requests,
    /// All tokens together (OpenAI's only token limit; Anthropic's
    /// most restrictive one).
    Tokens,
    InputTokens,
    OutputTokens,
}

/// The provider's view of its limits after one answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderView {
    /// After a 429: how long every worker should wait.
    pub pause: Option<Duration>,
    /// What the provider still has, per dimension it reported.
    pub remaining: Vec<(Dimension, u64)>,
    /// The provider's limit per minute, per dimension it reported.
    pub limits: Vec<(Dimension, u64)>,
    /// How long until the provider's bucket is full again, per dimension
    /// OpenAI reported it for (`x-ratelimit-reset-*`, to the ms; Anthropic's
    /// `-reset` is a moment in whole seconds rounded up, too coarse to place
    /// a one-second bucket by, and is not read).
    pub resets: Vec<(Dimension, Duration)>,
}

/// Reads an answer's `status` and `headers` (names in any case) at `now`
/// (the clock that HTTP-date `retry-after` values are measured against).
pub fn read(status: u16, headers: &[Header], now: SystemTime) -> ProviderView {
    let value = |name: &str| {
        headers
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case(name))
            .map(|header| header.value.trim())
    };
    let pause = (status == 429).then(|| {
        let retry_ms = value("retry-after-ms")
            .and_then(|ms| ms.parse::<f64>().ok())
            .and_then(|ms| capped_seconds(ms / 1000.0));
        let retry = || value("retry-after").and_then(|after| retry_after(after, now));
        retry_ms
            .or_else(retry)
            .unwrap_or(DEFAULT_PAUSE)
            .min(MAX_PAUSE)
    });
    let counts = |kind: &str| {
        let mut found: Vec<(Dimension, u64)> = Vec::new();
        for (dimension, openai, anthropic) in DIMENSIONS {
            // Anthropic rounds a token count's `remaining` to the nearest
            // thousand: read the most it may stand for, so that feedback
            // never lowers a bucket below what the provider still accepts.
            let rounding = match (kind, dimension) {
                ("remaining", Dimension::Requests) | ("limit", _) => 0,
                _ => ANTHROPIC_TOKENS_ROUNDING / 2,
            };
            let names = [
                openai.map(|openai| (format!("x-ratelimit-{kind}-{openai}"), 0)),
                Some((format!("anthropic-ratelimit-{anthropic}-{kind}"), rounding)),
            ];
            for (name, rounding) in names.iter().flatten() {
                let Some(count) = value(name).and_then(|count| count.parse::<u64>().ok()) else {
                    continue;
                };
                let count = count.saturating_add(*rounding);
                // Both providers' names for one dimension: the lower one counts.
                match found.iter_mut().find(|(seen, _)| *seen == dimension) {
                    Some((_, seen)) => *seen = (*seen).min(count),
                    None => found.push((dimension, count)),
                }
            }
        }
        found
    };
    let resets = DIMENSIONS
        .iter()
        .filter_map(|(dimension, openai, _)| {
            let name = format!("x-ratelimit-reset-{}", (*openai)?);
            Some((*dimension, openai_duration(value(&name)?)?))
        })
        .collect();
    ProviderView {
        pause,
        remaining: counts("remaining"),
        limits: counts("limit"),
        resets,
    }
}

/// OpenAI's reset format: `"20ms"`, `"1.5s"`, `"6m0s"`, `"1h2m3.5s"`; at
/// most [`MAX_PAUSE`]. `None` for anything else.
fn openai_duration(value: &str) -> Option<Duration> {
    let mut seconds = 0.0;
    let mut rest = value;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, scale) = [("ms", 0.001), ("h", 3600.0), ("m", 60.0), ("s", 1.0)]
            .into_iter()
            .find(|(unit, _)| rest.starts_with(unit))?;
        rest = &rest[unit.len()..];
        seconds += number * scale;
    }
    capped_seconds(seconds).map(|duration| duration.min(MAX_PAUSE))
}

/// Anthropic's `anthropic-ratelimit-*tokens-remaining` headers are "rounded
/// to the nearest thousand".
const ANTHROPIC_TOKENS_ROUNDING: u64 = 1000;

/// Each dimension as OpenAI's headers name it (if they do) and Anthropic's.
const DIMENSIONS: [(Dimension, Option<&str>, &str); 4] = [
    (Dimension::Requests, Some("requests"), "requests"),
    (Dimension::Tokens, Some("tokens"), "tokens"),
    (Dimension::InputTokens, None, "input-tokens"),
    (Dimension::OutputTokens, None, "output-tokens"),
];

/// `retry-after`: whole or fractional seconds, or an HTTP date.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    if let Ok(seconds) = value.parse::<f64>() {
        return capped_seconds(seconds);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `seconds` as a pause of at most [`MAX_PAUSE`]; `None` if negative or NaN.
fn capped_seconds(seconds: f64) -> Option<Duration> {
    (seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(MAX_PAUSE.as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<Header> {
        pairs
            .iter()
            .map(|(name, value)| Header {
                name: name.to_string(),
                value: value.to_string(),
            })
            .collect()
    }

    /// Read as at most an hour; each limit caps it again at its own
    /// `max_pause_ms` (a minute by default, `service::feedback`).
    #[test]
    fn a_retry_after_beyond_an_hour_pauses_an_hour() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for (name, value) in [
            ("retry-after", "7200"),
            ("retry-after-ms", "7200000"),
            ("retry-after", "Wed, 15 Nov 2023 00:13:20 GMT"),
        ] {
            let view = read(429, &headers(&[(name, value)]), now);
            assert_eq!(view.pause, Some(MAX_PAUSE), "{name}: {value}");
        }
    }

    #[test]
    fn headers_become_a_pause_and_remaining_counts() {
        let now = httpdate::parse_http_date("Tue, 01 Dec 2026 00:00:00 GMT").unwrap();
        let ms = Duration::from_millis;
        use Dimension::*;
        // (what, status, headers) → (pause, remaining)
        type Case<'a> = (
            &'a str,
            u16,
            Vec<(&'a str, &'a str)>,
            Option<Duration>,
            Vec<(Dimension, u64)>,
        );
        let cases: Vec<Case> = vec![
            (
                "a 200 pauses nothing",
                200,
                vec![("retry-after", "5")],
                None,
                vec![],
            ),
            (
                "Anthropic's 529 (overloaded) is no rate limit: it pauses nothing",
                529,
                vec![
                    ("retry-after", "5"),
                    ("anthropic-ratelimit-tokens-remaining", "80000"),
                ],
                None,
                // Rounded to the nearest thousand: at most 500 more.
                vec![(Tokens, 80_500)],
            ),
            (
                "OpenAI's remaining counts",
                200,
                vec![
                    ("x-ratelimit-remaining-requests", "2999"),
                    ("X-RateLimit-Remaining-Tokens", "149984"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                ],
                None,
                vec![(Requests, 2999), (Tokens, 149_984)],
            ),
            (
                "retry-after-ms wins",
                429,
                vec![("retry-after", "3"), ("retry-after-ms", "1250")],
                Some(ms(1250)),
                vec![],
            ),
            (
                "retry-after in seconds",
                429,
                vec![("retry-after", "3")],
                Some(ms(3000)),
                vec![],
            ),
            (
                "retry-after as a date",
                429,
                vec![("retry-after", "Tue, 01 Dec 2026 00:00:07 GMT")],
                Some(ms(7000)),
                vec![],
            ),
            (
                "a date in the past",
                429,
                vec![("retry-after", "Mon, 30 Nov 2026 23:00:00 GMT")],
                Some(ms(0)),
                vec![],
            ),
            (
                "no header: the default",
                429,
                vec![("retry-after", "soon")],
                Some(DEFAULT_PAUSE),
                vec![],
            ),
            (
                "an hour is capped",
                429,
                vec![("retry-after", "3600")],
                Some(MAX_PAUSE),
                vec![],
            ),
            (
                "so is forever",
                429,
                vec![("retry-after", "1e300")],
                Some(MAX_PAUSE),
                vec![],
            ),
            (
                "and infinity",
                429,
                vec![("retry-after-ms", "inf")],
                Some(MAX_PAUSE),
                vec![],
            ),
            (
                "negative: the default",
                429,
                vec![("retry-after", "-5")],
                Some(DEFAULT_PAUSE),
                vec![],
            ),
            (
                "NaN: the next header",
                429,
                vec![("retry-after-ms", "NaN"), ("retry-after", "2")],
                Some(ms(2000)),
                vec![],
            ),
            (
                "Anthropic's dimensions",
                429,
                vec![
                    ("retry-after", "2"),
                    ("anthropic-ratelimit-requests-remaining", "0"),
                    ("anthropic-ratelimit-input-tokens-remaining", "1200"),
                    ("anthropic-ratelimit-output-tokens-remaining", "oops"),
                    ("anthropic-ratelimit-tokens-remaining", "900"),
                ],
                Some(ms(2000)),
                // Token counts rounded by Anthropic; requests exact.
                vec![(Requests, 0), (Tokens, 1400), (InputTokens, 1700)],
            ),
        ];
        for (what, status, pairs, pause, remaining) in cases {
            let view = read(status, &headers(&pairs), now);
            assert_eq!((view.pause, view.remaining), (pause, remaining), "{what}");
        }
    }

    #[test]
    fn limit_headers_are_read_per_dimension() {
        let view = read(
            200,
            &headers(&[
                ("x-ratelimit-limit-requests", "5000"),
                ("x-ratelimit-limit-tokens", "800000"),
                ("anthropic-ratelimit-output-tokens-limit", "16000"),
                ("anthropic-ratelimit-tokens-limit", "900000"),
            ]),
            SystemTime::now(),
        );
        use Dimension::*;
        assert_eq!(
            view.limits,
            vec![(Requests, 5000), (Tokens, 800_000), (OutputTokens, 16_000)]
        );
        assert!(view.remaining.is_empty());
    }

    #[test]
    fn openai_resets_are_read_to_the_ms_and_anthropic_moments_are_not() {
        let view = read(
            200,
            &headers(&[
                ("x-ratelimit-reset-requests", "20ms"),
                ("x-ratelimit-reset-tokens", "0m59.5s"),
                ("anthropic-ratelimit-tokens-reset", "2026-12-03T10:00:01Z"),
            ]),
            SystemTime::now(),
        );
        use Dimension::*;
        assert_eq!(
            view.resets,
            vec![
                (Requests, Duration::from_millis(20)),
                (Tokens, Duration::from_millis(59_500))
            ]
        );
        for (value, expected) in [
            ("1h2m3s", Some(Duration::from_secs(3723).min(MAX_PAUSE))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("0s", Some(Duration::ZERO)),
            ("", None),
            ("5", None),
            ("5x", None),
            ("s", None),
            ("1000000000s", Some(MAX_PAUSE)),
            ("1e9s", None),
            ("-1s", None),
        ] {
            assert_eq!(openai_duration(value), expected, "{value:?}");
        }
    }
}
