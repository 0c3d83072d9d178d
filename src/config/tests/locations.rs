//! Where problems are reported: every one, in file order, at its line and
//! column.

use super::*;
use crate::config::diagnostics::line_col;

#[test]
fn config_reports_every_error_in_file_order() {
    let text = "\
default_priority = \"nope\"
[[limits]]
name = \"a\"
tokens_per_minute = 0
tenant_share = 2.0

[[limits]]
name = \"a\"
tokens_per_minute = 10

[[priorities]]
name = \"p\"
limits = [\"b\"]
";
    let message = parse_err(text);
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(lines.len(), 6, "{message}");
    assert_eq!(lines[0], "5 problems:");
    assert!(lines[1].starts_with("test.toml:1:20: default_priority \"nope\""));
    assert!(lines[2].starts_with("test.toml:4:21: limits[0] \"a\": tokens_per_minute"));
    assert!(lines[3].starts_with("test.toml:5:16: limits[0] \"a\": tenant_share"));
    assert!(lines[4].starts_with("test.toml:8:8: limits[1] \"a\": duplicate limit name"));
    assert!(lines[5].starts_with("test.toml:13:11: priorities[0] \"p\": limits names \"b\""));
}

/// Issue 28: one run reports every mistake, not one at a time: keys that
/// cannot be read (unknown, misspelled, of a value no choice names), each
/// with the key or value meant, beside every problem validation finds in
/// the rest.
#[test]
fn config_reports_unreadable_keys_and_invalid_values_in_one_run() {
    let text = "\
[server]
sockett = \"/run/rk.sock\"

[[limits]]
name = \"a\"
token_per_minute = 1000

[[limits]]
name = \"b\"
tokens_per_minute = 0
provider = \"opnai\"
";
    let message = parse_err(text);
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(
        lines,
        [
            "4 problems:",
            "test.toml:2:1: server: unknown key `sockett`, did you mean `socket`?",
            "test.toml:6:1: limits[0]: unknown key `token_per_minute`, did you mean `tokens_per_minute`?",
            "test.toml:10:21: limits[1] \"b\": tokens_per_minute must be greater than zero (got 0)",
            "test.toml:11:12: limits[1].provider: unknown value `opnai`, expected one of `openai`, `anthropic`, `generic`; did you mean `openai`?",
        ],
        "{message}"
    );
}

/// A key that cannot be read is reported once: what only follows from its
/// absence ("a limit needs a bucket", "url is required") is not repeated,
/// while independent problems in the same table still are.
#[test]
fn config_does_not_repeat_what_follows_from_an_unreadable_key() {
    let cases = [
        (
            "[[limits]]\nname = \"a\"\ntokens_per_minute = \"lots\"\n",
            vec!["test.toml:3:21: limits[0].tokens_per_minute: invalid type"],
        ),
        (
            "[redis]\nurll = \"redis://h\"\n",
            vec!["test.toml:2:1: redis: unknown key `urll`, did you mean `url`?"],
        ),
        (
            "[redis]\nurl = \"redis://h\"\non_failure = \"locall\"\nlocal_share = 0.5\n",
            vec!["test.toml:3:14: redis.on_failure: unknown value `locall`"],
        ),
        (
            "[[limits]]\nname = 7\ntokens_per_minute = 1\n",
            vec!["test.toml:2:8: limits[0].name: invalid type: integer `7`, expected a string"],
        ),
        (
            "[[limits]]\nname = \"a\"\ntoken_per_minute = 1\ntenant_share = 2.0\nburst_tokens = 5\n",
            vec![
                "test.toml:3:1: limits[0]: unknown key `token_per_minute`",
                "test.toml:4:16: limits[0] \"a\": tenant_share must be in (0, 1] (got 2)",
            ],
        ),
    ];
    for (text, expected) in cases {
        let message = parse_err(text);
        let lines: Vec<&str> = message
            .lines()
            .filter(|l| !l.ends_with("problems:"))
            .collect();
        assert_eq!(lines.len(), expected.len(), "{text}\n{message}");
        for (line, expected) in lines.iter().zip(expected) {
            assert!(line.starts_with(expected), "{text}\n{message}");
        }
    }
}

#[test]
fn config_columns_count_characters() {
    let message = parse_err("[[limits]]\nname = \"a\" # é\ntokens_per_minute = 0\n");
    assert!(message.contains("test.toml:3:21:"), "{message}");
    let message = parse_err("# ééé\n[[limits]]\nname = \"é\"; tokens_per_minute = 1\n");
    assert!(message.starts_with("test.toml:3:"), "{message}");
}

#[test]
fn config_line_col() {
    let text = "ab\ncdé\n\nx";
    assert_eq!(line_col(text, 0), (1, 1));
    assert_eq!(line_col(text, 2), (1, 3));
    assert_eq!(line_col(text, 3), (2, 1));
    assert_eq!(line_col(text, 7), (2, 4));
    assert_eq!(line_col(text, 8), (3, 1));
    assert_eq!(line_col(text, 9), (4, 1));
    assert_eq!(line_col(text, 100), (4, 2));
}
