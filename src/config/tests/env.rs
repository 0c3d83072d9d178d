//! Loading a file, and the environment overrides on top of it.

use super::*;

#[test]
fn config_env_overrides() {
    let env = |name: &str| match name {
        ENV_SOCKET => Some("/run/override.sock".to_string()),
        ENV_REDIS_URL => Some("redis://:pw@10.0.0.1:6379/1".to_string()),
        _ => None,
    };
    // Without a file: the defaults, overridden.
    let config = load(None, env).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/run/override.sock"));
    assert_eq!(
        config.redis.as_ref().and_then(|r| r.url.as_deref()),
        Some("redis://:pw@10.0.0.1:6379/1")
    );

    // With a file: the override replaces the file's values.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rk.toml");
    std::fs::write(
        &path,
        format!("[server]\nsocket = \"/run/file.sock\"\nsocket_mode = \"0600\"\n[redis]\nurl = \"redis://file:6379\"\n{LIMIT_A}"),
    )
    .unwrap();
    let config = load(Some(&path), env).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/run/override.sock"));
    assert_eq!(config.server.socket_mode, 0o600);
    assert_eq!(
        config.redis.unwrap().url.as_deref(),
        Some("redis://:pw@10.0.0.1:6379/1")
    );
    assert_eq!(config.limits.len(), 1);

    // No overrides: the file's values.
    let config = load(Some(&path), no_env).unwrap();
    assert_eq!(config.server.socket, PathBuf::from("/run/file.sock"));
    assert_eq!(
        config.redis.unwrap().url.as_deref(),
        Some("redis://file:6379")
    );
}

#[test]
fn config_env_overrides_are_validated() {
    let env = |name: &str| match name {
        ENV_SOCKET => Some(String::new()),
        ENV_REDIS_URL => Some("http://:secret@h".to_string()),
        _ => None,
    };
    let message = load(None, env).unwrap_err().to_string();
    assert_eq!(
        message,
        "2 problems:\n\
         RATEKEEPER_SOCKET: socket must not be empty\n\
         RATEKEEPER_REDIS_URL: url \"http://:****@h\" must start with redis://, rediss:// or unix://"
    );

    // A bad file and a bad override: both reported.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[limits]]\nname = \"a\"\ntokens_per_minute = 0\n").unwrap();
    let message = load(Some(&path), env).unwrap_err().to_string();
    let lines: Vec<&str> = message.lines().skip(1).collect();
    assert!(message.starts_with("3 problems:\n"), "{message}");
    assert_eq!(lines.len(), 3, "{message}");
    assert_eq!(
        lines[0],
        format!(
            "{}:3:21: limits[0] \"a\": tokens_per_minute must be greater than zero (got 0)",
            path.display()
        )
    );
    assert!(lines[1].starts_with("RATEKEEPER_SOCKET: "));
    assert!(lines[2].starts_with("RATEKEEPER_REDIS_URL: "));

    // A password the redis crate would cut at its `/`: refused, masked.
    let message = load(None, |name: &str| {
        (name == ENV_REDIS_URL).then(|| "redis://:ab/c?d#e@h:6379/0".to_string())
    })
    .unwrap_err()
    .to_string();
    assert_eq!(
        message,
        "RATEKEEPER_REDIS_URL: url \"redis://:****@h:6379/0\": a '/', '?' or '#' in the \
         userinfo must be percent-encoded (%2F, %3F, %23)"
    );

    let long = format!("/{}", "s".repeat(MAX_SOCKET_PATH_LEN));
    let message = load(None, |name: &str| {
        (name == ENV_SOCKET).then(|| long.clone())
    })
    .unwrap_err()
    .to_string();
    assert!(
        message.starts_with("RATEKEEPER_SOCKET: socket path is"),
        "{message}"
    );
}

#[test]
fn config_load_reports_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let err = load(Some(&missing), no_env).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("cannot read {}: ", missing.display())),
        "{message}"
    );

    let path = dir.path().join("syntax.toml");
    std::fs::write(&path, "[server\n").unwrap();
    let message = load(Some(&path), no_env).unwrap_err().to_string();
    assert!(
        message.starts_with(&format!("{}:1:", path.display())),
        "{message}"
    );
}
