//! How OpenAI's rate-limit estimate (characters ÷ 4, the `openai` preset)
//! compares with tiktoken's count (o200k_base) on real text: files of this
//! repository (technical English and Markdown, Rust, Lua, JSON, TOML), the
//! license texts every Debian system carries (plain English prose), and
//! short messages in other scripts. The table in docs/token-counting.md comes from this output.
//!
//! ```text
//! cargo run --release --example openai_estimates
//! ```
//!
//! A ratio above 1 means the character rule charges more than tiktoken
//! counts: a fleet reserving by tiktoken would send that much more than the
//! limit into a provider that charges by characters.

use std::path::Path;

use ratekeeper::tokens::{self, Counter, Encoding, OpenaiChars};

/// Files of the repository, as samples of kinds of text.
const FILES: &[(&str, &str)] = &[
    ("English prose and Markdown, the README", "README.md"),
    ("protocol spec (Markdown)", "proto-spec/PROTOCOL.md"),
    ("Rust source", "src/plan.rs"),
    ("Lua source", "lua/bucket.lua"),
    (
        "JSON (test vectors)",
        "proto-spec/vectors/request_acquire.json",
    ),
    ("TOML config", "examples/ratekeeper.toml"),
];

/// License texts of Debian's `base-files`: long plain English prose.
const LICENSES: &[&str] = &[
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/Apache-2.0",
];

/// Short messages in other scripts (the samples of `tests/it/tokens.rs`).
const MESSAGES: &[(&str, &str)] = &[
    (
        "German",
        "Wir haben Ihre Nachricht erhalten und werden uns innerhalb von zwei Werktagen bei Ihnen melden. Vielen Dank für Ihre Geduld.",
    ),
    (
        "Russian",
        "Мы получили ваше письмо и ответим в течение двух рабочих дней. Спасибо за терпение и понимание.",
    ),
    (
        "Chinese",
        "我们已经收到您的来信，将在两个工作日内回复。感谢您的耐心与理解。",
    ),
    (
        "Japanese",
        "お問い合わせありがとうございます。二営業日以内にご返信いたします。",
    ),
];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o200k = Counter::Tiktoken(Encoding::O200kBase);
    let rule = Counter::OpenaiChars(OpenaiChars::default());
    println!("| text | characters | o200k_base tokens | characters ÷ 4 | ÷4 / o200k |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let row = |kind: &str, text: &str| {
        let exact = tokens::count_text(o200k, text).expect("within bounds");
        let estimate = tokens::count_text(rule, text).expect("within bounds");
        println!(
            "| {kind} | {} | {exact} | {estimate} | {:.2} |",
            text.chars().count(),
            estimate as f64 / exact as f64
        );
    };
    for (kind, path) in FILES {
        let text = std::fs::read_to_string(root.join(path)).expect("a file of the repository");
        row(&format!("{kind}, `{path}`"), &text);
    }
    // Plain English prose that every Debian system carries.
    for path in LICENSES {
        match std::fs::read_to_string(path) {
            Ok(text) => row(&format!("English legal prose, `{path}`"), &text),
            Err(_) => println!("| `{path}` | absent on this system | | | |"),
        }
    }
    for (kind, text) in MESSAGES {
        row(kind, text);
    }
}
