//! `[redis]`: the nodes of the shared store, how it is reached, and what
//! acquires get while it fails.

use std::path::PathBuf;

use toml::Spanned;

use crate::config::diagnostics::{Diagnostics, Fraction, check_fraction, check_int};
use crate::config::model::{FailurePolicy, RedisConfig, SentinelMaster};
use crate::config::raw::RawRedis;
use crate::config::render::mask_redis_url;
use crate::proto::MAX_NAME_LEN;

/// Scheme of a node reached over plain TCP.
const TCP_SCHEME: &str = "redis://";
/// Scheme of a node reached over TLS.
const TLS_SCHEME: &str = "rediss://";
/// Scheme of a node reached over a Unix socket.
const UNIX_SCHEME: &str = "unix://";

/// Context of every message about the section.
const CONTEXT: &str = "redis";
/// Largest `pool_size`.
const MAX_POOL_SIZE: u64 = 64;
/// Longest `timeout_ms` / `connect_timeout_ms`.
const MAX_TIMEOUT_MS: u64 = 60_000;
/// Largest `master_db` (Redis's `databases` setting is 16 by default).
const MAX_DB: u64 = 65_535;

/// The `[redis]` section, or `None` (with the problems reported) when unusable.
pub(super) fn resolve_redis(redis: &Spanned<RawRedis>, d: &mut Diagnostics) -> Option<RedisConfig> {
    let at = redis.span().start;
    let raw = redis.get_ref();
    let mut resolved = RedisConfig::with_url(String::new());
    let mut usable = resolve_nodes(raw, at, &mut resolved, d);
    usable &= resolve_connections(raw, &mut resolved, d);
    usable &= resolve_key_prefix(raw, &mut resolved, d);
    usable &= resolve_failure_policy(raw, at, &mut resolved, d);
    usable &= resolve_tls_ca_file(raw, &mut resolved, d);
    usable.then_some(resolved)
}

/// `url`, `cluster_nodes` or `sentinels` (with the primary's name), exactly
/// one of them; whether they are usable.
fn resolve_nodes(
    raw: &RawRedis,
    section_at: usize,
    resolved: &mut RedisConfig,
    d: &mut Diagnostics,
) -> bool {
    let usable_master = resolve_sentinel_master(raw, section_at, resolved, d);
    match (&raw.url, &raw.cluster_nodes, &raw.sentinels) {
        (None, None, None) => {
            d.error(
                section_at,
                "redis: url (or cluster_nodes, or sentinels) is required in the [redis] section (remove the section to use the embedded store)"
                    .to_string(),
            );
            false
        }
        (Some(url), None, None) => {
            resolved.url = Some(url.get_ref().clone());
            check_url(d, url) && usable_master
        }
        (None, Some(nodes), None) => {
            resolved.url = None;
            let usable = resolve_node_list(d, nodes, "cluster_nodes", "seed node");
            resolved.cluster_nodes = urls(nodes);
            usable && usable_master
        }
        (None, None, Some(nodes)) => {
            resolved.url = None;
            let usable = resolve_node_list(d, nodes, "sentinels", "Sentinel");
            resolved.sentinels = urls(nodes);
            usable && usable_master
        }
        (url, cluster, sentinels) => {
            // Point at the later of the clashing settings.
            let at = [
                url.as_ref().map(|v| v.span().start),
                cluster.as_ref().map(|v| v.span().start),
                sentinels.as_ref().map(|v| v.span().start),
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(section_at);
            d.error(
                at,
                "redis: give one of url (one node), cluster_nodes (a Redis Cluster) or sentinels (a primary found by Redis Sentinel), not several"
                    .to_string(),
            );
            false
        }
    }
}

fn check_url(d: &mut Diagnostics, url: &Spanned<String>) -> bool {
    match redis_url_problem(url.get_ref()) {
        Some(problem) => {
            d.error(url.span().start, format!("{CONTEXT}: {problem}"));
            false
        }
        None => true,
    }
}

fn urls(nodes: &Spanned<Vec<Spanned<String>>>) -> Vec<String> {
    nodes
        .get_ref()
        .iter()
        .map(|node| node.get_ref().clone())
        .collect()
}

/// Cluster seed nodes or Sentinels: at least one, each a TCP URL.
fn resolve_node_list(
    d: &mut Diagnostics,
    nodes: &Spanned<Vec<Spanned<String>>>,
    field: &str,
    what: &str,
) -> bool {
    let mut usable = true;
    if nodes.get_ref().is_empty() {
        d.error(
            nodes.span().start,
            format!("redis: {field} is empty; list at least one {what}"),
        );
        usable = false;
    }
    for node in nodes.get_ref() {
        if node.get_ref().starts_with(UNIX_SCHEME) {
            d.error(
                node.span().start,
                format!("redis: {field} are reached over TCP (redis:// or rediss://), not unix://"),
            );
            usable = false;
        } else {
            usable &= check_url(d, node);
        }
    }
    usable
}

/// `master_name` and the primary's credentials: required (the name) with
/// `sentinels`, refused without; whether they are usable.
fn resolve_sentinel_master(
    raw: &RawRedis,
    section_at: usize,
    resolved: &mut RedisConfig,
    d: &mut Diagnostics,
) -> bool {
    let credentials = [
        raw.master_username.as_ref().map(|v| v.span().start),
        raw.master_password.as_ref().map(|v| v.span().start),
        raw.master_db.as_ref().map(|v| v.span().start),
    ];
    if raw.sentinels.is_none() {
        let stray = raw
            .master_name
            .as_ref()
            .map(|name| name.span().start)
            .into_iter()
            .chain(credentials.into_iter().flatten())
            .next();
        if let Some(at) = stray {
            d.error(
                at,
                "redis: master_name, master_username, master_password and master_db go with sentinels".to_string(),
            );
            return false;
        }
        return true;
    }
    let Some(name) = &raw.master_name else {
        d.error(
            section_at,
            "redis: sentinels need master_name, the name the Sentinels monitor the primary by"
                .to_string(),
        );
        return false;
    };
    if name.get_ref().is_empty() || name.get_ref().len() > MAX_NAME_LEN {
        d.error(
            name.span().start,
            format!("{CONTEXT}: master_name must be 1 to {MAX_NAME_LEN} bytes"),
        );
        return false;
    }
    let mut master = SentinelMaster {
        name: name.get_ref().clone(),
        username: raw.master_username.as_ref().map(|v| v.get_ref().clone()),
        password: raw.master_password.as_ref().map(|v| v.get_ref().clone()),
        db: 0,
    };
    if let Some(db) = &raw.master_db {
        match check_int(d, CONTEXT, "master_db", db, 0, MAX_DB) {
            Some(db) => master.db = db,
            None => return false,
        }
    }
    resolved.master = Some(master);
    true
}

/// `pool_size`, `timeout_ms` and `connect_timeout_ms`; whether they are usable.
fn resolve_connections(raw: &RawRedis, resolved: &mut RedisConfig, d: &mut Diagnostics) -> bool {
    let mut usable = true;
    if let Some(pool) = &raw.pool_size {
        match check_int(d, CONTEXT, "pool_size", pool, 1, MAX_POOL_SIZE) {
            Some(v) => resolved.pool_size = v as u32,
            None => usable = false,
        }
    }
    for (field, value, target) in [
        ("timeout_ms", &raw.timeout_ms, &mut resolved.timeout_ms),
        (
            "connect_timeout_ms",
            &raw.connect_timeout_ms,
            &mut resolved.connect_timeout_ms,
        ),
    ] {
        if let Some(value) = value {
            match check_int(d, CONTEXT, field, value, 1, MAX_TIMEOUT_MS) {
                Some(v) => *target = v,
                None => usable = false,
            }
        }
    }
    usable
}

/// `key_prefix`: a name without Redis Cluster hash tags; whether it is usable.
fn resolve_key_prefix(raw: &RawRedis, resolved: &mut RedisConfig, d: &mut Diagnostics) -> bool {
    let Some(prefix) = &raw.key_prefix else {
        return true;
    };
    let value = prefix.get_ref();
    if value.is_empty() || value.len() > MAX_NAME_LEN || value.contains(['{', '}']) {
        d.error(
            prefix.span().start,
            format!("{CONTEXT}: key_prefix must be 1 to {MAX_NAME_LEN} bytes without braces (braces are Redis Cluster hash tags) (got {value:?})"),
        );
        false
    } else {
        resolved.key_prefix = value.clone();
        true
    }
}

/// `on_failure` and `local_share`, which go together; whether they are usable.
fn resolve_failure_policy(
    raw: &RawRedis,
    section_at: usize,
    resolved: &mut RedisConfig,
    d: &mut Diagnostics,
) -> bool {
    let mut usable = true;
    if let Some(policy) = &raw.on_failure {
        resolved.on_failure = *policy.get_ref();
    }
    if let Some(share) = &raw.local_share {
        match check_fraction(d, CONTEXT, "local_share", share, Fraction::AboveZero) {
            Some(v) => resolved.local_share = Some(v),
            None => usable = false,
        }
    }
    match (resolved.on_failure, &raw.local_share) {
        (FailurePolicy::Local, None) => {
            let at = raw
                .on_failure
                .as_ref()
                .map_or(section_at, |p| p.span().start);
            d.error(
                at,
                format!("{CONTEXT}: on_failure = \"local\" needs local_share: the fraction of each limit this sidecar may use while Redis is down (e.g. 1 / number of sidecars)"),
            );
            false
        }
        (FailurePolicy::FailClosed | FailurePolicy::FailOpen, Some(share)) => {
            d.error(
                share.span().start,
                format!("{CONTEXT}: local_share only applies with on_failure = \"local\""),
            );
            false
        }
        _ => usable,
    }
}

/// `tls_ca_file`: only with TLS, and readable; whether it is usable.
fn resolve_tls_ca_file(raw: &RawRedis, resolved: &mut RedisConfig, d: &mut Diagnostics) -> bool {
    let Some(ca) = &raw.tls_ca_file else {
        return true;
    };
    let uses_tls = resolved.nodes().any(|url| url.starts_with(TLS_SCHEME));
    if !uses_tls {
        d.error(
            ca.span().start,
            format!("{CONTEXT}: tls_ca_file is set but no node uses TLS (rediss://)"),
        );
        false
    } else if let Err(problem) = std::fs::read(ca.get_ref()) {
        d.error(
            ca.span().start,
            format!(
                "{CONTEXT}: cannot read tls_ca_file {:?}: {problem}",
                ca.get_ref()
            ),
        );
        false
    } else {
        resolved.tls_ca_file = Some(PathBuf::from(ca.get_ref()));
        true
    }
}

/// Problem with a Redis URL, if any; messages show the URL masked.
pub(in crate::config) fn redis_url_problem(url: &str) -> Option<String> {
    let scheme_rest = [TCP_SCHEME, TLS_SCHEME, UNIX_SCHEME]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme).map(|rest| (*scheme, rest)));
    match scheme_rest {
        None => Some(format!(
            "url {:?} must start with redis://, rediss:// or unix://",
            mask_redis_url(url)
        )),
        Some((UNIX_SCHEME, rest)) => {
            let path = rest.split(['?', '#']).next().unwrap_or("");
            path.is_empty().then(|| {
                format!(
                    "url {:?} names no socket path (e.g. unix:///run/redis/redis.sock)",
                    mask_redis_url(url)
                )
            })
        }
        Some((_, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            // An `@` after the authority ends: the password holds a `/`, `?`
            // or `#` the redis crate would take as the end of the host.
            if rest[authority.len()..].contains('@') {
                return Some(format!(
                    "url {:?}: a '/', '?' or '#' in the userinfo must be percent-encoded \
                     (%2F, %3F, %23)",
                    mask_redis_url(url)
                ));
            }
            let host = authority.rsplit('@').next().unwrap_or("");
            host.is_empty().then(|| {
                format!(
                    "url {:?} names no host (e.g. redis://127.0.0.1:6379/0)",
                    mask_redis_url(url)
                )
            })
        }
    }
}
