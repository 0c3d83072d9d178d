//! What an operator's accidents and a hostile local client must not break:
//! forged log lines, a closed stderr. Each test reproduces a finding that
//! broke the daemon before it was fixed.

mod support;

use ratekeeper::proto::{PROTOCOL_VERSION, Request, Response};
use support::{Daemon, acquire, granted, receive, send};

const CONFIG: &str = r#"
[[limits]]
name = "gpt"
tokens_per_minute = 600000
"#;

/// A client name with a newline and a fake log line after it.
const FORGED: &str = "worker\n2099-01-01T00:00:00.000000Z  INFO ratekeeper: forged line";

async fn hello_as(daemon: &Daemon, client_name: &str) {
    let mut stream = daemon.raw().await;
    let hello = Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_name: client_name.into(),
    };
    send(&mut stream, 1, hello).await;
    let answer = receive(&mut stream).await.expect("hello answer");
    assert!(matches!(answer.response, Response::Hello { .. }));
}

#[tokio::test]
async fn a_client_name_cannot_forge_a_text_log_line() {
    let daemon = Daemon::start(CONFIG);
    hello_as(&daemon, FORGED).await;
    daemon.wait_for_log("client said hello").await;
    let log = daemon.log();
    assert!(
        !log.lines().any(|line| line.starts_with("2099-")),
        "a forged line:\n{log}"
    );
    assert!(log.contains(r"worker\n2099-01-01"), "escaped name:\n{log}");
}

#[tokio::test]
async fn a_client_name_cannot_forge_a_json_log_line() {
    let daemon = Daemon::start_with_env(CONFIG, &[("RATEKEEPER_LOG_FORMAT", "json")]);
    hello_as(&daemon, FORGED).await;
    daemon.wait_for_log("client said hello").await;
    for line in daemon.log().lines() {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|problem| panic!("not one JSON record: {line:?}: {problem}"));
        if record["message"] == "client said hello" {
            assert_eq!(record["client"], FORGED);
        }
    }
}

/// Issue: with the reader of stderr gone, every connection was dropped at
/// its first log line, and SIGTERM exited 101 leaving the socket behind.
#[tokio::test]
async fn a_closed_stderr_breaks_nothing() {
    let mut daemon = Daemon::start_with_closed_stderr(CONFIG);
    for _ in 0..5 {
        let client = daemon.client().await;
        let (lease, _, _) = granted(&client.call(acquire("gpt", 10, 0)).await.unwrap());
        let released = client.call(Request::Release { lease }).await.unwrap();
        assert!(matches!(released, Response::Released { .. }), "{released:?}");
    }
    let status = daemon.terminate();
    assert!(status.success(), "exit status {status}");
    assert!(!daemon.socket.exists(), "the socket file was left behind");
}
