//! The command line as a user meets it: exit codes and messages of
//! `check-config`, `acquire`, `status` and `ping` against a real daemon.

mod support;

use std::process::{Command, Output};

use support::Daemon;

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
    assert!(table.contains("store: embedded"), "{table}");
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("gpt") && line.contains("tokens")),
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
