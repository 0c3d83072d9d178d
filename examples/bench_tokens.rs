//! Token-counting benchmark: encoder build time and memory, and counting
//! throughput for 2 KB and 32 KB prompts with both encodings and the
//! character estimator. Results and how to read them: bench/tokens/README.md.
//!
//! ```text
//! cargo run --release --example bench_tokens              # everything
//! cargo run --release --example bench_tokens -- --quick   # shorter runs
//! ```
//!
//! Each encoder build is measured in a fresh child process (this binary with
//! `--load ENCODING`), since an encoder, once built, stays for the life of
//! the process. Memory is the resident set from /proc/self/status (Linux).

use std::process::Command;
use std::time::{Duration, Instant};

use ratekeeper::proto::{ChatMessage, ChatRequest};
use ratekeeper::tokens::{self, CharEstimator, Counter, Encoding};

const BUILD_RUNS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, encoding] = args.as_slice()
        && flag == "--load"
    {
        measure_load(encoding);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let budget = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };

    println!(
        "# ratekeeper token counting, {} build, {} CPUs\n",
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    encoder_builds();
    throughput(budget);
    pathological();
}

/// Child process: build one encoder (or both) and print time and memory.
fn measure_load(which: &str) {
    let models: &[&str] = match which {
        "o200k_base" => &["gpt-4o"],
        "cl100k_base" => &["gpt-4"],
        "both" => &["gpt-4o", "gpt-4"],
        _ => {
            eprintln!("unknown encoding {which}");
            std::process::exit(2);
        }
    };
    let before = proc_status_kb("VmRSS");
    let started = Instant::now();
    tokens::preload(models.iter().copied()).expect("encoders build");
    let build = started.elapsed();
    let after = proc_status_kb("VmRSS");
    let peak = proc_status_kb("VmHWM");
    println!(
        "{} {} {} {}",
        build.as_secs_f64() * 1000.0,
        before,
        after,
        peak
    );
}

fn proc_status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn encoder_builds() {
    println!("## Encoder build (fresh process each, median of {BUILD_RUNS})\n");
    println!("| encoding | build time | RSS added | RSS after | peak RSS |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let exe = std::env::current_exe().expect("own path");
    let mut base_rss = Vec::new();
    for which in ["o200k_base", "cl100k_base", "both"] {
        let (mut build, mut added, mut after, mut peak) = (vec![], vec![], vec![], vec![]);
        for _ in 0..BUILD_RUNS {
            let output = Command::new(&exe)
                .args(["--load", which])
                .output()
                .expect("child runs");
            let text = String::from_utf8_lossy(&output.stdout);
            let fields: Vec<f64> = text
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            let [ms, before, rss, hwm] = fields[..] else {
                panic!("child printed {text:?}");
            };
            build.push(ms);
            added.push((rss - before) / 1024.0);
            after.push(rss / 1024.0);
            peak.push(hwm / 1024.0);
            base_rss.push(before / 1024.0);
        }
        println!(
            "| {which} | {:.0} ms | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            median(&mut build),
            median(&mut added),
            median(&mut after),
            median(&mut peak)
        );
    }
    println!(
        "\nRSS of the process before building: {:.1} MiB.\n",
        median(&mut base_rss)
    );
}

/// Deterministic English-like prose with some code and numbers, `bytes`
/// long (cut at a character boundary).
fn prompt_text(bytes: usize, seed: u64) -> String {
    const WORDS: &[&str] = &[
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "had",
        "they",
        "you",
        "were",
        "their",
        "one",
        "all",
        "we",
        "can",
        "her",
        "has",
        "there",
        "been",
        "if",
        "more",
        "when",
        "will",
        "would",
        "who",
        "so",
        "no",
        "customer",
        "revenue",
        "quarterly",
        "report",
        "deployment",
        "latency",
        "request",
        "budget",
        "limit",
        "worker",
        "provider",
        "token",
        "bucket",
        "refund",
        "estimate",
        "pipeline",
        "schedule",
        "retry",
        "timeout",
        "database",
        "migration",
        "summary",
        "translate",
        "analysis",
        "contract",
        "invoice",
        "shipment",
        "warehouse",
        "forecast",
        "incident",
        "postmortem",
        "architecture",
        "throughput",
        "configuration",
        "authentication",
        "documentation",
    ];
    let mut state = seed;
    let mut next = move || {
        // xorshift64*: deterministic, no dependency.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut text = String::with_capacity(bytes + 64);
    while text.len() < bytes {
        let roll = next() % 20;
        if roll == 0 {
            text.push_str(&format!(
                "\n```\nfn total(xs: &[u64]) -> u64 {{ xs.iter().sum() }} // {}\n```\n",
                next() % 10_000
            ));
            continue;
        }
        let words = 8 + next() % 12;
        for i in 0..words {
            let word = WORDS[(next() % WORDS.len() as u64) as usize];
            if i == 0 {
                let mut chars = word.chars();
                let first = chars.next().unwrap().to_ascii_uppercase();
                text.push(first);
                text.push_str(chars.as_str());
            } else {
                text.push(' ');
                text.push_str(word);
            }
            if next() % 15 == 0 {
                text.push_str(&format!(" {}", next() % 100_000));
            }
        }
        text.push_str(if roll == 1 { ".\n\n" } else { ". " });
    }
    let mut cut = bytes;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

fn chat_of(user_bytes: usize) -> ChatRequest {
    ChatRequest {
        messages: vec![
            ChatMessage {
                role: "system".to_string(),
                name: None,
                content: vec!["You are a concise assistant. Answer in English.".to_string()],
                tool_calls_json: None,
            },
            ChatMessage {
                role: "user".to_string(),
                name: None,
                content: vec![prompt_text(user_bytes, 0x9e37_79b9_7f4a_7c15)],
                tool_calls_json: None,
            },
        ],
        tools_json: None,
        max_output_tokens: Some(512),
    }
}

struct Rate {
    per_count: Duration,
    tokens_per_sec: f64,
    mib_per_sec: f64,
    tokens: u64,
}

fn measure(counter: Counter, request: &ChatRequest, budget: Duration) -> Rate {
    let bytes: usize = request
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .map(String::len)
        .sum();
    // Warm up (and build the encoder outside the measurement).
    let tokens = tokens::count_messages(counter, request).unwrap().total;
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed() < budget || runs < 10 {
        std::hint::black_box(
            tokens::count_messages(counter, std::hint::black_box(request)).unwrap(),
        );
        runs += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Rate {
        per_count: Duration::from_secs_f64(elapsed / runs as f64),
        tokens_per_sec: (tokens * runs) as f64 / elapsed,
        mib_per_sec: (bytes as u64 * runs) as f64 / elapsed / (1024.0 * 1024.0),
        tokens,
    }
}

fn throughput(budget: Duration) {
    println!("## Counting throughput (one thread, chat of a system message + a user message)\n");
    println!("| prompt | counter | tokens | time per count | tokens/s | MiB/s |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    let counters = [
        ("o200k_base", Counter::Tiktoken(Encoding::O200kBase)),
        ("cl100k_base", Counter::Tiktoken(Encoding::Cl100kBase)),
        (
            "chars (3.5, ×1.1)",
            Counter::Chars(CharEstimator::default()),
        ),
    ];
    let mut rates = Vec::new();
    for (label, size) in [("2 KB", 2 * 1024), ("32 KB", 32 * 1024)] {
        let request = chat_of(size);
        for (name, counter) in counters {
            let rate = measure(counter, &request, budget);
            let per_count = rate.per_count.as_secs_f64() * 1e6;
            if counter.is_tiktoken() {
                println!(
                    "| {label} | {name} | {} | {per_count:.1} µs | {:.2} M | {:.1} |",
                    rate.tokens,
                    rate.tokens_per_sec / 1e6,
                    rate.mib_per_sec
                );
            } else {
                // Sums string lengths: constant in the size of the text.
                println!(
                    "| {label} | {name} | {} | {per_count:.2} µs | — | — |",
                    rate.tokens
                );
            }
            rates.push((label, name, rate));
        }
    }
    let find = |label: &str, name: &str| {
        &rates
            .iter()
            .find(|(l, n, _)| *l == label && *n == name)
            .unwrap()
            .2
    };
    println!("\nRatios (tokens/s):\n");
    for label in ["2 KB", "32 KB"] {
        println!(
            "- {label}: o200k_base / cl100k_base = {:.2}",
            find(label, "o200k_base").tokens_per_sec / find(label, "cl100k_base").tokens_per_sec
        );
    }
    for name in ["o200k_base", "cl100k_base"] {
        println!(
            "- {name}: 32 KB / 2 KB = {:.2}",
            find("32 KB", name).tokens_per_sec / find("2 KB", name).tokens_per_sec
        );
    }
    println!();
}

/// Inputs that make naive tokenizers slow (one endless word, long runs of
/// whitespace), at 1 MiB and at the 4 MiB bound: how long one count takes.
fn pathological() {
    println!("## Adversarial inputs (one count each, o200k_base)\n");
    println!("| input | bytes | tokens | time |");
    println!("| --- | ---: | ---: | ---: |");
    let mib = 1024 * 1024;
    let mut noise = String::with_capacity(mib);
    let mut state = 0x1234_5678_9abc_def0u64;
    while noise.len() < mib {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        noise.push((b'!' + (state % 94) as u8) as char);
    }
    let bound = tokens::Bounds::DEFAULT.max_text_bytes;
    let inputs = [
        ("one letter repeated", "a".repeat(mib)),
        ("spaces", " ".repeat(mib)),
        ("newlines and spaces", " \n".repeat(mib / 2)),
        ("digits", "7".repeat(mib)),
        ("printable noise, no spaces", noise),
        ("prose at the 4 MiB bound", prompt_text(bound, 7)),
        ("one letter repeated, 4 MiB bound", "a".repeat(bound)),
    ];
    let counter = Counter::Tiktoken(Encoding::O200kBase);
    for (label, text) in inputs {
        let started = Instant::now();
        let count = tokens::count_text(counter, &text).unwrap();
        println!(
            "| {label} | {} | {count} | {:.0} ms |",
            text.len(),
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
}
