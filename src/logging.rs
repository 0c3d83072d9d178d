//! Logging on stderr that can never take the daemon down: a write that fails
//! (whoever read stderr went away) is counted and dropped, never a panic and
//! never an error that reaches a request.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::EnvFilter;

/// Log lines that could not be written since start.
static WRITE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?}: {source}")]
pub struct LogFilterError {
    filter: String,
    source: tracing_subscriber::filter::ParseError,
}

/// The environment variable naming the level of ratekeeper's own logs.
pub const ENV_LOG_LEVEL: &str = "RATEKEEPER_LOG_LEVEL";

/// The levels [`ENV_LOG_LEVEL`] accepts.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Why [`ENV_LOG_LEVEL`] was refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ENV_LOG_LEVEL}={given:?} is not a level: use trace, debug, info, warn, error or off \
     (RUST_LOG or --log-level take a full filter)"
)]
pub struct LogLevelError {
    given: String,
}

/// The log filter when `RUST_LOG` is not set: `--log-level` when given,
/// else [`ENV_LOG_LEVEL`] for ratekeeper's own logs (other crates at
/// `info`, as `RUST_LOG=info,ratekeeper=LEVEL` would), else `info`.
/// `RUST_LOG`, when set and valid, wins over all three ([`init`]).
pub fn default_filter(
    flag: Option<&str>,
    log_level: Option<&str>,
) -> Result<String, LogLevelError> {
    if let Some(flag) = flag {
        return Ok(flag.to_string());
    }
    let Some(given) = log_level.map(str::trim).filter(|level| !level.is_empty()) else {
        return Ok("info".to_string());
    };
    let level = given.to_ascii_lowercase();
    if !LEVELS.contains(&level.as_str()) {
        return Err(LogLevelError {
            given: given.to_string(),
        });
    }
    Ok(format!("info,ratekeeper={level}"))
}

/// Installs the global subscriber: `RUST_LOG` if set, else `filter`.
pub fn init(format: LogFormat, filter: &str) -> Result<(), LogFilterError> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(filter))
        .map_err(|source| LogFilterError {
            filter: filter.to_string(),
            source,
        })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(io::stderr().is_terminal())
        .with_writer(|| Stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

/// Log lines lost to a failing stderr since start.
pub fn write_errors() -> u64 {
    WRITE_ERRORS.load(Ordering::Relaxed)
}

/// stderr, whose failures are counted instead of reported: the logging
/// layer would otherwise print them with `eprintln!`, which panics on a
/// closed stderr.
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if io::stderr().write_all(buf).is_err() {
            WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_level_variable_then_info() {
        // (--log-level, RATEKEEPER_LOG_LEVEL) -> filter
        let cases: &[(Option<&str>, Option<&str>, &str)] = &[
            (None, None, "info"),
            (None, Some(""), "info"),
            (None, Some("debug"), "info,ratekeeper=debug"),
            (None, Some(" WARN "), "info,ratekeeper=warn"),
            (Some("ratekeeper=trace"), Some("debug"), "ratekeeper=trace"),
            (Some("error"), None, "error"),
        ];
        for (flag, level, expected) in cases {
            assert_eq!(
                default_filter(*flag, *level).unwrap(),
                *expected,
                "{flag:?} {level:?}"
            );
            EnvFilter::try_new(expected).expect("a valid filter");
        }
        let refused = default_filter(None, Some("verbose"))
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("RATEKEEPER_LOG_LEVEL=\"verbose\" is not a level"),
            "{refused}"
        );
        assert!(default_filter(None, Some("ratekeeper=debug")).is_err());
    }
}
