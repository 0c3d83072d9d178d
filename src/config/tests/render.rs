//! The effective file `check-config` prints, and masked Redis URLs.

use super::*;

#[test]
fn config_mask_redis_url() {
    for (url, masked) in [
        ("redis://user:pass@h", "redis://user:****@h"),
        ("redis://:pass@h", "redis://:****@h"),
        (
            "redis://:secret@127.0.0.1:6379/0",
            "redis://:****@127.0.0.1:6379/0",
        ),
        (
            "rediss://u:p%40ss@h:6380/1?x=1",
            "rediss://u:****@h:6380/1?x=1",
        ),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://user@h", "redis://user@h"),
        ("redis://:@h", "redis://:@h"),
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
        ("redis://[::1]", "redis://[::1]"),
        ("redis://h:/0", "redis://h:/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        (
            "unix:///run/redis.sock?db=1&pass=secret",
            "unix:///run/redis.sock?db=1&pass=****",
        ),
        // Everything after a password parameter is masked: the password
        // may hold an unescaped `#` or `&`.
        (
            "unix:///run/redis.sock?password=s#frag",
            "unix:///run/redis.sock?password=****",
        ),
        ("redis://a:b@c@h/0", "redis://a:****@h/0"),
        ("not a url", "not a url"),
        ("", ""),
    ] {
        assert_eq!(mask_redis_url(url), masked, "{url}");
    }
}

/// Passwords a URL parser would cut short: an unescaped `/`, `?`, `#`,
/// `@`, `:` or `://` in the userinfo, a `&` or `#` in a `pass=` value, a
/// scheme mistyped. What the mask shows, and that no piece of the secret
/// (every part of it two characters or longer) is left in sight.
#[test]
fn config_mask_redis_url_hides_hostile_passwords() {
    for (url, masked, secret) in [
        (
            "redis://:ab/c?d#e@host:6379/0",
            "redis://:****@host:6379/0",
            "ab/c?d#e",
        ),
        ("redis://user:pa/ss@host", "redis://user:****@host", "pa/ss"),
        ("rediss://u:x?y@h:6380", "rediss://u:****@h:6380", "x?y"),
        ("redis://u:p#w@h/0", "redis://u:****@h/0", "p#w"),
        ("redis://:a@b@c/d@h:6379", "redis://:****@h:6379", "a@b@c/d"),
        ("redis://:a://b@h", "redis://:****@h", "a://b"),
        ("redis://:pw:pw@h", "redis://:****@h", "pw:pw"),
        ("redis://:ab/cd@/0", "redis://:****@/0", "ab/cd"),
        (
            "unix:///run/redis.sock?pass=ab#cd",
            "unix:///run/redis.sock?pass=****",
            "ab#cd",
        ),
        (
            "unix:///run/redis.sock?pass=ab&cd",
            "unix:///run/redis.sock?pass=****",
            "ab&cd",
        ),
        (
            "unix:///run/redis.sock?db=1&PASS=ab@cd:ef",
            "unix:///run/redis.sock?db=1&PASS=****",
            "ab@cd:ef",
        ),
        (
            "unix:///run/redis.sock?p%61ss=secret",
            "unix:///run/redis.sock?p%61ss=****",
            "secret",
        ),
        ("redis:/:secret@host", "redis:****@host", "secret"),
        ("redis//:secret@host", "redis//:****@host", "secret"),
        ("\"redis://:se/cret@h\",", "\"redis://:****@h\",", "se/cret"),
        // Base64-ish passwords and one that holds every separator.
        (
            "redis://:ab/c?d#e@f@host:6379/0",
            "redis://:****@host:6379/0",
            "ab/c?d#e@f",
        ),
        ("redis://:a+b/c=@host", "redis://:****@host", "a+b/c="),
        (
            "rediss://user:p@ss/w#rd@host:6379/0",
            "rediss://user:****@host:6379/0",
            "p@ss/w#rd",
        ),
        // No host after the password (the `@host` forgotten): what follows
        // the `:` is no port, so it is masked, to the end of the text.
        ("redis://:secret", "redis://:****", "secret"),
        ("redis://user:pa/ss?x#y", "redis://user:****", "pa/ss?x#y"),
        ("rediss://:a+b/c=", "rediss://:****", "a+b/c="),
    ] {
        let shown = mask_redis_url(url);
        assert_eq!(shown, masked, "{url}");
        // After the scheme, which may hold a piece ("ss" of "rediss").
        let after_scheme = shown.split_once("://").map_or(&shown[..], |(_, rest)| rest);
        for piece in secret.split(['/', '?', '#', '@', ':', '&']) {
            assert!(
                piece.len() < 2 || !after_scheme.contains(piece),
                "{url} shows {piece:?} of its password: {shown}"
            );
        }
    }
}

#[test]
fn config_effective_toml_round_trips_and_masks() {
    let text = "\
[server]
socket = \"/run/rk.sock\"
socket_mode = \"0600\"
allowed_uids = [1000]

[redis]
url = \"redis://:hunter2@127.0.0.1:6379/0\"

[[limits]]
name = \"gpt-4o\"
tokens_per_minute = 30000
requests_per_minute = 500
tenant_share = 0.25
max_request_tokens = 16000
model = \"gpt-4o\"

[[priorities]]
name = \"interactive\"
[[priorities]]
name = \"batch\"
reserved_fraction = 0.2
limits = [\"gpt-4o\"]
";
    let config = parse_ok(text);
    let effective = config.to_effective_toml();
    assert!(!effective.contains("hunter2"), "{effective}");
    assert!(
        effective.contains("url = \"redis://:****@127.0.0.1:6379/0\""),
        "{effective}"
    );
    assert!(effective.contains("socket_mode = \"0600\""), "{effective}");
    assert!(
        effective.contains("default_priority = \"interactive\""),
        "{effective}"
    );
    assert!(effective.contains("burst_tokens = 30000"), "{effective}");
    assert!(effective.contains("burst_requests = 500"), "{effective}");

    // The output is itself a valid configuration, equal but for the
    // masked password.
    let mut reparsed = parse_ok(&effective);
    assert_eq!(
        reparsed.redis.as_ref().unwrap().url.as_deref(),
        Some("redis://:****@127.0.0.1:6379/0")
    );
    reparsed.redis = config.redis.clone();
    assert_eq!(reparsed, config);

    // The defaults round-trip too (implicit class made explicit).
    let defaults = Config::default();
    assert_eq!(parse_ok(&defaults.to_effective_toml()), defaults);
}

#[test]
fn config_sentinels_name_the_primary_and_hide_its_password() {
    let text = r#"
[redis]
sentinels = ["redis://:sentinel-pass@10.0.0.1:26379", "redis://10.0.0.2:26379"]
master_name = "mymaster"
master_username = "app"
master_password = "primary-pass"
master_db = 3
"#;
    let config = from_toml_str(text, "sentinel.toml").unwrap();
    let redis = config.redis.as_ref().unwrap();
    assert_eq!(redis.topology(), "sentinel");
    assert_eq!(redis.url, None);
    assert_eq!(redis.sentinels.len(), 2);
    assert_eq!(
        redis.master,
        Some(SentinelMaster {
            name: "mymaster".into(),
            username: Some("app".into()),
            password: Some("primary-pass".into()),
            db: 3,
        })
    );
    let effective = config.to_effective_toml();
    assert!(
        !effective.contains("pass@") && !effective.contains("primary-pass"),
        "{effective}"
    );
    assert!(
        effective.contains("redis://:****@10.0.0.1:26379"),
        "{effective}"
    );
    assert_eq!(
        from_toml_str(&effective, "effective")
            .unwrap()
            .redis
            .unwrap()
            .sentinels
            .len(),
        2
    );
    // The environment's url replaces the file's nodes, Sentinels included.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rk.toml");
    std::fs::write(&path, text).unwrap();
    let env = |name: &str| (name == ENV_REDIS_URL).then(|| "redis://other:6379".to_string());
    let redis = load(Some(&path), env).unwrap().redis.unwrap();
    assert_eq!((redis.topology(), redis.master), ("single", None));
}
