//! `acquire`: one acquire from a shell script, by a token count (in total or
//! per side) or by a chat request's JSON for the daemon to count, and the
//! settlement that follows it (a total or per side, or a release).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::ArgGroup;

use ratekeeper::proto::{Acquire, Cost, Request, Response, Usage};
use ratekeeper::tokens::request_json;

use super::{ApiArg, EXIT_DENIED, answer_failure, connect};

/// The request shapes `--messages-file` and count-tokens read, for `--help`.
pub const REQUEST_SHAPES: &str = "The JSON is read as the Python client reads the same request, \
so both send the daemon the same text and images to count: OpenAI Chat Completions \
({\"model\", \"messages\", \"tools\", \"max_tokens\"}, or just the messages array; \
image_url parts priced by OpenAI's image rule), OpenAI Responses ({\"input\": a string or \
message, function_call and function_call_output items with input_text, output_text, refusal \
and input_image parts, \"instructions\", \"tools\", \"max_output_tokens\"}) and Anthropic \
Messages ({\"system\": a string or text blocks, \"messages\" of text, image, document, \
tool_use, tool_result, thinking blocks, \"tools\", \"max_tokens\"}; images by Anthropic's \
rule, 346 tokens of tool-use prompt with tools). A messages request is Anthropic's with --api \
anthropic, or when it has a top-level \"system\" or an Anthropic block (image, tool_use, \
tool_result, document, thinking). What cannot be counted from the request (a PDF document, \
an input_file part, an unknown block or item type) is refused by name.";

/// The arguments of `acquire`: the limit, the cost, the wait and the settlement.
#[derive(clap::Args)]
#[command(group(
    ArgGroup::new("cost")
        .required(true)
        .multiple(true)
        .args(["tokens", "input", "output", "messages_file"])
))]
pub struct AcquireArgs {
    /// The limit to draw from.
    limit: String,
    /// Tokens to reserve in total: the prompt plus the maximum output, as one
    /// count (the Python client's `tokens=` is the prompt alone; --input and
    /// --output give the two sides).
    #[arg(long, value_name = "N", conflicts_with_all = ["input", "output", "messages_file"])]
    tokens: Option<u64>,
    /// Prompt (input) tokens to reserve.
    #[arg(long, value_name = "N", conflicts_with = "messages_file")]
    input: Option<u64>,
    /// Output tokens to reserve (the request's maximum); with --messages-file,
    /// instead of the file's max_tokens.
    #[arg(long, value_name = "N")]
    output: Option<u64>,
    /// A request in JSON for the daemon to count, as count-tokens reads it
    /// (OpenAI Chat Completions or Responses, Anthropic Messages); `-` reads
    /// stdin.
    #[arg(long, value_name = "FILE")]
    messages_file: Option<PathBuf>,
    /// Whose shape the --messages-file request is (default: told from the
    /// request, as the Python client's api=None does).
    #[arg(long, value_enum, requires = "messages_file")]
    api: Option<ApiArg>,
    /// Longest acceptable wait in milliseconds (default: the priority class's).
    #[arg(long, value_name = "MS")]
    max_wait: Option<u64>,
    /// Also draw from this tenant's share and its spend budgets.
    #[arg(long)]
    tenant: Option<String>,
    /// Priority class (default: the configured default class).
    #[arg(long)]
    priority: Option<String>,
    /// Settle the lease with this total usage right after the grant.
    #[arg(
        long,
        value_name = "USED",
        conflicts_with_all = ["report_input", "report_output", "report_cached_input", "report_cache_write"]
    )]
    report: Option<u64>,
    /// Settle the lease with this many input tokens used (0 if only
    /// --report-output is given).
    #[arg(long, value_name = "N")]
    report_input: Option<u64>,
    /// Settle the lease with this many output tokens used (0 if only
    /// --report-input is given).
    #[arg(long, value_name = "N")]
    report_output: Option<u64>,
    /// Of the input, this many tokens were read from the provider's prompt
    /// cache (a spend budget prices them apart; --report-input is then the
    /// full-price input only).
    #[arg(long, value_name = "N")]
    report_cached_input: Option<u64>,
    /// Of the input, this many tokens were written to the prompt cache
    /// (--report-input is then the full-price input only).
    #[arg(long, value_name = "N")]
    report_cache_write: Option<u64>,
    /// Give the reservation back right after the grant (a dry run).
    #[arg(
        long,
        conflicts_with_all = ["report", "report_input", "report_output", "report_cached_input", "report_cache_write"]
    )]
    release: bool,
}

impl AcquireArgs {
    /// The cost to send: counts, or the messages read from --messages-file.
    fn cost(&self) -> anyhow::Result<Cost> {
        if let Some(total) = self.tokens {
            return Ok(Cost::Tokens {
                input_tokens: total,
                output_tokens: 0,
            });
        }
        let Some(file) = &self.messages_file else {
            return Ok(Cost::Tokens {
                input_tokens: self.input.unwrap_or(0),
                output_tokens: self.output.unwrap_or(0),
            });
        };
        let text = read_file_or_stdin(file)?;
        let mut cost = request_json::request_from_json(&text, self.api.map(Into::into))
            .with_context(|| format!("cannot read the request in {}", file.display()))?
            .cost;
        if self.output.is_some() {
            cost.set_max_output_tokens(self.output);
        }
        Ok(cost.into_cost())
    }

    /// The settlement to send after the grant, if any.
    fn settlement(&self, lease: u64) -> Option<Request> {
        if let Some(used) = self.report {
            return Some(Request::Report {
                lease,
                input_tokens: used,
                output_tokens: 0,
            });
        }
        if self.report_cached_input.is_some() || self.report_cache_write.is_some() {
            return Some(Request::UsageReport {
                lease,
                usage: Usage {
                    input_tokens: self.report_input.unwrap_or(0),
                    cached_input_tokens: self.report_cached_input.unwrap_or(0),
                    cache_write_tokens: self.report_cache_write.unwrap_or(0),
                    output_tokens: self.report_output.unwrap_or(0),
                },
            });
        }
        if self.report_input.is_some() || self.report_output.is_some() {
            return Some(Request::Report {
                lease,
                input_tokens: self.report_input.unwrap_or(0),
                output_tokens: self.report_output.unwrap_or(0),
            });
        }
        self.release.then_some(Request::Release { lease })
    }
}

fn read_file_or_stdin(file: &Path) -> anyhow::Result<String> {
    if file == Path::new("-") {
        use std::io::Read;
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
}

/// `acquire`: prints the decision, then the settlement if one was asked for.
pub async fn acquire(socket: &Path, args: AcquireArgs) -> anyhow::Result<ExitCode> {
    let request = Acquire {
        cost: args.cost()?,
        limit: args.limit.clone(),
        tenant: args.tenant.clone(),
        priority: args.priority.clone(),
        max_wait_ms: args.max_wait,
    };
    let client = connect(socket).await?;
    match client.call(Request::Acquire(request)).await? {
        Response::Granted {
            lease,
            tokens,
            waited_ms,
        } => {
            println!("granted lease={lease} tokens={tokens} waited_ms={waited_ms}");
            let Some(settle) = args.settlement(lease) else {
                return Ok(ExitCode::SUCCESS);
            };
            match client.call(settle).await? {
                Response::Settled { tokens_returned } => {
                    println!("settled lease={lease} tokens_returned={tokens_returned}")
                }
                Response::Released { tokens_returned } => {
                    println!("released lease={lease} tokens_returned={tokens_returned}")
                }
                other => return answer_failure(other),
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
