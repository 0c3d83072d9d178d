//! The one-shot commands of the CLI — `status`, `health`, `ping`, `acquire`
//! against a running daemon, and `count-tokens` without one — and how they
//! print.

mod acquire;
mod count_tokens;
mod status;

pub use acquire::{AcquireArgs, REQUEST_SHAPES, acquire};
pub use count_tokens::count_tokens;
pub use status::{StatusOptions, health, status, watch_interval};

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;

use ratekeeper::client::Client;
use ratekeeper::proto::{ErrorCode, Request, Response};
use ratekeeper::tokens::content::Api;

/// `--api` of count-tokens and acquire: whose shape a `messages` request is
/// (the Python client's `api=`).
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ApiArg {
    /// Anthropic's Messages API: a Conversation of content blocks.
    Anthropic,
    /// OpenAI's Chat Completions API (images priced, Anthropic blocks not read).
    Openai,
}

impl From<ApiArg> for Api {
    fn from(api: ApiArg) -> Self {
        match api {
            ApiArg::Anthropic => Api::Anthropic,
            ApiArg::Openai => Api::Openai,
        }
    }
}

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

/// The error an answer carried, as the command's failure.
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
