//! What a file leaves out, and what it may spell out.

use super::*;

#[test]
fn config_defaults_without_a_file() {
    let config = load(None, no_env).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.server.socket, PathBuf::from("/tmp/ratekeeper.sock"));
    assert_eq!(config.server.socket_mode, 0o660);
    assert_eq!(config.server.drain_timeout_ms, 10_000);
    assert!(config.redis.is_none());
    assert!(config.limits.is_empty());
    assert_eq!(config.priorities.len(), 1);
    assert_eq!(config.priorities[0].name, "default");
    assert_eq!(config.priorities[0].reserved_fraction, 0.0);
    assert_eq!(config.priorities[0].max_wait_ms, 10_000);
    assert_eq!(config.priorities[0].limits, None);
    assert_eq!(config.default_priority, "default");
}

#[test]
fn config_empty_file_is_the_defaults() {
    assert_eq!(parse_ok(""), Config::default());
    assert_eq!(
        parse_ok("default_priority = \"default\"\n"),
        Config::default()
    );
}

#[test]
fn config_resolves_defaults() {
    let config = parse_ok(
        "\
[[limits]]
name = \"gpt-4o\"
tokens_per_minute = 30000
requests_per_minute = 500

[[limits]]
name = \"embed\"
tokens_per_minute = 1000
burst_tokens = 2000
max_request_tokens = 2000
tenant_share = 1

[[priorities]]
name = \"interactive\"

[[priorities]]
name = \"batch\"
reserved_fraction = 0.25
max_wait_ms = 0
limits = [\"gpt-4o\"]
",
    );
    let gpt = config.limit("gpt-4o").unwrap();
    assert_eq!(gpt.tokens_per_minute, 30_000);
    assert_eq!(gpt.burst_tokens, 30_000);
    assert_eq!(gpt.requests_per_minute, Some(500));
    // 200 ms of refill held back from each own bucket's burst.
    assert_eq!(gpt.burst_headroom_ms, DEFAULT_BURST_HEADROOM_MS);
    let per_minute = crate::limiter::Refill::per_minute;
    assert_eq!(
        gpt.usable_burst(BucketKind::Tokens, &per_minute(30_000), 30_000),
        29_900
    );
    assert_eq!(
        gpt.usable_burst(BucketKind::Requests, &per_minute(500), 500),
        499
    );
    // max_request_tokens = burst: the token bucket keeps all of it.
    let embed = config.limit("embed").unwrap();
    assert_eq!(
        embed.usable_burst(BucketKind::Tokens, &per_minute(1000), 2000),
        2000
    );
    assert_eq!(gpt.burst_requests, Some(500));
    assert_eq!(gpt.tenant_share, None);
    assert_eq!(gpt.max_request_tokens, None);
    assert_eq!(gpt.model, None);

    let embed = config.limit("embed").unwrap();
    assert_eq!(embed.burst_tokens, 2000);
    assert_eq!(embed.requests_per_minute, None);
    assert_eq!(embed.burst_requests, None);
    assert_eq!(embed.tenant_share, Some(1.0));
    assert_eq!(embed.max_request_tokens, Some(2000));

    assert_eq!(config.default_priority, "interactive");
    let interactive = config.priority("interactive").unwrap();
    assert_eq!(interactive.reserved_fraction, 0.0);
    assert_eq!(interactive.max_wait_ms, 10_000);
    assert_eq!(interactive.limits, None);
    let batch = config.priority("batch").unwrap();
    assert_eq!(batch.reserved_fraction, 0.25);
    assert_eq!(batch.max_wait_ms, 0);
    assert_eq!(batch.limits, Some(vec!["gpt-4o".to_string()]));
    assert!(config.priority("default").is_none());
}

#[test]
fn config_explicit_values() {
    let config = parse_ok(
        "\
default_priority = \"batch\"

[server]
socket = \"/run/rk.sock\"
socket_mode = \"0600\"
allowed_uids = [1000, 0]
allowed_gids = [4294967295]
drain_timeout_ms = 0

[redis]
url = \"rediss://user:pw@redis.example:6380/2\"

[[limits]]
name = \"a\"
tokens_per_minute = 1_000_000_000
requests_per_minute = 1
burst_tokens = 10_000_000_000
burst_requests = 7
model = \"cl100k_base\"

[[priorities]]
name = \"interactive\"
[[priorities]]
name = \"batch\"
",
    );
    assert_eq!(config.default_priority, "batch");
    assert_eq!(config.server.socket, PathBuf::from("/run/rk.sock"));
    assert_eq!(config.server.socket_mode, 0o600);
    assert_eq!(config.server.allowed_uids, vec![1000, 0]);
    assert_eq!(config.server.allowed_gids, vec![u32::MAX]);
    assert_eq!(config.server.drain_timeout_ms, 0);
    assert_eq!(
        config.redis,
        Some(RedisConfig::with_url(
            "rediss://user:pw@redis.example:6380/2"
        ))
    );
    let a = config.limit("a").unwrap();
    assert_eq!(a.burst_tokens, 10_000_000_000);
    assert_eq!(a.burst_requests, Some(7));
    assert_eq!(a.model.as_deref(), Some("cl100k_base"));
}

#[test]
fn config_socket_mode_spellings() {
    for (text, mode) in [
        ("0660", 0o660),
        ("660", 0o660),
        ("0o600", 0o600),
        ("0777", 0o777),
        ("0", 0),
    ] {
        let config = parse_ok(&format!("[server]\nsocket_mode = \"{text}\"\n"));
        assert_eq!(config.server.socket_mode, mode, "{text}");
    }
    for text in [
        "",
        "0o",
        "rw-rw----",
        "0x1ff",
        "-660",
        "0 660",
        "99999999999999999",
    ] {
        let message = parse_err(&format!("[server]\nsocket_mode = \"{text}\"\n"));
        assert!(message.contains("is not an octal file mode"), "{message}");
    }
    for text in ["1000", "0o7777", "77777777777777777777"] {
        let message = parse_err(&format!("[server]\nsocket_mode = \"{text}\"\n"));
        assert!(
            message.contains("is above the largest file mode"),
            "{message}"
        );
    }
}
