//! A load generator over the real socket, for benchmarks and the fleet-wide
//! concurrency test: many pipelined acquires, their latencies, and a log of
//! every grant's arrival time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::client::{Client, ClientError};
use crate::proto::{Acquire, Cost, Request, Response};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub socket: PathBuf,
    pub limit: String,
    /// Tokens each acquire asks for.
    pub tokens: u64,
    /// Connections opened to the daemon.
    pub connections: usize,
    /// Acquires kept in flight on each connection.
    pub concurrency: usize,
    pub duration: Duration,
    pub max_wait_ms: u64,
    /// Give each granted lease back at once (one more round trip).
    pub release: bool,
    /// Where to write one line per grant: arrival time (ms since the Unix
    /// epoch, fractional) and tokens.
    pub grant_log: Option<PathBuf>,
}

/// What happened, with latencies of acquire round trips in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub acquires: u64,
    pub granted: u64,
    pub denied: u64,
    pub errors: u64,
    pub seconds: f64,
    pub acquires_per_second: f64,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_max_us: u64,
}

/// One worker's tally.
#[derive(Default)]
struct Tally {
    granted: u64,
    denied: u64,
    errors: u64,
    latencies_us: Vec<u64>,
    grants: Vec<(f64, u64)>,
}

/// Runs the load until the duration has passed and every worker has stopped.
pub async fn run(options: LoadOptions) -> Result<LoadReport, ClientError> {
    let mut clients = Vec::with_capacity(options.connections);
    for index in 0..options.connections {
        let name = format!("ratekeeper-loadgen pid={} conn={index}", std::process::id());
        clients.push(Arc::new(Client::connect(&options.socket, &name).await?));
    }
    let started = Instant::now();
    let deadline = started + options.duration;
    let mut workers = tokio::task::JoinSet::new();
    for client in &clients {
        for _ in 0..options.concurrency.max(1) {
            workers.spawn(worker(client.clone(), options.clone(), deadline));
        }
    }
    let mut total = Tally::default();
    while let Some(tally) = workers.join_next().await {
        let tally = tally.expect("load worker panicked");
        total.granted += tally.granted;
        total.denied += tally.denied;
        total.errors += tally.errors;
        total.latencies_us.extend(tally.latencies_us);
        total.grants.extend(tally.grants);
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &options.grant_log {
        write_grant_log(path, &mut total.grants)?;
    }
    total.latencies_us.sort_unstable();
    let acquires = total.latencies_us.len() as u64;
    Ok(LoadReport {
        acquires,
        granted: total.granted,
        denied: total.denied,
        errors: total.errors,
        seconds,
        acquires_per_second: acquires as f64 / seconds,
        latency_p50_us: percentile(&total.latencies_us, 0.50),
        latency_p99_us: percentile(&total.latencies_us, 0.99),
        latency_max_us: total.latencies_us.last().copied().unwrap_or(0),
    })
}

async fn worker(client: Arc<Client>, options: LoadOptions, deadline: Instant) -> Tally {
    let mut tally = Tally::default();
    let request = Request::Acquire(Acquire {
        limit: options.limit.clone(),
        tenant: None,
        priority: None,
        cost: Cost::Tokens {
            input_tokens: options.tokens,
            output_tokens: 0,
        },
        max_wait_ms: Some(options.max_wait_ms),
    });
    while Instant::now() < deadline {
        let sent = Instant::now();
        let answer = client.call(request.clone()).await;
        tally.latencies_us.push(sent.elapsed().as_micros() as u64);
        match answer {
            Ok(Response::Granted { lease, tokens, .. }) => {
                tally.granted += 1;
                if options.grant_log.is_some() {
                    tally.grants.push((unix_ms(), tokens));
                }
                if options.release {
                    let _ = client.call(Request::Release { lease }).await;
                }
            }
            Ok(Response::Denied { .. }) => tally.denied += 1,
            Ok(_) => tally.errors += 1,
            Err(_) => {
                tally.errors += 1;
                break;
            }
        }
    }
    tally
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64() * 1000.0)
}

fn write_grant_log(path: &Path, grants: &mut [(f64, u64)]) -> Result<(), ClientError> {
    use std::io::Write;
    grants.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (at, tokens) in grants.iter() {
        writeln!(file, "{at:.3} {tokens}")?;
    }
    file.flush()?;
    Ok(())
}

fn percentile(sorted: &[u64], quantile: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 * quantile).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.50), 50);
        assert_eq!(percentile(&values, 0.99), 99);
        assert_eq!(percentile(&values, 1.0), 100);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
