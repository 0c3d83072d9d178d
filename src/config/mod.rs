//! The typed configuration: loading (TOML file + environment overrides) and
//! validation with messages that point at the place in the file.
//!
//! `serve` and `check-config` both go through [`load`], so a file that passes
//! `check-config` is exactly a file `serve` accepts.
//!
//! | module | owns |
//! | --- | --- |
//! | `model` | the typed, validated settings, their defaults and bounds |
//! | `limit` | one `[[limits]]` entry as the daemon reads it: buckets, windows, charging, usable bursts |
//! | `raw` | the file as written: the serde schema, everything optional and spanned |
//! | `diagnostics` | located problems and the checks every section shares |
//! | `resolve` | raw → typed, one module a section (`server`, `redis`, `leases`, `metrics`, `groups`, `limits`, `priorities`, `clients`) |
//! | `env` | the environment overrides |
//! | `render` | the effective file `check-config` prints; Redis URLs masked |
//! | `warnings` | advice on a valid file that most likely does not mean what it says |
//!
//! The provider presets a limit starts from ([`Provider`] and its rules)
//! live with token counting, in [`crate::tokens::preset`].

mod diagnostics;
mod env;
mod limit;
mod model;
mod raw;
mod read;
mod render;
mod resolve;
mod suggest;
mod warnings;

use std::path::{Path, PathBuf};

pub use env::{ENV_METRICS_LISTEN, ENV_REDIS_URL, ENV_SOCKET};
pub use model::{
    BucketKind, ClientPolicy, Config, DEFAULT_BURST_HEADROOM_MS, DEFAULT_KEY_PREFIX,
    DEFAULT_MAX_OUTPUT_TOKENS, DisconnectRule, EnforcementWindow, FailurePolicy, GroupConfig,
    LeaseConfig, LimitConfig, LimitMode, MAX_BURST, MAX_RATE_PER_MINUTE, MAX_SOCKET_MODE,
    MAX_SOCKET_PATH_LEN, MAX_WAIT_MS, MetricsConfig, PriorityClass, RedisConfig,
    SESSION_SOCKET_NAME, SYSTEM_SOCKET_PATH, SentinelMaster, ServerConfig, TokenBuckets, TokenRate,
    default_socket_path, default_socket_path_in,
};
pub use render::mask_redis_url;

use diagnostics::Diagnostics;

/// A configuration that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Every problem found, one a line, located (under their count when
    /// there are several, so that each starts its own line).
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    /// [`ConfigError::Invalid`] for `problems` (at least one).
    fn invalid(problems: Vec<String>) -> Self {
        match problems.len() {
            0 | 1 => ConfigError::Invalid(problems.concat()),
            count => ConfigError::Invalid(format!("{count} problems:\n{}", problems.join("\n"))),
        }
    }
}

/// Loads and validates the configuration: the file when given (defaults
/// otherwise), then the environment overrides read through `env`.
///
/// Every problem found is reported, one per line, each as
/// `FILE:LINE:COLUMN: CONTEXT: MESSAGE` (or `VARIABLE: MESSAGE` for a bad
/// environment override), under `N problems:` when there are several.
pub fn load(
    path: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let parsed = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            parse(&text, &path.display().to_string())
        }
        None => Ok(Config::default()),
    };
    match parsed {
        Ok(mut config) => {
            let errors = env::apply_env(&mut config, &env);
            if errors.is_empty() {
                Ok(config)
            } else {
                Err(ConfigError::invalid(errors))
            }
        }
        Err(mut errors) => {
            // Still check the overrides, so one run shows every problem.
            errors.extend(env::apply_env(&mut Config::default(), &env));
            Err(ConfigError::invalid(errors))
        }
    }
}

/// Parses and validates configuration text (no environment overrides).
/// `origin` names the source in messages, normally the file's path.
pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
    parse(text, origin).map_err(ConfigError::invalid)
}

/// The configuration `text` describes, or every problem with it, located.
///
/// Bad syntax stops there; otherwise every key that cannot be read (with
/// the key or value it most likely misspells) and every problem with the
/// rest is reported together.
fn parse(text: &str, origin: &str) -> Result<Config, Vec<String>> {
    let root = match toml::de::DeTable::parse(text) {
        Ok(root) => root,
        Err(err) => return Err(vec![diagnostics::syntax_error(&err, text, origin)]),
    };
    let mut d = Diagnostics::new(text, origin);
    let config = read::read(root, &mut d).map(|raw| resolve::resolve(raw, &mut d));
    let errors = d.finish();
    match config {
        Some(config) if errors.is_empty() => Ok(config),
        _ => Err(errors),
    }
}

#[cfg(test)]
mod tests;
