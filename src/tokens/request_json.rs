//! A provider request's JSON as the protocol's [`ChatRequest`], with the model
//! it names: what the CLI reads (`count-tokens`, `acquire --messages-file`).
//!
//! Two shapes of OpenAI's are read: Chat Completions (`messages`, `tools`
//! nested under `function`, `max_tokens`), handled by
//! [`openai::chat_request_from_json`](super::openai::chat_request_from_json),
//! and Responses (`input` as a string or a list of items, `instructions`,
//! flat function `tools`, `max_output_tokens`), converted here to the same
//! messages so that both are counted by one set of rules.

use serde_json::{Map, Value, json};

use super::openai::{ChatJsonError, chat_message, chat_request_from_value, json_text};
use crate::proto::{ChatMessage, ChatRequest};

/// A request read from JSON: the messages to count, and the `model` it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestJson {
    /// The request's `model` field, if it has one.
    pub model: Option<String>,
    /// The messages, tools and output tokens to count and reserve.
    pub chat: ChatRequest,
}

/// Reads a Chat Completions request (or a bare list of messages) or a
/// Responses request.
pub fn request_from_json(text: &str) -> Result<RequestJson, ChatJsonError> {
    let parsed = serde_json::from_str::<Value>(text)
        .map_err(|syntax| ChatJsonError::Syntax(syntax.to_string()))?;
    let Value::Object(mut request) = parsed else {
        let chat = chat_request_from_value(parsed)?;
        return Ok(RequestJson { model: None, chat });
    };
    let model = match request.remove("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(model)) => Some(model),
        Some(other) => return Err(shape(format!("model must be a string, not {other}"))),
    };
    let chat = if request.contains_key("messages") {
        chat_request_from_value(Value::Object(request))?
    } else if request.contains_key("input") {
        responses_request(request)?
    } else {
        return Err(shape(
            "the request has no \"messages\" (Chat Completions) and no \"input\" (Responses)"
                .into(),
        ));
    };
    Ok(RequestJson { model, chat })
}

fn shape(message: String) -> ChatJsonError {
    ChatJsonError::Shape(message)
}

/// A Responses API request as chat messages: `instructions` first, as a
/// system message, then one message per input item.
fn responses_request(mut request: Map<String, Value>) -> Result<ChatRequest, ChatJsonError> {
    let mut messages = Vec::new();
    match request.remove("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(ChatMessage::text("system", &[&text])),
        Some(other) => {
            return Err(shape(format!("instructions must be a string, not {other}")));
        }
    }
    match request.remove("input") {
        Some(Value::String(text)) => messages.push(ChatMessage::text("user", &[&text])),
        Some(Value::Array(items)) => {
            for (index, item) in items.into_iter().enumerate() {
                let message = input_item(item)
                    .map_err(|problem| shape(format!("input[{index}]: {problem}")))?;
                messages.push(message);
            }
        }
        other => {
            let found = other.map_or_else(|| "nothing".to_string(), |value| value.to_string());
            return Err(shape(format!(
                "\"input\" must be a string or a list of items, not {found}"
            )));
        }
    }
    let max_output_tokens = match request.remove("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_u64().ok_or_else(|| {
            shape(format!(
                "max_output_tokens must be a non-negative integer, not {value}"
            ))
        })?),
    };
    let tools = match request.remove("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) if tools.is_empty() => None,
        Some(Value::Array(tools)) => Some(Value::Array(
            tools.into_iter().map(nested_function_tool).collect(),
        )),
        Some(other) => return Err(shape(format!("tools must be a list, not {other}"))),
    };
    Ok(ChatRequest {
        messages,
        tools_json: tools.map(|tools| json_text(&tools)),
        max_output_tokens,
    })
}

/// One item of a Responses `input`: a message (with or without `"type":
/// "message"`), a function call, or a function call's output. Other items
/// (reasoning, built-in tool calls, references) are refused, not counted as
/// nothing.
fn input_item(item: Value) -> Result<ChatMessage, String> {
    let Value::Object(mut item) = item else {
        return Err(format!("an input item must be an object, not {item}"));
    };
    let kind = match item.remove("type") {
        None | Some(Value::Null) => "message".to_string(),
        Some(Value::String(kind)) => kind,
        Some(other) => return Err(format!("type must be a string, not {other}")),
    };
    match kind.as_str() {
        "message" => chat_message(Value::Object(item)),
        "function_call" => {
            let call = json!([{
                "name": item.remove("name").unwrap_or(Value::Null),
                "arguments": item.remove("arguments").unwrap_or(Value::Null),
            }]);
            Ok(ChatMessage {
                role: "assistant".into(),
                name: None,
                content: Vec::new(),
                tool_calls_json: Some(json_text(&call)),
            })
        }
        "function_call_output" => {
            let output = item.remove("output").unwrap_or(Value::Null);
            chat_message(json!({"role": "tool", "content": output}))
                .map_err(|problem| problem.replace("content", "output"))
        }
        other => Err(format!(
            "items of type {other:?} are not counted; \
             only messages, function_call and function_call_output are"
        )),
    }
}

/// A Responses function tool (`{"type": "function", "name": …}`) in the
/// Chat Completions shape the tool counter reads (`{"type": "function",
/// "function": {"name": …}}`); any other tool as it is.
fn nested_function_tool(tool: Value) -> Value {
    match tool {
        Value::Object(mut tool)
            if tool.get("type").and_then(Value::as_str) == Some("function")
                && !tool.contains_key("function") =>
        {
            tool.remove("type");
            tool.remove("strict");
            json!({"type": "function", "function": Value::Object(tool)})
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_completions_with_its_model() {
        let read = request_from_json(
            r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 7}"#,
        )
        .unwrap();
        assert_eq!(read.model.as_deref(), Some("gpt-4o"));
        assert_eq!(read.chat.messages, vec![ChatMessage::text("user", &["hi"])]);
        assert_eq!(read.chat.max_output_tokens, Some(7));
        let bare = request_from_json(r#"[{"role": "user", "content": "hi"}]"#).unwrap();
        assert_eq!((bare.model, bare.chat.messages.len()), (None, 1));
    }

    #[test]
    fn responses_input_as_a_string() {
        let read = request_from_json(
            r#"{"model": "gpt-4.1", "instructions": "Be brief.", "input": "Hello",
                "max_output_tokens": 50}"#,
        )
        .unwrap();
        assert_eq!(read.model.as_deref(), Some("gpt-4.1"));
        assert_eq!(
            read.chat,
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
    fn responses_input_as_items() {
        let read = request_from_json(
            r#"{"input": [
                {"role": "developer", "content": "Use the tool."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather in Paris?"},
                    {"type": "input_image", "image_url": "https://x/y.png"}
                ]},
                {"type": "function_call", "call_id": "c1", "name": "weather",
                 "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "18C, sunny"}
            ],
            "tools": [{"type": "function", "name": "weather", "description": "Weather.",
                       "parameters": {"type": "object"}, "strict": true}]}"#,
        )
        .unwrap();
        let mut call = ChatMessage::text("assistant", &[]);
        call.tool_calls_json =
            Some(r#"[{"arguments":"{\"city\":\"Paris\"}","name":"weather"}]"#.into());
        assert_eq!(
            read.chat.messages,
            vec![
                ChatMessage::text("developer", &["Use the tool."]),
                ChatMessage::text("user", &["Weather in Paris?"]),
                call,
                ChatMessage::text("tool", &["18C, sunny"]),
            ]
        );
        assert_eq!(
            read.chat.tools_json.as_deref(),
            Some(
                r#"[{"function":{"description":"Weather.","name":"weather","parameters":{"type":"object"}},"type":"function"}]"#
            )
        );
    }

    #[test]
    fn mistakes_are_named_with_their_place() {
        let cases: &[(&str, &str)] = &[
            (
                "{}",
                "the request has no \"messages\" (Chat Completions) and no \"input\"",
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
                "{\"input\": \"x\", \"max_output_tokens\": 1.5}",
                "max_output_tokens must be a non-negative integer, not 1.5",
            ),
            (
                "{\"input\": \"x\", \"instructions\": []}",
                "instructions must be a string",
            ),
        ];
        for (input, expected) in cases {
            let message = request_from_json(input).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{input}: {message}");
        }
    }
}
