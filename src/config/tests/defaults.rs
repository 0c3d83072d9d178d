//! What a file leaves out, and what it may spell out.

use super::*;

/// Issue 27: the default socket was `/tmp/ratekeeper.sock`, a path any
/// local user can bind first. Now the session's private runtime directory,
/// or the system's.
#[test]
fn the_default_socket_is_in_a_directory_only_its_user_writes() {
    use std::ffi::OsStr;
    assert_eq!(
        default_socket_path_in(Some(OsStr::new("/run/user/1000"))),
        PathBuf::from("/run/user/1000/ratekeeper.sock")
    );
    for unusable in [None, Some(OsStr::new("")), Some(OsStr::new("relative/dir"))] {
        assert_eq!(
            default_socket_path_in(unusable),
            PathBuf::from("/run/ratekeeper/ratekeeper.sock"),
            "{unusable:?}"
        );
    }
}

#[test]
fn config_defaults_without_a_file() {
    let config = load(None, no_env).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.server.socket, default_socket_path());
    assert!(!config.server.allow_world_writable_dir);
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
fn the_presets_default_to_one_second_enforcement() {
    // (what, limit's settings) → (window, burst_tokens, burst_requests, the
    // largest cost of the token bucket)
    let cases = [
        (
            "generic: a minute",
            "tokens_per_minute = 30000\nrequests_per_minute = 500",
            (EnforcementWindow::Minute, 30_000, 500, 29_900),
        ),
        (
            "openai: a second, rounded down; the largest request is the minute's figure",
            "provider = \"openai\"\ntokens_per_minute = 30000\nrequests_per_minute = 500",
            (EnforcementWindow::Second, 500, 8, 30_000),
        ),
        (
            "anthropic: a second; at least one request",
            "provider = \"anthropic\"\ntokens_per_minute = 30000\nrequests_per_minute = 50",
            (EnforcementWindow::Second, 500, 1, 30_000),
        ),
        (
            "a declared burst is the provider's real one",
            "provider = \"openai\"\ntokens_per_minute = 30000\nburst_tokens = 30000\n\
             requests_per_minute = 500\nburst_requests = 50",
            (EnforcementWindow::Second, 30_000, 50, 30_000),
        ),
        (
            "a preset told its provider keeps minute buckets",
            "provider = \"openai\"\nenforcement_window = \"minute\"\n\
             tokens_per_minute = 30000\nrequests_per_minute = 500",
            (EnforcementWindow::Minute, 30_000, 500, 29_900),
        ),
        (
            "a generic limit told its provider enforces per second",
            "enforcement_window = \"second\"\ntokens_per_minute = 30000\n\
             requests_per_minute = 500",
            (EnforcementWindow::Second, 500, 8, 30_000),
        ),
    ];
    for (what, settings, expected) in cases {
        let config = parse_ok(&format!("[[limits]]\nname = \"a\"\n{settings}\n"));
        let limit = config.limit("a").unwrap();
        let refill = crate::limiter::Refill::per_minute(limit.tokens_per_minute);
        let capacity = limit.usable_burst(BucketKind::Tokens, &refill, limit.burst_tokens);
        let got = (
            limit.enforcement_window,
            limit.burst_tokens,
            limit.burst_requests.unwrap(),
            limit.largest_cost(capacity, limit.tokens_per_minute),
        );
        assert_eq!(got, expected, "{what}");
        assert_eq!(parse_ok(&config.to_effective_toml()), config, "{what}");
    }
}

#[test]
fn a_second_window_admits_a_largest_request_up_to_the_minute_figure() {
    let at = |settings: &str| parse_err(&format!("[[limits]]\nname = \"a\"\n{settings}\n"));
    // Under a second's enforcement max_request_tokens may exceed the burst,
    // not the per-minute figure.
    parse_ok(
        "[[limits]]\nname = \"a\"\nprovider = \"openai\"\ntokens_per_minute = 30000\n\
         max_request_tokens = 30000\n",
    );
    let error = at("provider = \"openai\"\ntokens_per_minute = 30000\nmax_request_tokens = 30001");
    assert!(
        error.contains(
            "tokens_per_minute (30000) is below max_request_tokens (30001): a request that large could never be admitted"
        ),
        "{error}"
    );
    let error = at(
        "provider = \"openai\"\nenforcement_window = \"minute\"\ntokens_per_minute = 30000\n\
         burst_tokens = 1000\nmax_request_tokens = 1001",
    );
    assert!(error.contains("burst_tokens (1000) is below"), "{error}");
    let error = at("tokens_per_minute = 30000\nenforcement_window = \"hour\"");
    assert!(error.contains("enforcement_window"), "{error}");
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
