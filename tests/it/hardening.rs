//! What an operator's accidents and a hostile local client must not break:
//! forged log lines, a closed stderr. Each test reproduces a finding that
//! broke the daemon before it was fixed.

use crate::support;

use ratekeeper::proto::{PROTOCOL_VERSION, Request, Response};
use support::{Daemon, SpawnedDaemon, acquire, granted, receive, send};

const CONFIG: &str = r#"
[[limits]]
name = "gpt"
tokens_per_minute = 600000
"#;

/// A client name with a newline and a fake log line after it.
const FORGED: &str = "worker\n2099-01-01T00:00:00.000000Z  INFO ratekeeper: forged line";

async fn hello_as(daemon: &SpawnedDaemon, client_name: &str) {
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
    let daemon = SpawnedDaemon::start(CONFIG);
    hello_as(&daemon, FORGED).await;
    daemon.wait_for_log("client said hello").await;
    let log = daemon.log();
    assert!(
        !log.lines().any(|line| line.starts_with("2099-")),
        "a forged line:\n{log}"
    );
    assert!(log.contains(r"worker\n2099-01-01"), "escaped name:\n{log}");
}

/// The decision log (DEBUG) shows the names an acquire carries: a limit,
/// tenant or priority cannot forge a line either.
#[tokio::test]
async fn an_acquire_cannot_forge_a_decision_line() {
    let daemon = SpawnedDaemon::start(CONFIG);
    let client = daemon.client().await;
    let mut forged = match acquire(FORGED, 10, 0) {
        Request::Acquire(fields) => fields,
        _ => unreachable!(),
    };
    forged.tenant = Some(FORGED.into());
    forged.priority = Some(FORGED.into());
    client.call(Request::Acquire(forged)).await.unwrap();
    daemon.wait_for_log("outcome=\"error\"").await;
    let log = daemon.log();
    assert!(
        !log.lines().any(|line| line.starts_with("2099-")),
        "a forged line:\n{log}"
    );
    assert!(
        log.contains(r#"limit="worker\n2099-01-01"#),
        "escaped limit:\n{log}"
    );
}

#[tokio::test]
async fn a_client_name_cannot_forge_a_json_log_line() {
    let daemon = SpawnedDaemon::start_with_env(CONFIG, &[("RATEKEEPER_LOG_FORMAT", "json")]);
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
    let mut daemon = SpawnedDaemon::start_with_closed_stderr(CONFIG);
    for _ in 0..5 {
        let client = daemon.client().await;
        let (lease, _, _) = granted(&client.call(acquire("gpt", 10, 0)).await.unwrap());
        let released = client.call(Request::Release { lease }).await.unwrap();
        assert!(
            matches!(released, Response::Released { .. }),
            "{released:?}"
        );
    }
    let status = daemon.terminate();
    assert!(status.success(), "exit status {status}");
    assert!(!daemon.socket.exists(), "the socket file was left behind");
}

/// Issue: started under umask 000, the socket existed with mode 0777 before
/// the configured 0660 was applied, so any local user could connect in that
/// window. The window is microseconds wide, so the test does not race it: it
/// watches the directory with inotify and requires that the socket is never
/// chmod-ed after its creation (no IN_ATTRIB), and has its final mode — so
/// it was created with it.
#[test]
fn the_socket_is_created_with_its_final_mode() {
    use std::mem::MaybeUninit;
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};

    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rk.sock");
    let config = dir.path().join("rk.toml");
    let text = format!(
        "[server]\nsocket = {:?}\nsocket_mode = \"0660\"\n{CONFIG}",
        socket.display().to_string()
    );
    std::fs::write(&config, text).unwrap();
    let watch = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(&watch, dir.path(), WatchFlags::CREATE | WatchFlags::ATTRIB).unwrap();

    let mut daemon = Command::new("sh")
        .arg("-c")
        .arg("umask 000 && exec \"$0\" serve --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_ratekeeper"))
        .arg(&config)
        .env_remove("RATEKEEPER_SOCKET")
        .env_remove("RATEKEEPER_REDIS_URL")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    let _ = daemon.kill();
    let _ = daemon.wait();

    let mut buffer = [MaybeUninit::uninit(); 4096];
    let mut events = inotify::Reader::new(&watch, &mut buffer);
    let mut seen = Vec::new();
    while let Ok(event) = events.next() {
        let name = event
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        if name.as_deref() == Some("rk.sock") {
            seen.push(if event.events().contains(ReadFlags::ATTRIB) {
                "attrib"
            } else {
                "create"
            });
        }
    }
    assert_eq!(format!("{mode:o}"), "660");
    assert_eq!(
        seen,
        ["create"],
        "the socket's mode changed after it was created"
    );
}

/// A limit that counts with tiktoken (o200k_base) and has room for anything.
const COUNTING: &str = r#"
[[limits]]
name = "gpt"
model = "gpt-4o-mini"
tokens_per_minute = 600000000
burst_tokens = 100000000
"#;

fn by_messages(text: &str, max_wait_ms: u64) -> Request {
    Request::Acquire(ratekeeper::proto::Acquire {
        limit: "gpt".into(),
        tenant: None,
        priority: None,
        cost: ratekeeper::proto::Cost::Messages(ratekeeper::proto::ChatRequest {
            messages: vec![ratekeeper::proto::ChatMessage::text("user", &[text])],
            tools_json: None,
            max_output_tokens: Some(10),
        }),
        max_wait_ms: Some(max_wait_ms),
    })
}

/// Issue: twelve pipelined acquires of 3.9 MiB prompts, then a disconnect,
/// kept the daemon busy 13 s for nobody, and another client's 2 KB
/// acquire-by-messages with `max_wait` 0.5 s waited up to 6.7 s. Now large
/// prompts queue apart from small ones (a bounded queue, with its own
/// error when full), and a count stops when its client leaves.
#[tokio::test]
async fn huge_prompts_neither_starve_others_nor_outlive_their_client() {
    use ratekeeper::proto::ErrorCode;
    let daemon = Daemon::start(COUNTING);
    let mut hog = daemon.raw_after_hello().await;
    // A single word of 3.9 MiB: the slowest text there is for BPE.
    let word = "a".repeat(3_900_000);
    for request_id in 1..=7 {
        send(&mut hog, request_id, by_messages(&word, 0)).await;
    }
    // One is counted, four wait, the others are refused at once.
    let mut refused = 0;
    for _ in 0..2 {
        let answer = receive(&mut hog).await.expect("an answer");
        assert_eq!(support::error_code(&answer.response), ErrorCode::Overloaded);
        refused += 1;
    }
    assert_eq!(refused, 2);
    // Meanwhile a small prompt of another client goes through at once.
    let other = daemon.client().await;
    let started = std::time::Instant::now();
    let small = "word ".repeat(400);
    let answer = other.call(by_messages(&small, 500)).await.unwrap();
    assert!(matches!(answer, Response::Granted { .. }), "{answer:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(500),
        "the small acquire waited {:?} behind the large prompts",
        started.elapsed()
    );
    // The hog leaves: the count in progress and the waiting ones stop.
    drop(hog);
    daemon.wait_for_log("counting abandoned").await;
    daemon.wait_for_log("unreported_leases=0").await;
    let log = daemon.log();
    let abandoned = log.matches("counting abandoned").count();
    assert!(abandoned >= 1, "{log}");
}
