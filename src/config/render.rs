//! The configuration shown to people: the effective file `check-config`
//! prints, and Redis URLs with their passwords masked for logs and messages.

use serde::Serialize;

use super::model::{
    Config, GroupConfig, LeaseConfig, LimitConfig, MetricsConfig, PriorityClass, RedisConfig,
    SentinelMaster,
};

/// What stands in for a password.
const MASK: &str = "****";

impl Config {
    /// The effective configuration (every default filled in) as TOML, in the
    /// file format [`load`](super::load) reads, with the Redis password
    /// masked. This is what `ratekeeper check-config` prints.
    pub fn to_effective_toml(&self) -> String {
        let view = EffectiveFile {
            default_priority: &self.default_priority,
            server: EffectiveServer {
                socket: self.server.socket.to_string_lossy().into_owned(),
                socket_mode: format!("{:04o}", self.server.socket_mode),
                allowed_uids: &self.server.allowed_uids,
                allowed_gids: &self.server.allowed_gids,
                drain_timeout_ms: self.server.drain_timeout_ms,
                max_connections: self.server.max_connections,
                threads: self.server.threads,
                max_buffered_bytes: self.server.max_buffered_bytes,
                hello_timeout_ms: self.server.hello_timeout_ms,
                frame_timeout_ms: self.server.frame_timeout_ms,
            },
            redis: self.redis.as_ref().map(|redis| RedisConfig {
                url: redis.url.as_deref().map(mask_redis_url),
                cluster_nodes: redis
                    .cluster_nodes
                    .iter()
                    .map(|url| mask_redis_url(url))
                    .collect(),
                sentinels: redis
                    .sentinels
                    .iter()
                    .map(|url| mask_redis_url(url))
                    .collect(),
                master: redis.master.as_ref().map(|master| SentinelMaster {
                    password: master.password.as_ref().map(|_| MASK.to_string()),
                    ..master.clone()
                }),
                ..redis.clone()
            }),
            groups: &self.groups,
            limits: &self.limits,
            leases: &self.leases,
            metrics: &self.metrics,
            priorities: &self.priorities,
        };
        match toml::to_string(&view) {
            Ok(text) => text,
            // Only reachable for a hand-built `Config` with numbers TOML
            // cannot hold (above i64::MAX); `load` never produces one.
            Err(err) => format!("# cannot render the effective configuration: {err}\n"),
        }
    }
}

impl RedisConfig {
    /// The nodes, passwords masked, for logs.
    pub fn masked_nodes(&self) -> String {
        let nodes: Vec<String> = self.nodes().map(|url| mask_redis_url(url)).collect();
        nodes.join(", ")
    }
}

/// The file as [`to_effective_toml`](Config::to_effective_toml) writes it:
/// the config with the socket mode in octal and the passwords masked.
#[derive(Serialize)]
struct EffectiveFile<'a> {
    default_priority: &'a str,
    server: EffectiveServer<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<RedisConfig>,
    groups: &'a [GroupConfig],
    limits: &'a [LimitConfig],
    leases: &'a LeaseConfig,
    metrics: &'a MetricsConfig,
    priorities: &'a [PriorityClass],
}

/// `[server]` with `socket_mode` written as the file writes it (`"0660"`).
#[derive(Serialize)]
struct EffectiveServer<'a> {
    socket: String,
    socket_mode: String,
    allowed_uids: &'a [u32],
    allowed_gids: &'a [u32],
    drain_timeout_ms: u64,
    max_connections: u64,
    threads: usize,
    max_buffered_bytes: u64,
    hello_timeout_ms: u64,
    frame_timeout_ms: u64,
}

/// `url` with its password (if any) replaced by `****`: in the userinfo
/// (`redis://user:pass@host` → `redis://user:****@host`) and in `pass=` /
/// `password=` query parameters. A URL without a password is returned
/// unchanged.
pub fn mask_redis_url(url: &str) -> String {
    let (prefix, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_len = if prefix.is_empty() {
        0
    } else {
        rest.find(['/', '?', '#']).unwrap_or(rest.len())
    };
    let (authority, tail) = rest.split_at(authority_len);

    let mut out = String::with_capacity(url.len());
    out.push_str(prefix);
    mask_authority(authority, &mut out);

    // Query parameters carrying a password (`unix:///run/redis.sock?pass=x`).
    let Some(q) = tail.find('?') else {
        out.push_str(tail);
        return out;
    };
    let (before_query, query_and_fragment) = tail.split_at(q + 1);
    out.push_str(before_query);
    let (query, fragment) = match query_and_fragment.find('#') {
        Some(f) => query_and_fragment.split_at(f),
        None => (query_and_fragment, ""),
    };
    mask_query(query, &mut out);
    out.push_str(fragment);
    out
}

/// `user:pass@host` → `user:****@host` onto `out`.
fn mask_authority(authority: &str, out: &mut String) {
    let Some(at) = authority.rfind('@') else {
        out.push_str(authority);
        return;
    };
    let (userinfo, host) = authority.split_at(at);
    match userinfo.split_once(':') {
        Some((user, password)) if !password.is_empty() => {
            out.push_str(user);
            out.push(':');
            out.push_str(MASK);
        }
        _ => out.push_str(userinfo),
    }
    out.push_str(host);
}

/// `db=1&pass=secret` → `db=1&pass=****` onto `out`.
fn mask_query(query: &str, out: &mut String) {
    for (i, param) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match param.split_once('=') {
            Some((key, value))
                if !value.is_empty()
                    && (key.eq_ignore_ascii_case("pass")
                        || key.eq_ignore_ascii_case("password")) =>
            {
                out.push_str(key);
                out.push('=');
                out.push_str(MASK);
            }
            _ => out.push_str(param),
        }
    }
}
