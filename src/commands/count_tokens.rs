//! `count-tokens`: a chat request read on stdin, counted as the daemon
//! would count it for a model and a provider preset, without a daemon.

use std::process::ExitCode;

use anyhow::{Context, bail};

use ratekeeper::config;
use ratekeeper::tokens::{self, CostRule, Counter, Provider, request_json};

/// `count-tokens`: the prompt of the chat request on stdin, counted with
/// the preset's tokenizer for `model`, and the reservation an acquire makes.
pub fn count_tokens(
    model: Option<&str>,
    provider: Provider,
    max_tokens: Option<u64>,
) -> anyhow::Result<ExitCode> {
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read stdin")?;
    let read =
        request_json::request_from_json(&text).context("cannot read the chat request on stdin")?;
    let Some(model) = model.or(read.model.as_deref()) else {
        bail!("no model to count for: give --model, or a \"model\" field in the request");
    };
    let request = read.chat;
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
