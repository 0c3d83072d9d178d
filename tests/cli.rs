//! The command line as a user meets it: exit codes and messages of
//! `check-config`, `acquire`, `status`, `health`, `ping` (against a real
//! daemon, and through a Redis outage) and `count-tokens`.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::Daemon;
use support::redis::RedisServer;

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
    assert!(
        text(&output.stderr).contains("cannot connect"),
        "{}",
        text(&output.stderr)
    );
}

/// `ratekeeper count-tokens` with `stdin` as its input.
fn count_tokens(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .arg("count-tokens")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ratekeeper");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
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
    let daemon = Daemon::start_with_env(
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
