//! The one-shot commands of the CLI — `status`, `health`, `ping`, `acquire`
//! against a running daemon, and `count-tokens` without one — and how they
//! print.

mod status;

pub use status::{StatusOptions, health, status};

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use ratekeeper::client::Client;
use ratekeeper::config;
use ratekeeper::proto::{Acquire, ErrorCode, Request, Response};
use ratekeeper::tokens::{self, Counter};
use ratekeeper::tokens::{CostRule, Provider};

/// Exit code of `acquire` when the request was denied (rate limited).
pub const EXIT_DENIED: u8 = 3;

pub async fn connect(socket: &Path) -> anyhow::Result<Client> {
    let name = format!("ratekeeper-cli pid={}", std::process::id());
    Ok(Client::connect(socket, &name).await?)
}

/// `ping`: one round trip, timed.
pub async fn ping(socket: &Path) -> anyhow::Result<ExitCode> {
    let client = connect(socket).await?;
    let started = std::time::Instant::now();
    match client.call(Request::Ping).await? {
        Response::Pong => {
            println!("pong from {} in {:?}", socket.display(), started.elapsed());
            Ok(ExitCode::SUCCESS)
        }
        other => bail!("unexpected answer to Ping: {other:?}"),
    }
}

pub async fn acquire(
    socket: &Path,
    request: Acquire,
    report: Option<u64>,
    release: bool,
) -> anyhow::Result<ExitCode> {
    let client = connect(socket).await?;
    match client.call(Request::Acquire(request)).await? {
        Response::Granted {
            lease,
            tokens,
            waited_ms,
        } => {
            println!("granted lease={lease} tokens={tokens} waited_ms={waited_ms}");
            let settle = match report {
                Some(used) => Some(Request::Report {
                    lease,
                    input_tokens: used,
                    output_tokens: 0,
                }),
                None if release => Some(Request::Release { lease }),
                None => None,
            };
            if let Some(settle) = settle {
                match client.call(settle).await? {
                    Response::Settled { tokens_returned } => {
                        println!("settled lease={lease} tokens_returned={tokens_returned}")
                    }
                    Response::Released { tokens_returned } => {
                        println!("released lease={lease} tokens_returned={tokens_returned}")
                    }
                    other => return answer_failure(other),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Denied {
            retry_after_ms,
            bucket,
        } => {
            println!("denied bucket={bucket} retry_after_ms={retry_after_ms}");
            Ok(ExitCode::from(EXIT_DENIED))
        }
        other => answer_failure(other),
    }
}

/// `count-tokens`: the prompt of the chat request on stdin, counted with
/// the preset's tokenizer for `model`, and the reservation an acquire makes.
pub fn count_tokens(
    model: &str,
    provider: Provider,
    max_tokens: Option<u64>,
) -> anyhow::Result<ExitCode> {
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read stdin")?;
    let request = tokens::openai::chat_request_from_json(&text)
        .context("cannot read the chat request on stdin")?;
    let counter = provider.auto_tokenizer(Some(model)).counter(None, None)?;
    let prompt = tokens::count_messages(counter, &request)?;
    let (output, output_source) = match (max_tokens, request.max_output_tokens) {
        (Some(given), _) => (given, "--max-tokens"),
        (None, Some(given)) => (given, "max_tokens"),
        (None, None) => (config::DEFAULT_MAX_OUTPUT_TOKENS, "default"),
    };
    let rule = provider.cost_rule();
    let reserved = rule
        .charge(prompt.total, output)
        .context("the reservation overflows 64 bits")?;
    let counted_with = match counter {
        Counter::Tiktoken(encoding) => format!("{encoding} (tiktoken)"),
        Counter::Chars(estimator) => format!(
            "the character estimate ({} bytes per token x {})",
            estimator.chars_per_token(),
            estimator.safety_factor()
        ),
        Counter::OpenaiChars(rule) => format!(
            "OpenAI's character rule ({} characters per token)",
            rule.chars_per_token()
        ),
    };
    let rule_text = match rule {
        CostRule::Sum => "prompt + output",
        CostRule::Max => "max(prompt, output)",
    };
    let provider_name = provider.name();
    println!("counter: {counted_with}");
    println!(
        "prompt_tokens: {} (messages {}, tools {})",
        prompt.total, prompt.messages, prompt.tools
    );
    println!("output_tokens: {output} ({output_source})");
    println!("reserved: {reserved} ({provider_name}: {rule_text})");
    Ok(ExitCode::SUCCESS)
}

fn answer_failure<T>(response: Response) -> anyhow::Result<T> {
    match response {
        Response::Error { code, message } => {
            let name = ErrorCode::from_u16(code)
                .map(|code| format!("{code:?}"))
                .unwrap_or_else(|| "unknown".to_string());
            bail!("error {code} ({name}): {message}")
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}
