//! OpenAI's rate-limit estimate of a request: its characters divided by a
//! fixed number of characters per token, nothing added.
//!
//! OpenAI's rate-limit guide: "Your rate limit is calculated as the maximum
//! of max_tokens and the estimated number of tokens based on the character
//! count of your request", and elsewhere "a token is about 4 characters".
//! The charge is therefore not tiktoken's count: for English prose tiktoken
//! counts about 0.86 of `characters / 4`, and a fleet that reserved by
//! tiktoken sent 16 % more than the limit into a provider that charged by
//! characters (issue 11). This counter reproduces the character rule; the
//! `max` cost rule then takes the larger of it and `max_tokens`.
//!
//! What "the character count of your request" covers is not published. We
//! count the Unicode characters of what the request says, not of its JSON
//! envelope: every content part, every `name`, the JSON of every tool call
//! and of the tool definitions. Roles and framing are not characters of the
//! request's text and are not counted.

use super::{PromptCount, TokenError};
use crate::proto::ChatRequest;

/// OpenAI's character rule with its divisor, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpenaiChars {
    /// Characters per token, in thousandths.
    chars_per_token_milli: u32,
}

impl OpenaiChars {
    /// Characters per token when a limit sets none: OpenAI's "a token is
    /// about 4 characters".
    pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;

    /// The rule with `chars_per_token` (0.5 to 16, kept to three decimals),
    /// or an error naming it.
    pub fn new(chars_per_token: f64) -> Result<OpenaiChars, TokenError> {
        let (low, high) = super::CharEstimator::CHARS_PER_TOKEN_RANGE;
        if !(chars_per_token.is_finite() && (low..=high).contains(&chars_per_token)) {
            return Err(TokenError::InvalidEstimator {
                parameter: "chars_per_token",
                value: chars_per_token.to_string(),
                expected: format!("from {low} to {high}"),
            });
        }
        Ok(OpenaiChars {
            chars_per_token_milli: (chars_per_token * 1000.0).round() as u32,
        })
    }

    /// Characters per token.
    pub fn chars_per_token(&self) -> f64 {
        f64::from(self.chars_per_token_milli) / 1000.0
    }

    /// `⌈characters / chars_per_token⌉`, in integers (4 characters at 4.0
    /// are 1 token, 5 are 2).
    pub fn estimate(&self, characters: u64) -> u64 {
        (u128::from(characters) * 1000)
            .div_ceil(u128::from(self.chars_per_token_milli))
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// The estimate of a chat request (already within bounds): its messages
    /// and its tool definitions, each rounded up on its own.
    pub(crate) fn count_request(&self, request: &ChatRequest) -> PromptCount {
        let characters = |text: &str| text.chars().count() as u64;
        let message_characters: u64 = request
            .messages
            .iter()
            .map(|message| {
                let parts: u64 = message.content.iter().map(|part| characters(part)).sum();
                parts
                    + message.name.as_deref().map_or(0, characters)
                    + message.tool_calls_json.as_deref().map_or(0, characters)
            })
            .sum();
        let messages = self.estimate(message_characters);
        let tools = request
            .tools_json
            .as_deref()
            .map_or(0, |json| self.estimate(characters(json)));
        PromptCount {
            total: messages + tools,
            messages,
            tools,
        }
    }
}

impl Default for OpenaiChars {
    fn default() -> Self {
        OpenaiChars {
            chars_per_token_milli: 4_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ChatMessage;

    #[test]
    fn characters_not_bytes_are_divided_and_rounded_up() {
        let rule = OpenaiChars::default();
        let count = |parts: &[&str]| {
            rule.count_request(&ChatRequest {
                messages: vec![ChatMessage::text("user", parts)],
                tools_json: None,
                max_output_tokens: None,
            })
            .total
        };
        assert_eq!(count(&[]), 0);
        assert_eq!(count(&["abcd"]), 1);
        assert_eq!(count(&["abcde"]), 2);
        // Eight characters in two parts, 24 bytes of UTF-8: two tokens.
        assert_eq!(count(&["我们已经", "收到您的"]), 2);
        assert_eq!(OpenaiChars::new(2.5).unwrap().estimate(5), 2);
        assert_eq!(OpenaiChars::new(3.0).unwrap().estimate(10), 4);
        assert_eq!(OpenaiChars::new(0.5).unwrap().estimate(u64::MAX), u64::MAX);
    }

    #[test]
    fn names_tool_calls_and_tools_count_but_roles_do_not() {
        let rule = OpenaiChars::default();
        let request = ChatRequest {
            messages: vec![ChatMessage {
                role: "assistant-with-a-long-role".into(),
                name: Some("bob".into()),
                content: vec!["hi".into()],
                tool_calls_json: Some("[{}]".into()),
            }],
            tools_json: Some("[1,2,3]".into()),
            max_output_tokens: None,
        };
        // (2 + 3 + 4) / 4 → 3; tools 7 / 4 → 2.
        let counted = rule.count_request(&request);
        assert_eq!((counted.messages, counted.tools, counted.total), (3, 2, 5));
    }

    #[test]
    fn the_divisor_is_checked() {
        for bad in [0.0, -4.0, 16.5, f64::NAN, f64::INFINITY] {
            assert!(OpenaiChars::new(bad).is_err(), "{bad}");
        }
        assert_eq!(OpenaiChars::new(4.0).unwrap(), OpenaiChars::default());
    }
}
