use super::*;
use crate::budget::money::{Usage, format_amount};

/// The page this table is shown on; the part between the markers is
/// generated from the shipped file by [`doc_table`].
const DOC: &str = include_str!("../../../docs/prices.md");
const DOC_BEGIN: &str = "<!-- prices:begin (generated from src/budget/prices.toml) -->\n";
const DOC_END: &str = "<!-- prices:end -->";

#[test]
fn the_shipped_table_parses_and_every_entry_holds_together() {
    let table = PriceTable::shipped();
    assert!(table.models().len() >= 30, "{}", table.models().len());
    for model in table.models() {
        let price = model.price;
        assert!(price.input > 0 && price.output > 0, "{}", model.name);
        assert!(price.cached_input <= price.input, "{}", model.name);
        match model.provider {
            PriceProvider::Anthropic => {
                assert!(model.name.starts_with("claude-"), "{}", model.name);
                assert!(price.cache_write >= price.input, "{}", model.name);
            }
            PriceProvider::Openai => {
                assert!(!model.name.starts_with("claude"), "{}", model.name);
                assert_eq!(price.cache_write, price.input, "{}", model.name);
            }
        }
        assert!(model.source.starts_with("https://"), "{}", model.name);
        assert!(is_date(&model.as_of), "{}", model.name);
        // Every entry is found under its own name and its aliases.
        for id in std::iter::once(&model.name).chain(&model.aliases) {
            assert_eq!(table.lookup(id).map(|found| &found.name), Some(&model.name));
        }
    }
    // The models the issue names are all priced.
    for name in [
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-4.1-nano",
        "o1",
        "o3",
        "o3-mini",
        "o4-mini",
        "gpt-5",
        "gpt-5-mini",
        "gpt-5-nano",
        "claude-opus-4-1",
        "claude-opus-4",
        "claude-sonnet-4",
        "claude-sonnet-4-5",
        "claude-haiku-4-5",
        "claude-3-7-sonnet",
        "claude-3-5-haiku",
        "claude-3-haiku",
    ] {
        assert!(table.lookup(name).is_some(), "{name} has no price");
    }
}

#[test]
fn a_known_call_costs_what_the_providers_pages_say() {
    let table = PriceTable::shipped();
    let call = Usage {
        input: 1_000,
        output: 500,
        ..Usage::default()
    };
    // gpt-4o, $2.50 in / $10 out: 1,000 × 2.5 + 500 × 10 = 7,500 millionths.
    assert_eq!(table.lookup("gpt-4o").unwrap().price.cost(&call), 7_500);
    // claude-sonnet-4-5 with caching: 1,000 × $3 + 10,000 cache reads × $0.30
    // + 2,000 cache writes × $3.75 + 500 × $15 = 21,000 millionths ($0.021).
    let cached = Usage {
        input: 1_000,
        cached_input: 10_000,
        cache_write: 2_000,
        output: 500,
    };
    let sonnet = &table.lookup("claude-sonnet-4-5-20250929").unwrap().price;
    assert_eq!(format_amount(sonnet.cost(&cached)), "0.021");
    // gpt-5-nano, a cheap call rounds up: 1,000 × 0.05 + 500 × 0.40 = 250.
    assert_eq!(table.lookup("gpt-5-nano").unwrap().price.cost(&call), 250);
}

#[test]
fn a_model_matches_by_name_or_dated_snapshot_and_nothing_looser() {
    let table = PriceTable::shipped();
    let priced_as = |model: &str| table.lookup(model).map(|found| found.name.as_str());
    for (model, expected) in [
        ("gpt-4o", Some("gpt-4o")),
        ("  GPT-4o ", Some("gpt-4o")),
        ("gpt-4o-2024-08-06", Some("gpt-4o")),
        ("gpt-4o-2024-11-20", Some("gpt-4o")),
        // An older snapshot billed differently has its own entry.
        ("gpt-4o-2024-05-13", Some("gpt-4o-2024-05-13")),
        ("gpt-4o-mini", Some("gpt-4o-mini")),
        ("gpt-4o-mini-2024-07-18", Some("gpt-4o-mini")),
        ("gpt-4o-audio-preview", None),
        ("gpt-4o-realtime-preview-2024-12-17", None),
        ("gpt-4o-latest", Some("gpt-4o")),
        ("chatgpt-4o-latest", None),
        ("gpt-5-chat-latest", None),
        ("gpt-5-2025-08-07", Some("gpt-5")),
        ("gpt-5-pro", None),
        ("gpt-5.1-codex", None),
        ("o3-mini-2025-01-31", Some("o3-mini")),
        ("o3-pro", None),
        ("o4-mini-2025-04-16", Some("o4-mini")),
        ("claude-sonnet-4-20250514", Some("claude-sonnet-4")),
        ("claude-sonnet-4-0", Some("claude-sonnet-4")),
        ("claude-sonnet-4-5-20250929", Some("claude-sonnet-4-5")),
        ("claude-sonnet-4-5", Some("claude-sonnet-4-5")),
        ("claude-opus-4-1-20250805", Some("claude-opus-4-1")),
        ("claude-opus-4-20250514", Some("claude-opus-4")),
        ("claude-3-5-haiku-latest", Some("claude-3-5-haiku")),
        ("claude-3-5-haiku-20241022", Some("claude-3-5-haiku")),
        ("claude-3-haiku-20240307", Some("claude-3-haiku")),
        // Not a date, or not a suffix the providers use.
        ("gpt-4o-20241399", None),
        ("gpt-4o-2024-13-01", None),
        ("gpt-4o-2024-08-06-latest", None),
        ("gpt-4o-preview", None),
        ("gpt-4", None),
        ("claude-sonnet", None),
        ("claude-sonnet-4-7", None),
        ("", None),
        ("-latest", None),
        ("gpt-4oé-2024-08-06", None),
    ] {
        assert_eq!(priced_as(model), expected, "{model:?}");
    }
}

#[test]
fn a_malformed_table_is_refused_naming_the_entry_and_the_field() {
    let entry = |fields: &str| {
        format!(
            "[[model]]\nname = \"m\"\nprovider = \"openai\"\n{fields}\n\
             source = \"https://example.com/p\"\nas_of = \"2026-01-02\"\n"
        )
    };
    let good = "input = \"1\"\ncached_input = \"0.5\"\ncache_write = \"1\"\noutput = \"2\"";
    assert!(PriceTable::parse(&entry(good)).is_ok());
    let cases: [(String, &str); 9] = [
        (
            entry(&good.replace("output = \"2\"", "output = \"2 dollars\"")),
            "model \"m\", field output",
        ),
        (
            entry(&good.replace("\"0.5\"", "\"0.0000001\"")),
            "model \"m\", field cached_input",
        ),
        (
            entry(&good.replace("\"0.5\"", "\"1.5\"")),
            "cached_input must not exceed",
        ),
        (
            entry(&good.replace("cache_write = \"1\"", "cache_write = \"1.25\"")),
            "OpenAI bills no cache write",
        ),
        (
            entry(good)
                .replace("openai", "anthropic")
                .replace("cache_write = \"1\"", "cache_write = \"0.9\""),
            "Anthropic cache_write",
        ),
        (
            entry(good).replace("https://example.com/p", "http://example.com/p"),
            "model \"m\", field source",
        ),
        (
            entry(good).replace("2026-01-02", "January 2026"),
            "model \"m\", field as_of",
        ),
        (
            format!("{}\n{}", entry(good), entry(good)),
            "\"m\" appears twice",
        ),
        (
            entry(good).replace("name = \"m\"", "name = \"M\""),
            "lower case",
        ),
    ];
    for (text, expected) in cases {
        let message = PriceTable::parse(&text).unwrap_err().to_string();
        assert!(message.contains(expected), "{message:?} lacks {expected:?}");
    }
    let missing = PriceTable::parse(&entry("input = \"1\"")).unwrap_err();
    assert!(
        matches!(&missing, PriceTableError::Toml { message } if message.contains("cached_input")),
        "{missing}"
    );
    let unknown = PriceTable::parse(&entry(&format!("{good}\nbatch = \"0.5\""))).unwrap_err();
    assert!(unknown.to_string().contains("batch"), "{unknown}");
}

/// The table docs/prices.md shows: one row per model, in the file's order.
fn doc_table(table: &PriceTable) -> String {
    let mut rows = String::from(
        "| model | input | cached input | cache write | output | source | as of |\n\
         | --- | ---: | ---: | ---: | ---: | --- | --- |\n",
    );
    for model in table.models() {
        let name = if model.aliases.is_empty() {
            format!("`{}`", model.name)
        } else {
            let aliases: Vec<String> = model.aliases.iter().map(|a| format!("`{a}`")).collect();
            format!("`{}` (also {})", model.name, aliases.join(", "))
        };
        let dollars = |micros| format!("${}", format_amount(micros));
        let price = model.price;
        rows.push_str(&format!(
            "| {name} | {} | {} | {} | {} | [{}]({}) | {} |\n",
            dollars(price.input),
            dollars(price.cached_input),
            dollars(price.cache_write),
            dollars(price.output),
            source_label(&model.source),
            model.source,
            model.as_of,
        ));
    }
    rows
}

/// A source URL shortened for the table: `owner/repo@commit` for a GitHub
/// file, the host and path otherwise.
fn source_label(url: &str) -> String {
    let rest = url.trim_start_matches("https://");
    if let Some(path) = rest.strip_prefix("github.com/") {
        let parts: Vec<&str> = path.split('/').collect();
        if let [owner, repo, "blob", commit, ..] = parts.as_slice() {
            return format!("{owner}/{repo}@{}", &commit[..commit.len().min(7)]);
        }
    }
    rest.to_string()
}

#[test]
fn the_doc_shows_the_shipped_table() {
    let expected = doc_table(PriceTable::shipped());
    let shown = DOC
        .split_once(DOC_BEGIN)
        .and_then(|(_, rest)| rest.split_once(DOC_END))
        .map(|(table, _)| table);
    assert_eq!(
        shown,
        Some(expected.as_str()),
        "docs/prices.md differs from src/budget/prices.toml; put this between its markers:\n{expected}"
    );
}
