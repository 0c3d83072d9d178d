//! The real daemon over its real socket: reservations and their exact waits,
//! settlement, cancellation, pipelining and shutdown, on the embedded store.

use crate::support;

use std::time::{Duration, Instant};

use ratekeeper::proto::{ErrorCode, Request, Response, Usage};
use support::{Daemon, SpawnedDaemon, acquire, error_code, granted, level, report};

/// Waits may differ from the prediction by scheduling and the few
/// milliseconds of refill between the requests.
const TOLERANCE_MS: i64 = 15;

/// How much later than predicted a busy machine may deliver an answer: a
/// wait ends late when the runtime gets the CPU late, never early, so only
/// the early side is held to `TOLERANCE_MS`. Later than this would be a
/// wrong wait rather than scheduling.
const LATE_MS: i64 = 1_000;

/// `fast`: 10 tokens per ms, so waits are short but well above scheduling noise.
/// `slow`: 1 token per second, so levels read by `status` barely move.
/// `fast` keeps no burst headroom: its 3000 tokens are all usable.
const CONFIG: &str = r#"
# Acquires here may wait up to an hour, the protocol's longest wait.
[[priorities]]
name = "patient"
max_wait_ms = 3600000

[[limits]]
name = "fast"
tokens_per_minute = 600000
burst_tokens = 3000
requests_per_minute = 600000
burst_headroom_ms = 0

[[limits]]
name = "slow"
tokens_per_minute = 60
burst_tokens = 1000
requests_per_minute = 60
burst_requests = 5
"#;

/// A wait the daemon measured: not earlier than `expected`, and not later
/// than a busy machine explains.
fn assert_wait(actual: i64, expected: i64, what: &str) {
    assert!(
        (expected - TOLERANCE_MS..=expected + LATE_MS).contains(&actual),
        "{what}: {actual} ms, predicted {expected} ms (-{TOLERANCE_MS}, +{LATE_MS})"
    );
}

#[tokio::test]
async fn waits_follow_the_reservation_semantics_and_reports_refund() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;

    // Empty the 3000-token bucket in one grant: no wait.
    let (_, tokens, waited) = granted(&client.call(acquire("fast", 3000, 0)).await.unwrap());
    assert_eq!((tokens, waited), (3000, 0));

    // Two reservations below zero. 2000 tokens take 200 ms to refill; the
    // 1000 after them are due 100 ms later, counted from the first. The second
    // is sent once the first is visibly reserved, so their order is known.
    let started = Instant::now();
    let first = client.call(acquire("fast", 2000, 1000));
    let second = async {
        while level(&client, "fast", "tokens").await > -1000 {
            tokio::task::yield_now().await;
        }
        let sent_after = started.elapsed();
        (sent_after, client.call(acquire("fast", 1000, 1000)).await)
    };
    let (first, (sent_after, second)) = tokio::join!(first, second);
    let (_, _, first_wait) = granted(&first.unwrap());
    let (_, _, second_wait) = granted(&second.unwrap());
    assert_wait(first_wait as i64, 200, "first reservation");
    assert_wait(
        sent_after.as_millis() as i64 + second_wait as i64,
        300,
        "second reservation, from the first",
    );
    assert!(started.elapsed() >= Duration::from_millis(300 - TOLERANCE_MS as u64));

    // The level was about 0 when the second reservation fell due, 300 ms in:
    // 2500 tokens need 250 ms from then, so with 100 ms allowed the answer is
    // a denial with retry_after 150 ms less the time since.
    let sent = started.elapsed().as_millis() as i64 - 300;
    let denial = client.call(acquire("fast", 2500, 100)).await.unwrap();
    let answered = started.elapsed().as_millis() as i64 - 300;
    match denial {
        Response::Denied {
            retry_after_ms,
            bucket,
        } => {
            assert_eq!(bucket, "tokens");
            let retry_after_ms = retry_after_ms as i64;
            assert!(
                (150 - answered - TOLERANCE_MS..=150 - sent + TOLERANCE_MS)
                    .contains(&retry_after_ms),
                "retry_after: {retry_after_ms} ms, sent {sent} ms and answered {answered} ms \
                 after the level was 0"
            );
        }
        other => panic!("expected a denial, got {other:?}"),
    }

    // Settlement on the slow limit, where the level stands still while we look.
    let before = level(&client, "slow", "tokens").await;
    let (lease, _, _) = granted(&client.call(acquire("slow", 800, 0)).await.unwrap());
    let reserved = level(&client, "slow", "tokens").await;
    assert!(
        (before - 800..=before - 798).contains(&reserved),
        "{before} → {reserved}"
    );
    let settled = client
        .call(Request::Report {
            lease,
            input_tokens: 200,
            output_tokens: 100,
        })
        .await
        .unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 500
        }
    );
    let refunded = level(&client, "slow", "tokens").await;
    assert!(
        (reserved + 500..=reserved + 502).contains(&refunded),
        "{reserved} → {refunded}"
    );

    // A lease settles once: the second report changes nothing.
    let again = client.call(report(lease, 0)).await.unwrap();
    assert_eq!(error_code(&again), ErrorCode::UnknownLease);
    let after = level(&client, "slow", "tokens").await;
    assert!(
        (refunded..=refunded + 2).contains(&after),
        "{refunded} → {after}"
    );
}

#[tokio::test]
async fn release_returns_tokens_and_the_request() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    let (lease, _, _) = granted(&client.call(acquire("slow", 600, 0)).await.unwrap());
    assert_eq!(level(&client, "slow", "requests").await, 4);
    let released = client.call(Request::Release { lease }).await.unwrap();
    assert_eq!(
        released,
        Response::Released {
            tokens_returned: 600
        }
    );
    assert_eq!(level(&client, "slow", "requests").await, 5);
    assert!(level(&client, "slow", "tokens").await >= 1000 - 2);
    let twice = client.call(Request::Release { lease }).await.unwrap();
    assert_eq!(error_code(&twice), ErrorCode::UnknownLease);
}

/// Revision 6: a `UsageReport` settles a lease as `Report` does, by the
/// figure the rate limit counts: full-price input and cache writes, plus
/// output. (No cache reads here: whether a limit counts them depends on
/// its provider, which is the settlement's business, not the protocol's.)
#[tokio::test]
async fn a_usage_report_settles_a_lease_by_its_rate_limit_tokens() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    let (lease, tokens, _) = granted(&client.call(acquire("slow", 800, 0)).await.unwrap());
    assert_eq!(tokens, 800);
    let usage = |input_tokens, cache_write_tokens, output_tokens| Request::UsageReport {
        lease,
        usage: Usage {
            input_tokens,
            cached_input_tokens: 0,
            cache_write_tokens,
            output_tokens,
        },
    };
    let settled = client.call(usage(200, 150, 50)).await.unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 800 - (200 + 150 + 50)
        }
    );
    // Settled once, whichever report comes second.
    let again = client.call(usage(0, 0, 0)).await.unwrap();
    assert_eq!(error_code(&again), ErrorCode::UnknownLease);
    let by_report = client.call(report(lease, 0)).await.unwrap();
    assert_eq!(error_code(&by_report), ErrorCode::UnknownLease);
}

/// Issue: lease ids were sequential, so any connection could release the
/// next worker's lease by guessing its number.
#[tokio::test]
async fn another_connection_cannot_guess_a_lease() {
    let daemon = Daemon::start(CONFIG);
    let worker = daemon.client().await;
    let intruder = daemon.client().await;
    // The intruder's own lease sits between two of the worker's.
    let (first, _, _) = granted(&worker.call(acquire("fast", 10, 0)).await.unwrap());
    let (own, _, _) = granted(&intruder.call(acquire("fast", 10, 0)).await.unwrap());
    let (second, _, _) = granted(&worker.call(acquire("fast", 10, 0)).await.unwrap());
    for guess in (1..=3).flat_map(|step| [own.wrapping_add(step), own.wrapping_sub(step)]) {
        let answer = intruder
            .call(Request::Release { lease: guess })
            .await
            .unwrap();
        assert_eq!(
            error_code(&answer),
            ErrorCode::UnknownLease,
            "lease {guess}"
        );
    }
    for lease in [first, second] {
        let settled = worker.call(report(lease, 5)).await.unwrap();
        assert!(matches!(settled, Response::Settled { .. }), "{settled:?}");
    }
    // Whoever knows a lease may settle it: a reconnecting worker reports its own.
    let reconnected = daemon.client().await;
    let settled = reconnected.call(report(own, 5)).await.unwrap();
    assert!(matches!(settled, Response::Settled { .. }), "{settled:?}");
}

#[tokio::test]
async fn request_bucket_refusal_leaves_the_token_bucket_untouched() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    for _ in 0..5 {
        granted(&client.call(acquire("slow", 1, 0)).await.unwrap());
    }
    let tokens_before = level(&client, "slow", "tokens").await;
    match client.call(acquire("slow", 1, 0)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "requests"),
        other => panic!("expected a denial, got {other:?}"),
    }
    let tokens_after = level(&client, "slow", "tokens").await;
    assert!((tokens_before..=tokens_before + 2).contains(&tokens_after));
}

#[tokio::test]
async fn a_ping_is_not_held_up_behind_a_waiting_acquire() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    granted(&client.call(acquire("fast", 3000, 0)).await.unwrap());
    let waiting = client.call(acquire("fast", 3000, 5000));
    let ping = async {
        let started = Instant::now();
        assert_eq!(client.call(Request::Ping).await.unwrap(), Response::Pong);
        started.elapsed()
    };
    let (waited, ping_took) = tokio::join!(waiting, ping);
    let (_, _, waited_ms) = granted(&waited.unwrap());
    assert!(
        waited_ms >= 250,
        "the acquire should have waited, not {waited_ms} ms"
    );
    assert!(
        ping_took < Duration::from_millis(waited_ms),
        "ping took {ping_took:?}, as long as the acquire's {waited_ms} ms wait"
    );
}

#[tokio::test]
async fn status_counts_waiters() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    let watcher = daemon.client().await;
    granted(&client.call(acquire("slow", 1000, 0)).await.unwrap());
    let id = client.next_request_id();
    let waiting = client.call_with_id(id, acquire("slow", 10, 60_000));
    let observe = async {
        // The acquire is in flight once its reservation shows in the level.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let response = watcher
                .call(Request::Status {
                    limit: Some("slow".into()),
                })
                .await
                .unwrap();
            if let Response::Status { limits, .. } = response {
                if limits[0].waiters == 1 {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the waiter never showed in status"
            );
            tokio::task::yield_now().await;
        }
        client
            .call(Request::Cancel { request_id: id })
            .await
            .unwrap()
    };
    let (waited, cancelled) = tokio::join!(waiting, observe);
    assert_eq!(cancelled, Response::Cancelled { found: true });
    assert_eq!(error_code(&waited.unwrap()), ErrorCode::Cancelled);
}

#[tokio::test]
async fn cancel_returns_the_reservation() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    granted(&client.call(acquire("slow", 900, 0)).await.unwrap());
    let before = level(&client, "slow", "tokens").await;
    let id = client.next_request_id();
    let (waited, cancelled) = tokio::join!(
        client.call_with_id(id, acquire("slow", 500, 600_000)),
        async {
            // Cancel once the reservation is visibly taken.
            let deadline = Instant::now() + Duration::from_secs(10);
            while level(&client, "slow", "tokens").await > before - 400 {
                assert!(Instant::now() < deadline, "the reservation never showed");
                tokio::task::yield_now().await;
            }
            client
                .call(Request::Cancel { request_id: id })
                .await
                .unwrap()
        }
    );
    assert_eq!(error_code(&waited.unwrap()), ErrorCode::Cancelled);
    assert_eq!(cancelled, Response::Cancelled { found: true });
    let after = level(&client, "slow", "tokens").await;
    assert!((before..=before + 3).contains(&after), "{before} → {after}");
    let unknown = client
        .call(Request::Cancel { request_id: id })
        .await
        .unwrap();
    assert_eq!(unknown, Response::Cancelled { found: false });
}

#[tokio::test]
async fn a_disconnect_returns_waiting_reservations() {
    let daemon = Daemon::start(CONFIG);
    let observer = daemon.client().await;
    let leaving = daemon.client().await;
    granted(&leaving.call(acquire("slow", 900, 0)).await.unwrap());
    let before = level(&observer, "slow", "tokens").await;
    let pending = tokio::spawn(async move {
        let _ = leaving.call(acquire("slow", 500, 600_000)).await;
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while level(&observer, "slow", "tokens").await > before - 400 {
        assert!(Instant::now() < deadline, "the reservation never showed");
        tokio::task::yield_now().await;
    }
    pending.abort(); // drops the client and with it the connection
    let deadline = Instant::now() + Duration::from_secs(5);
    while level(&observer, "slow", "tokens").await < before {
        assert!(
            Instant::now() < deadline,
            "reservation not returned after disconnect"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn sigterm_drains_and_removes_the_socket() {
    let mut daemon = SpawnedDaemon::start(CONFIG);
    let client = daemon.client().await;
    granted(&client.call(acquire("fast", 3000, 0)).await.unwrap());
    // A reservation due in 300 ms is in flight when SIGTERM arrives; the
    // drain lets it finish.
    let waiting = client.call(acquire("fast", 3000, 5000));
    let terminate = async {
        let _ = client.call(Request::Ping).await;
        let pid = daemon.pid();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .unwrap()
        })
        .await
        .unwrap();
    };
    let (waited, ()) = tokio::join!(waiting, terminate);
    granted(&waited.unwrap());
    let status = daemon.wait_exit();
    assert!(status.success(), "exit status {status}\n{}", daemon.log());
    assert!(!daemon.socket.exists(), "socket file left behind");
}

/// The same drain started in-process, as the tests' harness stops a daemon:
/// `serve` returns only after the reservation in flight was granted.
#[tokio::test]
async fn a_shutdown_drains_in_flight_acquires_and_removes_the_socket() {
    let mut daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    granted(&client.call(acquire("fast", 3000, 0)).await.unwrap());
    let waiting = client.call(acquire("fast", 3000, 5000));
    let shut_down = async {
        // Frames are read in order: once the ping is answered the acquire
        // is in flight.
        let _ = client.call(Request::Ping).await;
        daemon.shut_down().await;
    };
    let (waited, ()) = tokio::join!(waiting, shut_down);
    granted(&waited.unwrap());
    assert!(!daemon.socket.exists(), "socket file left behind");
}

#[tokio::test]
async fn a_second_daemon_refuses_a_live_socket() {
    let daemon = Daemon::start(CONFIG);
    let config = daemon.dir().join("second.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(["serve", "--config"])
        .arg(&config)
        .env(ratekeeper::config::ENV_SOCKET, &daemon.socket)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already listening"), "{stderr}");
    daemon.assert_serving().await;
}

#[tokio::test]
async fn a_crashed_worker_keeps_its_reservation_by_default() {
    let daemon = Daemon::start(CONFIG);
    let observer = daemon.client().await;
    let worker = daemon.client().await;
    granted(&worker.call(acquire("slow", 800, 0)).await.unwrap());
    let before = level(&observer, "slow", "tokens").await;
    drop(worker);
    daemon.wait_for_log("unreported_leases=1").await;
    let after = level(&observer, "slow", "tokens").await;
    assert!((before..=before + 2).contains(&after), "{before} → {after}");
}

#[tokio::test]
async fn the_refund_rule_returns_a_fraction_after_the_grace_period() {
    let config = format!(
        "{CONFIG}\n[leases]\non_disconnect = \"refund\"\ndisconnect_refund_fraction = 0.5\ndisconnect_grace_ms = 300\n"
    );
    let daemon = Daemon::start(&config);
    let observer = daemon.client().await;
    let worker = daemon.client().await;
    granted(&worker.call(acquire("slow", 800, 0)).await.unwrap());
    let before = level(&observer, "slow", "tokens").await;
    let closed = Instant::now();
    drop(worker);
    let deadline = closed + Duration::from_secs(10);
    while level(&observer, "slow", "tokens").await < before + 400 {
        assert!(
            Instant::now() < deadline,
            "no refund after the grace period"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        closed.elapsed() >= Duration::from_millis(300),
        "refunded before the grace period"
    );
    let after = level(&observer, "slow", "tokens").await;
    assert!(
        (before + 400..=before + 405).contains(&after),
        "{before} → {after}"
    );
}

#[tokio::test]
async fn unreported_leases_expire() {
    let config = format!("{CONFIG}\n[leases]\nexpire_after_ms = 200\n");
    let daemon = Daemon::start(&config);
    let client = daemon.client().await;
    let (lease, _, _) = granted(&client.call(acquire("slow", 10, 0)).await.unwrap());
    daemon.wait_for_log("forgot unreported leases").await;
    let late = client.call(report(lease, 1)).await.unwrap();
    assert_eq!(error_code(&late), ErrorCode::UnknownLease);
}

#[tokio::test]
async fn sighup_reloads_the_config_and_keeps_the_old_one_when_the_new_is_bad() {
    let daemon = SpawnedDaemon::start(CONFIG);
    let client = daemon.client().await;
    let with_new_limit =
        format!("{CONFIG}\n[[limits]]\nname = \"added\"\ntokens_per_minute = 600\n");
    std::fs::write(daemon.config_path(), with_new_limit).unwrap();
    daemon.send_signal("HUP");
    daemon.wait_for_log("configuration reloaded").await;
    granted(&client.call(acquire("added", 10, 0)).await.unwrap());

    std::fs::write(daemon.config_path(), "[[limits]]\nname = \"broken\"\n").unwrap();
    daemon.send_signal("HUP");
    daemon.wait_for_log("configuration not reloaded").await;
    assert!(
        daemon.log().contains("a limit needs a bucket"),
        "{}",
        daemon.log()
    );
    granted(&client.call(acquire("added", 10, 0)).await.unwrap());
    let unknown = client.call(acquire("broken", 1, 0)).await.unwrap();
    assert_eq!(error_code(&unknown), ErrorCode::UnknownLimit);
}

/// The burst keeps headroom for the delay before the provider sees a call:
/// a full bucket holds the burst less 200 ms of refill by default, so a
/// fleet emptying it at once cannot run ahead of the provider's bucket,
/// which could not bank that refill. The rate is untouched.
#[tokio::test]
async fn the_burst_keeps_headroom_for_the_providers_delay() {
    let daemon = Daemon::start(
        "[[limits]]\nname = \"edge\"\ntokens_per_minute = 60000\nburst_tokens = 3000\n\
         requests_per_minute = 3000\n\n\
         [[limits]]\nname = \"wide\"\ntokens_per_minute = 60000\nburst_tokens = 3000\n\
         burst_headroom_ms = 1000\n",
    );
    let client = daemon.client().await;
    let status = client.call(Request::Status { limit: None }).await.unwrap();
    let Response::Status { limits, .. } = status else {
        panic!("expected status, got {status:?}");
    };
    let buckets: Vec<(&str, &str, u64, u64)> = limits
        .iter()
        .flat_map(|limit| {
            limit.buckets.iter().map(|bucket| {
                (
                    limit.name.as_str(),
                    bucket.name.as_str(),
                    bucket.capacity,
                    bucket.per_minute,
                )
            })
        })
        .collect();
    assert_eq!(
        buckets,
        [
            ("edge", "tokens", 2800, 60000),
            ("edge", "requests", 2990, 3000),
            ("wide", "tokens", 2000, 60000),
        ]
    );
    // What the burst no longer holds cannot be granted at once.
    let denied = client.call(acquire("edge", 2900, 0)).await.unwrap();
    assert_eq!(error_code(&denied), ErrorCode::CostExceedsCapacity);
    granted(&client.call(acquire("edge", 2800, 0)).await.unwrap());
}

/// The limits people have: requests per second and per day at once, no
/// token bucket. Any cost is accepted (a cost of none too), the tighter
/// window holds each acquire back, and the day's figure denies at its end.
#[tokio::test]
async fn a_requests_only_limit_with_a_second_and_a_day_window() {
    let daemon = Daemon::start(
        "[[limits]]\nname = \"rps\"\nrequests_per_second = 5\nrequests_per_day = 7\n\
         burst_headroom_ms = 0\n",
    );
    let client = daemon.client().await;
    let started = Instant::now();
    for _ in 0..5 {
        let (_, tokens, waited) = granted(&client.call(acquire("rps", 0, 0)).await.unwrap());
        assert_eq!((tokens, waited), (0, 0));
    }
    // The sixth and seventh each wait for a fifth of the second's refill:
    // the seventh is due 400 ms after the bucket emptied.
    for _ in 0..2 {
        let (_, _, waited) = granted(&client.call(acquire("rps", 1, 1_000)).await.unwrap());
        // About 200 ms, more on a busy machine; never the day's refill.
        assert!((190..1_000).contains(&waited), "{waited}");
    }
    assert!(started.elapsed() >= Duration::from_millis(399));
    // The eighth meets the day's end: a day refills 7, one every 3.4 hours.
    match client.call(acquire("rps", 1, 1_000)).await.unwrap() {
        Response::Denied {
            bucket,
            retry_after_ms,
        } => {
            assert_eq!(bucket, "requests_per_day");
            assert!(retry_after_ms > 12_000_000, "{retry_after_ms}");
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    let (_, buckets) = support::status_of(&client, "rps").await;
    let names: Vec<&str> = buckets.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["requests_per_second", "requests_per_day"]);
}

/// The shipped config's small limit, gpt-4o at 30k TPM under the openai
/// preset's one-second enforcement window (a burst of 500 tokens, 400 of
/// them usable): a single request of 10k tokens is not refused but waits
/// until the bucket is full, then passes and leaves the bucket in debt,
/// which the next request waits for. Only a cost above the per-minute
/// figure can never be granted.
#[tokio::test]
async fn a_request_above_the_one_second_burst_passes_once_the_bucket_is_full() {
    let daemon = Daemon::start(include_str!("../../examples/ratekeeper.toml"));
    let client = daemon.client().await;
    let started = Instant::now();
    let (_, tokens, waited) = granted(&client.call(acquire("gpt-4o", 300, 0)).await.unwrap());
    assert_eq!((tokens, waited), (300, 0));

    // 300 of the 400 are taken: full again after 300 tokens at 500 a
    // second, 600 ms after the first grant, less what passed before the
    // second request.
    let sent = started.elapsed().as_millis() as i64;
    let (_, tokens, waited) =
        granted(&client.call(acquire("gpt-4o", 10_000, 2_000)).await.unwrap());
    assert_eq!(tokens, 10_000);
    assert_wait(waited as i64, 600 - sent, "the wait for a full bucket");

    // Then 10,000 tokens of debt: 20 s until full, 1 s of it allowed.
    match client.call(acquire("gpt-4o", 10_000, 1_000)).await.unwrap() {
        Response::Denied {
            retry_after_ms,
            bucket,
        } => {
            assert_eq!(bucket, "tokens");
            assert!(
                (18_000..=19_000).contains(&retry_after_ms),
                "retry after {retry_after_ms} ms"
            );
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    let refused = client.call(acquire("gpt-4o", 30_001, 0)).await.unwrap();
    assert_eq!(error_code(&refused), ErrorCode::CostExceedsCapacity);
    assert!(
        format!("{refused:?}").contains("holds at most 30000"),
        "{refused:?}"
    );
}
