//! Sidecars sharing real Redis servers (one node, and a three-node cluster):
//! shared buckets, the Redis cost of each operation, script flushes, and the
//! failure policies through an outage and its recovery.

use crate::support;

use std::time::{Duration, Instant};

use ratekeeper::client::Client;
use ratekeeper::proto::{ErrorCode, Request, Response};
use support::redis::{RedisCluster, RedisServer};
use support::{Daemon, SpawnedDaemon, acquire, error_code, granted, report, status_of};

fn config(redis: &str, extra_redis: &str) -> String {
    format!(
        r#"
[redis]
{redis}
timeout_ms = 300
{extra_redis}

# Acquires here may wait up to an hour, the protocol's longest wait.
[[priorities]]
name = "patient"
max_wait_ms = 3600000

[[groups]]
name = "org"
tokens_per_minute = 6000
burst_tokens = 1500

[[limits]]
name = "gpt"
tokens_per_minute = 60
burst_tokens = 1000
requests_per_minute = 60
burst_requests = 100

[[limits]]
name = "claude"
tokens_per_minute = 60
burst_tokens = 1000

[[limits]]
name = "mini"
group = "org"
tokens_per_minute = 60000
burst_tokens = 1000
burst_headroom_ms = 0

[[limits]]
name = "nano"
group = "org"
tokens_per_minute = 60000
burst_tokens = 1000
burst_headroom_ms = 0
"#
    )
}

fn single(server: &RedisServer) -> String {
    config(&format!("url = \"{}\"", server.url()), "")
}

#[tokio::test]
async fn two_sidecars_draw_from_the_same_buckets() {
    let server = RedisServer::start();
    let first = Daemon::start(&single(&server));
    let second = Daemon::start(&single(&server));
    let a = first.client().await;
    let b = second.client().await;
    lease_of(a.call(acquire("gpt", 900, 0)).await.unwrap());
    // The other sidecar sees the 900 gone: 200 more cannot come at once.
    match b.call(acquire("gpt", 200, 0)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "tokens"),
        other => panic!("expected a denial, got {other:?}"),
    }
    let lease = lease_of(b.call(acquire("gpt", 100, 0)).await.unwrap());
    // A refund through one sidecar shows in the other's status.
    let settled = b.call(report(lease, 40)).await.unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 60
        }
    );
    let seen = levels(&a, "gpt").await;
    assert!((60..=63).contains(&seen[0].1), "{seen:?}");
    assert_eq!(seen[1], ("requests".to_string(), 98));
}

#[tokio::test]
async fn each_acquire_and_each_report_is_one_script_call() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    // Warm up: the first call of each script loads it after NOSCRIPT.
    let lease = lease_of(client.call(acquire("gpt", 1, 0)).await.unwrap());
    client.call(report(lease, 0)).await.unwrap();
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).unwrap(), "OK");
    const ROUNDS: u64 = 25;
    for _ in 0..ROUNDS {
        let lease = lease_of(client.call(acquire("gpt", 2, 0)).await.unwrap());
        let settled = client.call(report(lease, 1)).await.unwrap();
        assert_eq!(settled, Response::Settled { tokens_returned: 1 });
    }
    assert_eq!(server.command_calls("evalsha"), 2 * ROUNDS);
    // No script was loaded again and nothing else was sent: the other
    // commands counted are the scripts' own calls and this test's.
    let stats = server.cli(&["INFO", "commandstats"]).unwrap();
    let commands: Vec<&str> = stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .map(|line| line.split(':').next().unwrap())
        .collect();
    let inside_scripts = ["time", "hmget", "hset", "pexpire", "del", "get", "set"];
    let from_this_test = ["info", "config|resetstat"];
    assert!(
        commands
            .iter()
            .all(|c| *c == "evalsha" || inside_scripts.contains(c) || from_this_test.contains(c)),
        "{commands:?}"
    );
}

#[tokio::test]
async fn a_script_flush_in_the_middle_of_a_run_fails_no_request() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    let mut granted = 0;
    for round in 0..60 {
        if round % 10 == 5 {
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).unwrap(), "OK");
        }
        let (one, two) = tokio::join!(
            client.call(acquire("mini", 5, 0)),
            client.call(acquire("claude", 5, 0))
        );
        for answer in [one.unwrap(), two.unwrap()] {
            let lease = lease_of(answer);
            granted += 1;
            let released = client.call(Request::Release { lease }).await.unwrap();
            assert!(matches!(
                released,
                Response::Released { tokens_returned: 5 }
            ));
        }
    }
    assert_eq!(granted, 120);
}

#[tokio::test]
async fn fail_closed_denies_during_an_outage_and_recovers_by_itself() {
    let mut server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    lease_of(client.call(acquire("gpt", 10, 0)).await.unwrap());
    server.kill();
    let started = Instant::now();
    let answer = client.call(acquire("gpt", 10, 0)).await.unwrap();
    assert_eq!(error_code(&answer), ErrorCode::StoreUnavailable);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    server.restart();
    // The connection broke with the restart: the next call reconnects.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.call(acquire("gpt", 10, 0)).await.unwrap() {
            Response::Granted { .. } => break,
            answer => assert_eq!(error_code(&answer), ErrorCode::StoreUnavailable),
        }
        assert!(
            Instant::now() < deadline,
            "never recovered:\n{}",
            daemon.log()
        );
    }
    assert!(daemon.log().contains("reachable again"), "{}", daemon.log());
}

#[tokio::test]
async fn fail_open_and_local_keep_serving_through_an_outage() {
    let mut server = RedisServer::start();
    let open = Daemon::start(&config(
        &format!("url = \"{}\"", server.url()),
        "on_failure = \"fail_open\"",
    ));
    let local = Daemon::start(&config(
        &format!("url = \"{}\"", server.url()),
        "on_failure = \"local\"\nlocal_share = 0.25",
    ));
    let open = open.client().await;
    let local = local.client().await;
    server.kill();
    // fail_open: not limited at all.
    for _ in 0..3 {
        lease_of(open.call(acquire("gpt", 1000, 0)).await.unwrap());
    }
    // local: a quarter of the 1000-token burst, then denials.
    let lease = lease_of(local.call(acquire("gpt", 250, 0)).await.unwrap());
    match local.call(acquire("gpt", 10, 0)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "tokens"),
        other => panic!("expected a local denial, got {other:?}"),
    }
    // Settling a local lease refunds the local bucket.
    let settled = local.call(report(lease, 50)).await.unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 200
        }
    );
    lease_of(local.call(acquire("gpt", 200, 0)).await.unwrap());
    // Back to the shared, full bucket once Redis returns: 900 tokens cannot
    // come from the 250-token local share, so a grant proves it.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(
        local.call(acquire("gpt", 900, 0)).await.unwrap(),
        Response::Granted { .. }
    ) {
        assert!(Instant::now() < deadline, "never went back to Redis");
    }
    let seen = levels(&local, "gpt").await;
    assert!((100..=103).contains(&seen[0].1), "{seen:?}");
}

#[tokio::test]
async fn the_scripts_work_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect();
    let daemon = Daemon::start(&config(
        &format!("cluster_nodes = [{}]", nodes.join(", ")),
        "",
    ));
    let client = daemon.client().await;
    // (limit, tokens refilled per ms)
    for (limit, per_ms) in [
        ("gpt", 0.001),
        ("claude", 0.001),
        ("mini", 1.0),
        ("nano", 1.0),
    ] {
        let started = Instant::now();
        let lease = lease_of(client.call(acquire(limit, 300, 0)).await.unwrap());
        let settled = client.call(report(lease, 100)).await.unwrap();
        assert_eq!(
            settled,
            Response::Settled {
                tokens_returned: 200
            }
        );
        let seen = levels(&client, limit).await;
        // 900 left, plus what refilled since the acquire.
        let refilled = (started.elapsed().as_millis() as f64 * per_ms).ceil() as i64;
        assert!(
            (900..=900 + refilled + 1).contains(&seen[0].1),
            "{limit}: {seen:?}"
        );
    }
    // The group cap is shared by mini and nano: 100 + 100 of its 1500 are gone.
    let seen = levels(&client, "nano").await;
    let group = seen
        .iter()
        .find(|(name, _)| name == "group_tokens")
        .unwrap();
    assert!((1300..=1310).contains(&group.1), "{seen:?}");
    match client.call(acquire("mini", 800, 0)).await.unwrap() {
        Response::Granted { .. } => {}
        other => panic!("{other:?}"),
    }
    match client.call(acquire("nano", 800, 0)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "group_tokens"),
        other => panic!("expected the group cap to refuse, got {other:?}"),
    }

    // Keys of one group share a slot; different groups land elsewhere.
    let slot = |key: &str| cluster.keyslot(key);
    let mini = slot("ratekeeper:{g:org}:mini:tokens");
    assert_eq!(mini, slot("ratekeeper:{g:org}:nano:tokens"));
    assert_eq!(mini, slot("ratekeeper:{g:org}:tokens"));
    assert_eq!(
        slot("ratekeeper:{l:gpt}:gpt:tokens"),
        slot("ratekeeper:{l:gpt}:gpt:requests")
    );
    let distinct: std::collections::HashSet<u16> = [
        mini,
        slot("ratekeeper:{l:gpt}:gpt:tokens"),
        slot("ratekeeper:{l:claude}:claude:tokens"),
    ]
    .into();
    assert_eq!(distinct.len(), 3, "{distinct:?}");
    // And the keys really are where the daemon wrote them.
    let owners: usize = cluster
        .nodes
        .iter()
        .filter(|node| {
            node.cli(&["EXISTS", "ratekeeper:{g:org}:tokens"])
                .is_some_and(|reply| reply == "1")
        })
        .count();
    assert_eq!(owners, 1);
}

fn lease_of(response: Response) -> u64 {
    granted(&response).0
}

/// The `(name, level)` of each bucket of `limit`, as a Redis-backed daemon sees them.
async fn levels(client: &Client, limit: &str) -> Vec<(String, i64)> {
    let (store, buckets) = status_of(client, limit).await;
    assert_eq!(store, "redis");
    buckets
}

/// Acquires of one limit that meet while a script call for the limit is
/// in flight go together as the next call: far fewer calls than acquires.
#[tokio::test]
async fn concurrent_acquires_share_script_calls() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = std::sync::Arc::new(daemon.client().await);
    lease_of(client.call(acquire("gpt", 1, 0)).await.unwrap());
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).unwrap(), "OK");
    const ACQUIRES: u64 = 64;
    let calls: Vec<_> = (0..ACQUIRES)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.call(acquire("gpt", 1, 0)).await.unwrap() })
        })
        .collect();
    for call in calls {
        lease_of(call.await.unwrap());
    }
    let script_calls = server.command_calls("evalsha");
    assert!(
        (1..=ACQUIRES / 4).contains(&script_calls),
        "{script_calls} script calls for {ACQUIRES} acquires"
    );
}

#[tokio::test]
async fn a_denial_the_sidecar_can_prove_costs_redis_nothing() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    // Load both scripts first, so that counted calls are all EVALSHA hits.
    let warm_up = lease_of(client.call(acquire("gpt", 1, 0)).await.unwrap());
    client
        .call(Request::Release { lease: warm_up })
        .await
        .unwrap();
    let lease = lease_of(client.call(acquire("gpt", 900, 0)).await.unwrap());
    // Asked of Redis: 500 more need 400 s of refill.
    let first = client.call(acquire("gpt", 500, 0)).await.unwrap();
    assert!(matches!(first, Response::Denied { .. }), "{first:?}");
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).unwrap(), "OK");
    // The same or a larger cost, as impatient: answered by the sidecar.
    for tokens in [500, 600, 500] {
        match client.call(acquire("gpt", tokens, 0)).await.unwrap() {
            Response::Denied {
                retry_after_ms,
                bucket,
            } => {
                assert_eq!(bucket, "tokens");
                assert!(
                    (390_000..=400_000).contains(&retry_after_ms),
                    "{retry_after_ms}"
                );
            }
            other => panic!("expected a denial, got {other:?}"),
        }
    }
    assert_eq!(server.command_calls("evalsha"), 0);
    // A smaller cost still asks Redis, and is granted.
    lease_of(client.call(acquire("gpt", 50, 0)).await.unwrap());
    assert_eq!(server.command_calls("evalsha"), 1);
    // A release through this sidecar makes room: the next 500 asks again.
    client.call(Request::Release { lease }).await.unwrap();
    lease_of(client.call(acquire("gpt", 500, 0)).await.unwrap());
    assert_eq!(server.command_calls("evalsha"), 3);
}

/// Issue: the daemon connected lazily, so the first acquire paid for the
/// connection and met NOSCRIPT, and the bucket clock started late.
#[tokio::test]
async fn connections_and_scripts_are_ready_before_the_socket_appears() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    // Four scripts (batch, cancel, levels, slots) on each of the four
    // pooled connections, before any request.
    assert_eq!(server.command_calls("script|load"), 16);
    let client = daemon.client().await;
    lease_of(client.call(acquire("gpt", 1, 0)).await.unwrap());
    let errors = server.cli(&["INFO", "errorstats"]).unwrap();
    assert!(!errors.contains("NOSCRIPT"), "{errors}");
}

/// Issue: with Redis unreachable (or a wrong password) the daemon said
/// nothing until the first acquire failed. The binary, because what is
/// checked is what it writes: the warning, and no password in it.
#[tokio::test]
async fn an_unreachable_redis_at_start_is_reported_and_retried() {
    let mut server = RedisServer::start();
    server.kill();
    let url = format!("redis://:hunter2@127.0.0.1:{}/0", server.port);
    let daemon = SpawnedDaemon::start(&config(&format!("url = \"{url}\""), ""));
    // The warning comes before the socket is bound; wait for both lines.
    daemon.wait_for_log("listening").await;
    let log = daemon.log();
    let warning = log
        .lines()
        .find(|line| line.contains("Redis is not reachable at start"))
        .unwrap();
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains(&format!("127.0.0.1:{}", server.port)),
        "{warning}"
    );
    assert!(
        warning.contains("fail_closed") && !warning.contains("FailClosed"),
        "{warning}"
    );
    assert!(!log.contains("hunter2"), "the password leaked:\n{log}");
    // Every line names a policy as the config file spells it (issue 28).
    assert!(
        log.contains("on_failure=\"fail_closed\"") && !log.contains("FailClosed"),
        "{log}"
    );
    let listening = log.find("listening").expect("the daemon listens");
    assert!(log.find("Redis is not reachable").unwrap() < listening);

    server.restart();
    server
        .cli(&["CONFIG", "SET", "requirepass", "hunter2"])
        .unwrap();
    daemon
        .wait_for_log("connected to Redis and loaded the scripts")
        .await;
    let client = daemon.client().await;
    lease_of(client.call(acquire("gpt", 1, 0)).await.unwrap());
}

fn feedback(limit: &str, status: u16, since_grant_ms: u64, headers: &[(&str, &str)]) -> Request {
    Request::Feedback(ratekeeper::proto::Feedback {
        limit: limit.into(),
        status,
        since_grant_ms,
        headers: headers
            .iter()
            .map(|(name, value)| ratekeeper::proto::Header {
                name: name.to_string(),
                value: value.to_string(),
            })
            .collect(),
    })
}

/// A 429 one worker saw holds back every worker of every sidecar until
/// the provider's `retry-after` has passed.
#[tokio::test]
async fn a_429_seen_by_one_sidecar_pauses_the_limit_for_all() {
    let server = RedisServer::start();
    let first = Daemon::start(&single(&server));
    let second = Daemon::start(&single(&server));
    let a = first.client().await;
    let b = second.client().await;
    let noted = a
        .call(feedback("gpt", 429, 0, &[("Retry-After", "3")]))
        .await
        .unwrap();
    assert_eq!(
        noted,
        Response::Noted {
            paused_ms: 3000,
            lowered: 2
        }
    );
    match b.call(acquire("gpt", 1, 0)).await.unwrap() {
        Response::Denied { retry_after_ms, .. } => {
            assert!(retry_after_ms >= 2900, "{retry_after_ms}")
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    // The other limits are untouched.
    lease_of(b.call(acquire("claude", 1, 0)).await.unwrap());
}

/// Issue 27, item 5: every `Feedback` frame with a 429 and `retry-after`
/// paused the limit again, so a flood of them kept re-extending the pause
/// (to 60 s from the latest frame). Now a 429 while the limit's pause is in
/// force does not pause it again (`service::feedback`'s unit test shows a
/// pause after it has ended). The pause is logged with the client's name
/// and uid.
#[tokio::test]
async fn a_429_flood_does_not_extend_the_pause_in_force() {
    use std::os::unix::fs::MetadataExt;
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    let set_at = Instant::now();
    let noted = client
        .call(feedback("gpt", 429, 0, &[("Retry-After", "20")]))
        .await
        .unwrap();
    assert_eq!(
        noted,
        Response::Noted {
            paused_ms: 20_000,
            lowered: 2
        }
    );
    for _ in 0..50 {
        let noted = client
            .call(feedback("gpt", 429, 0, &[("Retry-After", "60")]))
            .await
            .unwrap();
        assert!(
            set_at.elapsed() < Duration::from_secs(19),
            "too slow to tell"
        );
        assert!(
            matches!(noted, Response::Noted { paused_ms: 0, .. }),
            "{noted:?}"
        );
    }
    // 20 s of refill, then the token's own second (a token a second); a
    // pause re-extended to 60 s would ask for a minute.
    match client.call(acquire("gpt", 1, 0)).await.unwrap() {
        Response::Denied { retry_after_ms, .. } => {
            assert!(retry_after_ms <= 21_000, "the pause grew: {retry_after_ms}")
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    // One pause, logged with who sent it.
    let uid = std::fs::metadata(daemon.dir()).unwrap().uid();
    let who = format!("client=\"integration-test\" uid={uid}");
    daemon.wait_for_log(&who).await;
    let pauses: Vec<String> = daemon
        .log()
        .lines()
        .filter(|line| line.contains("the limit is paused for every worker"))
        .map(str::to_string)
        .collect();
    assert_eq!(pauses.len(), 1, "{pauses:#?}");
    assert!(pauses[0].contains(&who), "{pauses:#?}");
}

/// Issue 27, item 5: a provider pause is at most the limit's `max_pause_ms`:
/// a minute by default (one frame with `retry-after: 600` paused the fleet
/// for ten minutes), less where the operator says so, and none at 0.
#[tokio::test]
async fn a_pause_is_at_most_the_limits_max_pause() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&format!(
        "[redis]\nurl = \"{}\"\n\n\
         [[limits]]\nname = \"default\"\ntokens_per_minute = 60\n\n\
         [[limits]]\nname = \"short\"\ntokens_per_minute = 60\nmax_pause_ms = 5000\n\n\
         [[limits]]\nname = \"never\"\ntokens_per_minute = 60\nmax_pause_ms = 0\n",
        server.url()
    ));
    let client = daemon.client().await;
    for (limit, paused_ms) in [("default", 60_000), ("short", 5_000), ("never", 0)] {
        let noted = client
            .call(feedback(limit, 429, 0, &[("Retry-After", "600")]))
            .await
            .unwrap();
        assert!(
            matches!(noted, Response::Noted { paused_ms: p, .. } if p == paused_ms),
            "{limit}: {noted:?}"
        );
    }
}

/// `x-ratelimit-remaining-*` lowers the buckets to the provider's count,
/// less what was granted since the answered call, and never raises them.
#[tokio::test]
async fn remaining_headers_lower_the_buckets_and_never_raise_them() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    lease_of(client.call(acquire("gpt", 100, 0)).await.unwrap());
    lease_of(client.call(acquire("gpt", 100, 0)).await.unwrap());
    // The provider saw the first call only: the second is ours to subtract.
    let noted = client
        .call(feedback(
            "gpt",
            200,
            5_000,
            &[
                ("x-ratelimit-remaining-tokens", "500"),
                ("x-ratelimit-remaining-requests", "90"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        noted,
        Response::Noted {
            paused_ms: 0,
            lowered: 2
        }
    );
    let seen = levels(&client, "gpt").await;
    // 500, plus the 5 tokens refilled in the 5 s since the provider
    // counted, less the 200 granted since (both grants fall within
    // since_grant_ms).
    assert!((305..=308).contains(&seen[0].1), "{seen:?}");
    assert_eq!(seen[1], ("requests".to_string(), 93));
    // A provider count above ours changes nothing.
    client
        .call(feedback(
            "gpt",
            200,
            0,
            &[("x-ratelimit-remaining-tokens", "100000")],
        ))
        .await
        .unwrap();
    let after = levels(&client, "gpt").await;
    assert!(after[0].1 <= seen[0].1 + 3, "{after:?}");
    // A count older than the ten seconds of reservations remembered cannot
    // be placed, however low.
    let stale = client
        .call(feedback(
            "gpt",
            200,
            60_000,
            &[("x-ratelimit-remaining-tokens", "0")],
        ))
        .await
        .unwrap();
    assert_eq!(
        stale,
        Response::Noted {
            paused_ms: 0,
            lowered: 0
        }
    );
}

fn concurrency_config(server: &RedisServer) -> String {
    format!(
        r#"
[redis]
url = "{}"
timeout_ms = 300

[[limits]]
name = "local-llm"
max_concurrent = 2

[[limits]]
name = "gpt"
tokens_per_minute = 60
burst_tokens = 3000
max_concurrent = 1
"#,
        server.url()
    )
}

/// Issue 11: at most `max_concurrent` requests in flight per limit across
/// the fleet, each slot held from the grant to the report or release.
#[tokio::test]
async fn a_concurrency_limit_holds_across_sidecars_until_a_report_or_release() {
    let server = RedisServer::start();
    let first = Daemon::start(&concurrency_config(&server));
    let second = Daemon::start(&concurrency_config(&server));
    let a = first.client().await;
    let b = second.client().await;
    let one = lease_of(a.call(acquire("local-llm", 0, 0)).await.unwrap());
    let two = lease_of(b.call(acquire("local-llm", 0, 0)).await.unwrap());
    match a.call(acquire("local-llm", 0, 0)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "concurrent"),
        other => panic!("a third request in flight: {other:?}"),
    }
    let (_, buckets) = status_of(&b, "local-llm").await;
    assert_eq!(buckets, vec![("concurrent".to_string(), 0)]);

    // A waiting acquire on one sidecar gets the slot the other gives back.
    let waiting = {
        let a = first.client().await;
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = a.call(acquire("local-llm", 0, 5000)).await.unwrap();
            (answer, started.elapsed())
        })
    };
    wait_for_waiters(&a, "local-llm", 1).await;
    let released = Instant::now();
    b.call(Request::Release { lease: two }).await.unwrap();
    let (answer, waited) = waiting.await.unwrap();
    lease_of(answer);
    assert!(
        released.elapsed() < Duration::from_millis(1000) && waited < Duration::from_millis(5000),
        "granted {:?} after the release",
        released.elapsed()
    );

    // A report gives the slot back too; so does a connection that closes
    // (the waiting acquire's, which ended with its task). Both happen after
    // the answer, so the test watches the slots come free rather than
    // racing the give-backs.
    a.call(report(one, 0)).await.unwrap();
    wait_for_free_slots(&b, "local-llm", 2).await;
    let held_by_closed = {
        let c = second.client().await;
        lease_of(c.call(acquire("local-llm", 0, 0)).await.unwrap());
        c
    };
    drop(held_by_closed);
    lease_of(b.call(acquire("local-llm", 0, 3000)).await.unwrap());

    // With token buckets too, a denied slot draws no tokens.
    let gpt = lease_of(a.call(acquire("gpt", 1000, 0)).await.unwrap());
    let (_, before) = status_of(&a, "gpt").await;
    match b.call(acquire("gpt", 1000, 0)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "concurrent"),
        other => panic!("a second gpt request in flight: {other:?}"),
    }
    let tokens = |buckets: &[(String, i64)]| buckets[0].1;
    assert!(tokens(&status_of(&a, "gpt").await.1) >= tokens(&before));
    a.call(Request::Release { lease: gpt }).await.unwrap();
    lease_of(b.call(acquire("gpt", 1000, 3000)).await.unwrap());
}

/// Waits until `status` shows `free` slots of `limit`'s concurrency bucket.
async fn wait_for_free_slots(client: &Client, limit: &str, free: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, buckets) = status_of(client, limit).await;
        if buckets == vec![("concurrent".to_string(), free)] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never {free} free slots of {limit}: {buckets:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `status` shows `count` waiters on `limit`.
async fn wait_for_waiters(client: &Client, limit: &str, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = Request::Status {
            limit: Some(limit.into()),
        };
        if let Response::Status { limits, .. } = client.call(status).await.unwrap() {
            if limits[0].waiters == count {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never {count} waiters on {limit}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 11: a correction forgot reservations still waiting to come due,
/// so it handed their tokens out a second time (14.7 % 429s through one
/// sidecar under 20 % foreign traffic, 2.0 % once they counted).
#[tokio::test]
async fn a_reservation_still_waiting_counts_as_unseen_by_the_provider() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&single(&server));
    let client = daemon.client().await;
    // The provider says 100 tokens are left: so do the buckets.
    let remaining =
        |count: &'static str| feedback("gpt", 200, 0, &[("x-ratelimit-remaining-tokens", count)]);
    client.call(remaining("100")).await.unwrap();
    // 200 wait about 100 s for the refill (one token a second).
    let waiting = {
        let client = daemon.client().await;
        tokio::spawn(async move { client.call(acquire("gpt", 200, 200_000)).await })
    };
    wait_for_waiters(&client, "gpt", 1).await;
    let before = levels(&client, "gpt").await[0].1;
    assert!((-101..=-99).contains(&before), "{before}");
    // The provider has nothing left and has not seen the waiting call.
    client.call(remaining("0")).await.unwrap();
    let after = levels(&client, "gpt").await[0].1;
    assert!(after <= -198, "lowered to {after} only");
    waiting.abort();
}

/// Issue 11: each sidecar subtracted only its own reservations from the
/// provider's count, so through two sidecars under foreign traffic the
/// other's calls were handed out again (16 % 429s). The shared bucket now
/// counts what the whole fleet drew since the answered call.
#[tokio::test]
async fn a_correction_subtracts_what_every_sidecar_reserved_since() {
    let server = RedisServer::start();
    let first = Daemon::start(&single(&server));
    let second = Daemon::start(&single(&server));
    let a = first.client().await;
    let b = second.client().await;
    let remaining = |count: &'static str, since_grant_ms: u64| {
        feedback(
            "gpt",
            200,
            since_grant_ms,
            &[("x-ratelimit-remaining-tokens", count)],
        )
    };
    // A first count starts the bucket's history of draws (a full bucket
    // has none to keep, hence the call through B; A's count names no call
    // of its own, so the answered one below is the only one A knows).
    lease_of(b.call(acquire("gpt", 100, 0)).await.unwrap());
    a.call(remaining("100000", 0)).await.unwrap();
    // The answered call, then one through the other sidecar.
    lease_of(a.call(acquire("gpt", 100, 0)).await.unwrap());
    let answered = Instant::now();
    lease_of(b.call(acquire("gpt", 300, 0)).await.unwrap());
    let before = levels(&a, "gpt").await[0].1;
    assert!((500..=503).contains(&before), "{before}");
    // The provider has 500 left. Sidecar A alone would subtract what it
    // reserved since (the answered call: 400); the fleet's count subtracts
    // the other sidecar's 300 too (the answered call itself counts, as the
    // history cannot tell it from what came just before it in its slot).
    let since = answered.elapsed().as_millis() as u64;
    a.call(remaining("500", since)).await.unwrap();
    let after = levels(&a, "gpt").await[0].1;
    assert!((100..=103).contains(&after), "lowered to {after}");
}

/// Issue 26: a correction placed by history slots also subtracted the
/// answered call itself and whatever came just before it in its slot, so
/// the bucket stepped below the provider. Feedback that names its lease
/// (revision 5) subtracts exactly what the fleet drew after that lease:
/// the other sidecar's call and this sidecar's later one, and nothing else.
#[tokio::test]
async fn a_correction_naming_its_lease_subtracts_exactly_what_the_fleet_drew_after_it() {
    let server = RedisServer::start();
    let first = Daemon::start(&single(&server));
    let second = Daemon::start(&single(&server));
    let a = first.client().await;
    let b = second.client().await;
    // Drawn before the answered call: the provider has counted it.
    lease_of(a.call(acquire("gpt", 200, 0)).await.unwrap());
    // Long enough before it that it cannot have reached the provider after it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let answered = lease_of(a.call(acquire("gpt", 100, 0)).await.unwrap());
    // After it, through both sidecars: the provider had not seen these.
    lease_of(b.call(acquire("gpt", 300, 0)).await.unwrap());
    lease_of(a.call(acquire("gpt", 50, 0)).await.unwrap());
    let before = levels(&a, "gpt").await[0].1;
    assert!((350..=353).contains(&before), "{before}");
    // A provider with 700 left after the answered call agrees with the
    // bucket (1000 less the 300 it had seen): the bucket stays where it is;
    // 600 lowers it by exactly 100 (two counts make a line with no noise
    // to measure: no fluctuation margin yet, `lua/batch.lua`).
    let named = |count: &'static str| Request::LeaseFeedback {
        lease: answered,
        feedback: match feedback("gpt", 200, 0, &[("x-ratelimit-remaining-tokens", count)]) {
            Request::Feedback(feedback) => feedback,
            other => unreachable!("{other:?}"),
        },
    };
    a.call(named("700")).await.unwrap();
    let kept = levels(&a, "gpt").await[0].1;
    assert!(
        (350..=356).contains(&kept),
        "a count that agrees moved it to {kept}"
    );
    a.call(named("600")).await.unwrap();
    let after = levels(&a, "gpt").await[0].1;
    assert!((250..=256).contains(&after), "lowered to {after}");
    // Through the sidecar that did not grant it, the lease is unknown: the
    // count is placed by its age instead, which still never raises it.
    b.call(named("900")).await.unwrap();
    assert!(levels(&a, "gpt").await[0].1 <= 259);
}

/// Two sidecars on one Redis whose configs give the same limit different
/// bursts (a rolling update of the config): the one that meets the other's
/// shape warns, naming both, shows it in `status` and `/metrics` at once,
/// and both draw with the smaller capacity, so the bucket never holds more
/// than the safer config allows.
#[tokio::test]
async fn sidecars_with_different_shapes_warn_show_it_and_draw_the_smaller() {
    let server = RedisServer::start();
    let shaped = |burst: u64| {
        format!(
            "[redis]\nurl = \"{}\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [[limits]]\nname = \"gpt\"\ntokens_per_minute = 60\nburst_tokens = {burst}\n\
             burst_headroom_ms = 0\n",
            server.url()
        )
    };
    let small = Daemon::start(&shaped(1000));
    let large = Daemon::start(&shaped(2000));
    let small_client = small.client().await;
    let large_client = large.client().await;
    granted(&small_client.call(acquire("gpt", 100, 0)).await.unwrap());
    // The large sidecar's own shape would hold 1500 (after a wait); the
    // smaller capacity in force never can.
    let refused = large_client
        .call(acquire("gpt", 1500, 60_000))
        .await
        .unwrap();
    assert_eq!(error_code(&refused), ErrorCode::CostExceedsCapacity);
    // The log is written before the answer goes out: the warning came with
    // the first acquire that met the other shape, however busy the machine.
    let log = large.log();
    let warning = log
        .lines()
        .find(|line| line.contains("another sidecar draws this bucket"))
        .unwrap_or_else(|| panic!("no warning with the answer:\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("ours=capacity 2000 refilled 60 a minute")
            && warning.contains("theirs=capacity 1000 refilled 60 a minute"),
        "{warning}"
    );
    let (_, buckets) = status_of(&large_client, "gpt").await;
    let names: Vec<&str> = buckets.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["tokens", "tokens:elsewhere"], "{buckets:?}");
    let (_, exposition) = support::http_get(&large.metrics_address(), "/metrics");
    assert_eq!(
        support::metric(
            &exposition,
            "ratekeeper_bucket_shape_conflict{limit=\"gpt\",bucket=\"tokens\",tenant=\"\"}"
        ),
        Some(1.0),
        "{exposition}"
    );
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .arg("status")
        .env(ratekeeper::config::ENV_SOCKET, &large.socket)
        .output()
        .expect("ratekeeper status");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(
            "! another sidecar draws tokens with capacity 1000 refilled 60 a minute: configs differ"
        ),
        "{table}"
    );
    granted(&large_client.call(acquire("gpt", 900, 0)).await.unwrap());

    // The small sidecar learns it from the large one's draws too.
    granted(&small_client.call(acquire("gpt", 1, 1000)).await.unwrap());
    assert!(
        small
            .log()
            .contains("ours=capacity 1000 refilled 60 a minute theirs=capacity 2000"),
        "{}",
        small.log()
    );
}

/// The Redis ACL docs/security.md gives the daemon's user: every command it
/// sends, and every command its scripts call, on its own keys only. A
/// daemon restricted to it acquires, reports, takes feedback, reloads its
/// scripts after a flush and shows its status; Redis logs no denial.
#[tokio::test]
async fn the_documented_acl_is_all_the_daemon_needs() {
    let security = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md"),
    )
    .expect("docs/security.md");
    let rule = security
        .lines()
        .find_map(|line| line.trim().strip_prefix("ACL SETUSER ratekeeper "))
        .expect("docs/security.md gives an `ACL SETUSER ratekeeper …` line");
    let server = RedisServer::start();
    let mut setuser = vec!["ACL", "SETUSER", "ratekeeper"];
    setuser.extend(rule.split_whitespace());
    // The documented password placeholder, replaced by the test's own.
    let setuser: Vec<&str> = setuser
        .into_iter()
        .map(|word| {
            if word.starts_with('>') {
                ">acl-test-secret"
            } else {
                word
            }
        })
        .collect();
    assert_eq!(server.cli(&setuser).as_deref(), Some("OK"));
    let url = format!(
        "url = \"redis://ratekeeper:acl-test-secret@127.0.0.1:{}/0\"",
        server.port
    );
    let daemon = Daemon::start(&config(&url, ""));
    let client = daemon.client().await;
    for round in 0..3 {
        if round == 1 {
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).unwrap(), "OK");
        }
        let lease = lease_of(client.call(acquire("mini", 10, 0)).await.unwrap());
        let settled = client.call(report(lease, 4)).await.unwrap();
        assert_eq!(settled, Response::Settled { tokens_returned: 6 });
    }
    let noted = client
        .call(feedback(
            "gpt",
            200,
            10,
            &[("x-ratelimit-remaining-tokens", "500")],
        ))
        .await
        .unwrap();
    assert!(matches!(noted, Response::Noted { .. }), "{noted:?}");
    assert!(!levels(&client, "mini").await.is_empty());
    assert_eq!(
        server.cli(&["ACL", "LOG"]).unwrap_or_default().trim(),
        "",
        "Redis denied the daemon's user something"
    );
}

/// Issue 27, item 4: 500 one-token leases reported with `u64::MAX` usage
/// took one capacity each (500 capacities: hours of debt for the whole
/// fleet). Overruns together now hold a bucket, and a tenant's share, at
/// most one capacity below where its reservations put it; the rest is
/// counted and warned about. The binary, because the count and the
/// warning's once-per-10-s throttle are process-wide.
#[tokio::test]
async fn hostile_overrun_reports_leave_at_most_one_capacity_of_debt() {
    let server = RedisServer::start();
    let daemon = SpawnedDaemon::start(&format!(
        r#"
[redis]
url = "{}"
timeout_ms = 300

[metrics]
listen = "127.0.0.1:0"

[[limits]]
name = "gpt"
tokens_per_minute = 60
burst_tokens = 1000
burst_headroom_ms = 0
tenant_share = 0.5
"#,
        server.url()
    ));
    let client = daemon.client().await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut leases = Vec::new();
    for _ in 0..500 {
        let mut request = acquire("gpt", 1, 0);
        if let Request::Acquire(acquire) = &mut request {
            acquire.tenant = Some("acme".into());
        }
        leases.push(lease_of(client.call(request).await.unwrap()));
    }
    for lease in leases {
        assert!(Instant::now() < deadline, "500 reports took over 2 minutes");
        let settled = client.call(report(lease, u64::MAX)).await.unwrap();
        assert!(matches!(settled, Response::Settled { .. }), "{settled:?}");
    }
    // The reservations left 500 in the limit's bucket (capacity 1,000) and
    // 0 in the tenant's (capacity 500): one capacity of overrun below that,
    // and refill (a token a second, half that for the tenant) since.
    for (key, floor) in [
        ("ratekeeper:{l:gpt}:gpt:tokens", -500),
        ("ratekeeper:{l:gpt}:gpt:tenant:acme", -500),
    ] {
        let stored = server.cli(&["HGET", key, "l"]).unwrap();
        let tokens = stored.parse::<i64>().unwrap().div_euclid(60_000);
        assert!(
            (floor - 1..floor + 120).contains(&tokens),
            "{key}: {tokens} tokens (floor {floor})"
        );
    }
    daemon.wait_for_log("overrun was not wholly taken").await;
    let (_, exposition) = support::http_get(&daemon.metrics_address().await, "/metrics");
    let clipped = support::metric(&exposition, "ratekeeper_overrun_clipped_tokens_total");
    // Each report's overrun is one capacity at most (1,000 and 500 tokens):
    // all but the first one of each bucket, less what refill paid back.
    assert!(
        clipped.is_some_and(|tokens| tokens > 700_000.0),
        "{clipped:?}"
    );
}
