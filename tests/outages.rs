//! What a Redis restart, a stalled Redis and an outage must not cost: no
//! spurious error once Redis answers again, no capacity burnt by a call
//! answered "unavailable", no report lost. Each test reproduces a finding
//! that cost exactly that before it was fixed.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratekeeper::client::Client;
use ratekeeper::proto::{ErrorCode, Request, Response};
use support::redis::RedisServer;
use support::{Daemon, acquire, error_code, granted, level, report};

/// One token per second refills: levels barely move during a test.
fn config(server: &RedisServer) -> String {
    format!(
        r#"
[redis]
url = "{}"
timeout_ms = 250

[[limits]]
name = "big"
tokens_per_minute = 60
burst_tokens = 1000000
"#,
        server.url()
    )
}

/// Polls the level of `big` until it is at least `floor`, for up to 10 s;
/// a status refused while Redis is still paused counts as not yet.
async fn level_reaches(client: &Client, floor: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = Request::Status {
            limit: Some("big".into()),
        };
        let seen = match client.call(status).await.unwrap() {
            Response::Status { limits, .. } => Some(limits[0].buckets[0].level),
            _ => None,
        };
        match seen {
            Some(seen) if seen >= floor || Instant::now() > deadline => return seen,
            None if Instant::now() > deadline => panic!("Redis never answered again"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Issue: after Redis came back on the same port, each of the pool's four
/// stale connections cost one `StoreUnavailable ... broken pipe`.
#[tokio::test]
async fn a_restarted_redis_costs_no_request_an_error() {
    let mut server = RedisServer::start();
    let daemon = Daemon::start(&config(&server));
    let client = daemon.client().await;
    // Every pooled connection has been used.
    for _ in 0..8 {
        granted(&client.call(acquire("big", 1, 0)).await.unwrap());
    }
    server.kill();
    server.restart();
    let mut errors = Vec::new();
    for _ in 0..16 {
        match client.call(acquire("big", 1, 0)).await.unwrap() {
            Response::Granted { .. } => {}
            other => errors.push(other),
        }
    }
    assert!(errors.is_empty(), "{errors:?}\n{}", daemon.log());
}

/// Issue: during a 2 s stall (`DEBUG SLEEP`), acquires answered
/// "unavailable" still ran when Redis woke up, and 19,005 tokens were gone
/// that nobody used.
#[tokio::test]
async fn a_stalled_redis_loses_no_capacity() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let daemon = Daemon::start(&config(&server));
    let client = Arc::new(daemon.client().await);
    granted(&client.call(acquire("big", 1, 0)).await.unwrap());
    let before = level(&client, "big", "tokens").await;
    let started = Instant::now();
    // Redis sleeps 2 s with whatever it read; the daemon gives up on each
    // call after 250 ms.
    let sleeper = stall(&server, 2);
    let mut acquires = Vec::new();
    for _ in 0..20 {
        let client = client.clone();
        acquires.push(tokio::spawn(async move {
            client.call(acquire("big", 1000, 0)).await.unwrap()
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut granted_tokens = 0;
    for answer in acquires {
        match answer.await.unwrap() {
            Response::Granted { tokens, .. } => granted_tokens += tokens as i64,
            other => assert_eq!(error_code(&other), ErrorCode::StoreUnavailable),
        }
    }
    assert!(granted_tokens < 20_000, "the stall was not noticed");
    sleeper.join().unwrap();
    // After the stall, and once the calls whose answer was lost are settled:
    // exactly what was granted is gone, give or take the refill since (one
    // token a second).
    daemon
        .wait_for_log("calls whose answer was lost are settled")
        .await;
    let expected = before - granted_tokens;
    let seen = level_reaches(&client, expected).await;
    let refilled = started.elapsed().as_secs() as i64 + 1;
    assert!(
        (expected..=expected + refilled).contains(&seen),
        "level {seen}, expected {expected}: {} tokens burnt\n{}",
        expected - seen,
        daemon.log()
    );
}

/// Runs `DEBUG SLEEP seconds` on `server` and returns once Redis is asleep
/// (a PING goes unanswered); the thread ends when Redis wakes.
fn stall(server: &RedisServer, seconds: u32) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    let port = server.port;
    let sleeper = std::thread::spawn(move || {
        support::redis::redis_cli(port, &["DEBUG", "SLEEP", &seconds.to_string()]);
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut probe = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        probe
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        probe.write_all(b"PING\r\n").unwrap();
        if probe.read(&mut [0; 16]).is_err() {
            return sleeper;
        }
        assert!(Instant::now() < deadline, "Redis never fell asleep");
    }
}

/// Issue: a report during an outage was answered "could not be settled,
/// retry the report", and the client did not retry: the refund was lost.
/// Now it is answered and replayed when Redis answers, exactly once.
#[tokio::test]
async fn a_report_during_an_outage_is_settled_once_redis_answers() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&config(&server));
    let client = daemon.client().await;
    let (lease, _, _) = granted(&client.call(acquire("big", 500_000, 0)).await.unwrap());
    let after_grant = level(&client, "big", "tokens").await;
    let started = Instant::now();
    assert_eq!(
        server.cli(&["CLIENT", "PAUSE", "1500", "ALL"]).unwrap(),
        "OK"
    );
    let settled = client.call(report(lease, 100_000)).await.unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 400_000
        }
    );
    // Once the lost call is settled and the report replayed:
    daemon
        .wait_for_log("calls whose answer was lost are settled")
        .await;
    daemon
        .wait_for_log("settlements made during the outage are applied")
        .await;
    let expected = after_grant + 400_000;
    let seen = level_reaches(&client, expected).await;
    let refilled = started.elapsed().as_secs() as i64 + 1;
    assert!(
        (expected..=expected + refilled).contains(&seen),
        "level {seen}, expected {expected} (a refund lost or applied twice)\n{}",
        daemon.log()
    );
}

/// With `[redis] sentinels`, the primary dies in the middle of a lease:
/// the report made while no primary answers is kept, acquires resume once
/// the Sentinels promote the replica, and the report is applied there.
#[tokio::test]
async fn a_sentinel_failover_loses_no_report() {
    use support::redis::{RedisSentinels, SENTINEL_MASTER};
    let mut set = RedisSentinels::start();
    let sentinels: Vec<String> = set.urls().iter().map(|url| format!("\"{url}\"")).collect();
    let config = format!(
        r#"
[redis]
sentinels = [{}]
master_name = "{SENTINEL_MASTER}"
timeout_ms = 250
connect_timeout_ms = 250

[[limits]]
name = "big"
tokens_per_minute = 60
burst_tokens = 1000000
"#,
        sentinels.join(", ")
    );
    let daemon = Daemon::start(&config);
    let client = daemon.client().await;
    let (lease, _, _) = granted(&client.call(acquire("big", 500_000, 0)).await.unwrap());
    let replica = set.replica.port;
    set.primary.kill();
    let settled = client.call(report(lease, 100_000)).await.unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 400_000
        }
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.call(acquire("big", 1, 0)).await.unwrap() {
            Response::Granted { .. } => break,
            other => assert_eq!(error_code(&other), ErrorCode::StoreUnavailable),
        }
        assert!(Instant::now() < deadline, "no promotion:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(set.master_port(), Some(replica), "the replica was promoted");
    daemon
        .wait_for_log("settlements made during the outage are applied")
        .await;
    // The refund reached the new primary: 400 000 of the 500 000 are back
    // (all of them if the debit had not been replicated yet).
    let seen = level(&client, "big", "tokens").await;
    assert!(seen >= 900_000 - 2, "level {seen}: the report was lost");
}
