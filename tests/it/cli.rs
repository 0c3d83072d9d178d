//! The command line as a user meets it: exit codes and messages of
//! `check-config`, `acquire`, `status`, `health`, `ping` (against a real
//! daemon, and through a Redis outage) and `count-tokens`.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use support::{Daemon, SpawnedDaemon, count_tokens};

fn ratekeeper(args: &[&str], socket: Option<&std::path::Path>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratekeeper"));
    command
        .args(args)
        .env_remove("RATEKEEPER_SOCKET")
        .env_remove("RATEKEEPER_REDIS_URL");
    if let Some(socket) = socket {
        command.env("RATEKEEPER_SOCKET", socket);
    }
    command.output().expect("run ratekeeper")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Issue 28: OS errors were printed twice (the message quoted its cause,
/// and the cause followed), and a second sidecar clashing on the metrics
/// port was not told which setting to change.
#[test]
fn a_failure_to_start_says_its_cause_once_and_the_setting_to_change() {
    let missing = ratekeeper(&["serve", "--config", "/nonexistent/ratekeeper.toml"], None);
    assert_eq!(missing.status.code(), Some(1));
    let said = text(&missing.stderr);
    assert_eq!(said.matches("os error 2").count(), 1, "{said}");

    let port = support::redis::free_port();
    let first = Daemon::start(&format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let dir = tempfile::tempdir().unwrap();
    let second = dir.path().join("second.toml");
    std::fs::write(
        &second,
        format!(
            "[server]\nsocket = \"{}\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n",
            dir.path().join("second.sock").display()
        ),
    )
    .unwrap();
    let clash = ratekeeper(&["serve", "--config", second.to_str().unwrap()], None);
    assert_eq!(clash.status.code(), Some(1));
    let said = text(&clash.stderr);
    assert_eq!(said.matches("os error 98").count(), 1, "{said}");
    assert!(said.contains("metrics.listen"), "{said}");
    drop(first);
}

/// Issue 28: `check-config` ignored `--config` and `RATEKEEPER_CONFIG`,
/// which `serve` reads: it checks the file `serve` would load.
#[test]
fn check_config_finds_its_file_as_serve_does() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("from-elsewhere.toml");
    std::fs::write(
        &file,
        "[[limits]]\nname = \"elsewhere\"\ntokens_per_minute = 7\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let by_flag = ratekeeper(&["check-config", "--config", path], None);
    assert_eq!(by_flag.status.code(), Some(0), "{}", text(&by_flag.stderr));
    assert!(text(&by_flag.stdout).contains("elsewhere"));
    let by_env = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .arg("check-config")
        .env("RATEKEEPER_CONFIG", path)
        .output()
        .unwrap();
    assert_eq!(by_env.status.code(), Some(0), "{}", text(&by_env.stderr));
    assert!(text(&by_env.stdout).contains("elsewhere"));
    let neither = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .arg("check-config")
        .env_remove("RATEKEEPER_CONFIG")
        .output()
        .unwrap();
    assert_eq!(neither.status.code(), Some(2), "{}", text(&neither.stderr));
}

#[test]
fn check_config_prints_the_effective_config_or_every_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 1000\n",
    )
    .unwrap();
    let output = ratekeeper(&["check-config", good.to_str().unwrap()], None);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let effective = text(&output.stdout);
    assert!(effective.contains("burst_tokens = 1000"), "{effective}");
    assert!(!text(&output.stderr).contains("warning"));

    // Valid, but an OpenAI model under the generic preset: a warning.
    let mismatched = dir.path().join("mismatched.toml");
    std::fs::write(
        &mismatched,
        "[[limits]]\nname = \"a\"\nmodel = \"gpt-4o\"\ntokens_per_minute = 1000\n",
    )
    .unwrap();
    let output = ratekeeper(&["check-config", mismatched.to_str().unwrap()], None);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("mismatched.toml: warning: limits[0] \"a\": model \"gpt-4o\" is OpenAI's"),
        "{stderr}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[limits]]\nname = \"a\"\ntokens_per_minute = 0\n\n[[limits]]\nname = \"a\"\ntokens_per_minute = 5\n",
    )
    .unwrap();
    let output = ratekeeper(&["check-config", bad.to_str().unwrap()], None);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("bad.toml:3:21"), "{stderr}");
    assert!(stderr.contains("must be greater than zero"), "{stderr}");
    assert!(stderr.contains("bad.toml:6:8"), "{stderr}");
    assert!(stderr.contains("duplicate limit name"), "{stderr}");

    // serve validates the same way and refuses to start.
    let output = ratekeeper(&["serve", "--config", bad.to_str().unwrap()], None);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("duplicate limit name"));
}

/// Issue 28: `check-config` showed one mistake at a time and guessed
/// none. Three independent mistakes (a misspelled key in `[server]`, one in
/// a limit, a bad value in another limit) come out of one run, each at its
/// line with the key meant; `serve` refuses with the same three.
#[test]
fn check_config_reports_every_mistake_in_one_run_with_the_key_meant() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("three.toml");
    std::fs::write(
        &file,
        "[server]\nsockett = \"/tmp/rk.sock\"\n\n\
         [[limits]]\nname = \"gpt-4o\"\ntoken_per_minute = 30000\n\n\
         [[limits]]\nname = \"gpt-4o-mini\"\ntokens_per_minute = 0\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let expected = [
        "3 problems:".to_string(),
        format!("{path}:2:1: server: unknown key `sockett`, did you mean `socket`?"),
        format!(
            "{path}:6:1: limits[0]: unknown key `token_per_minute`, did you mean `tokens_per_minute`?"
        ),
        format!(
            "{path}:10:21: limits[1] \"gpt-4o-mini\": tokens_per_minute must be greater than zero (got 0)"
        ),
    ];
    for args in [
        ["check-config", "--config", path],
        ["serve", "--config", path],
    ] {
        let output = ratekeeper(&args, None);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = text(&output.stderr);
        for line in &expected {
            assert!(stderr.contains(line.as_str()), "{args:?}: {line}\n{stderr}");
        }
        assert_eq!(stderr.lines().count(), 4, "{args:?}\n{stderr}");
    }
}

/// docs/cli.md's "Checking a config" example prints exactly what the page
/// says it prints.
#[test]
fn check_config_prints_what_the_docs_show() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
        .expect("docs/cli.md");
    let section = page
        .split("\n## Checking a config\n")
        .nth(1)
        .expect("docs/cli.md has a \"Checking a config\" section");
    let block = |fence: &str| {
        let start = section.find(fence).expect(fence) + fence.len();
        let end = start + section[start..].find("\n```").expect("a closing fence");
        &section[start..end + 1]
    };
    let (config, printed) = (block("```toml\n"), block("```text\n"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ratekeeper.toml"), config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(["check-config", "ratekeeper.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stderr), printed);
}

#[tokio::test]
async fn acquire_exit_codes_say_granted_or_denied() {
    let daemon =
        Daemon::start("[[limits]]\nname = \"gpt\"\ntokens_per_minute = 60\nburst_tokens = 100\n");
    let socket = Some(daemon.socket.as_path());
    let run = |args: &[&str]| ratekeeper(args, socket);

    let granted = run(&["acquire", "gpt", "--tokens", "80", "--max-wait", "0"]);
    assert_eq!(granted.status.code(), Some(0), "{}", text(&granted.stderr));
    assert!(text(&granted.stdout).starts_with("granted lease="));

    let denied = run(&["acquire", "gpt", "--tokens", "80", "--max-wait", "0"]);
    assert_eq!(denied.status.code(), Some(3));
    assert!(text(&denied.stdout).contains("denied bucket=tokens retry_after_ms="));

    let settled = run(&[
        "acquire",
        "gpt",
        "--tokens",
        "20",
        "--max-wait",
        "1000",
        "--report",
        "5",
    ]);
    assert_eq!(settled.status.code(), Some(0));
    assert!(
        text(&settled.stdout).contains("tokens_returned=15"),
        "{}",
        text(&settled.stdout)
    );

    let unknown = run(&["acquire", "nope", "--tokens", "1"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(text(&unknown.stderr).contains("UnknownLimit"));

    let status = run(&["status"]);
    assert_eq!(status.status.code(), Some(0));
    let table = text(&status.stdout);
    assert!(table.contains("store: embedded up"), "{table}");
    assert!(table.contains("\ngpt  waiters: 0\n"), "{table}");
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("  tokens") && line.ends_with('%')),
        "{table}"
    );

    let ping = run(&["ping"]);
    assert_eq!(ping.status.code(), Some(0));
    assert!(text(&ping.stdout).starts_with("pong"));
}

#[test]
fn client_commands_fail_clearly_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let output = ratekeeper(&["ping"], Some(&socket));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("cannot connect"), "{stderr}");
    // The cause once, not again as the error's source.
    assert_eq!(stderr.matches("os error 2").count(), 1, "{stderr}");
}

#[test]
fn count_tokens_prints_the_prompt_and_the_reservation() {
    use ratekeeper::tokens::{self, CharEstimator, Counter};
    let request = r#"{
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "How many tokens is this?"}]}
        ],
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "Look it up."}}],
        "max_tokens": 20
    }"#;
    let parsed = tokens::openai::chat_request_from_json(request).unwrap();
    let prompt = tokens::count_messages(
        Counter::for_model("gpt-4o", CharEstimator::default()),
        &parsed,
    )
    .unwrap();
    assert!(prompt.total > 20);

    let output = count_tokens(&["--model", "gpt-4o"], request);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let expected = format!(
        "counter: o200k_base (tiktoken)\n\
         prompt_tokens: {} (messages {}, tools {})\n\
         output_tokens: 20 (max_tokens)\n\
         reserved: {} (generic: prompt + output)\n",
        prompt.total,
        prompt.messages,
        prompt.tools,
        prompt.total + 20
    );
    assert_eq!(text(&output.stdout), expected);

    // openai charges the larger of its character rule and the output;
    // --max-tokens overrides the request's.
    let output = count_tokens(
        &[
            "--model",
            "gpt-4o",
            "--provider",
            "openai",
            "--max-tokens",
            "5000",
        ],
        request,
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with("counter: OpenAI's character rule (4 characters per token)\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("output_tokens: 5000 (--max-tokens)"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("reserved: 5000 (openai: max(prompt, output))\n"),
        "{stdout}"
    );

    // A bare list of messages, counted with the estimate, default output.
    let output = count_tokens(
        &["--model", "claude-sonnet-4-5", "--provider", "anthropic"],
        r#"[{"role": "user", "content": "hello there"}]"#,
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with("counter: the character estimate"),
        "{stdout}"
    );
    assert!(stdout.contains("output_tokens: 1024 (default)"), "{stdout}");

    // Bad input: exit 1 and a message that says what is wrong.
    for (args, input, message) in [
        (
            &["--model", "gpt-4o"][..],
            "{\"messages\": [",
            "not valid JSON",
        ),
        (
            &["--model", "gpt-4o"][..],
            "{\"prompt\": \"hi\"}",
            "no \"messages\"",
        ),
    ] {
        let output = count_tokens(args, input);
        assert_eq!(output.status.code(), Some(1), "{input}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(message), "{input}: {stderr}");
        assert!(text(&output.stdout).is_empty());
    }
}

/// Issue: every probe wrote two INFO lines ("client said hello", "connection
/// closed"), about 36 a minute per pod. A connection that ends cleanly with
/// nothing left behind is routine, logged at DEBUG.
#[tokio::test]
async fn probes_leave_no_info_line() {
    let daemon = SpawnedDaemon::start_with_env(
        "[[limits]]\nname = \"gpt\"\ntokens_per_minute = 6000\n",
        &[("RUST_LOG", "info")],
    );
    for command in [
        &["ping"][..],
        &["health"],
        &["status"],
        &["status", "--json"],
        &["acquire", "gpt", "--tokens", "5", "--release"],
    ] {
        let output = ratekeeper(command, Some(&daemon.socket));
        assert_eq!(
            output.status.code(),
            Some(0),
            "{command:?}: {}",
            text(&output.stderr)
        );
    }
    // A worker that disconnects with a lease unreported is worth a line; it
    // comes after the probes' closes.
    let worker = daemon.client().await;
    worker.call(support::acquire("gpt", 5, 0)).await.unwrap();
    drop(worker);
    daemon.wait_for_log("unreported_leases=1").await;
    let log = daemon.log();
    let connection_lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("connection"))
        .collect();
    assert_eq!(connection_lines.len(), 1, "{log}");
    assert!(!log.contains("client said hello"), "{log}");
}

/// A limit with tenant shares, on Redis under `policy`.
fn redis_config(redis: &RedisServer, policy: &str) -> String {
    format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 300\n{policy}\n\n\
         [[limits]]\nname = \"gpt\"\ntokens_per_minute = 6000\ntenant_share = 0.5\nburst_headroom_ms = 0\n",
        redis.url()
    )
}

fn json(output: &Output) -> serde_json::Value {
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("status --json prints JSON")
}

/// Issue: status failed outright (StoreUnavailable, exit 1) during a Redis
/// outage, even while the local policy granted; tenant buckets never showed.
#[tokio::test]
async fn status_answers_through_a_redis_outage() {
    let mut redis = RedisServer::start();
    let daemon = Daemon::start(&redis_config(
        &redis,
        "on_failure = \"local\"\nlocal_share = 0.5",
    ));
    let socket = Some(daemon.socket.as_path());
    let run = |args: &[&str]| ratekeeper(args, socket);
    let acquired = run(&["acquire", "gpt", "--tokens", "100", "--tenant", "acme"]);
    assert_eq!(
        acquired.status.code(),
        Some(0),
        "{}",
        text(&acquired.stderr)
    );

    let up = json(&run(&["status", "--json"]));
    assert_eq!(up["health"]["store_up"], true);
    assert_eq!(up["health"]["policy"], "local");
    assert_eq!(up["levels_from"], "store");
    let buckets = &up["limits"][0]["buckets"];
    assert_eq!(buckets[0]["name"], "tokens");
    // 100 taken, refilling at 100 a second since.
    let level = |bucket: &serde_json::Value| bucket["level"].as_i64().expect("a level");
    assert!((5900..=6000).contains(&level(&buckets[0])), "{buckets}");
    assert_eq!(buckets[1]["name"], "tenant");
    assert_eq!(buckets[1]["tenant"], "acme");
    assert!((2900..=3000).contains(&level(&buckets[1])), "{buckets}");

    redis.kill();
    let started = Instant::now();
    let down = loop {
        let down = json(&run(&["status", "--json"]));
        if down["health"]["store_up"] == false {
            break down;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{down}");
    };
    assert_eq!(down["health"]["ready"], true, "the local policy serves");
    assert_eq!(down["levels_from"], "local");
    // The local buckets: half of each, full (nothing granted locally yet).
    let buckets = &down["limits"][0]["buckets"];
    assert_eq!(buckets[0]["capacity"], 3000);
    assert_eq!(buckets[0]["level"], 3000);
    let table = text(&run(&["status"]).stdout);
    assert!(table.contains("store: redis DOWN for"), "{table}");
    assert!(
        table.contains("levels: this sidecar's local buckets"),
        "{table}"
    );
    assert!(table.contains("acme"), "{table}");
}

#[tokio::test]
async fn status_json_answers_during_an_outage_under_fail_closed() {
    let mut redis = RedisServer::start();
    let daemon = Daemon::start(&redis_config(&redis, "on_failure = \"fail_closed\""));
    redis.kill();
    let socket = Some(daemon.socket.as_path());
    let started = Instant::now();
    let down = loop {
        let down = json(&ratekeeper(&["status", "--json"], socket));
        if down["health"]["store_up"] == false {
            break down;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{down}");
    };
    assert_eq!(down["health"]["ready"], false);
    assert_eq!(down["levels_from"], "none");
    assert_eq!(
        down["limits"][0]["buckets"][0]["level"],
        serde_json::Value::Null
    );
    let health = ratekeeper(&["health"], socket);
    assert_eq!(health.status.code(), Some(1));
    assert!(
        text(&health.stdout).contains("fail_closed"),
        "{}",
        text(&health.stdout)
    );
}

#[tokio::test]
async fn status_watch_prints_again_and_again() {
    let daemon = Daemon::start("[[limits]]\nname = \"gpt\"\ntokens_per_minute = 60\n");
    let mut watching = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(["status", "--json", "--watch", "0.05"])
        .env("RATEKEEPER_SOCKET", &daemon.socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run status --watch");
    let mut lines = BufReader::new(watching.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().expect("another frame").unwrap();
        let frame: serde_json::Value = serde_json::from_str(&line).expect("one JSON object a line");
        assert_eq!(frame["limits"][0]["name"], "gpt");
    }
    watching.kill().unwrap();
    watching.wait().unwrap();

    let bad = ratekeeper(&["status", "--watch", "0"], Some(&daemon.socket));
    assert_eq!(bad.status.code(), Some(2));
    let health = ratekeeper(&["health"], Some(&daemon.socket));
    assert_eq!(health.status.code(), Some(0));
    assert_eq!(text(&health.stdout), "ready: the embedded store answers\n");
}

/// An interval `status --watch` cannot wait is refused with a message and
/// exit code 2, before any connection: never a panic.
#[test]
fn status_watch_refuses_an_interval_it_cannot_wait() {
    for secs in ["1e300", "inf", "NaN", "-1", "0", "0.0001", "86401", "soon"] {
        let out = ratekeeper(&["status", &format!("--watch={secs}")], None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--watch {secs}: {stderr}");
        assert!(
            stderr.contains("--watch") && !stderr.contains("panicked"),
            "--watch {secs}: {stderr}"
        );
    }
}

/// A limit with separate input and output buckets that barely refill (one
/// token a second), so levels can be asserted within a token or two.
const SIDES: &str = "[[limits]]\nname = \"sides\"\n\
    input_tokens_per_minute = 60\nburst_input_tokens = 10000\n\
    output_tokens_per_minute = 60\nburst_output_tokens = 10000\nburst_headroom_ms = 0\n";

/// The level of each bucket of `limit`, from `status --json`.
fn levels(socket: &std::path::Path, limit: &str) -> Vec<(String, i64)> {
    let status = json(&ratekeeper(
        &["status", "--json", "--limit", limit],
        Some(socket),
    ));
    status["limits"][0]["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|bucket| {
            let name = bucket["name"].as_str().expect("a name").to_string();
            (name, bucket["level"].as_i64().expect("a level"))
        })
        .collect()
}

fn assert_near(levels: &[(String, i64)], expected: &[(&str, i64)]) {
    assert_eq!(levels.len(), expected.len(), "{levels:?}");
    for ((name, level), (want_name, want)) in levels.iter().zip(expected) {
        assert_eq!(name, want_name, "{levels:?}");
        assert!(
            (*want..=want + 5).contains(level),
            "{levels:?} vs {expected:?}"
        );
    }
}

/// Issue 12: the CLI could give neither side on its own nor settle both.
#[tokio::test]
async fn acquire_reserves_and_settles_each_side() {
    let daemon = Daemon::start(SIDES);
    let socket = daemon.socket.as_path();
    let run = |args: &[&str]| ratekeeper(args, Some(socket));

    let granted = run(&["acquire", "sides", "--input", "300", "--output", "200"]);
    assert_eq!(granted.status.code(), Some(0), "{}", text(&granted.stderr));
    assert!(
        text(&granted.stdout).contains(" tokens=500 "),
        "{}",
        text(&granted.stdout)
    );
    let after_grant = [("input_tokens", 9700), ("output_tokens", 9800)];
    assert_near(&levels(socket, "sides"), &after_grant);

    let settled = run(&[
        "acquire",
        "sides",
        "--input",
        "300",
        "--output",
        "200",
        "--report-input",
        "250",
        "--report-output",
        "50",
    ]);
    assert_eq!(settled.status.code(), Some(0), "{}", text(&settled.stderr));
    assert!(
        text(&settled.stdout).contains("tokens_returned=200"),
        "{}",
        text(&settled.stdout)
    );
    assert_near(
        &levels(socket, "sides"),
        &[("input_tokens", 9450), ("output_tokens", 9750)],
    );

    // One side alone: the other is zero, on both ends.
    let output_only = run(&[
        "acquire",
        "sides",
        "--output",
        "100",
        "--report-output",
        "40",
    ]);
    assert_eq!(
        output_only.status.code(),
        Some(0),
        "{}",
        text(&output_only.stderr)
    );
    assert!(text(&output_only.stdout).contains("tokens_returned=60"));
    assert_near(
        &levels(socket, "sides"),
        &[("input_tokens", 9450), ("output_tokens", 9710)],
    );

    // What cannot be meant together is a usage error (exit 2), said clearly.
    for args in [
        &["acquire", "sides"][..],
        &["acquire", "sides", "--tokens", "5", "--input", "5"],
        &[
            "acquire",
            "sides",
            "--input",
            "5",
            "--report",
            "5",
            "--report-input",
            "5",
        ],
        &[
            "acquire",
            "sides",
            "--input",
            "5",
            "--release",
            "--report-output",
            "5",
        ],
        &[
            "acquire",
            "sides",
            "--input",
            "5",
            "--messages-file",
            "x.json",
        ],
    ] {
        let refused = run(args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        assert!(text(&refused.stderr).contains("error:"), "{args:?}");
    }
    let help = text(&run(&["acquire", "--help"]).stdout);
    assert!(
        help.contains("Tokens to reserve in total: the prompt plus the maximum output"),
        "{help}"
    );
}

/// A chat request in both of OpenAI's shapes, written to a file.
fn write_requests(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let chat = dir.join("chat.json");
    std::fs::write(
        &chat,
        r#"{"model": "gpt-4o", "max_tokens": 30, "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "What colour is the sky on a clear day?"}
        ]}"#,
    )
    .unwrap();
    let responses = dir.join("responses.json");
    std::fs::write(
        &responses,
        r#"{"model": "gpt-4o", "max_output_tokens": 30,
            "instructions": "Answer in one word.",
            "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "What colour is the sky on a clear day?"}
            ]}]}"#,
    )
    .unwrap();
    (chat, responses)
}

/// The `reserved: N` figure of count-tokens.
fn reserved(output: &Output) -> u64 {
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let line = stdout
        .lines()
        .find(|line| line.starts_with("reserved: "))
        .unwrap_or_else(|| panic!("no reserved line: {stdout}"));
    line["reserved: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn acquire_counts_a_messages_file_as_count_tokens_does() {
    let daemon = Daemon::start(
        "[[limits]]\nname = \"gpt\"\nmodel = \"gpt-4o\"\ntokens_per_minute = 600000\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let (chat, responses) = write_requests(dir.path());
    let counted = reserved(&count_tokens(&[], &std::fs::read_to_string(&chat).unwrap()));
    assert!(counted > 30, "{counted}");

    for file in [&chat, &responses] {
        let granted = ratekeeper(
            &[
                "acquire",
                "gpt",
                "--messages-file",
                file.to_str().unwrap(),
                "--release",
            ],
            Some(&daemon.socket),
        );
        assert_eq!(granted.status.code(), Some(0), "{}", text(&granted.stderr));
        let stdout = text(&granted.stdout);
        assert!(
            stdout.contains(&format!(" tokens={counted} ")),
            "{file:?}: {stdout}"
        );
        assert!(
            stdout.contains(&format!("tokens_returned={counted}")),
            "{stdout}"
        );
    }
    // --output replaces the file's max_tokens.
    let granted = ratekeeper(
        &[
            "acquire",
            "gpt",
            "--messages-file",
            chat.to_str().unwrap(),
            "--output",
            "7",
        ],
        Some(&daemon.socket),
    );
    let stdout = text(&granted.stdout);
    assert!(
        stdout.contains(&format!(" tokens={} ", counted - 30 + 7)),
        "{stdout}"
    );

    let missing = ratekeeper(
        &[
            "acquire",
            "gpt",
            "--messages-file",
            "/nonexistent/request.json",
        ],
        Some(&daemon.socket),
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("cannot read /nonexistent/request.json"),
        "{}",
        text(&missing.stderr)
    );
}

/// Issue 12: count-tokens required --model even when the JSON named it, and
/// refused the Responses API's `input`.
#[test]
fn count_tokens_reads_the_model_and_the_responses_shape() {
    let dir = tempfile::tempdir().unwrap();
    let (chat, responses) = write_requests(dir.path());
    let chat = std::fs::read_to_string(chat).unwrap();
    let responses = std::fs::read_to_string(responses).unwrap();

    let from_json = count_tokens(&[], &chat);
    assert!(text(&from_json.stdout).starts_with("counter: o200k_base (tiktoken)\n"));
    // The Responses request says the same: the same figures.
    let from_responses = count_tokens(&[], &responses);
    assert_eq!(text(&from_responses.stdout), text(&from_json.stdout));
    assert_eq!(reserved(&from_responses), reserved(&from_json));
    // --model wins over the request's.
    let overridden = count_tokens(&["--model", "gpt-4"], &chat);
    assert!(text(&overridden.stdout).starts_with("counter: cl100k_base (tiktoken)\n"));
    let plain = count_tokens(
        &[],
        r#"{"model": "gpt-4o", "input": "hello", "max_output_tokens": 5}"#,
    );
    assert!(text(&plain.stdout).contains("output_tokens: 5 (max_tokens)"));

    for (input, message) in [
        (
            r#"[{"role": "user", "content": "hi"}]"#,
            "no model to count for: give --model, or a \"model\" field",
        ),
        (
            r#"{"model": "gpt-4o", "input": [{"type": "reasoning", "summary": []}]}"#,
            "input[0]: items of type \"reasoning\" are not counted",
        ),
        (
            r#"{"model": "gpt-4o", "input": 3}"#,
            "\"input\" must be a string or a list",
        ),
    ] {
        let output = count_tokens(&[], input);
        assert_eq!(output.status.code(), Some(1), "{input}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(message), "{input}: {stderr}");
    }
}

#[test]
fn completions_for_every_shell() {
    for (shell, marker) in [
        ("bash", "_ratekeeper()"),
        ("zsh", "#compdef ratekeeper"),
        ("fish", "complete -c ratekeeper"),
        ("elvish", "ratekeeper"),
        ("powershell", "ratekeeper"),
    ] {
        let output = ratekeeper(&["completions", shell], None);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{shell}: {}",
            text(&output.stderr)
        );
        let script = text(&output.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("count-tokens"), "{shell}");
        assert!(script.contains("messages-file"), "{shell}");
    }
    let unknown = ratekeeper(&["completions", "tcsh"], None);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown.stderr).contains("possible values"));
}

/// `--version` names the commit it was built from when built from a git
/// checkout (or given RATEKEEPER_GIT_COMMIT), else the version alone.
#[test]
fn version_names_the_commit() {
    let output = ratekeeper(&["--version"], None);
    assert_eq!(output.status.code(), Some(0));
    let version = text(&output.stdout);
    let package = env!("CARGO_PKG_VERSION");
    let root = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| text(&output.stdout).trim().to_string())
    };
    let checkout = git(&["rev-parse", "--show-toplevel"])
        .is_some_and(|top| std::fs::canonicalize(top).ok() == std::fs::canonicalize(root).ok());
    let commit = option_env!("RATEKEEPER_GIT_COMMIT")
        .map(str::to_string)
        .or_else(|| {
            checkout
                .then(|| git(&["rev-parse", "--short", "HEAD"]))
                .flatten()
        });
    match commit {
        Some(commit) => assert_eq!(version, format!("ratekeeper {package} ({commit})\n")),
        None => assert_eq!(version, format!("ratekeeper {package}\n")),
    }
}

/// Issue 12: RATEKEEPER_LOG_LEVEL sets ratekeeper's own level; --log-level
/// and RUST_LOG win over it, in that order.
#[tokio::test]
async fn log_level_comes_from_rust_log_then_the_flag_then_the_variable() {
    const CONFIG: &str = "[[limits]]\nname = \"a\"\ntokens_per_minute = 60\n";
    /// `serve` with `args` and `env` logs INFO lines if `info`, DEBUG lines if `debug`.
    struct Case {
        args: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
        info: bool,
        debug: bool,
    }
    let case = |args, env, info, debug| Case {
        args,
        env,
        info,
        debug,
    };
    let cases = [
        case(&[], &[], true, false),
        case(&[], &[("RATEKEEPER_LOG_LEVEL", "debug")], true, true),
        case(&[], &[("RATEKEEPER_LOG_LEVEL", "warn")], false, false),
        case(
            &["--log-level", "warn"],
            &[("RATEKEEPER_LOG_LEVEL", "debug")],
            false,
            false,
        ),
        case(
            &[],
            &[("RUST_LOG", "info"), ("RATEKEEPER_LOG_LEVEL", "debug")],
            true,
            false,
        ),
    ];
    for Case {
        args,
        env,
        info,
        debug,
    } in cases
    {
        let mut daemon = SpawnedDaemon::start_with_log_settings(CONFIG, args, env);
        let ping = ratekeeper(&["ping"], Some(&daemon.socket));
        assert_eq!(ping.status.code(), Some(0));
        assert!(daemon.terminate().success());
        let log = daemon.log();
        assert_eq!(log.contains(" INFO "), info, "{args:?} {env:?}:\n{log}");
        assert_eq!(log.contains(" DEBUG "), debug, "{args:?} {env:?}:\n{log}");
        if debug {
            assert!(log.contains("client said hello"), "{log}");
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ratekeeper.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("RATEKEEPER_SOCKET", dir.path().join("rk.sock"))
        .env("RATEKEEPER_LOG_LEVEL", "verbose")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("RATEKEEPER_LOG_LEVEL=\"verbose\" is not a level"),
        "{}",
        text(&refused.stderr)
    );
}
