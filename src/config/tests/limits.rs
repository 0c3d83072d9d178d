//! How limits count and charge: provider presets and their overrides,
//! separate input and output buckets, and the shipped token-counting examples.

use super::*;
use crate::tokens::{CharEstimator, CostRule, Counter, Encoding, Provider, SettleRule, Tokenizer};

#[test]
fn config_provider_presets_and_overrides() {
    use CostRule::{Max, Sum};
    use SettleRule::{NoRefund, Refund};
    use Tokenizer::{Chars, Cl100kBase, O200kBase, OpenaiChars};
    // (keys after name and tokens_per_minute) → (tokenizer, chars
    // per token and safety factor, cost rule, settlement rule)
    type Expected = (Tokenizer, Option<(f64, f64)>, CostRule, SettleRule);
    let cases: &[(&str, Expected)] = &[
        ("", (Chars, Some((3.5, 1.1)), Sum, Refund)),
        ("model = \"gpt-4o-mini\"", (O200kBase, None, Sum, Refund)),
        ("model = \"gpt-4\"", (Cl100kBase, None, Sum, Refund)),
        (
            "model = \"claude-sonnet-4-5\"",
            (Chars, Some((3.5, 1.1)), Sum, Refund),
        ),
        // OpenAI charges by characters, whatever the model's tokenizer.
        (
            "provider = \"openai\"\nmodel = \"gpt-4o\"",
            (OpenaiChars, Some((4.0, 0.0)), Max, NoRefund),
        ),
        (
            "provider = \"openai\"\nmodel = \"my-proxy\"\nchars_per_token = 3.5",
            (OpenaiChars, Some((3.5, 0.0)), Max, NoRefund),
        ),
        (
            "provider = \"openai\"\nmodel = \"gpt-3.5-turbo\"\ntokenizer = \"cl100k_base\"",
            (Cl100kBase, None, Max, NoRefund),
        ),
        (
            "provider = \"openai\"\ntokenizer = \"o200k_base\"",
            (O200kBase, None, Max, NoRefund),
        ),
        (
            "provider = \"openai\"\nmodel = \"gpt-4o\"\ncost_rule = \"sum\"\nsettle = \"refund\"",
            (OpenaiChars, Some((4.0, 0.0)), Sum, Refund),
        ),
        (
            "provider = \"anthropic\"",
            (Chars, Some((3.5, 1.1)), Sum, Refund),
        ),
        // An Anthropic limit never uses tiktoken, whatever the model.
        (
            "provider = \"anthropic\"\nmodel = \"gpt-4o\"\nchars_per_token = 3\nsafety_factor = 1.25",
            (Chars, Some((3.0, 1.25)), Sum, Refund),
        ),
        (
            "provider = \"anthropic\"\nsettle = \"none\"\ncost_rule = \"max\"",
            (Chars, Some((3.5, 1.1)), Max, NoRefund),
        ),
        (
            "model = \"gpt-4o\"\ntokenizer = \"chars\"",
            (Chars, Some((3.5, 1.1)), Sum, Refund),
        ),
        (
            "model = \"gpt-4o\"\ntokenizer = \"auto\"",
            (O200kBase, None, Sum, Refund),
        ),
    ];
    for (keys, (tokenizer, estimate, cost_rule, settle)) in cases {
        let text = format!("{LIMIT_A}{keys}\n");
        let config = parse_ok(&text);
        let limit = &config.limits[0];
        assert_eq!(limit.tokenizer, *tokenizer, "{keys}");
        assert_eq!(
            limit
                .chars_per_token
                .map(|chars| (chars, limit.safety_factor.unwrap_or(0.0))),
            *estimate,
            "{keys}"
        );
        assert_eq!(limit.cost_rule, *cost_rule, "{keys}");
        assert_eq!(limit.settle, *settle, "{keys}");
        assert_eq!(limit.default_max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS);
        assert!(!limit.learn_max_output);
        // check-config's output reads back as the same configuration.
        assert_eq!(parse_ok(&config.to_effective_toml()), config, "{keys}");
    }
    let limit = &parse_ok("[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nprovider = \"anthropic\"\nchars_per_token = 2.5\n").limits[0];
    assert_eq!(
        limit.counter(),
        Counter::Chars(CharEstimator::new(2.5, 1.1).unwrap())
    );
    let config = parse_ok(
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1\nmodel = \"gpt-4o\"\n[[limits]]\nname = \"b\"\ntokens_per_minute = 1\nmodel = \"gpt-4o-mini\"\n[[limits]]\nname = \"c\"\ntokens_per_minute = 1\nprovider = \"anthropic\"\n",
    );
    assert_eq!(
        config.encodings(),
        std::collections::BTreeSet::from([Encoding::O200kBase])
    );
}

#[test]
fn config_separate_input_and_output_buckets() {
    let config = parse_ok(
        "\
[[limits]]
name = \"claude\"
provider = \"anthropic\"
input_tokens_per_minute = 40000
output_tokens_per_minute = 8000
burst_output_tokens = 4000
requests_per_minute = 50
tenant_share = 0.5
default_max_output_tokens = 2048
learn_max_output = true
max_request_tokens = 40000
",
    );
    let limit = config.limit("claude").unwrap();
    assert_eq!(
        limit.token_buckets(),
        TokenBuckets::Split {
            // The preset's one-second window: 40000 / 60, rounded down.
            input: TokenRate {
                per_minute: 40_000,
                burst: 666
            },
            output: TokenRate {
                per_minute: 8_000,
                burst: 4_000
            },
        }
    );
    assert_eq!(
        limit.total_token_rate(),
        TokenRate {
            per_minute: 48_000,
            burst: 4_666
        }
    );
    assert_eq!((limit.tokens_per_minute, limit.burst_tokens), (0, 0));
    assert_eq!(limit.default_max_output_tokens, 2048);
    assert!(limit.learn_max_output);
    let effective = config.to_effective_toml();
    assert!(!effective.contains("\ntokens_per_minute"), "{effective}");
    assert!(!effective.contains("\nburst_tokens"), "{effective}");
    assert!(
        effective.contains("burst_input_tokens = 666"),
        "{effective}"
    );
    assert_eq!(parse_ok(&effective), config);

    let combined = parse_ok(LIMIT_A);
    assert_eq!(
        combined.limits[0].token_buckets(),
        TokenBuckets::Combined(TokenRate {
            per_minute: 100,
            burst: 100
        })
    );
}

#[test]
fn config_example_commented_anthropic_limit_is_valid() {
    let example = include_str!("../../../examples/ratekeeper.toml");
    let start = example
        .find("# --- anthropic example ---\n")
        .expect("the example marks its anthropic block");
    let end = example[start..]
        .find("# --- end of anthropic example ---")
        .expect("the block ends")
        + start;
    let block: String = example[start..end]
        .lines()
        .skip(1)
        .map(|line| format!("{}\n", line.strip_prefix("# ").unwrap_or(line)))
        .collect();
    let config = parse_ok(&block);
    let limit = config.limit("claude-sonnet").unwrap();
    assert_eq!(limit.provider, Provider::Anthropic);
    assert!(matches!(limit.token_buckets(), TokenBuckets::Split { .. }));
    assert_eq!(limit.tokenizer, Tokenizer::Chars);
    // The commented keys of the first limit are its defaults.
    let first_limit_end = example
        .match_indices("[[limits]]")
        .nth(1)
        .expect("a second limit")
        .0;
    let uncommented: String = example[..first_limit_end]
        .lines()
        .map(|line| {
            let key = line.trim_start_matches("# ");
            let is_default_key = [
                "enforcement_window =",
                "burst_tokens =",
                "burst_requests =",
                "burst_headroom_ms =",
                "tokenizer =",
                "chars_per_token =",
                "default_max_output_tokens =",
                "cost_rule =",
                "settle =",
                "learn_max_output =",
            ]
            .iter()
            .any(|k| key.starts_with(k));
            if is_default_key { key } else { line }.to_string() + "\n"
        })
        .chain(std::iter::once(example[first_limit_end..].to_string()))
        .collect();
    assert_eq!(
        parse_ok(&uncommented).limits[0],
        parse_ok(example).limits[0]
    );
}

#[test]
fn config_readme_token_counting_example_is_valid() {
    // The manual's "Token counting and cost" page (moved out of the README).
    let section = include_str!("../../../docs/token-counting.md");
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert!(
        !blocks.is_empty(),
        "no TOML example in docs/token-counting.md"
    );
    for block in blocks {
        let config = parse_ok(block);
        assert!(
            config
                .limits
                .iter()
                .any(|l| l.provider != Provider::Generic)
        );
    }
}
