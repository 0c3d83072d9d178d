//! `count-tokens`: a request read on stdin (OpenAI's or Anthropic's shape),
//! converted to the cost the Python client would send for it and counted
//! as the daemon counts that cost, for a model and a provider preset,
//! without a daemon.

use std::process::ExitCode;

use anyhow::{Context, bail};

use ratekeeper::config;
use ratekeeper::tokens::content::Api;
use ratekeeper::tokens::{CostRule, Counter, Provider, request_json};

/// `count-tokens`: the prompt of the request on stdin, counted with the
/// preset's tokenizer for `model`, and the reservation an acquire makes.
/// `api` says whose shape a `messages` request is; the `anthropic` preset
/// reads it as Anthropic's (as the Python client's Anthropic wrapper does),
/// the others tell it from the request.
pub fn count_tokens(
    model: Option<&str>,
    provider: Provider,
    api: Option<Api>,
    max_tokens: Option<u64>,
) -> anyhow::Result<ExitCode> {
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read stdin")?;
    let api = api.or((provider == Provider::Anthropic).then_some(Api::Anthropic));
    let read =
        request_json::request_from_json(&text, api).context("cannot read the request on stdin")?;
    let Some(model) = model.or(read.model.as_deref()) else {
        bail!("no model to count for: give --model, or a \"model\" field in the request");
    };
    let request = read.cost;
    let requested_output = request.max_output_tokens();
    let counter = provider.auto_tokenizer(Some(model)).counter(None, None)?;
    let prompt = request.count(counter)?;
    let (output, output_source) = match (max_tokens, requested_output) {
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
    let beyond_text = if prompt.fixed_tokens > 0 {
        format!(", images and tool-use prompt {}", prompt.fixed_tokens)
    } else {
        String::new()
    };
    println!(
        "prompt_tokens: {} (messages {}, tools {}{beyond_text})",
        prompt.total, prompt.text.messages, prompt.text.tools
    );
    println!("output_tokens: {output} ({output_source})");
    println!("reserved: {reserved} ({provider_name}: {rule_text})");
    Ok(ExitCode::SUCCESS)
}
