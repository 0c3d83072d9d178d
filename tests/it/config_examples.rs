//! The shipped example configurations load and validate.

use std::path::{Path, PathBuf};

use ratekeeper::config::{self, Config};

fn shipped(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A shipped config, validated, with no warning: every limit uses the
/// preset of its model's provider.
fn load(relative: &str) -> Config {
    let path = shipped(relative);
    match config::load(Some(&path), |_| None) {
        Ok(config) => {
            assert_eq!(config.warnings(), Vec::<String>::new(), "{relative}");
            config
        }
        Err(err) => panic!("{relative} does not validate:\n{err}"),
    }
}

fn assert_common_limits(config: &Config) {
    let mini = config.limit("gpt-4o-mini").expect("gpt-4o-mini limit");
    assert_eq!(mini.tokens_per_minute, 200_000);
    // The openai preset: the provider may enforce its minute per second.
    assert_eq!(
        mini.enforcement_window,
        ratekeeper::config::EnforcementWindow::Second
    );
    assert_eq!(mini.burst_tokens, 3_333);
    assert_eq!(mini.requests_per_minute, Some(500));
    assert_eq!(mini.burst_requests, Some(8));
    // Above the burst: such a request waits for a full bucket.
    assert_eq!(mini.max_request_tokens, Some(16_000));
    assert_eq!(mini.tenant_share, None);

    assert_eq!(mini.provider, ratekeeper::tokens::Provider::Openai);

    let gpt4o = config.limit("gpt-4o").expect("gpt-4o limit");
    assert_eq!(gpt4o.provider, ratekeeper::tokens::Provider::Openai);
    assert_eq!(gpt4o.tenant_share, Some(0.25));

    let names: Vec<&str> = config.priorities.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["interactive", "batch"]);
    assert_eq!(config.default_priority, "interactive");
    assert_eq!(config.priority("interactive").unwrap().max_wait_ms, 5_000);
    assert_eq!(config.priority("batch").unwrap().reserved_fraction, 0.2);
}

#[test]
fn example_config_validates() {
    let config = load("examples/ratekeeper.toml");
    assert_eq!(
        config.server.socket,
        ratekeeper::config::default_socket_path()
    );
    assert_eq!(config.server.socket_mode, 0o660);
    assert!(config.redis.is_none());
    assert_common_limits(&config);
}

#[test]
fn systemd_config_validates() {
    let config = load("systemd/ratekeeper.toml");
    assert_eq!(
        config.server.socket,
        PathBuf::from("/run/ratekeeper/ratekeeper.sock")
    );
    assert_eq!(config.server.socket_mode, 0o660);
    assert_eq!(
        config.redis.as_ref().and_then(|r| r.url.as_deref()),
        Some("redis://127.0.0.1:6379/0")
    );
    assert_common_limits(&config);
}

#[test]
fn shipped_configs_agree_on_limits_and_classes() {
    let example = load("examples/ratekeeper.toml");
    let systemd = load("systemd/ratekeeper.toml");
    assert_eq!(example.limits, systemd.limits);
    assert_eq!(example.priorities, systemd.priorities);
}

#[test]
fn effective_example_config_reloads() {
    for relative in ["examples/ratekeeper.toml", "systemd/ratekeeper.toml"] {
        let config = load(relative);
        let effective = config.to_effective_toml();
        let reloaded = config::from_toml_str(&effective, "effective")
            .unwrap_or_else(|err| panic!("effective {relative} does not validate:\n{err}"));
        assert_eq!(reloaded, config, "{relative}");
    }
}
