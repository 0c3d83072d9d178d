//! Environment overrides: the variables that replace a setting of the file,
//! checked as the file's values are.

use std::path::PathBuf;

use super::model::{Config, RedisConfig};
use super::resolve::{parse_listen, redis_url_problem, socket_problem};

/// Environment variable overriding `server.socket`.
pub const ENV_SOCKET: &str = "RATEKEEPER_SOCKET";
/// Environment variable overriding `redis.url`.
pub const ENV_REDIS_URL: &str = "RATEKEEPER_REDIS_URL";
/// Environment variable overriding `metrics.listen`.
pub const ENV_METRICS_LISTEN: &str = "RATEKEEPER_METRICS_LISTEN";

/// Applies the environment overrides; returns the problems with them.
pub(super) fn apply_env(config: &mut Config, env: &impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(socket) = env(ENV_SOCKET) {
        match socket_problem(&socket) {
            Some(problem) => errors.push(format!("{ENV_SOCKET}: {problem}")),
            None => config.server.socket = PathBuf::from(socket),
        }
    }
    if let Some(url) = env(ENV_REDIS_URL) {
        match redis_url_problem(&url) {
            Some(problem) => errors.push(format!("{ENV_REDIS_URL}: {problem}")),
            // The variable replaces the file's nodes (a cluster included)
            // and keeps its other settings.
            None => {
                let redis = config
                    .redis
                    .get_or_insert_with(|| RedisConfig::with_url(url.clone()));
                redis.url = Some(url);
                redis.cluster_nodes.clear();
                redis.sentinels.clear();
                redis.master = None;
            }
        }
    }
    if let Some(listen) = env(ENV_METRICS_LISTEN) {
        match parse_listen(&listen) {
            Ok(address) => config.metrics.listen = Some(address),
            Err(problem) => errors.push(format!("{ENV_METRICS_LISTEN}: {problem}")),
        }
    }
    errors
}
