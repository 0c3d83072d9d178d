//! `tests/fixtures/requests.json`, held against the real `ratekeeper
//! count-tokens` and `acquire --messages-file` (issue 28: the CLI reads what
//! the client reads).
//!
//! The fixture is a table of provider requests (OpenAI Chat Completions and
//! Responses, Anthropic Messages, images and tools included) with the prompt
//! tokens the daemon counts for each under each preset. The Python client's
//! `Client.estimate` must find the same numbers for the same JSON
//! (`clients/python/tests/test_request_shapes.py`, which also generates the
//! fixture); here `count-tokens` must.

use crate::support;

use std::process::{Command, Output};

use serde_json::Value;
use support::{Daemon, count_tokens};

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/requests.json");
    let text = std::fs::read_to_string(path).expect("read tests/fixtures/requests.json");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The count-tokens arguments of a preset, and of the case's `api`.
fn arguments(fixture: &Value, case: &Value, preset: &str) -> Vec<String> {
    let settings = &fixture["presets"][preset];
    let mut args = vec![
        "--provider".to_string(),
        settings["provider"].as_str().unwrap().to_string(),
        "--model".to_string(),
        settings["model"].as_str().unwrap().to_string(),
    ];
    if let Some(api) = case.get("api").and_then(Value::as_str) {
        args.extend(["--api".to_string(), api.to_string()]);
    }
    args
}

/// The `prompt_tokens: N` figure of count-tokens.
fn prompt_tokens(output: &Output) -> u64 {
    let stdout = text(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("prompt_tokens: "))
        .unwrap_or_else(|| panic!("no prompt_tokens line: {stdout}"));
    line.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn count_tokens_counts_what_the_client_estimates() {
    let fixture = fixture();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    let presets: Vec<&String> = fixture["presets"].as_object().unwrap().keys().collect();
    let mut wrong = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let request = case["request"].to_string();
        if let Some(refused) = case.get("refused").and_then(Value::as_str) {
            for preset in &presets {
                let args = arguments(&fixture, case, preset);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let output = count_tokens(&args, &request);
                let stderr = text(&output.stderr);
                assert_eq!(output.status.code(), Some(1), "{name} {preset}: {stderr}");
                assert!(stderr.contains(refused), "{name} {preset}: {stderr}");
            }
            continue;
        }
        for (preset, expected) in case["prompt_tokens"].as_object().unwrap() {
            let args = arguments(&fixture, case, preset);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let output = count_tokens(&args, &request);
            assert_eq!(
                output.status.code(),
                Some(0),
                "{name} {preset}: {}",
                text(&output.stderr)
            );
            let found = prompt_tokens(&output);
            if found != expected.as_u64().unwrap() {
                wrong.push(format!(
                    "{name} under {preset}: {found}, expected {expected}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The issue's example: an 11 KB system prompt and a 2.4 KB tool result are
/// counted whole (the CLI counted 25 tokens), images and the tool-use prompt
/// shown on their own.
#[test]
fn the_issue_example_is_counted_whole() {
    let fixture = fixture();
    let case = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|case| case["name"] == "anthropic_issue_28")
        .expect("the issue's case");
    let request = &case["request"];
    let system = request["system"].as_str().unwrap();
    let result = request["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap();
    assert!(
        (10_900..=11_100).contains(&system.len()),
        "{}",
        system.len()
    );
    assert!((2_300..=2_500).contains(&result.len()), "{}", result.len());

    let output = count_tokens(
        &["--provider", "anthropic", "--model", "claude-sonnet-4-5"],
        &request.to_string(),
    );
    let stdout = text(&output.stdout);
    let prompt = prompt_tokens(&output);
    assert_eq!(prompt, case["prompt_tokens"]["anthropic"].as_u64().unwrap());
    // The character estimate of the two texts alone, and the tool-use prompt.
    assert!(
        prompt as f64 > (system.len() + result.len()) as f64 / 3.5 * 1.1 + 346.0,
        "{stdout}"
    );
    assert!(
        stdout.contains(", images and tool-use prompt 346)"),
        "{stdout}"
    );
    // What the CLI counted before issue 28, reading the OpenAI chat shape
    // only (the system prompt and the tool blocks left out): 110 of 4,698.
    let openai_only = ratekeeper::tokens::openai::chat_request_from_json(&request.to_string())
        .expect("read as Chat Completions");
    let before = ratekeeper::tokens::count_messages(
        ratekeeper::tokens::Counter::Chars(Default::default()),
        &openai_only,
    )
    .unwrap();
    assert_eq!(before.total, 110, "{before:?}");
    // Detected without --provider anthropic too: it has a system prompt.
    let generic = count_tokens(&["--model", "claude-sonnet-4-5"], &request.to_string());
    assert_eq!(prompt_tokens(&generic), prompt);
}

/// `acquire --messages-file` sends the same cost: the daemon's grant is the
/// fixture's prompt plus the request's max_tokens.
#[test]
fn acquire_sends_what_count_tokens_counts() {
    let fixture = fixture();
    let daemon = Daemon::start(
        "[[limits]]\nname = \"claude\"\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\n\
         tokens_per_minute = 100000000\n",
    );
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "anthropic_issue_28",
        "anthropic_blocks",
        "responses_items_and_image",
    ] {
        let case = fixture["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|case| case["name"] == name)
            .unwrap();
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, case["request"].to_string()).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
            .args(["acquire", "claude", "--messages-file"])
            .arg(&file)
            .args(["--api", "anthropic", "--release"])
            .env("RATEKEEPER_SOCKET", &daemon.socket)
            .output()
            .unwrap();
        let stdout = text(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{name}: {stdout}{}",
            text(&output.stderr)
        );
        let prompt = case["prompt_tokens"]["anthropic"].as_u64().unwrap();
        let output_tokens = case["request"]
            .get("max_tokens")
            .or_else(|| case["request"].get("max_output_tokens"))
            .and_then(Value::as_u64)
            .unwrap();
        assert!(
            stdout.contains(&format!(" tokens={} ", prompt + output_tokens)),
            "{name}: {stdout}"
        );
    }
}
