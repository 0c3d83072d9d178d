use super::*;

fn message(role: &str, parts: &[&str]) -> ChatMessage {
    ChatMessage::text(role, parts)
}

#[test]
fn chat_json_in_openai_shape() {
    let request = chat_request_from_json(
        r#"{
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "What is in"},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    "this picture?"
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ]},
                {"role": "assistant", "function_call": {"name": "g", "arguments": "{}"}},
                {"content": "no role"}
            ],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "max_tokens": 300
        }"#,
    )
    .unwrap();
    let mut named = message("user", &["What is in", "this picture?"]);
    named.name = Some("ann".into());
    let mut called = message("assistant", &[]);
    called.tool_calls_json =
        Some(r#"[{"function":{"arguments":"{}","name":"f"},"id":"c1","type":"function"}]"#.into());
    let mut legacy = message("assistant", &[]);
    legacy.tool_calls_json = Some(r#"[{"arguments":"{}","name":"g"}]"#.into());
    assert_eq!(
        request,
        ChatRequest {
            messages: vec![
                message("system", &["Be brief."]),
                named,
                called,
                legacy,
                message("user", &["no role"]),
            ],
            tools_json: Some(r#"[{"function":{"name":"f"},"type":"function"}]"#.into()),
            max_output_tokens: Some(300),
        }
    );
}

#[test]
fn chat_json_variants_and_mistakes() {
    let bare = chat_request_from_json(r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    assert_eq!(bare.messages, vec![message("user", &["hi"])]);
    assert_eq!((bare.tools_json, bare.max_output_tokens), (None, None));
    let newer =
        chat_request_from_json(r#"{"messages": [], "tools": [], "max_completion_tokens": 5}"#)
            .unwrap();
    assert_eq!((newer.tools_json, newer.max_output_tokens), (None, Some(5)));

    // (input, start of the message)
    let mistakes: &[(&str, &str)] = &[
        ("", "not valid JSON: EOF"),
        ("{\"messages\": [", "not valid JSON"),
        (
            "\"hello\"",
            "expected a chat request object or a list of messages",
        ),
        ("{}", "the request has no \"messages\""),
        ("{\"messages\": {}}", "\"messages\" must be a list"),
        ("[1]", "messages[0]: a message must be an object"),
        (
            "[{\"role\": 7}]",
            "messages[0]: role must be a string, not 7",
        ),
        (
            "[{}, {\"content\": 7}]",
            "messages[1]: content must be a string or a list of parts",
        ),
        (
            "{\"messages\": [], \"max_tokens\": -1}",
            "max_tokens must be a non-negative integer, not -1",
        ),
    ];
    for (input, expected) in mistakes {
        let message = chat_request_from_json(input).unwrap_err().to_string();
        assert!(message.starts_with(expected), "{input}: {message}");
    }
}
