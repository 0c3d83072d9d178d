//! Token counting: how many tokens a chat request's prompt costs.
//!
//! This module owns the encoders (built once, shared, only those the
//! configuration needs: [`preload`]), the model → encoding map
//! ([`encoding_for_model`]), OpenAI's per-message and per-tool framing
//! ([`openai`]), a character estimate for models with no public tokenizer
//! ([`CharEstimator`]), OpenAI's character rule for its rate limits
//! ([`OpenaiChars`]), the input bounds that keep counting finite
//! ([`Bounds`]), a learned default for max output tokens
//! ([`OutputTokenLearner`]), the provider presets ([`preset`]): which
//! counter, cost rule and settlement rule mirror a provider's accounting,
//! and reading a request's JSON in OpenAI's and Anthropic's shapes as the
//! Python client does ([`request_json`]).
//! It knows nothing of limits or buckets: the dispatcher turns a
//! [`PromptCount`] into a cost with the limit's [`CostRule`].
//!
//! Counting is CPU work proportional to the prompt (with o200k_base in a
//! release build, about 80 µs for 2 KB and 1.2 ms for 32 KB; cl100k_base is
//! 1.5–1.7× slower; at most about 2.5 s for the worst 4 MiB input; see
//! `bench/tokens/README.md`), so [`count_messages`] is a plain synchronous
//! function over `Send` data that borrows nothing beyond the call, meant to
//! run in `tokio::task::spawn_blocking` with the request moved in:
//!
//! ```no_run
//! # async fn example(request: ratekeeper::proto::ChatRequest) -> Result<(), Box<dyn std::error::Error>> {
//! use ratekeeper::tokens::{self, Counter};
//! let counter = Counter::for_model("gpt-4o", Default::default());
//! let prompt = tokio::task::spawn_blocking(move || tokens::count_messages(counter, &request))
//!     .await??;
//! println!("{} prompt tokens", prompt.total);
//! # Ok(()) }
//! ```
//!
//! What is exact and what is an estimate: message counts with tiktoken follow
//! OpenAI's cookbook and match the API's published `prompt_tokens` for the
//! cookbook's examples (tested in `tests/it/tokens.rs`); tool definitions follow
//! the cookbook's `num_tokens_for_tools`, exact for its example and an
//! estimate beyond it; tool calls and the character estimator are estimates.

mod chars;
pub mod content;
mod encoding;
mod image_size;
mod learned;
pub mod openai;
mod openai_chars;
pub mod preset;
mod pyjson;
pub mod request_json;

pub use chars::CharEstimator;
pub use encoding::{
    Encoding, Preloaded, encoding_for_model, encodings_for_models, preload, preload_encodings,
};
pub use learned::{LearnerSettings, OutputTokenLearner};
pub use openai_chars::OpenaiChars;
pub use preset::{CostRule, Provider, SettleRule, Tokenizer};

use crate::proto::{ChatRequest, MAX_FRAME_LEN};

/// Why a prompt was not counted, or an estimator not built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The request's text (every role, name, part, tool call and tool
    /// definition together) exceeds [`Bounds::max_text_bytes`].
    #[error("the prompt holds more than {max} bytes of text; counting stops there")]
    TextTooLarge { max: usize },
    /// More messages than [`Bounds::max_messages`].
    #[error("the prompt has {count} messages, more than the {max} that are counted")]
    TooManyMessages { count: usize, max: usize },
    /// More content parts, over all messages, than [`Bounds::max_parts`].
    #[error("the prompt has more than {max} content parts")]
    TooManyParts { max: usize },
    /// The encoder could not be built; only a broken build can cause it.
    #[error("the {encoding} encoder could not be built: {reason}")]
    EncoderUnavailable { encoding: Encoding, reason: String },
    /// A [`crate::proto::Conversation`] names an API whose shape is not
    /// known.
    #[error("unknown api {api:?}: expected \"anthropic\" or \"openai\"")]
    UnknownApi { api: String },
    /// The count was abandoned: its request was cancelled or its client left.
    #[error("counting was abandoned: the request was cancelled")]
    Cancelled,
    /// An estimator or learner parameter out of range.
    #[error("{parameter} = {value} is out of range: expected {expected}")]
    InvalidEstimator {
        parameter: &'static str,
        value: String,
        expected: String,
    },
}

/// Size limits checked before any counting starts, so that the work of one
/// count is bounded whatever a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Bytes of text over all messages and tool definitions.
    pub max_text_bytes: usize,
    /// Messages in one request.
    pub max_messages: usize,
    /// Content parts over all messages.
    pub max_parts: usize,
}

impl Bounds {
    /// 4 MiB of text ([`MAX_FRAME_LEN`], the protocol's largest frame, about
    /// a million tokens), 16,384 messages, 65,536 parts: far above what any
    /// provider accepts in one request, so only abuse is refused.
    pub const DEFAULT: Bounds = Bounds {
        max_text_bytes: MAX_FRAME_LEN as usize,
        max_messages: 16_384,
        max_parts: 65_536,
    };

    /// Checks `request` against the bounds without reading its text.
    pub fn check(&self, request: &ChatRequest) -> Result<(), TokenError> {
        if request.messages.len() > self.max_messages {
            return Err(TokenError::TooManyMessages {
                count: request.messages.len(),
                max: self.max_messages,
            });
        }
        let too_large = TokenError::TextTooLarge {
            max: self.max_text_bytes,
        };
        let mut parts = 0usize;
        let mut bytes = request.tools_json.as_deref().map_or(0, str::len);
        for message in &request.messages {
            parts += message.content.len();
            if parts > self.max_parts {
                return Err(TokenError::TooManyParts {
                    max: self.max_parts,
                });
            }
            let lengths = [
                message.role.len(),
                message.name.as_deref().map_or(0, str::len),
                message.tool_calls_json.as_deref().map_or(0, str::len),
            ];
            for length in lengths
                .into_iter()
                .chain(message.content.iter().map(String::len))
            {
                bytes = bytes.saturating_add(length);
                if bytes > self.max_text_bytes {
                    return Err(too_large);
                }
            }
        }
        if bytes > self.max_text_bytes {
            return Err(too_large);
        }
        Ok(())
    }
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds::DEFAULT
    }
}

/// How a limit turns a prompt into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// tiktoken with this encoding and OpenAI's chat framing.
    Tiktoken(Encoding),
    /// The character estimate, for models without a public tokenizer.
    Chars(CharEstimator),
    /// OpenAI's rate-limit rule: characters ÷ a divisor, nothing added.
    OpenaiChars(OpenaiChars),
}

impl Counter {
    /// The model's encoding when it has one, else `fallback`.
    pub fn for_model(model: &str, fallback: CharEstimator) -> Counter {
        match encoding_for_model(model) {
            Some(encoding) => Counter::Tiktoken(encoding),
            None => Counter::Chars(fallback),
        }
    }

    /// Whether the count is tiktoken's (exact for message text) rather than
    /// the character estimate.
    pub fn is_tiktoken(&self) -> bool {
        matches!(self, Counter::Tiktoken(_))
    }
}

/// The prompt tokens of one chat request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptCount {
    /// Everything the prompt costs: `messages + tools`.
    pub total: u64,
    /// Messages with their framing and the reply priming.
    pub messages: u64,
    /// Tool definitions (zero without tools).
    pub tools: u64,
}

/// Counts the prompt tokens of `request` within [`Bounds::DEFAULT`].
///
/// Synchronous and CPU-bound (see the module docs): call it from
/// `spawn_blocking`. The request's `max_output_tokens` is not part of the
/// prompt and is ignored here.
pub fn count_messages(counter: Counter, request: &ChatRequest) -> Result<PromptCount, TokenError> {
    count_messages_within(counter, request, &Bounds::DEFAULT)
}

/// [`count_messages`] with explicit bounds.
pub fn count_messages_within(
    counter: Counter,
    request: &ChatRequest,
    bounds: &Bounds,
) -> Result<PromptCount, TokenError> {
    count_messages_until(counter, request, bounds, &|| false)
}

/// [`count_messages_within`] that gives up with [`TokenError::Cancelled`]
/// as soon as `cancelled` says so (it is asked between segments of text,
/// at most [`openai::SEGMENT_LEN`] bytes apart): the daemon stops counting
/// for a client that has gone.
pub fn count_messages_until(
    counter: Counter,
    request: &ChatRequest,
    bounds: &Bounds,
    cancelled: &dyn Fn() -> bool,
) -> Result<PromptCount, TokenError> {
    bounds.check(request)?;
    match counter {
        Counter::Tiktoken(encoding) => {
            let text = openai::TextCounter::new(encoding.encoder()?, cancelled);
            let messages = openai::count_messages(&text, &request.messages);
            let tools = request
                .tools_json
                .as_deref()
                .map_or(0, |json| openai::count_tools(&text, encoding, json));
            if text.gave_up() {
                return Err(TokenError::Cancelled);
            }
            Ok(PromptCount {
                total: messages + tools,
                messages,
                tools,
            })
        }
        Counter::Chars(estimator) => Ok(estimator.count_request(request)),
        Counter::OpenaiChars(rule) => Ok(rule.count_request(request)),
    }
}

/// Tokens of one plain text, without any chat framing (within
/// [`Bounds::DEFAULT`]'s text bound).
pub fn count_text(counter: Counter, text: &str) -> Result<u64, TokenError> {
    let max = Bounds::DEFAULT.max_text_bytes;
    if text.len() > max {
        return Err(TokenError::TextTooLarge { max });
    }
    match counter {
        Counter::Tiktoken(encoding) => {
            Ok(openai::TextCounter::new(encoding.encoder()?, &|| false).count(text))
        }
        Counter::Chars(estimator) => Ok(estimator.estimate(text.len() as u64, 0)),
        Counter::OpenaiChars(rule) => Ok(rule.estimate(text.chars().count() as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ChatMessage;

    fn message(role: &str, parts: &[&str]) -> ChatMessage {
        ChatMessage::text(role, parts)
    }

    fn request(messages: Vec<ChatMessage>, tools_json: Option<&str>) -> ChatRequest {
        ChatRequest {
            messages,
            tools_json: tools_json.map(str::to_string),
            max_output_tokens: None,
        }
    }

    #[test]
    fn bounds_table() {
        let bounds = Bounds {
            max_text_bytes: 10,
            max_messages: 2,
            max_parts: 3,
        };
        // (request, expected)
        let cases: Vec<(ChatRequest, Result<(), TokenError>)> = vec![
            (request(vec![], None), Ok(())),
            // "user" + "123456" = 10 bytes: at the bound.
            (request(vec![message("user", &["123456"])], None), Ok(())),
            (
                request(vec![message("user", &["1234567"])], None),
                Err(TokenError::TextTooLarge { max: 10 }),
            ),
            // Tool definitions count towards the text.
            (
                request(vec![message("user", &["1"])], Some("[123456]")),
                Err(TokenError::TextTooLarge { max: 10 }),
            ),
            (
                request(
                    vec![message("a", &[]), message("b", &[]), message("c", &[])],
                    None,
                ),
                Err(TokenError::TooManyMessages { count: 3, max: 2 }),
            ),
            (
                request(vec![message("a", &["", ""]), message("b", &["", ""])], None),
                Err(TokenError::TooManyParts { max: 3 }),
            ),
        ];
        for (request, expected) in cases {
            assert_eq!(bounds.check(&request), expected, "{request:?}");
        }
    }

    #[test]
    fn bounds_are_checked_before_counting() {
        let bounds = Bounds {
            max_text_bytes: 4,
            ..Bounds::DEFAULT
        };
        let big = request(vec![message("user", &["hello"])], None);
        let counter = Counter::Chars(CharEstimator::default());
        assert_eq!(
            count_messages_within(counter, &big, &bounds),
            Err(TokenError::TextTooLarge { max: 4 })
        );
    }

    #[test]
    fn char_counter_counts_every_text_field() {
        let estimator = CharEstimator::new(1.0, 1.0).unwrap();
        let counter = Counter::Chars(estimator);
        let mut with_all = message("user", &["abc", "de"]);
        with_all.name = Some("nm".to_string());
        with_all.tool_calls_json = Some("[1]".to_string());
        // 4 + 3 + 2 + 2 + 3 = 14 bytes, + 3 per message + 3 per request.
        let count = count_messages(counter, &request(vec![with_all], Some("[\"x\"]"))).unwrap();
        assert_eq!(
            count,
            PromptCount {
                total: 20 + 5,
                messages: 20,
                tools: 5,
            }
        );
    }

    #[test]
    fn counter_for_model_falls_back_to_the_estimator() {
        let fallback = CharEstimator::new(4.0, 1.2).unwrap();
        assert_eq!(
            Counter::for_model("gpt-4o-mini", fallback),
            Counter::Tiktoken(Encoding::O200kBase)
        );
        assert_eq!(
            Counter::for_model("claude-3-5-haiku-latest", fallback),
            Counter::Chars(fallback)
        );
    }
}
