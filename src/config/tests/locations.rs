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
    assert_eq!(lines.len(), 5, "{message}");
    assert!(lines[0].starts_with("test.toml:1:20: default_priority \"nope\""));
    assert!(lines[1].starts_with("test.toml:4:21: limits[0] \"a\": tokens_per_minute"));
    assert!(lines[2].starts_with("test.toml:5:16: limits[0] \"a\": tenant_share"));
    assert!(lines[3].starts_with("test.toml:8:8: limits[1] \"a\": duplicate limit name"));
    assert!(lines[4].starts_with("test.toml:13:11: priorities[0] \"p\": limits names \"b\""));
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
