//! "Did you mean …?": the known key, value or name closest to a misspelled
//! one.

/// Jaro-Winkler similarity above which a candidate counts as a likely
/// misspelling: `token_per_minute` → `tokens_per_minute` (0.99), `max_wait`
/// → `max_wait_ms` (0.95), `sockett` → `socket` (0.97); not `bogus` →
/// `groups` (0.74) nor `azure` → `anthropic` (0.54).
const MIN_SIMILARITY: f64 = 0.85;

/// The candidate `written` most likely misspells, if any is close enough.
/// A candidate equal but for case, `_` and `-` (`FailOpen`, `fail-open` →
/// `fail_open`) wins outright; ties go to the first candidate.
pub(super) fn closest<'a>(
    written: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let normalized = normalize(written);
    let mut best: Option<(f64, &str)> = None;
    for candidate in candidates {
        if candidate == written {
            continue;
        }
        if normalize(candidate) == normalized {
            return Some(candidate);
        }
        let similarity = strsim::jaro_winkler(written, candidate);
        if similarity >= MIN_SIMILARITY && best.is_none_or(|(score, _)| similarity > score) {
            best = Some((similarity, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// Lower case without `_` and `-`.
fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn config_suggests_the_likely_key_and_nothing_far_off() {
        let limit_keys = [
            "name",
            "tokens_per_minute",
            "requests_per_minute",
            "tokens_per_second",
            "burst_tokens",
        ];
        let table = [
            ("token_per_minute", Some("tokens_per_minute")),
            ("tokens_per_min", Some("tokens_per_minute")),
            ("request_per_minute", Some("requests_per_minute")),
            ("burst", Some("burst_tokens")),
            ("Tokens-Per-Minute", Some("tokens_per_minute")),
            ("bogus", None),
            ("max_wait", None),
            ("name", None),
        ];
        for (written, expected) in table {
            assert_eq!(closest(written, limit_keys), expected, "{written}");
        }
        let policies = ["fail_closed", "fail_open", "local"];
        assert_eq!(closest("locall", policies), Some("local"));
        assert_eq!(closest("FailOpen", policies), Some("fail_open"));
        assert_eq!(closest("retry", policies), None);
    }
}
