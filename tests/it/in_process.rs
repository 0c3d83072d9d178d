//! A daemon started in-process through `ratekeeper::app::App`, as `main.rs`
//! starts it, without the binary: built from a config string, serving a
//! Unix socket in a temporary directory on the test's own runtime, used
//! through the real socket by the Rust client, and shut down through the
//! future `serve` takes. Once with the embedded store, once with a real
//! `redis-server`. `support::Daemon`, the other tests' harness, is built
//! the same way; here each step is checked on its own.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use ratekeeper::app::App;
use ratekeeper::client::Client;
use ratekeeper::config;
use ratekeeper::proto::{Request, Response};
use support::redis::RedisServer;
use support::{acquire, granted, report, status_of};
use tokio::sync::{mpsc, oneshot};

const BURST: i64 = 10_000;

/// The config: the socket at `socket`, one limit, and `store` (a `[redis]`
/// section, or nothing for the embedded store).
fn config_text(socket: &Path, store: &str) -> String {
    format!(
        r#"
[server]
socket = "{}"

{store}

[[limits]]
name = "gpt"
tokens_per_minute = 60
burst_tokens = {BURST}
"#,
        socket.display()
    )
}

/// Assembles, binds and serves a daemon in-process; acquires and reports
/// through its socket; then shuts it down and checks that it is gone.
async fn serve_use_and_shut_down(store: &str, expected_store: &str) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let socket = dir.path().join("ratekeeper.sock");
    let config = config::from_toml_str(&config_text(&socket, store), "in-process test")
        .expect("a valid config");
    let mut app = App::new(config, None).expect("the daemon assembles");
    app.warm_up().await;
    let listener = app.bind().expect("the socket binds");
    assert!(socket.exists(), "bind creates the socket");
    assert_eq!(app.service().config().limits.len(), 1);

    let (stop, stopped) = oneshot::channel::<()>();
    let (_reload, reloads) = mpsc::unbounded_channel();
    let shutdown = async {
        let _ = stopped.await;
    };
    let serving = tokio::spawn(app.serve(listener, shutdown, reloads));

    let started = Instant::now();
    let client = Client::connect(&socket, "in-process-test")
        .await
        .expect("connect through the socket");
    assert!(matches!(client.server_hello, Response::Hello { .. }));
    let (lease, tokens, _) = granted(&client.call(acquire("gpt", 1_000, 0)).await.unwrap());
    assert_eq!(tokens, 1_000);
    assert_eq!(
        client.call(report(lease, 400)).await.unwrap(),
        Response::Settled {
            tokens_returned: 600
        }
    );
    // The lease is settled: a second report does not find it.
    assert!(matches!(
        client.call(report(lease, 400)).await.unwrap(),
        Response::Error { .. }
    ));
    let (store_kind, buckets) = status_of(&client, "gpt").await;
    assert_eq!(store_kind, expected_store);
    let level = buckets
        .iter()
        .find(|(name, _)| name == "tokens")
        .expect("a tokens bucket")
        .1;
    // 400 tokens used, give or take the refill since (one a second).
    let refilled = started.elapsed().as_secs() as i64 + 1;
    let expected = BURST - 400;
    assert!(
        (expected..=(expected + refilled).min(BURST)).contains(&level),
        "level {level}, expected {expected}"
    );
    assert_eq!(client.call(Request::Ping).await.unwrap(), Response::Pong);

    // Shutdown: serve returns, the socket is removed and the open
    // connection is closed.
    stop.send(()).expect("the daemon is serving");
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("serve returns after shutdown")
        .expect("serve did not panic");
    assert!(!socket.exists(), "the socket is removed on shutdown");
    assert!(
        client.call(Request::Ping).await.is_err(),
        "the connection is closed on shutdown"
    );
    assert!(Client::connect(&socket, "too-late").await.is_err());
}

#[tokio::test]
async fn an_in_process_daemon_serves_from_the_embedded_store_and_shuts_down() {
    serve_use_and_shut_down("", "embedded").await;
}

#[tokio::test]
async fn an_in_process_daemon_serves_from_redis_and_shuts_down() {
    let server = RedisServer::start();
    let store = format!("[redis]\nurl = \"{}\"", server.url());
    serve_use_and_shut_down(&store, "redis").await;
    // The buckets were in Redis.
    let keys = server.cli(&["DBSIZE"]).expect("redis answers");
    assert_ne!(keys, "0", "nothing was written to Redis");
}
