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
use ratekeeper::proto::{Acquire, ChatMessage, ChatRequest, Cost, Request, Response};

/// Send acquires as fast as answers come, and report throughput and latency.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ratekeeper-loadgen",
    version,
    after_help = "Prints one JSON object: acquires, granted, denied, errors (other \
answers, and with --report-tokens reports not settled), acquires_per_second and \
latency percentiles in microseconds (with --ping: pings, each Pong counted as \
granted). Used by bench/ and the tests.\n\n\
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
    #[arg(long, conflicts_with = "report_tokens")]
    release: bool,
    /// Settle each granted lease right away with a `Report` of this many
    /// input tokens and no output (one more round trip, not in the
    /// latencies): an acquire + report, as a worker does after its call.
    #[arg(long, value_name = "TOKENS")]
    report_tokens: Option<u64>,
    /// Name this tenant in each acquire, to draw also from its share and
    /// budgets where the limit declares them.
    #[arg(long)]
    tenant: Option<String>,
    /// Write one line per grant: arrival time (ms since the Unix epoch) and tokens.
    #[arg(long, value_name = "FILE")]
    grant_log: Option<PathBuf>,
    /// Send `Ping` instead of acquires: answered by the connection itself,
    /// so its latency is the socket loop's alone.
    #[arg(long, conflicts_with_all = ["prompt_bytes", "release", "report_tokens", "tenant"])]
    ping: bool,
    /// Acquire by messages: one user message of this many bytes of text for
    /// the limit's tokenizer to count, instead of a token count.
    #[arg(long, value_name = "BYTES")]
    prompt_bytes: Option<usize>,
    /// What the prompt is: one message of English-like prose; one letter
    /// repeated (a single word, the slowest text for tiktoken); or the
    /// prose cut into the most messages and parts a prompt may have
    /// (16,384 messages of 4 parts, a frame of about `--prompt-bytes`),
    /// the slowest to decode.
    #[arg(long, value_enum, default_value_t = PromptText::Prose, requires = "prompt_bytes")]
    prompt_text: PromptText,
    /// Send each connection's next request this long after the last one
    /// was sent (or when it is answered, if later), instead of at once:
    /// latency samples at a steady pace that loads nothing.
    #[arg(long, value_name = "MS", value_parser = parse_interval)]
    interval: Option<f64>,
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

/// The text of `--prompt-bytes` prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PromptText {
    Prose,
    Letter,
    Parts,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    let ms = parse_seconds(text)?;
    if ms > 0.0 {
        Ok(ms)
    } else {
        Err("must be more than 0 ms".to_string())
    }
}

/// `bytes` of English-like prose (words, spaces, sentences, line breaks):
/// what a large prompt holds, at the tokenizer's ordinary speed.
fn prose(bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "the", "limit", "of", "every", "worker", "is", "shared", "by", "a", "fleet", "that",
        "calls", "one", "provider", "and", "waits", "for", "its", "turn", "when", "budget", "runs",
        "out", "today",
    ];
    let mut text = String::with_capacity(bytes + 16);
    let mut index = 0usize;
    while text.len() < bytes {
        // A stride coprime with the list, so sentences do not repeat quickly.
        text.push_str(WORDS[index * 7 % WORDS.len()]);
        index += 1;
        text.push_str(match index % 97 {
            0 => ".\n",
            n if n % 13 == 0 => ", ",
            _ => " ",
        });
    }
    text.truncate(bytes);
    text
}

/// The messages of a `--prompt-bytes` prompt.
fn prompt(text: PromptText, bytes: usize) -> Vec<ChatMessage> {
    let message = |content| ChatMessage {
        role: "user".to_string(),
        name: None,
        content,
        tool_calls_json: None,
    };
    match text {
        PromptText::Prose => vec![message(vec![prose(bytes)])],
        PromptText::Letter => vec![message(vec!["a".repeat(bytes)])],
        PromptText::Parts => {
            const MESSAGES: usize = 16_384;
            const PARTS: usize = 4;
            // What each message takes on the wire besides its text (role,
            // no name, no tool calls, each part's length), so that the
            // frame, not the text, is `bytes` long.
            const FRAMING: usize = 8 + 4 + 1 + 8 + 1 + 8 * PARTS;
            let part = prose(bytes.saturating_sub(MESSAGES * FRAMING) / (MESSAGES * PARTS));
            (0..MESSAGES)
                .map(|_| message(vec![part.clone(); PARTS]))
                .collect()
        }
    }
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
    let cost = match options.prompt_bytes {
        Some(bytes) => Cost::Messages(ChatRequest {
            messages: prompt(options.prompt_text, bytes),
            tools_json: None,
            max_output_tokens: Some(options.tokens),
        }),
        None => Cost::Tokens {
            input_tokens: options.tokens,
            output_tokens: 0,
        },
    };
    let request = if options.ping {
        Request::Ping
    } else {
        Request::Acquire(Acquire {
            limit: options.limit.clone(),
            tenant: options.tenant.clone(),
            priority: None,
            cost,
            max_wait_ms: Some(options.max_wait_ms),
        })
    };
    let mut pace = options.interval.map(|ms| {
        let mut pace = tokio::time::interval(Duration::from_secs_f64(ms / 1000.0));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        pace
    });
    while Instant::now() < deadline {
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        let sent = Instant::now();
        let answer = client.call(request.clone()).await;
        tally.latencies_us.push(sent.elapsed().as_micros() as u64);
        match answer {
            Ok(Response::Pong) => tally.granted += 1,
            Ok(Response::Granted { lease, tokens, .. }) => {
                tally.granted += 1;
                if options.grant_log.is_some() {
                    tally.grants.push((unix_ms(), tokens));
                }
                if options.release {
                    let _ = client.call(Request::Release { lease }).await;
                }
                if let Some(input_tokens) = options.report_tokens {
                    let report = Request::Report {
                        lease,
                        input_tokens,
                        output_tokens: 0,
                    };
                    if !matches!(client.call(report).await, Ok(Response::Settled { .. })) {
                        tally.errors += 1;
                    }
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
