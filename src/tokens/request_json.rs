//! A provider request's JSON as the cost the Python client would send for
//! it, with the model it names: what the CLI reads (`count-tokens`,
//! `acquire --messages-file`).
//!
//! The conversion is the Python client's, step for step, so that the CLI and
//! the client send the daemon the same text and the same images to count
//! (`clients/python/src/ratekeeper/_requests.py`, `_content.py`,
//! `_openai_calls.py`, `_anthropic_core.py`):
//!
//! - **Chat Completions** (`messages`, `tools`, `max_tokens` or
//!   `max_completion_tokens`) and a bare list of messages: a
//!   [`ChatRequest`] of the messages' text parts, or, when a message holds an
//!   `image_url` part, a [`Conversation`] of `api` `"openai"` whose images
//!   are priced by OpenAI's rule.
//! - **Anthropic Messages** (a top-level `system`, string or text blocks;
//!   content blocks `text`, `image`, `document`, `tool_use`, `tool_result`,
//!   `thinking`, …; `tools`): a [`Conversation`] of `api` `"anthropic"`.
//!   Read so when the caller says the request is Anthropic's
//!   ([`Api::Anthropic`]: `--provider anthropic`, `--api anthropic`), or,
//!   as the client's `api=None` does, when the request has a `system` or a
//!   block only Anthropic's shape has (`image`, `tool_use`, `tool_result`,
//!   `document`, `thinking`, `redacted_thinking`).
//! - **Responses** (`input`, `instructions`, flat function `tools`,
//!   `max_output_tokens`): converted to chat messages as the client's
//!   OpenAI wrapper does (`instructions` a system message, one message per
//!   input item, `input_text` parts as text, `input_image` parts as
//!   images), then read as Chat Completions.
//!
//! What the client refuses is refused here too, by name (a PDF document,
//! an `input_file` part, an unknown block type, a reasoning item), never
//! counted as nothing. Objects keep their key order and JSON text is
//! written as Python writes it ([`super::pyjson`]).

use super::content::{self, Api};
use super::image_size::{base64_image_size, data_url_size};
use super::openai::ChatJsonError;
use super::pyjson::Json;
use super::{Counter, PromptCount, TokenError};
use crate::proto::{Block, ChatMessage, ChatRequest, Conversation, Cost, Turn};

/// A request read from JSON: the cost to count, and the `model` it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestJson {
    /// The request's `model` field, if it has one.
    pub model: Option<String>,
    /// The messages (or content blocks), tools and output tokens to count
    /// and reserve.
    pub cost: MessageCost,
}

/// The cost of a request by its messages, as the client sends it: chat
/// messages of text, or content blocks (Anthropic's shape, images).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageCost {
    /// `Cost::Messages`: text messages.
    Messages(ChatRequest),
    /// `Cost::Conversation`: content blocks in an API's shape.
    Conversation(Conversation),
}

/// What a [`MessageCost`] counts to: the text by the counter, and the
/// tokens priced beyond text (images, Anthropic's tool-use prompt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostCount {
    /// Every prompt token: `text.total + fixed_tokens`.
    pub total: u64,
    /// The text: messages (with their framing) and tool definitions.
    pub text: PromptCount,
    /// Images and the tool-use system prompt, by the provider's rules.
    pub fixed_tokens: u64,
}

impl MessageCost {
    /// The output tokens the request asks for, if it says.
    pub fn max_output_tokens(&self) -> Option<u64> {
        match self {
            MessageCost::Messages(chat) => chat.max_output_tokens,
            MessageCost::Conversation(conversation) => conversation.max_output_tokens,
        }
    }

    /// Replaces the output tokens to reserve.
    pub fn set_max_output_tokens(&mut self, tokens: Option<u64>) {
        match self {
            MessageCost::Messages(chat) => chat.max_output_tokens = tokens,
            MessageCost::Conversation(conversation) => conversation.max_output_tokens = tokens,
        }
    }

    /// The wire's cost.
    pub fn into_cost(self) -> Cost {
        match self {
            MessageCost::Messages(chat) => Cost::Messages(chat),
            MessageCost::Conversation(conversation) => Cost::Conversation(conversation),
        }
    }

    /// Counts the prompt as the daemon counts this cost: a conversation is
    /// split into its text and its fixed tokens ([`content::split`]), the
    /// text counted by `counter` ([`super::count_messages`]).
    pub fn count(self, counter: Counter) -> Result<CostCount, TokenError> {
        let (chat, fixed_tokens) = match self {
            MessageCost::Messages(chat) => (chat, 0),
            MessageCost::Conversation(conversation) => {
                let split = content::split(conversation)?;
                (split.text, split.fixed_tokens)
            }
        };
        let text = super::count_messages(counter, &chat)?;
        Ok(CostCount {
            total: text.total.saturating_add(fixed_tokens),
            text,
            fixed_tokens,
        })
    }
}

/// Reads a Chat Completions request (or a bare list of messages), an
/// Anthropic Messages request or a Responses request. `api` says whose
/// shape a `messages` request is (the client's `api=`); `None` tells it
/// from the request, as the client does. A Responses request is OpenAI's
/// whatever `api` says.
pub fn request_from_json(text: &str, api: Option<Api>) -> Result<RequestJson, ChatJsonError> {
    let parsed = Json::parse(text).map_err(|syntax| ChatJsonError::Syntax(syntax.to_string()))?;
    let shape = ChatJsonError::Shape;
    if let Json::Array(messages) = &parsed {
        let cost = message_cost(messages, None, None, None, api).map_err(shape)?;
        return Ok(RequestJson { model: None, cost });
    }
    if !matches!(parsed, Json::Object(_)) {
        return Err(shape(format!(
            "expected a request object or a list of messages, not {}",
            parsed.shown()
        )));
    }
    let model = match parsed.get("model") {
        None | Some(Json::Null) => None,
        Some(Json::Str(model)) => Some(model.clone()),
        Some(other) => {
            return Err(shape(format!(
                "model must be a string, not {}",
                other.shown()
            )));
        }
    };
    let cost = if let Some(messages) = parsed.get("messages") {
        let messages = match messages {
            Json::Array(messages) => messages.as_slice(),
            Json::Null => &[],
            _ => return Err(shape("\"messages\" must be a list".into())),
        };
        // The OpenAI wrapper's `tools or functions`, the Anthropic one's `tools`.
        let tools = [parsed.get("tools"), parsed.get("functions")]
            .into_iter()
            .flatten()
            .find(|tools| tools.truthy());
        let system = parsed.get("system").filter(|system| system.truthy());
        let max_tokens = match output_tokens(&parsed, "max_completion_tokens").map_err(shape)? {
            Some(tokens) => Some(tokens),
            None => output_tokens(&parsed, "max_tokens").map_err(shape)?,
        };
        message_cost(messages, max_tokens, tools, system, api).map_err(shape)?
    } else if parsed.get("input").is_some() {
        responses_cost(&parsed).map_err(shape)?
    } else {
        return Err(shape(
            "the request has no \"messages\" (Chat Completions, Anthropic Messages) \
             and no \"input\" (Responses)"
                .into(),
        ));
    };
    Ok(RequestJson { model, cost })
}

/// A request's output-token field, if it is there.
fn output_tokens(request: &Json, name: &str) -> Result<Option<u64>, String> {
    match request.get(name) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Int(tokens)) if *tokens >= 0 && *tokens <= i128::from(u64::MAX) => {
            Ok(Some(*tokens as u64))
        }
        Some(other) => Err(format!(
            "{name} must be a non-negative integer, not {}",
            other.shown()
        )),
    }
}

/// The client's `message_cost`: Anthropic's shape when `api` says so or the
/// request looks it; else a chat request, with images a conversation.
fn message_cost(
    messages: &[Json],
    max_tokens: Option<u64>,
    tools: Option<&Json>,
    system: Option<&Json>,
    api: Option<Api>,
) -> Result<MessageCost, String> {
    let shape = api.or_else(|| shape_of(messages, system.is_some()));
    if shape == Some(Api::Anthropic) {
        return anthropic_conversation(messages, system, tools, max_tokens)
            .map(MessageCost::Conversation);
    }
    if system.is_some() {
        return Err(
            "a top-level \"system\" is Anthropic's: an OpenAI request carries its \
                    system prompt as a message"
                .into(),
        );
    }
    let chat = chat_request(messages, max_tokens, tools)?;
    if shape_of(messages, false) == Some(Api::Openai) {
        return openai_conversation(chat, messages).map(MessageCost::Conversation);
    }
    Ok(MessageCost::Messages(chat))
}

/// Block types only Anthropic's shape has: one makes a request Anthropic's.
const ANTHROPIC_BLOCKS: [&str; 6] = [
    "image",
    "tool_use",
    "tool_result",
    "document",
    "thinking",
    "redacted_thinking",
];

/// The client's `shape_of`: Anthropic's for a `system` or an Anthropic
/// block, OpenAI's for an `image_url` part, `None` for what a
/// [`ChatRequest`] holds whole.
fn shape_of(messages: &[Json], has_system: bool) -> Option<Api> {
    if has_system {
        return Some(Api::Anthropic);
    }
    let kinds: Vec<&str> = messages
        .iter()
        .filter_map(|message| match message.get("content") {
            Some(Json::Array(parts)) => Some(parts),
            _ => None,
        })
        .flatten()
        .filter_map(|part| part.get("type").and_then(Json::as_str))
        .collect();
    if kinds.iter().any(|kind| ANTHROPIC_BLOCKS.contains(kind)) {
        Some(Api::Anthropic)
    } else if kinds.contains(&"image_url") {
        Some(Api::Openai)
    } else {
        None
    }
}

/// Python's `str(value)` of a field, or an error naming it.
fn py_str(value: &Json, place: &str) -> Result<String, String> {
    value
        .py_str()
        .ok_or_else(|| format!("{place} must be text, not {}", value.shown()))
}

/// Python's `str(value or "")` of a field, or an error naming it.
fn py_str_or_empty(value: Option<&Json>, place: &str) -> Result<String, String> {
    Json::py_str_or_empty(value).ok_or_else(|| {
        let shown = value.map(Json::shown).unwrap_or_default();
        format!("{place} must be text, not {shown}")
    })
}

/// A message's `role`, `"user"` when it has none (`str(message.get("role", "user"))`).
fn role_of(message: &Json, place: &str) -> Result<String, String> {
    match message.get("role") {
        None => Ok("user".into()),
        Some(role) => py_str(role, &format!("{place}.role")),
    }
}

// ---------------------------------------------------------------------------
// Anthropic
// ---------------------------------------------------------------------------

fn anthropic_conversation(
    messages: &[Json],
    system: Option<&Json>,
    tools: Option<&Json>,
    max_tokens: Option<u64>,
) -> Result<Conversation, String> {
    let mut turns = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let place = format!("messages[{index}]");
        if !matches!(message, Json::Object(_)) {
            return Err(format!("{place}: a message must be an object"));
        }
        let blocks = anthropic_blocks(message.get("content"), &format!("{place}.content"))?;
        turns.push(Turn {
            role: role_of(message, &place)?,
            name: None,
            blocks,
            tool_calls_json: None,
        });
    }
    let tools_json = match tools.filter(|tools| tools.truthy()) {
        None => None,
        Some(tools @ Json::Array(_)) => Some(tools.compact()),
        Some(other) => return Err(format!("tools must be a list, not {}", other.shown())),
    };
    Ok(Conversation {
        api: "anthropic".into(),
        system: system_texts(system)?,
        messages: turns,
        tools_json,
        max_output_tokens: max_tokens,
    })
}

/// The texts of a `system`: a string, or a list of text blocks.
fn system_texts(system: Option<&Json>) -> Result<Vec<String>, String> {
    match system {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Str(text)) if text.is_empty() => Ok(Vec::new()),
        Some(Json::Str(text)) => Ok(vec![text.clone()]),
        Some(Json::Array(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(index, block)| {
                let place = format!("system[{index}]");
                match block {
                    Json::Str(text) => Ok(text.clone()),
                    Json::Object(_) => match block.get("type") {
                        None => py_str_or_empty(block.get("text"), &format!("{place}.text")),
                        Some(Json::Str(kind)) if kind == "text" => {
                            py_str_or_empty(block.get("text"), &format!("{place}.text"))
                        }
                        Some(kind) => Err(format!(
                            "{place}: a system block must be text, not {}",
                            kind.shown()
                        )),
                    },
                    other => Err(format!(
                        "{place}: a system block must be an object, not {}",
                        other.shown()
                    )),
                }
            })
            .collect(),
        Some(other) => Err(format!(
            "system must be a string or a list of text blocks, not {}",
            other.shown()
        )),
    }
}

/// The blocks of an Anthropic content: a string, or a list of blocks.
fn anthropic_blocks(content: Option<&Json>, place: &str) -> Result<Vec<Block>, String> {
    match content {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Str(text)) => Ok(vec![text_block(text.clone())]),
        Some(Json::Array(blocks)) => {
            let mut all = Vec::new();
            for (index, block) in blocks.iter().enumerate() {
                all.extend(anthropic_block(block, &format!("{place}[{index}]"))?);
            }
            Ok(all)
        }
        Some(other) => Err(format!(
            "{place}: content must be a string or a list of blocks, not {}",
            other.shown()
        )),
    }
}

fn text_block(text: String) -> Block {
    Block::Text { text }
}

/// `compact_json(value)` of a field: `null` when it is absent.
fn compact_field(block: &Json, key: &str) -> Block {
    text_block(
        block
            .get(key)
            .map_or_else(|| "null".into(), Json::compact_text),
    )
}

fn anthropic_block(block: &Json, place: &str) -> Result<Vec<Block>, String> {
    let kind = match block {
        Json::Str(text) => return Ok(vec![text_block(text.clone())]),
        Json::Object(_) => block.get("type").and_then(Json::as_str).unwrap_or(""),
        other => {
            return Err(format!(
                "{place}: a content block must be an object, not {}",
                other.shown()
            ));
        }
    };
    let text = |key: &str| py_str_or_empty(block.get(key), &format!("{place}.{key}"));
    Ok(match kind {
        "text" => vec![text_block(text("text")?)],
        "image" => vec![anthropic_image(block, place)?],
        "tool_use" | "server_tool_use" | "mcp_tool_use" => {
            vec![text_block(text("name")?), compact_field(block, "input")]
        }
        "tool_result" => anthropic_blocks(block.get("content"), &format!("{place}.content"))?,
        "document" => anthropic_document(block, place)?,
        "thinking" => vec![text_block(text("thinking")?)],
        "redacted_thinking" => vec![text_block(text("data")?)],
        "search_result" => {
            let mut blocks = vec![text_block(text("title")?), text_block(text("source")?)];
            blocks.extend(anthropic_blocks(
                block.get("content"),
                &format!("{place}.content"),
            )?);
            blocks
        }
        kind if kind.ends_with("_tool_result") => vec![compact_field(block, "content")],
        _ => {
            let kind = block.get("type").map_or_else(|| "null".into(), Json::shown);
            return Err(format!(
                "{place}: content block type {kind} is not known to ratekeeper, so its \
                 tokens cannot be counted; give the count yourself (acquire --input)"
            ));
        }
    })
}

/// A block's `source`: an object, `{}` when it has none.
fn source_of<'a>(block: &'a Json, place: &str) -> Result<Option<&'a Json>, String> {
    match block.get("source").filter(|source| source.truthy()) {
        None => Ok(None),
        Some(source @ Json::Object(_)) => Ok(Some(source)),
        Some(other) => Err(format!(
            "{place}.source must be an object, not {}",
            other.shown()
        )),
    }
}

fn anthropic_image(block: &Json, place: &str) -> Result<Block, String> {
    let source = source_of(block, place)?;
    let kind = source.and_then(|source| source.get("type"));
    let (width, height) = match kind.and_then(Json::as_str) {
        Some("base64") => base64_image_size(&py_str_or_empty(
            source.and_then(|source| source.get("data")),
            &format!("{place}.source.data"),
        )?),
        Some("url" | "file") => (0, 0),
        _ => {
            let kind = kind.map_or_else(|| "null".into(), Json::shown);
            return Err(format!(
                "{place}: an image source of type {kind} cannot be counted"
            ));
        }
    };
    Ok(Block::Image {
        width,
        height,
        detail: String::new(),
    })
}

fn anthropic_document(block: &Json, place: &str) -> Result<Vec<Block>, String> {
    let source = source_of(block, place)?;
    let mut blocks = Vec::new();
    for key in ["title", "context"] {
        if let Some(value) = block.get(key).filter(|value| value.truthy()) {
            blocks.push(text_block(py_str(value, &format!("{place}.{key}"))?));
        }
    }
    let kind = source.and_then(|source| source.get("type"));
    match kind.and_then(Json::as_str) {
        Some("text") => blocks.push(text_block(py_str_or_empty(
            source.and_then(|source| source.get("data")),
            &format!("{place}.source.data"),
        )?)),
        Some("content") => blocks.extend(anthropic_blocks(
            source.and_then(|source| source.get("content")),
            &format!("{place}.source.content"),
        )?),
        _ => {
            let kind = kind.map_or_else(|| "null".into(), Json::shown);
            return Err(format!(
                "{place}: a document of source type {kind} (a PDF) cannot be counted from \
                 the request; give the count yourself (e.g. Anthropic's count_tokens, then \
                 acquire --input)"
            ));
        }
    }
    Ok(blocks)
}

// ---------------------------------------------------------------------------
// OpenAI
// ---------------------------------------------------------------------------

fn chat_request(
    messages: &[Json],
    max_tokens: Option<u64>,
    tools: Option<&Json>,
) -> Result<ChatRequest, String> {
    let messages = messages
        .iter()
        .enumerate()
        .map(|(index, message)| chat_message(message, &format!("messages[{index}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ChatRequest {
        messages,
        tools_json: tools.filter(|tools| tools.truthy()).map(Json::compact_text),
        max_output_tokens: max_tokens,
    })
}

/// One OpenAI chat message: its text parts, `name`, and `tool_calls` (or a
/// legacy `function_call`) as JSON.
fn chat_message(message: &Json, place: &str) -> Result<ChatMessage, String> {
    if !matches!(message, Json::Object(_)) {
        return Err(format!("{place}: a message must be an object"));
    }
    let tool_calls = match message.field("tool_calls") {
        Some(calls) => Some(calls.compact_text()),
        None => message
            .field("function_call")
            .map(|call| Json::Array(vec![call.clone()]).compact()),
    };
    let name = match message.get("name") {
        None | Some(Json::Null) => None,
        Some(Json::Str(name)) => Some(name.clone()),
        Some(other) => {
            return Err(format!(
                "{place}: name must be a string, not {}",
                other.shown()
            ));
        }
    };
    Ok(ChatMessage {
        role: role_of(message, place)?,
        name,
        content: text_parts(message.get("content"), place)?,
        tool_calls_json: tool_calls,
    })
}

/// The text parts of a content: a string is one part; a list keeps its
/// strings, `text` and `refusal` parts and leaves out the rest (images,
/// audio, files).
fn text_parts(content: Option<&Json>, place: &str) -> Result<Vec<String>, String> {
    match content {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Str(text)) => Ok(vec![text.clone()]),
        Some(Json::Array(parts)) => {
            let mut texts = Vec::new();
            for part in parts {
                match part {
                    Json::Str(text) => texts.push(text.clone()),
                    Json::Object(_) => {
                        if let Some(Json::Str(text)) = part.get("text") {
                            texts.push(text.clone());
                        } else if let Some(Json::Str(text)) = part.get("refusal") {
                            texts.push(text.clone());
                        }
                    }
                    other => {
                        return Err(format!(
                            "{place}: a content part must be an object or a string, not {}",
                            other.shown()
                        ));
                    }
                }
            }
            Ok(texts)
        }
        Some(other) => Err(format!(
            "{place}: content must be a string or a list of parts, not {}",
            other.shown()
        )),
    }
}

/// OpenAI messages with images: `chat` with each message's content as
/// blocks, images priced by size.
fn openai_conversation(chat: ChatRequest, messages: &[Json]) -> Result<Conversation, String> {
    let mut turns = Vec::with_capacity(chat.messages.len());
    for (converted, message) in chat.messages.into_iter().zip(messages) {
        let blocks = match message.field("content") {
            Some(content) => openai_blocks(content)?,
            None => converted.content.into_iter().map(text_block).collect(),
        };
        turns.push(Turn {
            role: converted.role,
            name: converted.name,
            blocks,
            tool_calls_json: converted.tool_calls_json,
        });
    }
    Ok(Conversation {
        api: "openai".into(),
        system: Vec::new(),
        messages: turns,
        tools_json: chat.tools_json,
        max_output_tokens: chat.max_output_tokens,
    })
}

/// The blocks of an OpenAI content: text parts and images (audio and files
/// are left out, as for a chat message).
fn openai_blocks(content: &Json) -> Result<Vec<Block>, String> {
    let parts = match content {
        Json::Str(text) => return Ok(vec![text_block(text.clone())]),
        Json::Array(parts) => parts,
        // Refused by `text_parts` already.
        _ => return Ok(Vec::new()),
    };
    let mut blocks = Vec::new();
    for part in parts {
        if let Json::Str(text) = part {
            blocks.push(text_block(text.clone()));
        } else if part.get("type").and_then(Json::as_str) == Some("image_url") {
            blocks.push(openai_image(part)?);
        } else if let Some(Json::Str(text)) = part.get("text") {
            blocks.push(text_block(text.clone()));
        } else if let Some(Json::Str(text)) = part.get("refusal") {
            blocks.push(text_block(text.clone()));
        }
    }
    Ok(blocks)
}

fn openai_image(part: &Json) -> Result<Block, String> {
    let image = part.get("image_url").filter(|image| image.truthy());
    let (url, detail) = match image {
        None => (String::new(), String::new()),
        Some(Json::Str(url)) => (url.clone(), String::new()),
        Some(image @ Json::Object(_)) => (
            py_str_or_empty(image.get("url"), "image_url.url")?,
            py_str_or_empty(image.get("detail"), "image_url.detail")?,
        ),
        Some(other) => {
            return Err(format!(
                "image_url must be an object or a URL, not {}",
                other.shown()
            ));
        }
    };
    let (width, height) = data_url_size(&url);
    Ok(Block::Image {
        width,
        height,
        detail,
    })
}

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

fn string(text: &str) -> Json {
    Json::Str(text.into())
}

fn object(fields: Vec<(&str, Json)>) -> Json {
    Json::Object(
        fields
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
    )
}

/// `value or default` of a field.
fn or(value: Option<&Json>, default: Json) -> Json {
    value
        .filter(|value| value.truthy())
        .cloned()
        .unwrap_or(default)
}

/// A Responses request as the OpenAI wrapper acquires it: `instructions`
/// and `input` as chat messages, function tools nested as chat tools,
/// `max_output_tokens`; read as Chat Completions from there.
fn responses_cost(request: &Json) -> Result<MessageCost, String> {
    let mut messages = Vec::new();
    match request.get("instructions") {
        Some(Json::Str(text)) => {
            messages.push(object(vec![
                ("role", string("system")),
                ("content", string(text)),
            ]));
        }
        Some(other) if other.truthy() => {
            return Err(format!(
                "instructions must be a string, not {}",
                other.shown()
            ));
        }
        _ => {}
    }
    match request.get("input") {
        Some(Json::Str(text)) => {
            messages.push(object(vec![
                ("role", string("user")),
                ("content", string(text)),
            ]));
        }
        Some(Json::Array(items)) => {
            for (index, item) in items.iter().enumerate() {
                messages.push(input_item(item, &format!("input[{index}]"))?);
            }
        }
        Some(other) if other.truthy() => {
            return Err(format!(
                "\"input\" must be a string or a list of items, not {}",
                other.shown()
            ));
        }
        _ => {}
    }
    let tools = responses_tools(request.get("tools"))?;
    let max_tokens = output_tokens(request, "max_output_tokens")?;
    message_cost(&messages, max_tokens, tools.as_ref(), None, None)
}

/// One Responses input item as a chat message: a message (`type`
/// `"message"` or none), a function call (an assistant's tool call) or a
/// function call's output (a tool message). Other items (reasoning,
/// built-in tool calls, references) are refused, not counted as nothing.
fn input_item(item: &Json, place: &str) -> Result<Json, String> {
    if !matches!(item, Json::Object(_)) {
        return Err(format!(
            "{place}: an input item must be an object, not {}",
            item.shown()
        ));
    }
    let kind = or(item.get("type"), string("message"));
    match kind.as_str() {
        Some("message") => Ok(object(vec![
            ("role", or(item.get("role"), string("user"))),
            (
                "content",
                input_content(item.get("content"), &format!("{place}.content"))?,
            ),
        ])),
        Some("function_call") => {
            // Keys in the order the client writes them.
            let call = object(vec![
                (
                    "arguments",
                    item.get("arguments").cloned().unwrap_or(Json::Null),
                ),
                ("name", item.get("name").cloned().unwrap_or(Json::Null)),
            ]);
            Ok(object(vec![
                ("role", string("assistant")),
                ("tool_calls", Json::Array(vec![call])),
            ]))
        }
        Some("function_call_output") => Ok(object(vec![
            ("role", string("tool")),
            (
                "content",
                input_content(item.get("output"), &format!("{place}.output"))?,
            ),
        ])),
        _ => Err(format!(
            "{place}: items of type {} are not counted by ratekeeper; only messages, \
             function_call and function_call_output are (leave the others out, or give the \
             count yourself: acquire --input)",
            kind.shown()
        )),
    }
}

/// A Responses content as a chat content: text parts (`input_text`,
/// `output_text`, `refusal`) as text, `input_image` as an image; other
/// parts (`input_file`, `input_audio`) refused.
fn input_content(content: Option<&Json>, place: &str) -> Result<Json, String> {
    let parts = match content {
        None | Some(Json::Null) => return Ok(Json::Null),
        Some(text @ Json::Str(_)) => return Ok(text.clone()),
        Some(Json::Array(parts)) => parts,
        Some(other) => {
            return Err(format!(
                "{place} must be a string or a list of parts, not {}",
                other.shown()
            ));
        }
    };
    let mut converted = Vec::with_capacity(parts.len());
    for (index, part) in parts.iter().enumerate() {
        let kind = part.get("type");
        converted.push(match kind.and_then(Json::as_str) {
            Some("input_text" | "output_text" | "text") => object(vec![
                ("type", string("text")),
                ("text", or(part.get("text"), string(""))),
            ]),
            Some("refusal") => object(vec![
                ("type", string("text")),
                ("text", or(part.get("refusal"), string(""))),
            ]),
            Some("input_image") => object(vec![
                ("type", string("image_url")),
                (
                    "image_url",
                    object(vec![
                        ("url", or(part.get("image_url"), string(""))),
                        ("detail", or(part.get("detail"), string(""))),
                    ]),
                ),
            ]),
            _ => {
                let kind = kind.map_or_else(|| "null".into(), Json::shown);
                return Err(format!(
                    "{place}[{index}]: content parts of type {kind} are not counted by \
                     ratekeeper (only input_text, output_text, refusal and input_image are); \
                     give the count yourself (acquire --input)"
                ));
            }
        });
    }
    Ok(Json::Array(converted))
}

/// Responses tools as chat tools: a function tool's fields (less `type` and
/// `strict`) nested under `function`; other tools as they are.
fn responses_tools(tools: Option<&Json>) -> Result<Option<Json>, String> {
    let tools = match tools.filter(|tools| tools.truthy()) {
        None => return Ok(None),
        Some(Json::Array(tools)) => tools,
        Some(other) => return Err(format!("tools must be a list, not {}", other.shown())),
    };
    let nested = tools
        .iter()
        .map(|tool| match tool {
            Json::Object(fields)
                if tool.get("type").and_then(Json::as_str) == Some("function")
                    && tool.get("function").is_none() =>
            {
                let function = fields
                    .iter()
                    .filter(|(name, _)| name != "type" && name != "strict")
                    .cloned()
                    .collect();
                object(vec![
                    ("type", string("function")),
                    ("function", Json::Object(function)),
                ])
            }
            other => other.clone(),
        })
        .collect();
    Ok(Some(Json::Array(nested)))
}
#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> RequestJson {
        request_from_json(text, None).unwrap()
    }

    fn chat(read: RequestJson) -> ChatRequest {
        match read.cost {
            MessageCost::Messages(chat) => chat,
            other => panic!("not a chat request: {other:?}"),
        }
    }

    fn conversation(read: RequestJson) -> Conversation {
        match read.cost {
            MessageCost::Conversation(conversation) => conversation,
            other => panic!("not a conversation: {other:?}"),
        }
    }

    fn text(text: &str) -> Block {
        Block::Text { text: text.into() }
    }

    #[test]
    fn chat_completions_with_its_model() {
        let request = read(
            r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 7}"#,
        );
        assert_eq!(request.model.as_deref(), Some("gpt-4o"));
        let request = chat(request);
        assert_eq!(request.messages, vec![ChatMessage::text("user", &["hi"])]);
        assert_eq!(request.max_output_tokens, Some(7));
        let bare = read(r#"[{"role": "user", "content": "hi"}]"#);
        assert_eq!(bare.model, None);
        assert_eq!(chat(bare).messages.len(), 1);
    }

    #[test]
    fn responses_input_as_a_string() {
        let request = read(
            r#"{"model": "gpt-4.1", "instructions": "Be brief.", "input": "Hello",
                "max_output_tokens": 50}"#,
        );
        assert_eq!(request.model.as_deref(), Some("gpt-4.1"));
        assert_eq!(
            chat(request),
            ChatRequest {
                messages: vec![
                    ChatMessage::text("system", &["Be brief."]),
                    ChatMessage::text("user", &["Hello"]),
                ],
                tools_json: None,
                max_output_tokens: Some(50),
            }
        );
    }

    #[test]
    fn responses_input_as_items_with_an_image() {
        let request = read(
            r#"{"input": [
                {"role": "developer", "content": "Use the tool."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather in Paris?"},
                    {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}
                ]},
                {"type": "function_call", "call_id": "c1", "name": "weather",
                 "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "18C, sunny"}
            ],
            "tools": [{"type": "function", "name": "weather", "description": "Weather.",
                       "parameters": {"type": "object"}, "strict": true}]}"#,
        );
        let conversation = conversation(request);
        assert_eq!(conversation.api, "openai");
        let blocks: Vec<_> = conversation.messages.iter().map(|t| &t.blocks).collect();
        assert_eq!(
            blocks,
            [
                &vec![text("Use the tool.")],
                &vec![
                    text("Weather in Paris?"),
                    Block::Image {
                        width: 0,
                        height: 0,
                        detail: "low".into()
                    }
                ],
                &vec![],
                &vec![text("18C, sunny")],
            ]
        );
        assert_eq!(
            conversation.messages[2].tool_calls_json.as_deref(),
            Some(r#"[{"arguments":"{\"city\":\"Paris\"}","name":"weather"}]"#)
        );
        // The client's order: `type`, then the function's fields as written.
        assert_eq!(
            conversation.tools_json.as_deref(),
            Some(
                r#"[{"type":"function","function":{"name":"weather","description":"Weather.","parameters":{"type":"object"}}}]"#
            )
        );
    }

    #[test]
    fn anthropic_messages_by_their_system_or_blocks() {
        let request = read(
            r#"{"model": "claude-sonnet-4-5", "max_tokens": 100,
                "system": [{"type": "text", "text": "Be brief."}, "Cite."],
                "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
                "messages": [
                  {"role": "user", "content": "Look it up."},
                  {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x", "n": 1.0}}
                  ]},
                  {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [
                      {"type": "text", "text": "found"}]},
                    {"type": "document", "title": "Doc", "source": {"type": "text", "data": "body"}},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
                  ]}
                ]}"#,
        );
        let conversation = conversation(request);
        assert_eq!(conversation.api, "anthropic");
        assert_eq!(conversation.system, ["Be brief.", "Cite."]);
        assert_eq!(conversation.max_output_tokens, Some(100));
        assert_eq!(
            conversation.tools_json.as_deref(),
            Some(r#"[{"name":"lookup","input_schema":{"type":"object"}}]"#)
        );
        assert_eq!(
            conversation.messages[1].blocks,
            [
                text("Looking."),
                text("lookup"),
                text(r#"{"q":"x","n":1.0}"#)
            ]
        );
        assert_eq!(
            conversation.messages[2].blocks,
            [
                text("found"),
                text("Doc"),
                text("body"),
                Block::Image {
                    width: 0,
                    height: 0,
                    detail: String::new()
                }
            ]
        );
        // Text messages alone are a chat request, unless the caller says
        // they are Anthropic's.
        let plain = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        assert!(matches!(read(plain).cost, MessageCost::Messages(_)));
        let anthropic = request_from_json(plain, Some(Api::Anthropic)).unwrap();
        assert_eq!(conversation_api(anthropic), "anthropic");
    }

    fn conversation_api(read: RequestJson) -> String {
        conversation(read).api
    }

    #[test]
    fn mistakes_are_named_with_their_place() {
        let cases: &[(&str, &str)] = &[
            (
                "{}",
                "the request has no \"messages\" (Chat Completions, Anthropic Messages) and no \"input\"",
            ),
            (
                "{\"model\": 4, \"input\": \"x\"}",
                "model must be a string, not 4",
            ),
            (
                "{\"input\": 5}",
                "\"input\" must be a string or a list of items, not 5",
            ),
            (
                "{\"input\": [\"x\"]}",
                "input[0]: an input item must be an object",
            ),
            (
                "{\"input\": [{\"type\": \"reasoning\", \"summary\": []}]}",
                "input[0]: items of type \"reasoning\" are not counted",
            ),
            (
                "{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_file\", \"file_id\": \"f\"}]}]}",
                "input[0].content[0]: content parts of type \"input_file\" are not counted",
            ),
            (
                "{\"input\": \"x\", \"max_output_tokens\": 1.5}",
                "max_output_tokens must be a non-negative integer, not 1.5",
            ),
            (
                "{\"input\": \"x\", \"instructions\": [1]}",
                "instructions must be a string",
            ),
            (
                "{\"system\": \"s\", \"messages\": [{\"content\": [{\"type\": \"video\"}]}]}",
                "messages[0].content[0]: content block type \"video\" is not known",
            ),
            (
                "{\"messages\": [{\"content\": [{\"type\": \"document\", \"source\": {\"type\": \"base64\", \"data\": \"JVBERi0=\"}}]}]}",
                "messages[0].content[0]: a document of source type \"base64\" (a PDF)",
            ),
            (
                "{\"system\": [{\"type\": \"image\"}], \"messages\": []}",
                "system[0]: a system block must be text, not \"image\"",
            ),
        ];
        for (input, expected) in cases {
            let message = request_from_json(input, None).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{input}: {message}");
        }
        let system = r#"{"system": "s", "messages": []}"#;
        let message = request_from_json(system, Some(Api::Openai))
            .unwrap_err()
            .to_string();
        assert!(message.contains("\"system\" is Anthropic's"), "{message}");
    }
}
