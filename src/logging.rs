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
