//! `ratekeeper-loadgen`: a load generator over the real socket, for the
//! benchmarks and the fleet-wide concurrency test — many pipelined acquires,
//! their latencies, and a log of every grant's arrival time. A binary of its
//! own, so the daemon carries none of it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde::Serialize;

use ratekeeper::client::{Client, ClientError};
use ratekeeper::config;
use ratekeeper::proto::{Acquire, Cost, Request, Response};

/// Send acquires as fast as answers come, and report throughput and latency.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ratekeeper-loadgen",
    version,
    after_help = "Prints one JSON object: acquires, granted, denied, errors, \
acquires_per_second and latency percentiles in microseconds. Used by bench/ and the tests.\n\n\
Exit codes: 0 the run completed, 1 the daemon was unreachable, 2 usage error."
)]
struct LoadOptions {
    /// Path of the daemon's Unix socket [default: $XDG_RUNTIME_DIR/ratekeeper.sock,
    /// else /run/ratekeeper/ratekeeper.sock]
    #[arg(long, short, env = config::ENV_SOCKET, default_value_os_t = config::default_socket_path(), hide_default_value = true)]
    socket: PathBuf,
    /// The limit to draw from.
    limit: String,
    /// Tokens each acquire asks for.
    #[arg(long, default_value_t = 1)]
    tokens: u64,
    /// Connections to open.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    connections: u32,
    /// Acquires kept in flight on each connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    seconds: f64,
    /// max_wait_ms of each acquire.
    #[arg(long = "max-wait", value_name = "MS", default_value_t = 0)]
    max_wait_ms: u64,
    /// Release each granted lease right away (one more round trip).
    #[arg(long)]
    release: bool,
    /// Write one line per grant: arrival time (ms since the Unix epoch) and tokens.
    #[arg(long, value_name = "FILE")]
    grant_log: Option<PathBuf>,
    /// Threads driving the connections. One, like redis-benchmark's
    /// default: on a small machine a second thread mostly adds wake-ups
    /// between the two, taking CPU from the daemon and Redis under test.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text.parse().map_err(|e| format!("{e}"))?;
    Duration::try_from_secs_f64(seconds)
        .map(|_| seconds)
        .map_err(|_| "must be a finite number of seconds, not negative".to_string())
}

fn main() -> ExitCode {
    let options = LoadOptions::parse();
    let runtime = if options.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads.into())
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(io_error) => {
            eprintln!("ratekeeper-loadgen: cannot start the runtime: {io_error}");
            return ExitCode::FAILURE;
        }
    };
    let report = match runtime.block_on(run(options)) {
        Ok(report) => report,
        Err(failure) => {
            eprintln!("ratekeeper-loadgen: {failure}");
            return ExitCode::FAILURE;
        }
    };
    match serde_json::to_string(&report) {
        Ok(json) => println!("{json}"),
        Err(json_error) => {
            eprintln!("ratekeeper-loadgen: {json_error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// What happened, with latencies of acquire round trips in microseconds.
#[derive(Debug, Clone, Serialize)]
struct LoadReport {
    acquires: u64,
    granted: u64,
    denied: u64,
    errors: u64,
    seconds: f64,
    acquires_per_second: f64,
    latency_p50_us: u64,
    latency_p99_us: u64,
    latency_max_us: u64,
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
async fn run(options: LoadOptions) -> Result<LoadReport, ClientError> {
    let mut clients = Vec::with_capacity(options.connections as usize);
    for index in 0..options.connections {
        let name = format!("ratekeeper-loadgen pid={} conn={index}", std::process::id());
        clients.push(Arc::new(Client::connect(&options.socket, &name).await?));
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(options.seconds);
    let mut workers = tokio::task::JoinSet::new();
    for client in &clients {
        for _ in 0..options.concurrency {
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
