//! `acquire`: one acquire from a shell script, by a token count (in total or
//! per side) or by a chat request's JSON for the daemon to count, and the
//! settlement that follows it (a total or per side, or a release).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::ArgGroup;

use ratekeeper::proto::{Acquire, Cost, Request, Response};
use ratekeeper::tokens::request_json;

use super::{EXIT_DENIED, answer_failure, connect};

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
    /// A chat request in JSON for the daemon to count, as count-tokens reads
    /// it (Chat Completions `messages`, Responses `input`); `-` reads stdin.
    #[arg(long, value_name = "FILE")]
    messages_file: Option<PathBuf>,
    /// Longest acceptable wait in milliseconds (default: the priority class's).
    #[arg(long, value_name = "MS")]
    max_wait: Option<u64>,
    /// Also draw from this tenant's share.
    #[arg(long)]
    tenant: Option<String>,
    /// Priority class (default: the configured default class).
    #[arg(long)]
    priority: Option<String>,
    /// Settle the lease with this total usage right after the grant.
    #[arg(long, value_name = "USED", conflicts_with_all = ["report_input", "report_output"])]
    report: Option<u64>,
    /// Settle the lease with this many input tokens used (0 if only
    /// --report-output is given).
    #[arg(long, value_name = "N")]
    report_input: Option<u64>,
    /// Settle the lease with this many output tokens used (0 if only
    /// --report-input is given).
    #[arg(long, value_name = "N")]
    report_output: Option<u64>,
    /// Give the reservation back right after the grant (a dry run).
    #[arg(long, conflicts_with_all = ["report", "report_input", "report_output"])]
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
        let mut chat = request_json::request_from_json(&text)
            .with_context(|| format!("cannot read the chat request in {}", file.display()))?
            .chat;
        if self.output.is_some() {
            chat.max_output_tokens = self.output;
        }
        Ok(Cost::Messages(chat))
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
