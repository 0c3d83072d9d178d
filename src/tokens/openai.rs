//! OpenAI's chat accounting: tiktoken counts plus the framing tokens the
//! API adds around messages and tool definitions.
//!
//! Messages follow `num_tokens_from_messages` of OpenAI's cookbook "How to
//! count tokens with tiktoken" (section 6, rules for gpt-3.5-turbo-0125,
//! gpt-4-0613, gpt-4o-2024-08-06 and gpt-4o-mini-2024-07-18): 3 tokens per
//! message, 1 more when it carries a `name`, the encoded role, name and
//! content, and 3 tokens priming the reply. The cookbook shows these match
//! the API's `prompt_tokens` exactly for its example.
//!
//! Tool definitions follow `num_tokens_for_tools` of the same notebook
//! (section 7), which matches the API for its example; tool calls inside
//! assistant messages have no published rule. Both are estimates: see
//! [`TOOL_CALL_OVERHEAD`] and the rules of `count_tools`.

use std::cell::Cell;

use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

use super::Encoding;
use crate::proto::{ChatMessage, ChatRequest};

/// Framing tokens of every message (`<|start|>{role}<|message|>…<|end|>`).
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// Extra tokens of a message that carries a `name`.
pub const TOKENS_PER_NAME: u64 = 1;
/// Tokens priming the reply (`<|start|>assistant<|message|>`), once per request.
pub const REPLY_PRIMING: u64 = 3;

/// Framing tokens added per tool call of an assistant message, beyond its
/// function name and arguments. OpenAI publishes no rule for chat
/// completions; this is the framing of a call in the harmony format that
/// OpenAI published for gpt-oss (`<|channel|>commentary to=functions.NAME
/// <|constrain|>json … <|call|>` less the name), an estimate.
pub const TOOL_CALL_OVERHEAD: u64 = 7;

/// The cookbook's per-tool constants (`num_tokens_for_tools`): tokens at
/// the start of each function, before its properties, per property, for an
/// enum (negative), per enum item, and once after all functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ToolConstants {
    func_init: i64,
    prop_init: i64,
    prop_key: i64,
    enum_init: i64,
    enum_item: i64,
    func_end: i64,
}

impl ToolConstants {
    /// The cookbook gives them for gpt-4o / gpt-4o-mini (o200k_base) and
    /// gpt-3.5-turbo / gpt-4 (cl100k_base); other models of the same
    /// encoding reuse them.
    fn for_encoding(encoding: Encoding) -> ToolConstants {
        let func_init = match encoding {
            Encoding::O200kBase => 7,
            Encoding::Cl100kBase => 10,
        };
        ToolConstants {
            func_init,
            prop_init: 3,
            prop_key: 3,
            enum_init: -3,
            enum_item: 3,
            func_end: 12,
        }
    }
}

/// Longest text handed to the tokenizer in one call, in bytes.
///
/// Longer texts are cut into segments and counted one after the other, for
/// three reasons: a cut text can be abandoned between segments when its
/// client has gone; BPE grows faster than linearly on one long word (a
/// 64 KiB word takes 24 ms, a 3.9 MiB one seconds), so a segment bounds that
/// cost; and tiktoken's split pattern has a look-ahead (`\s+(?!\S)`) that
/// fancy-regex backtracks through one step per character, so that a
/// whitespace run of about a million characters makes `encode_ordinary`
/// panic. A cut falls before a space that follows a non-space character
/// when the second half of the segment has one: no piece of either
/// encoding's split pattern spans such a place, so the count is exactly
/// tiktoken's. Only text without one for [`SEGMENT_LEN`] / 2 bytes (a huge
/// word, a huge whitespace run) is cut anywhere, which may change its count
/// by a token or two per cut.
pub const SEGMENT_LEN: usize = 16 * 1024;

/// Counts texts with one tiktoken encoder, segment by segment, until the
/// caller says to stop.
pub(crate) struct TextCounter<'a> {
    bpe: &'a CoreBPE,
    cancelled: &'a dyn Fn() -> bool,
    gave_up: Cell<bool>,
}

impl<'a> TextCounter<'a> {
    pub(crate) fn new(bpe: &'a CoreBPE, cancelled: &'a dyn Fn() -> bool) -> Self {
        TextCounter {
            bpe,
            cancelled,
            gave_up: Cell::new(false),
        }
    }

    /// Whether counting stopped because `cancelled` said so; the counts
    /// returned since are meaningless.
    pub(crate) fn gave_up(&self) -> bool {
        self.gave_up.get()
    }

    /// Counts one piece of text as the API sees user text: special-token
    /// markers such as `<|endoftext|>` are ordinary characters there.
    pub(crate) fn count(&self, text: &str) -> u64 {
        let mut total = 0;
        let mut rest = text;
        while !rest.is_empty() {
            if self.gave_up.get() || (self.cancelled)() {
                self.gave_up.set(true);
                return 0;
            }
            let cut = segment_end(rest);
            total += self.bpe.encode_ordinary(&rest[..cut]).len() as u64;
            rest = &rest[cut..];
        }
        total
    }
}

/// Where the first segment of `text` ends (see [`SEGMENT_LEN`]).
fn segment_end(text: &str) -> usize {
    if text.len() <= SEGMENT_LEN {
        return text.len();
    }
    let bytes = text.as_bytes();
    let safe = (SEGMENT_LEN / 2..SEGMENT_LEN)
        .rev()
        .find(|&at| bytes[at] == b' ' && !bytes[at - 1].is_ascii_whitespace());
    safe.unwrap_or_else(|| {
        let mut at = SEGMENT_LEN;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        at
    })
}

/// Tokens of the messages: framing, role, name, every content part counted
/// on its own, tool calls, and the reply priming.
pub(crate) fn count_messages(counter: &TextCounter, messages: &[ChatMessage]) -> u64 {
    let mut total = REPLY_PRIMING;
    for message in messages {
        total += TOKENS_PER_MESSAGE + counter.count(&message.role);
        if let Some(name) = &message.name {
            total += TOKENS_PER_NAME + counter.count(name);
        }
        for part in &message.content {
            total += counter.count(part);
        }
        if let Some(calls) = &message.tool_calls_json {
            total += count_tool_calls(counter, calls);
        }
    }
    total
}

/// Tokens of an assistant message's `tool_calls` JSON: for each call its
/// function name and arguments plus [`TOOL_CALL_OVERHEAD`]. Text that is not
/// a list of `{"function": {"name", "arguments"}}` objects is counted whole,
/// as one call.
pub(crate) fn count_tool_calls(counter: &TextCounter, json: &str) -> u64 {
    let Ok(Value::Array(calls)) = serde_json::from_str::<Value>(json) else {
        return counter.count(json) + TOOL_CALL_OVERHEAD;
    };
    calls
        .iter()
        .map(|call| {
            let function = call.get("function");
            let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
            let arguments = function
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str);
            let content = match (name, arguments) {
                (Some(name), Some(arguments)) => counter.count(name) + counter.count(arguments),
                _ => counter.count(&call.to_string()),
            };
            content + TOOL_CALL_OVERHEAD
        })
        .sum()
}

/// Tokens of the request's `tools` JSON, following the cookbook's
/// `num_tokens_for_tools`: per function its constants, `name:description`,
/// and per property `key:type:description` plus its enum items (a trailing
/// period of a description is not counted).
///
/// The cookbook only renders flat properties; anything else a property
/// declares (nested `properties`, `items`, `anyOf`, …) is counted as its
/// JSON text, and a tool that is not a `{"type": "function", "function":
/// {…}}` object, or text that is not a JSON list, is counted as its JSON
/// text plus the function constants. An estimate beyond the cookbook's
/// example.
pub(crate) fn count_tools(counter: &TextCounter, encoding: Encoding, json: &str) -> u64 {
    let k = ToolConstants::for_encoding(encoding);
    let tools = match serde_json::from_str::<Value>(json) {
        Ok(Value::Array(tools)) => tools,
        Ok(Value::Null) => return 0,
        _ => return counter.count(json) + (k.func_init + k.func_end) as u64,
    };
    if tools.is_empty() {
        return 0;
    }
    let mut total: i64 = 0;
    for tool in &tools {
        total += k.func_init;
        match tool.get("function").and_then(Value::as_object) {
            Some(function) if tool.get("type").and_then(Value::as_str) == Some("function") => {
                total += count_function(counter, &k, function);
            }
            _ => total += counter.count(&tool.to_string()) as i64,
        }
    }
    total += k.func_end;
    total.max(0) as u64
}

fn count_function(counter: &TextCounter, k: &ToolConstants, function: &Map<String, Value>) -> i64 {
    let name = function.get("name").map(text_of).unwrap_or_default();
    let description = function.get("description").map(text_of).unwrap_or_default();
    let line = format!("{name}:{}", without_final_period(&description));
    let mut total = counter.count(&line) as i64;

    let properties = function
        .get("parameters")
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object);
    let Some(properties) = properties.filter(|p| !p.is_empty()) else {
        return total;
    };
    total += k.prop_init;
    for (key, property) in properties {
        total += k.prop_key;
        let Some(property) = property.as_object() else {
            total += counter.count(&format!("{key}:{property}")) as i64;
            continue;
        };
        if let Some(items) = property.get("enum") {
            total += k.enum_init;
            for item in items.as_array().into_iter().flatten() {
                total += k.enum_item + counter.count(&text_of(item)) as i64;
            }
        }
        let kind = property.get("type").map(text_of).unwrap_or_default();
        let description = property.get("description").map(text_of).unwrap_or_default();
        let line = format!("{key}:{kind}:{}", without_final_period(&description));
        total += counter.count(&line) as i64;

        let rest: Map<String, Value> = property
            .iter()
            .filter(|(name, _)| !matches!(name.as_str(), "type" | "description" | "enum"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        if !rest.is_empty() {
            total += counter.count(&Value::Object(rest).to_string()) as i64;
        }
    }
    total
}

/// A string value as itself, anything else as its JSON text.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn without_final_period(text: &str) -> &str {
    text.strip_suffix('.').unwrap_or(text)
}

/// Why a chat request's JSON could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ChatJsonError {
    #[error("not valid JSON: {0}")]
    Syntax(String),
    #[error("{0}")]
    Shape(String),
}

/// A chat completion request in OpenAI's JSON shape as the protocol's
/// [`ChatRequest`]: `{"messages": [...], "tools": [...], "max_tokens": N}`
/// (`max_completion_tokens` is read too), or just the messages array.
///
/// The conversion is the Python client's: a string content is one part, a
/// list keeps its text parts (strings, `text`, `refusal`) and drops the rest
/// (images, audio, files), a missing role is `"user"`, and `tool_calls` (or
/// a legacy `function_call`) and `tools` are kept as JSON text.
pub fn chat_request_from_json(text: &str) -> Result<ChatRequest, ChatJsonError> {
    let parsed = serde_json::from_str::<Value>(text)
        .map_err(|syntax| ChatJsonError::Syntax(syntax.to_string()))?;
    chat_request_from_value(parsed)
}

/// [`chat_request_from_json`] of JSON already parsed.
pub(crate) fn chat_request_from_value(parsed: Value) -> Result<ChatRequest, ChatJsonError> {
    let shape = |message: String| ChatJsonError::Shape(message);
    let (messages, tools, max_tokens) = match parsed {
        Value::Array(messages) => (messages, None, None),
        Value::Object(mut request) => {
            let messages = match request.remove("messages") {
                Some(Value::Array(messages)) => messages,
                Some(_) => return Err(shape("\"messages\" must be a list".into())),
                None => return Err(shape("the request has no \"messages\"".into())),
            };
            let max_tokens = match request
                .remove("max_tokens")
                .or_else(|| request.remove("max_completion_tokens"))
            {
                None | Some(Value::Null) => None,
                Some(value) => Some(value.as_u64().ok_or_else(|| {
                    shape(format!(
                        "max_tokens must be a non-negative integer, not {value}"
                    ))
                })?),
            };
            let tools = request
                .remove("tools")
                .filter(|tools| !tools.is_null() && tools.as_array().is_none_or(|t| !t.is_empty()));
            (messages, tools, max_tokens)
        }
        _ => {
            return Err(shape(
                "expected a chat request object or a list of messages".into(),
            ));
        }
    };
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| {
            chat_message(message).map_err(|problem| shape(format!("messages[{index}]: {problem}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ChatRequest {
        messages,
        tools_json: tools.map(|tools| json_text(&tools)),
        max_output_tokens: max_tokens,
    })
}

/// One message of a chat request's JSON; a problem is said without its place.
pub(crate) fn chat_message(message: Value) -> Result<ChatMessage, String> {
    let Value::Object(mut message) = message else {
        return Err("a message must be an object".into());
    };
    let role = match message.remove("role") {
        None | Some(Value::Null) => "user".to_string(),
        Some(Value::String(role)) => role,
        Some(other) => return Err(format!("role must be a string, not {other}")),
    };
    let name = match message.remove("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(name),
        Some(other) => return Err(format!("name must be a string, not {other}")),
    };
    let content = match message.remove("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![text],
        Some(Value::Array(parts)) => parts
            .into_iter()
            .filter_map(|part| match part {
                Value::String(text) => Some(text),
                Value::Object(mut part) => match (part.remove("text"), part.remove("refusal")) {
                    (Some(Value::String(text)), _) | (_, Some(Value::String(text))) => Some(text),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        Some(other) => {
            return Err(format!(
                "content must be a string or a list of parts, not {other}"
            ));
        }
    };
    let tool_calls = match message.remove("tool_calls") {
        None | Some(Value::Null) => message
            .remove("function_call")
            .filter(|call| !call.is_null())
            .map(|call| Value::Array(vec![call])),
        calls => calls,
    };
    Ok(ChatMessage {
        role,
        name,
        content,
        tool_calls_json: tool_calls.map(|calls| json_text(&calls)),
    })
}

/// A JSON string as its text, anything else as compact JSON.
pub(crate) fn json_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
