//! `[metrics]`: the listener address and the tenants with labels of their own.

use super::*;

#[test]
fn config_metrics_is_off_unless_asked_for() {
    let config = parse_ok(LIMIT_A);
    assert_eq!(config.metrics, MetricsConfig::default());
    assert_eq!(config.metrics.listen, None);

    let config =
        parse_ok("[metrics]\nlisten = \"127.0.0.1:9464\"\ntenants = [\"acme\", \"globex\"]\n");
    assert_eq!(
        config.metrics.listen,
        Some("127.0.0.1:9464".parse().unwrap())
    );
    assert_eq!(config.metrics.tenants, ["acme", "globex"]);
    // check-config shows it, and what it shows reads back the same.
    let effective = config.to_effective_toml();
    assert!(
        effective
            .contains("[metrics]\nlisten = \"127.0.0.1:9464\"\ntenants = [\"acme\", \"globex\"]"),
        "{effective}"
    );
    assert_eq!(parse_ok(&effective), config);
}

#[test]
fn config_metrics_mistakes_are_located() {
    let too_many: Vec<String> = (0..=MetricsConfig::MAX_TENANTS)
        .map(|i| format!("\"t{i}\""))
        .collect();
    let cases = [
        (
            "[metrics]\nlisten = \"localhost:9464\"\n".to_string(),
            "test.toml:2:10: metrics: listen \"localhost:9464\" is not an IP address and port",
        ),
        (
            "[metrics]\nlisten = \"127.0.0.1\"\n".to_string(),
            "test.toml:2:10: metrics: listen \"127.0.0.1\" is not an IP address and port",
        ),
        (
            "[metrics]\ntenants = [\"a\", \"other\"]\n".to_string(),
            "test.toml:2:17: metrics: tenants[1] \"other\" is the label of every tenant not listed",
        ),
        (
            "[metrics]\ntenants = [\"a\", \"a\"]\n".to_string(),
            "test.toml:2:17: metrics: tenants[1] \"a\" is listed twice",
        ),
        (
            "[metrics]\ntenants = [\"\"]\n".to_string(),
            "test.toml:2:12: metrics: tenants[0] must be 1 to 128 bytes long",
        ),
        (
            format!("[metrics]\ntenants = [{}]\n", too_many.join(", ")),
            "metrics: tenants lists 101 names, more than the 100",
        ),
        (
            "[metrics]\nport = 9464\n".to_string(),
            "test.toml:2:1: metrics: unknown key `port`, expected `listen` or `tenants`",
        ),
    ];
    for (text, expected) in cases {
        let message = parse_err(&text);
        assert!(message.contains(expected), "{text}\n{message}");
    }
}

#[test]
fn config_metrics_listen_from_the_environment() {
    let env = |name: &str| (name == ENV_METRICS_LISTEN).then(|| "[::1]:9555".to_string());
    let config = load(None, env).unwrap();
    assert_eq!(config.metrics.listen, Some("[::1]:9555".parse().unwrap()));

    let bad = |name: &str| (name == ENV_METRICS_LISTEN).then(|| "nine".to_string());
    let message = load(None, bad).unwrap_err().to_string();
    assert_eq!(
        message,
        "RATEKEEPER_METRICS_LISTEN: listen \"nine\" is not an IP address and port, e.g. \"127.0.0.1:9464\" or \"[::]:9464\""
    );
}
