//! The latency that acquire-by-messages adds over acquire-by-count, through
//! the real socket. Results and how to read them: bench/tokens/README.md.
//!
//! ```text
//! cargo run --release --example bench_messages              # 5000 of each
//! cargo run --release --example bench_messages -- --quick   # 1000 of each
//! ```
//!
//! The example starts the daemon itself: a child process (this binary with
//! `--serve SOCKET`) serving the embedded store with limits too large to
//! ever wait, its encoders built before it listens. One connection then
//! sends one acquire at a time, in rounds of three: the 2 KB prompt's token
//! count, the same prompt as messages on a tiktoken (o200k_base) limit, and
//! as messages on a character-estimate limit. Each grant is released
//! (untimed), so every acquire finds the same full bucket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratekeeper::app::App;
use ratekeeper::client::Client;
use ratekeeper::config;
use ratekeeper::proto::{Acquire, ChatMessage, ChatRequest, Cost, Request, Response};
use ratekeeper::tokens::{self, CharEstimator, Counter};

/// Limits no benchmark run can exhaust: it measures the path, not waits.
const CONFIG: &str = r#"
[[limits]]
name = "gpt-4o"
model = "gpt-4o"
tokens_per_minute = 1_000_000_000
burst_tokens = 10_000_000_000

[[limits]]
name = "claude"
provider = "anthropic"
tokens_per_minute = 1_000_000_000
burst_tokens = 10_000_000_000
"#;

const PROMPT_BYTES: usize = 2048;
const MAX_OUTPUT_TOKENS: u64 = 256;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, socket] = args.as_slice()
        && flag == "--serve"
    {
        serve(Path::new(socket));
        return;
    }
    let rounds = if args.iter().any(|a| a == "--quick") {
        1_000
    } else {
        5_000
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(measure(rounds));
}

/// Child process: the daemon's library parts, served on `socket` until
/// stdin closes.
fn serve(socket: &Path) {
    let mut config = config::from_toml_str(CONFIG, "bench").expect("bench config");
    config.server.socket = socket.to_path_buf();
    config.server.socket_mode = 0o600;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut app = App::new(config, None).expect("assemble the daemon");
        let listener = app.bind().expect("bind");
        let stdin_closed = async {
            let _ = tokio::task::spawn_blocking(|| {
                use std::io::Read;
                std::io::stdin().read_to_end(&mut Vec::new())
            })
            .await;
        };
        let (_reload, reloads) = tokio::sync::mpsc::unbounded_channel();
        app.serve(listener, stdin_closed, reloads).await;
    });
}

/// The daemon child; closing its stdin stops it.
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_daemon() -> (Daemon, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rk-bench-messages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let socket = dir.join("ratekeeper.sock");
    let child = Command::new(std::env::current_exe().expect("own path"))
        .arg("--serve")
        .arg(&socket)
        .stdin(Stdio::piped())
        .spawn()
        .expect("start the daemon");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "the daemon did not listen");
        std::thread::sleep(Duration::from_millis(5));
    }
    (Daemon { child, dir }, socket)
}

/// A 2 KB chat prompt: a system line and English-like prose with numbers.
fn chat() -> ChatRequest {
    const SENTENCES: &[&str] = &[
        "The quarterly report shows revenue up 12.5% over last year. ",
        "Latency at the 99th percentile stayed under 250 ms for 31 days. ",
        "Each customer request is routed to the nearest region first. ",
        "We will review the budget and the deployment plan on Thursday. ",
        "Error rates fell from 0.8% to 0.3% after the cache was added. ",
    ];
    let text: String = SENTENCES
        .iter()
        .cycle()
        .flat_map(|sentence| sentence.chars())
        .take(PROMPT_BYTES)
        .collect();
    let message = |role: &str, content: String| ChatMessage {
        role: role.into(),
        name: None,
        content: vec![content],
        tool_calls_json: None,
    };
    ChatRequest {
        messages: vec![
            message("system", "Summarise the text in two sentences.".into()),
            message("user", text),
        ],
        tools_json: None,
        max_output_tokens: Some(MAX_OUTPUT_TOKENS),
    }
}

fn acquire(limit: &str, cost: Cost) -> Request {
    Request::Acquire(Acquire {
        limit: limit.into(),
        tenant: None,
        priority: None,
        cost,
        max_wait_ms: Some(0),
    })
}

/// Sends one acquire, returns its round trip, and releases the grant.
async fn timed(client: &Client, request: Request) -> Duration {
    let started = Instant::now();
    let answer = client.call(request).await.expect("an answer");
    let took = started.elapsed();
    match answer {
        Response::Granted { lease, .. } => {
            client
                .call(Request::Release { lease })
                .await
                .expect("release");
        }
        other => panic!("expected a grant, got {other:?}"),
    }
    took
}

/// `p`-th percentile (nearest rank) of sorted samples, in microseconds.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank - 1].as_secs_f64() * 1e6
}

async fn measure(rounds: usize) {
    let (_daemon, socket) = start_daemon();
    let client = Client::connect(&socket, "bench_messages")
        .await
        .expect("connect");
    let request = chat();
    let prompt = tokens::count_messages(
        Counter::for_model("gpt-4o", CharEstimator::default()),
        &request,
    )
    .expect("count");
    let estimate = tokens::count_messages(Counter::Chars(CharEstimator::default()), &request)
        .expect("estimate");
    let kinds: [(&str, &str, Cost); 3] = [
        (
            "by count",
            "gpt-4o",
            Cost::Tokens {
                input_tokens: prompt.total,
                output_tokens: MAX_OUTPUT_TOKENS,
            },
        ),
        (
            "by messages, o200k_base",
            "gpt-4o",
            Cost::Messages(request.clone()),
        ),
        ("by messages, chars", "claude", Cost::Messages(request)),
    ];
    // Warm up: connections, allocator, caches.
    for _ in 0..200 {
        for (_, limit, cost) in &kinds {
            timed(&client, acquire(limit, cost.clone())).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); kinds.len()];
    for _ in 0..rounds {
        for ((_, limit, cost), times) in kinds.iter().zip(&mut samples) {
            times.push(timed(&client, acquire(limit, cost.clone())).await);
        }
    }

    println!(
        "# acquire by messages vs by count, {} build, {} CPUs, {rounds} acquires each",
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "# prompt: {PROMPT_BYTES} bytes, {} tokens (o200k_base), {} estimated (chars); max output {MAX_OUTPUT_TOKENS}",
        prompt.total, estimate.total
    );
    // The counting alone, in this process: what the daemon's path adds on top.
    let (tiktoken, sample) = (
        Counter::for_model("gpt-4o", CharEstimator::default()),
        chat(),
    );
    let mut counts: Vec<Duration> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(tokens::count_messages(tiktoken, &sample).expect("count"));
            started.elapsed()
        })
        .collect();
    counts.sort();
    println!(
        "# counting alone (o200k_base, in process): p50 {:.0} µs, p99 {:.0} µs\n",
        percentile(&counts, 50.0),
        percentile(&counts, 99.0)
    );
    println!("| acquire | p50 µs | p99 µs | p50 vs count | p99 vs count |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut base = (0.0, 0.0);
    for ((name, _, _), times) in kinds.iter().zip(&mut samples) {
        times.sort();
        let (p50, p99) = (percentile(times, 50.0), percentile(times, 99.0));
        if base == (0.0, 0.0) {
            base = (p50, p99);
        }
        println!(
            "| {name} | {p50:.0} | {p99:.0} | {:.2}× ({:+.0} µs) | {:.2}× ({:+.0} µs) |",
            p50 / base.0,
            p50 - base.0,
            p99 / base.1,
            p99 - base.1
        );
    }
}
