//! The configuration shown to people: the effective file `check-config`
//! prints, and Redis URLs with their passwords masked for logs and messages.

use serde::Serialize;

use super::model::{
    ClientPolicy, Config, GroupConfig, LeaseConfig, LimitConfig, MetricsConfig, PriorityClass,
    RedisConfig, SentinelMaster,
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
                allow_world_writable_dir: self.server.allow_world_writable_dir,
                allowed_uids: &self.server.allowed_uids,
                allowed_gids: &self.server.allowed_gids,
                drain_timeout_ms: self.server.drain_timeout_ms,
                max_connections: self.server.max_connections,
                max_connections_per_uid: self.server.max_connections_per_uid,
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
            clients: &self.clients,
            budgets: EffectiveBudgets {
                time_zone: &self.budget_time_zone,
            },
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
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    clients: &'a [ClientPolicy],
    budgets: EffectiveBudgets<'a>,
}

/// `[budgets]`.
#[derive(Serialize)]
struct EffectiveBudgets<'a> {
    time_zone: &'a str,
}

/// `[server]` with `socket_mode` written as the file writes it (`"0660"`).
#[derive(Serialize)]
struct EffectiveServer<'a> {
    socket: String,
    socket_mode: String,
    allow_world_writable_dir: bool,
    allowed_uids: &'a [u32],
    allowed_gids: &'a [u32],
    drain_timeout_ms: u64,
    max_connections: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections_per_uid: Option<u64>,
    threads: usize,
    max_buffered_bytes: u64,
    hello_timeout_ms: u64,
    frame_timeout_ms: u64,
}

/// `url` with its password (if any) replaced by `****`: in the userinfo
/// (`redis://user:pass@host` → `redis://user:****@host`) and in `pass=` /
/// `password=` query parameters. A URL without a password is returned
/// unchanged.
///
/// The text is not parsed as a URL: a password may hold an unescaped `/`,
/// `?`, `#` or `@` (base64 does), where a URL parser would end the
/// userinfo early and show the rest. So the userinfo runs from the
/// scheme's `://` to the *last* `@`, and everything in it after its first
/// `:` is masked; a password parameter is masked to the end of the text.
/// Where the text is ambiguous this masks more than the password, never
/// less. It also masks strings that are no URL at all (a mistyped scheme,
/// a quoted URL inside a message), and a URL whose password has no `@host`
/// after it (`redis://:secret`): past the scheme, a `:` followed by no
/// valid port, or by anything after an empty host, starts a secret that
/// is masked to the end of the text.
pub fn mask_redis_url(url: &str) -> String {
    let start = userinfo_start(url);
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..start]);
    let rest = &url[start..];
    match rest.rfind('@') {
        Some(at) => {
            let (userinfo, host) = rest.split_at(at);
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
        None if start > 0 => match unparsed_secret(rest) {
            Some(colon) => {
                out.push_str(&rest[..=colon]);
                out.push_str(MASK);
                return out;
            }
            None => out.push_str(rest),
        },
        None => out.push_str(rest),
    }
    mask_password_parameter(&mut out, start);
    out
}

/// In `rest`, the text after `scheme://` with no `@` in it, the `:` that
/// may start a password with its `@host` left out: the first `:` of the
/// authority (outside an IPv6 address's brackets) when what follows it is
/// no port, or when no host precedes it.
fn unparsed_secret(rest: &str) -> Option<usize> {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // `[::1]:6379`: the colons between brackets are the address's.
    let outside = authority
        .starts_with('[')
        .then(|| authority.find(']'))
        .flatten()
        .map_or(0, |close| close + 1);
    let colon = outside + authority[outside..].find(':')?;
    let port = &authority[colon + 1..];
    let is_port = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|n| n <= 65535);
    (colon == 0 || !(is_port || port.is_empty())).then_some(colon)
}

/// Where the userinfo of `url` would start: after `scheme://` when what
/// precedes the `://` holds no `:` (which could start a password), else
/// at the beginning, so that the first `:` anywhere is taken as the one
/// before a password.
fn userinfo_start(url: &str) -> usize {
    match url.find("://") {
        Some(i) if !url[..i].contains(':') => i + 3,
        _ => 0,
    }
}

/// Replaces the value of the first `pass=` / `password=` query parameter
/// after `from` (the key compared without case and percent-decoded, as
/// the redis crate's URL parser decodes it), and everything after it, by
/// `****`: an unescaped `&` or `#` may be part of the password.
fn mask_password_parameter(out: &mut String, from: usize) {
    let Some(q) = out[from..].find('?') else {
        return;
    };
    let mut param_start = from + q + 1;
    loop {
        let param_end = out[param_start..]
            .find('&')
            .map_or(out.len(), |i| param_start + i);
        let param = &out[param_start..param_end];
        if let Some((key, value)) = param.split_once('=') {
            let key: Vec<u8> = percent_encoding::percent_decode_str(key).collect();
            if !value.is_empty()
                && (key.eq_ignore_ascii_case(b"pass") || key.eq_ignore_ascii_case(b"password"))
            {
                out.truncate(param_start + param.len() - value.len());
                out.push_str(MASK);
                return;
            }
        }
        if param_end == out.len() {
            return;
        }
        param_start = param_end + 1;
    }
}
