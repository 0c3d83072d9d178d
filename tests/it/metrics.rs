//! What an operator sees of a running daemon: `/metrics` scraped from a real
//! daemon while grants, denials, reports and a Redis outage happen,
//! `/readyz` following Redis under each failure policy, the decision log,
//! and the systemd readiness notification.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use ratekeeper::proto::{ErrorCode, Request, Response};
use support::redis::RedisServer;
use support::{
    Daemon, SpawnedDaemon, acquire, error_code, granted, http_get, level, metric, report,
};

/// A limit with tenant shares; `acme` gets labels of its own.
fn config(redis: Option<(&RedisServer, &str)>) -> String {
    let redis = redis.map_or(String::new(), |(server, policy)| {
        format!(
            "[redis]\nurl = \"{}\"\ntimeout_ms = 300\n{policy}\n",
            server.url()
        )
    });
    format!(
        r#"{redis}
[metrics]
listen = "127.0.0.1:0"
tenants = ["acme"]

[[limits]]
name = "gpt"
tokens_per_minute = 600
requests_per_minute = 600
tenant_share = 0.5
burst_headroom_ms = 0
"#
    )
}

fn tenant_acquire(tenant: &str, tokens: u64) -> Request {
    match acquire("gpt", tokens, 0) {
        Request::Acquire(mut fields) => {
            fields.tenant = Some(tenant.into());
            Request::Acquire(fields)
        }
        _ => unreachable!(),
    }
}

fn scrape(address: &str) -> String {
    let (status, body) = http_get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

fn value(exposition: &str, series: &str) -> f64 {
    metric(exposition, series).unwrap_or_else(|| panic!("no {series} in:\n{exposition}"))
}

/// Polls `/readyz` until it answers `status`; how long that took.
fn await_readyz(address: &str, status: u16, within: Duration) -> (Duration, String) {
    let started = Instant::now();
    loop {
        let (seen, body) = http_get(address, "/readyz");
        if seen == status {
            return (started.elapsed(), body);
        }
        assert!(
            started.elapsed() < within,
            "/readyz still answers {seen} ({body}) after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(args: &[&str], socket: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(args)
        .env("RATEKEEPER_SOCKET", socket)
        .output()
        .expect("run ratekeeper")
}

#[tokio::test]
async fn counters_move_with_grants_denials_reports_and_an_outage() {
    let mut redis = RedisServer::start();
    let daemon = Daemon::start(&config(Some((&redis, "on_failure = \"fail_closed\""))));
    let address = daemon.metrics_address();
    let client = daemon.client().await;

    let (lease, tokens, _) = granted(&client.call(tenant_acquire("acme", 100)).await.unwrap());
    assert_eq!(tokens, 100);
    // acme's share is 300 tokens: 250 more do not fit now.
    match client.call(tenant_acquire("acme", 250)).await.unwrap() {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "tenant"),
        other => panic!("expected a denial, got {other:?}"),
    }
    // A tenant not listed in [metrics] tenants is counted as "other".
    granted(&client.call(tenant_acquire("initech", 10)).await.unwrap());
    let settled = client.call(report(lease, 40)).await.unwrap();
    assert_eq!(
        settled,
        Response::Settled {
            tokens_returned: 60
        }
    );

    let text = scrape(&address);
    let acquires = |tenant: &str, outcome: &str, reason: &str| {
        format!(
            "ratekeeper_acquires_total{{limit=\"gpt\",tenant=\"{tenant}\",outcome=\"{outcome}\",reason=\"{reason}\"}}"
        )
    };
    assert_eq!(value(&text, &acquires("acme", "granted", "")), 1.0);
    assert_eq!(value(&text, &acquires("acme", "denied", "tenant")), 1.0);
    assert_eq!(value(&text, &acquires("other", "granted", "")), 1.0);
    assert!(!text.contains("initech"), "an unlisted tenant got a label");
    let tokens = "ratekeeper_acquired_tokens_total{limit=\"gpt\",tenant=\"acme\"}";
    assert_eq!(value(&text, tokens), 100.0);
    let waits = "ratekeeper_acquire_wait_seconds_count{limit=\"gpt\"}";
    assert_eq!(value(&text, waits), 2.0);
    let reports = "ratekeeper_reports_total{limit=\"gpt\",outcome=\"settled\"}";
    assert_eq!(value(&text, reports), 1.0);
    assert_eq!(
        value(&text, "ratekeeper_refunded_tokens_total{limit=\"gpt\"}"),
        60.0
    );
    let error = "ratekeeper_estimation_error_tokens_sum{limit=\"gpt\"}";
    assert_eq!(value(&text, error), 60.0, "reserved 100, used 40");
    // The latest store answer: 600 − 100 + 60 − 10 tokens (give or take the
    // refill since), the tenant's own bucket, and the capacities.
    let level = value(
        &text,
        "ratekeeper_bucket_level{limit=\"gpt\",bucket=\"tokens\",tenant=\"\"}",
    );
    assert!((550.0..=600.0).contains(&level), "{level}");
    let capacity = "ratekeeper_bucket_capacity{limit=\"gpt\",bucket=\"tenant\",tenant=\"acme\"}";
    assert_eq!(value(&text, capacity), 300.0);
    assert_eq!(value(&text, "ratekeeper_store_up"), 1.0);
    assert_eq!(value(&text, "ratekeeper_ready"), 1.0);
    assert_eq!(
        value(&text, "ratekeeper_failure_policy{policy=\"fail_closed\"}"),
        1.0
    );
    assert!(
        value(
            &text,
            "ratekeeper_store_call_duration_seconds_count{operation=\"acquire\"}"
        ) >= 3.0
    );
    assert!(value(&text, "ratekeeper_connections_total") >= 1.0);
    assert_eq!(value(&text, "ratekeeper_connections_open"), 1.0);
    assert_eq!(value(&text, "ratekeeper_leases_open"), 1.0);
    assert!(text.contains("ratekeeper_build_info{version=\""), "{text}");
    let (_, body) = await_readyz(&address, 200, Duration::from_secs(1));
    assert!(body.starts_with("ready: the redis store answers"), "{body}");

    // Redis dies: within a second /readyz says so, without any traffic.
    redis.kill();
    let (took, body) = await_readyz(&address, 503, Duration::from_secs(3));
    assert!(took < Duration::from_secs(1), "took {took:?}");
    eprintln!("/readyz went 503 {took:?} after Redis died");
    assert!(body.contains("fail_closed"), "{body}");
    let health = run(&["health"], &daemon.socket);
    assert_eq!(health.status.code(), Some(1), "{health:?}");
    assert!(String::from_utf8_lossy(&health.stdout).starts_with("not ready: "));

    let answer = client.call(acquire("gpt", 10, 0)).await.unwrap();
    assert_eq!(error_code(&answer), ErrorCode::StoreUnavailable);
    let text = scrape(&address);
    assert_eq!(value(&text, "ratekeeper_store_up"), 0.0);
    assert_eq!(value(&text, "ratekeeper_ready"), 0.0);
    assert_eq!(value(&text, "ratekeeper_failure_policy_active"), 1.0);
    assert!(value(&text, "ratekeeper_store_down_seconds") > 0.0);
    assert_eq!(
        value(&text, &acquires("", "error", "store_unavailable")),
        1.0
    );
    assert!(value(&text, "ratekeeper_policy_decisions_total") >= 1.0);
    let failed: f64 = text
        .lines()
        .filter(|line| line.starts_with("ratekeeper_store_errors_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(failed >= 2.0, "a ping and an acquire at least:\n{text}");
    assert!(
        metric(
            &text,
            "ratekeeper_bucket_level{limit=\"gpt\",bucket=\"tokens\",tenant=\"\"}"
        )
        .is_none(),
        "no level while the store is down"
    );

    // Back: ready again, by itself.
    redis.restart();
    await_readyz(&address, 200, Duration::from_secs(10));
    let text = scrape(&address);
    assert_eq!(value(&text, "ratekeeper_store_up"), 1.0);
    assert!(daemon.log().contains("reachable again"));
}

/// Issue 27, item 8: each scrape read every bucket level from Redis, so
/// many scrapers (or one scraping in a loop) cost Redis a call each. Now
/// scrapes within a second share one reading, and still show the levels.
#[tokio::test]
async fn scrapes_within_a_second_read_the_levels_once() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(&config(Some((&redis, ""))));
    let address = daemon.metrics_address();
    let client = daemon.client().await;
    granted(&client.call(acquire("gpt", 100, 0)).await.unwrap());
    let levels_read = |text: &str| {
        value(
            text,
            "ratekeeper_store_call_duration_seconds_count{operation=\"levels\"}",
        )
    };
    let started = Instant::now();
    // Each exposition counts the reading its own scrape made, if any.
    let first = levels_read(&scrape(&address));
    const SCRAPES: usize = 20;
    let mut last = String::new();
    for _ in 0..SCRAPES {
        last = scrape(&address);
        let level = value(
            &last,
            "ratekeeper_bucket_level{limit=\"gpt\",bucket=\"tokens\",tenant=\"\"}",
        );
        assert!((500.0..=600.0).contains(&level), "{level}");
    }
    // At most one more reading per second since the first (a busy machine
    // may take over a second for the scrapes).
    let elapsed = started.elapsed();
    let reads = levels_read(&last) - first;
    assert!(
        reads <= elapsed.as_secs_f64().floor(),
        "{reads} more readings for {SCRAPES} scrapes in {elapsed:?}"
    );
}

#[tokio::test]
async fn readyz_reports_serving_on_the_local_policy() {
    let mut redis = RedisServer::start();
    let daemon = Daemon::start(&config(Some((
        &redis,
        "on_failure = \"local\"\nlocal_share = 0.5",
    ))));
    let address = daemon.metrics_address();
    await_readyz(&address, 200, Duration::from_secs(1));
    redis.kill();
    // Still ready, and saying why.
    let started = Instant::now();
    let text = loop {
        let text = scrape(&address);
        if metric(&text, "ratekeeper_store_up") == Some(0.0) {
            break text;
        }
        assert!(started.elapsed() < Duration::from_secs(3), "{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(value(&text, "ratekeeper_ready"), 1.0);
    let (status, body) = http_get(&address, "/readyz");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("ready: serving on the failure policy")
            && body.contains("on_failure = \"local\""),
        "{body}"
    );
    let health = run(&["health"], &daemon.socket);
    assert_eq!(health.status.code(), Some(0), "{health:?}");
    let client = daemon.client().await;
    granted(&client.call(acquire("gpt", 100, 0)).await.unwrap());
    let text = scrape(&address);
    let granted_series =
        "ratekeeper_acquires_total{limit=\"gpt\",tenant=\"\",outcome=\"granted\",reason=\"\"}";
    assert_eq!(value(&text, granted_series), 1.0);
    assert_eq!(value(&text, "ratekeeper_policy_decisions_total"), 1.0);
}

#[tokio::test]
async fn the_listener_serves_probes_and_nothing_else() {
    let daemon = Daemon::start(&config(None));
    let address = daemon.metrics_address();
    assert_eq!(http_get(&address, "/healthz"), (200, "alive\n".into()));
    let (status, body) = http_get(&address, "/readyz");
    assert_eq!(
        (status, body.as_str()),
        (200, "ready: the embedded store answers\n")
    );
    assert_eq!(http_get(&address, "/").0, 404);
    let client = daemon.client().await;
    granted(&client.call(acquire("gpt", 10, 0)).await.unwrap());
    let text = scrape(&address);
    assert!(
        text.contains("# TYPE ratekeeper_acquires_total counter"),
        "{text}"
    );
    assert_eq!(value(&text, "ratekeeper_store_up"), 1.0);
    // The embedded store has no failure policy.
    assert!(!text.contains("ratekeeper_failure_policy"), "{text}");

    // Off unless configured.
    let quiet = Daemon::start("[[limits]]\nname = \"gpt\"\ntokens_per_minute = 60\n");
    quiet.assert_serving().await;
    assert!(!quiet.log().contains("serving /metrics"), "{}", quiet.log());
}

/// One line per acquire, report and release, with fields a JSON log can be
/// queried by; a tenant's newline stays inside its value. Metrics off: the
/// log does not need them.
#[tokio::test]
async fn decisions_are_logged_at_debug_as_fields() {
    let unmetered = "[[limits]]\nname = \"gpt\"\ntokens_per_minute = 600\ntenant_share = 0.5\n";
    let daemon = SpawnedDaemon::start_with_env(unmetered, &[("RATEKEEPER_LOG_FORMAT", "json")]);
    let client = daemon.client().await;
    let (lease, _, _) = granted(
        &client
            .call(tenant_acquire("acme\n{\"forged\":1}", 100))
            .await
            .unwrap(),
    );
    client.call(report(lease, 30)).await.unwrap();
    client.call(acquire("gpt", 10_000, 0)).await.unwrap();
    daemon.wait_for_log("\"request\":\"report\"").await;
    let decisions: Vec<serde_json::Value> = daemon
        .log()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .filter(|line: &serde_json::Value| line["message"] == "decision")
        .collect();
    let fields: Vec<&serde_json::Value> = decisions.iter().collect();
    assert_eq!(fields.len(), 3, "{fields:?}");
    assert_eq!(fields[0]["request"], "acquire");
    assert_eq!(fields[0]["limit"], "gpt");
    assert_eq!(fields[0]["tenant"], "acme\n{\"forged\":1}");
    assert_eq!(fields[0]["outcome"], "granted");
    assert_eq!(fields[0]["waited_ms"], 0);
    assert_eq!(fields[0]["input_tokens"], 100);
    assert_eq!(fields[1]["request"], "report");
    assert_eq!(fields[1]["limit"], "gpt");
    assert_eq!(fields[1]["tokens_returned"], 70);
    assert_eq!(fields[2]["outcome"], "error");
    assert_eq!(fields[2]["code"], "cost_exceeds_capacity");
    assert!(decisions.iter().all(|d| d["level"] == "DEBUG"));
}

#[tokio::test]
async fn systemd_hears_ready_once_the_socket_listens() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let daemon = SpawnedDaemon::start_with_env(
        "[[limits]]\nname = \"gpt\"\ntokens_per_minute = 60\n",
        &[("NOTIFY_SOCKET", notify.to_str().unwrap())],
    );
    let mut datagram = [0u8; 256];
    let len = listener.recv(&mut datagram).expect("a notification");
    let state = String::from_utf8_lossy(&datagram[..len]);
    assert!(state.starts_with("READY=1\n"), "{state:?}");
    assert!(daemon.socket.exists(), "READY before the socket");
    daemon.assert_serving().await;
    let mut daemon = daemon;
    assert!(daemon.terminate().success());
    let len = listener.recv(&mut datagram).expect("a notification");
    assert_eq!(&datagram[..len], b"STOPPING=1\n");
}

/// Every `ratekeeper_` series name in `text`, histogram suffixes removed.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("ratekeeper_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        names.insert(base.to_string());
    }
    names
}

/// The manual's metrics page (docs/metrics.md) lists every metric the daemon
/// exports, and the dashboard uses only metrics it lists.
#[tokio::test]
async fn every_metric_is_documented_and_the_dashboard_uses_only_those() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("docs/metrics.md")).unwrap();
    let table: String = readme
        .lines()
        .filter(|line| line.starts_with("| `ratekeeper_"))
        .map(|line| line.split(" | ").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let documented = metric_names(&table);

    let mut redis = RedisServer::start();
    // A shadow limit and a spend budget too, and an outage at the end:
    // families without a sample are not exported, and every documented
    // one must be.
    let with_shadow = format!(
        "{}\n[[limits]]\nname = \"watch\"\nmode = \"shadow\"\ntokens_per_minute = 60\n\
         \n[[limits]]\nname = \"paid\"\ntokens_per_minute = 600\nbudget = {{ day = \"100\" }}\n\
         price = {{ input = \"1\", output = \"1\" }}\n",
        config(Some((&redis, "")))
    );
    let daemon = Daemon::start(&with_shadow);
    let address = daemon.metrics_address();
    let client = daemon.client().await;
    let (lease, _, _) = granted(&client.call(tenant_acquire("acme", 10)).await.unwrap());
    client.call(report(lease, 5)).await.unwrap();
    let (lease, _, _) = granted(&client.call(acquire("gpt", 10, 0)).await.unwrap());
    client.call(Request::Release { lease }).await.unwrap();
    client.call(acquire("gpt", 100_000, 0)).await.unwrap();
    client.call(acquire("watch", 10, 0)).await.unwrap();
    let (lease, _, _) = granted(&client.call(acquire("paid", 10, 0)).await.unwrap());
    client.call(report(lease, 5)).await.unwrap();
    daemon
        .reload_with(&with_shadow)
        .await
        .expect("the reload applies");
    // Levels are read from the store at scrape time: scrape before the outage too.
    let before_the_outage = scrape(&address);
    redis.kill();
    client.call(acquire("gpt", 10, 0)).await.unwrap();
    let exported: std::collections::BTreeSet<String> = [before_the_outage, scrape(&address)]
        .iter()
        .flat_map(|text| text.lines())
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .flat_map(metric_names)
        .collect();
    let undocumented: Vec<&String> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
    assert!(exported.len() >= 25, "{exported:?}");
    // And the other way: no docs/metrics.md row for a metric that is gone.
    let stale: Vec<&String> = documented.difference(&exported).collect();
    assert!(
        stale.is_empty(),
        "in docs/metrics.md, not exported: {stale:?}"
    );

    let dashboard = std::fs::read_to_string(repo.join("k8s/grafana-dashboard.json")).unwrap();
    let parsed: serde_json::Value =
        serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(
        parsed["panels"]
            .as_array()
            .is_some_and(|panels| panels.len() >= 8)
    );
    let used = metric_names(&dashboard);
    let unknown: Vec<&String> = used.difference(&documented).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard uses unknown metrics: {unknown:?}"
    );
}

/// A shadow limit decides as an enforced one would, counts what it would
/// have done, and grants every acquire at once: a denial reserves nothing,
/// a wait keeps its reservation, a cost that could never fit is let through.
#[tokio::test]
async fn a_shadow_limit_grants_at_once_and_counts_what_it_would_have_done() {
    let daemon = Daemon::start(
        "[metrics]\nlisten = \"127.0.0.1:0\"\n\n\
         [[priorities]]\nname = \"patient\"\nmax_wait_ms = 60000\n\n\
         [[limits]]\nname = \"watch\"\nmode = \"shadow\"\ntokens_per_minute = 60\n\
         burst_tokens = 100\nburst_headroom_ms = 0\n",
    );
    let client = daemon.client().await;
    let granted_at_once = |request| {
        let client = &client;
        async move {
            let (lease, tokens, waited) = granted(&client.call(request).await.unwrap());
            assert_eq!(waited, 0);
            (lease, tokens)
        }
    };
    granted_at_once(acquire("watch", 100, 0)).await;
    // Empty bucket: would be denied; granted, nothing reserved.
    let (denied_lease, _) = granted_at_once(acquire("watch", 50, 0)).await;
    assert!(level(&client, "watch", "tokens").await <= 0);
    // Would wait 50 s: granted now, the reservation kept.
    granted_at_once(acquire("watch", 50, 60_000)).await;
    assert!(level(&client, "watch", "tokens").await <= -49);
    // Could never fit: granted too.
    granted_at_once(acquire("watch", 1_000, 0)).await;
    // Settling a lease that reserved nothing gives nothing back.
    let released = client
        .call(Request::Release {
            lease: denied_lease,
        })
        .await
        .unwrap();
    assert_eq!(released, Response::Released { tokens_returned: 0 });
    assert!(level(&client, "watch", "tokens").await <= -49);

    let (_, text) = http_get(&daemon.metrics_address(), "/metrics");
    let decisions = |decision: &str| {
        value(
            &text,
            &format!(
                "ratekeeper_shadow_decisions_total{{limit=\"watch\",decision=\"{decision}\"}}"
            ),
        )
    };
    assert_eq!(decisions("granted"), 1.0);
    assert_eq!(decisions("would_deny"), 1.0);
    assert_eq!(decisions("would_wait"), 1.0);
    assert_eq!(decisions("would_refuse"), 1.0);
}
