//! Token counts against figures OpenAI published, and the estimator against
//! the real encoders.
//!
//! Source of every exact figure: OpenAI cookbook, "How to count tokens with
//! tiktoken", `examples/How_to_count_tokens_with_tiktoken.ipynb` in
//! github.com/openai/openai-cookbook (revision c81359cd). Each figure printed
//! there is both what `num_tokens_from_messages` / `num_tokens_for_tools`
//! compute and what the API reported as `usage.prompt_tokens`.

use ratekeeper::proto::{ChatMessage, ChatRequest};
use ratekeeper::tokens::{self, Bounds, CharEstimator, Counter, Encoding, PromptCount, TokenError};

fn message(role: &str, name: Option<&str>, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        name: name.map(str::to_string),
        content: vec![content.to_string()],
        tool_calls_json: None,
    }
}

fn chat(messages: Vec<ChatMessage>, tools_json: Option<&str>) -> ChatRequest {
    ChatRequest {
        messages,
        tools_json: tools_json.map(str::to_string),
        max_output_tokens: None,
    }
}

/// The cookbook's section 6 example: a system prompt, four few-shot
/// messages with `name`, and a user message.
fn cookbook_example_messages() -> ChatRequest {
    chat(
        vec![
            message(
                "system",
                None,
                "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
            ),
            message(
                "system",
                Some("example_user"),
                "New synergies will help drive top-line growth.",
            ),
            message(
                "system",
                Some("example_assistant"),
                "Things working well together will increase revenue.",
            ),
            message(
                "system",
                Some("example_user"),
                "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
            ),
            message(
                "system",
                Some("example_assistant"),
                "Let's talk later when we're less busy about how to do better.",
            ),
            message(
                "user",
                None,
                "This late pivot means we don't have time to boil the ocean for the client deliverable.",
            ),
        ],
        None,
    )
}

/// The cookbook's section 7 tool, as a client sends it.
const COOKBOOK_WEATHER_TOOL: &str = r#"[
  {
    "type": "function",
    "function": {
      "name": "get_current_weather",
      "description": "Get the current weather in a given location",
      "parameters": {
        "type": "object",
        "properties": {
          "location": {
            "type": "string",
            "description": "The city and state, e.g. San Francisco, CA"
          },
          "unit": {
            "type": "string",
            "description": "The unit of temperature to return",
            "enum": ["celsius", "fahrenheit"]
          }
        },
        "required": ["location"]
      }
    }
  }
]"#;

fn cookbook_tool_request() -> ChatRequest {
    chat(
        vec![
            message(
                "system",
                None,
                "You are a helpful assistant that can answer to questions about the weather.",
            ),
            message("user", None, "What's the weather like in San Francisco?"),
        ],
        Some(COOKBOOK_WEATHER_TOOL),
    )
}

fn prompt_tokens(model: &str, request: &ChatRequest) -> u64 {
    let counter = Counter::for_model(model, CharEstimator::default());
    assert!(counter.is_tiktoken(), "{model} should have an encoding");
    tokens::count_messages(counter, request).unwrap().total
}

#[test]
fn cookbook_example_messages_match_the_published_prompt_tokens() {
    // Section 6 output: "129 prompt tokens counted by the OpenAI API" for
    // gpt-3.5-turbo, gpt-4-0613 and gpt-4; "124" for gpt-4o and gpt-4o-mini.
    let published = [
        ("gpt-3.5-turbo", 129),
        ("gpt-4-0613", 129),
        ("gpt-4", 129),
        ("gpt-4o", 124),
        ("gpt-4o-mini", 124),
    ];
    let request = cookbook_example_messages();
    for (model, expected) in published {
        assert_eq!(prompt_tokens(model, &request), expected, "{model}");
    }
}

#[test]
fn cookbook_tool_example_matches_the_published_prompt_tokens() {
    // Section 7 output: "105 prompt tokens counted by the OpenAI API" for
    // gpt-3.5-turbo and gpt-4; "101" for gpt-4o and gpt-4o-mini.
    let published = [
        ("gpt-3.5-turbo", 105),
        ("gpt-4", 105),
        ("gpt-4o", 101),
        ("gpt-4o-mini", 101),
    ];
    let request = cookbook_tool_request();
    for (model, expected) in published {
        assert_eq!(prompt_tokens(model, &request), expected, "{model}");
    }
    // The split: the two messages alone, then the tool definitions.
    let counter = Counter::Tiktoken(Encoding::O200kBase);
    let count = tokens::count_messages(counter, &request).unwrap();
    let without_tools = chat(request.messages.clone(), None);
    let messages_only = tokens::count_messages(counter, &without_tools).unwrap();
    assert_eq!(count.messages, messages_only.total);
    assert_eq!(count.total, count.messages + count.tools);
    assert!(count.tools > 0);
}

#[test]
fn cookbook_encoding_examples() {
    // Section 3: "tiktoken is great!" is 6 tokens in cl100k_base; section 5:
    // "お誕生日おめでとう" is 9 tokens in cl100k_base and 8 in o200k_base.
    let cl100k = Counter::Tiktoken(Encoding::Cl100kBase);
    let o200k = Counter::Tiktoken(Encoding::O200kBase);
    assert_eq!(tokens::count_text(cl100k, "tiktoken is great!"), Ok(6));
    assert_eq!(tokens::count_text(cl100k, "お誕生日おめでとう"), Ok(9));
    assert_eq!(tokens::count_text(o200k, "お誕生日おめでとう"), Ok(8));
    assert_eq!(
        tokens::count_text(cl100k, "antidisestablishmentarianism"),
        Ok(6)
    );
    assert_eq!(tokens::count_text(cl100k, "2 + 2 = 4"), Ok(7));
}

#[test]
fn content_parts_are_each_counted() {
    let counter = Counter::Tiktoken(Encoding::O200kBase);
    let one_part = chat(vec![message("user", None, "Hello there")], None);
    let mut two_parts = one_part.clone();
    two_parts.messages[0]
        .content
        .push(" and goodbye".to_string());
    let extra = tokens::count_text(counter, " and goodbye").unwrap();
    let one = tokens::count_messages(counter, &one_part).unwrap().total;
    let two = tokens::count_messages(counter, &two_parts).unwrap().total;
    assert_eq!(two, one + extra);
    // 3 per message + "user" + "Hello there" + 3 priming.
    assert_eq!(one, 3 + 1 + 2 + 3);
}

#[test]
fn special_token_markers_in_user_text_count_as_ordinary_text() {
    // The API encodes user text as ordinary text: "<|endoftext|>" is several
    // tokens, not the single special token.
    let counter = Counter::Tiktoken(Encoding::Cl100kBase);
    let count = tokens::count_text(counter, "<|endoftext|>").unwrap();
    assert!(count > 1, "{count}");
}

#[test]
fn tool_calls_count_name_arguments_and_overhead() {
    let counter = Counter::Tiktoken(Encoding::O200kBase);
    let plain = chat(vec![message("assistant", None, "")], None);
    let mut with_calls = plain.clone();
    with_calls.messages[0].tool_calls_json = Some(
        r#"[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
            {"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]"#
            .to_string(),
    );
    let text = |t: &str| tokens::count_text(counter, t).unwrap();
    let expected_calls = text("get_weather")
        + text(r#"{"city":"Paris"}"#)
        + text("get_time")
        + text("{}")
        + 2 * tokens::openai::TOOL_CALL_OVERHEAD;
    let base = tokens::count_messages(counter, &plain).unwrap().total;
    let total = tokens::count_messages(counter, &with_calls).unwrap().total;
    assert_eq!(total, base + expected_calls);

    // Text that is not a list of calls is counted whole, as one call.
    let mut malformed = plain.clone();
    malformed.messages[0].tool_calls_json = Some("not json".to_string());
    let total = tokens::count_messages(counter, &malformed).unwrap().total;
    assert_eq!(
        total,
        base + text("not json") + tokens::openai::TOOL_CALL_OVERHEAD
    );
}

#[test]
fn tool_definitions_beyond_the_cookbook_are_still_counted() {
    let counter = Counter::Tiktoken(Encoding::O200kBase);
    let count = |tools: &str| {
        tokens::count_messages(counter, &chat(vec![], Some(tools)))
            .unwrap()
            .tools
    };
    assert_eq!(count("[]"), 0);
    assert_eq!(count("null"), 0);
    // A nested schema costs more than the same property without it.
    let flat = r#"[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"xs":{"type":"array","description":"list"}}}}}]"#;
    let nested = r#"[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"xs":{"type":"array","description":"list","items":{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}}}}}}}}]"#;
    assert!(
        count(nested) > count(flat) + 10,
        "{} vs {}",
        count(nested),
        count(flat)
    );
    // Not JSON, or not function tools: the JSON text and the constants.
    let text = tokens::count_text(counter, "garbage").unwrap();
    assert_eq!(count("garbage"), text + 7 + 12);
    assert!(count(r#"[{"type":"web_search"}]"#) > 7 + 12);
}

/// (kind, text, lowest accepted estimate / o200k_base count)
const ESTIMATOR_SAMPLES: &[(&str, &str, f64)] = &[
    (
        "english",
        "The quarterly report shows that revenue grew by twelve percent while operating costs stayed flat, \
         which the board attributes to the new pricing model and to lower churn among enterprise customers.",
        1.0,
    ),
    (
        "german",
        "Wir haben Ihre Nachricht erhalten und werden uns innerhalb von zwei Werktagen bei Ihnen melden. Vielen Dank für Ihre Geduld.",
        1.0,
    ),
    (
        "russian",
        "Мы получили ваше письмо и ответим в течение двух рабочих дней. Спасибо за терпение и понимание.",
        1.0,
    ),
    (
        "chinese",
        "我们已经收到您的来信，将在两个工作日内回复。感谢您的耐心与理解。",
        1.0,
    ),
    (
        "japanese",
        "お問い合わせありがとうございます。二営業日以内にご返信いたします。",
        1.0,
    ),
    (
        "hindi",
        "हमें आपका संदेश मिल गया है और हम दो कार्य दिवसों के भीतर जवाब देंगे। आपके धैर्य के लिए धन्यवाद।",
        1.0,
    ),
    ("emoji", "🎉🎉🎉 great job team 🚀🚀 let's ship it 👍", 1.0),
    // Symbol-dense text tokenizes at 2–3 bytes per token: the documented
    // shortfall of the default, which settlement corrects.
    (
        "code",
        "fn main() {\n    let xs: Vec<u64> = (0..10).map(|i| i * i).collect();\n    println!(\"{:?}\", xs.iter().sum::<u64>());\n}\n",
        0.85,
    ),
    (
        "digits",
        "3.14159265358979323846264338327950288419716939937510",
        0.85,
    ),
    (
        "json",
        r#"{"id": 48213, "items": [{"sku": "A-1192", "qty": 3, "price": 19.99}, {"sku": "B-0007", "qty": 1, "price": 249.0}], "paid": true}"#,
        0.65,
    ),
];

#[test]
fn char_estimate_against_o200k_by_kind_of_text() {
    let estimator = Counter::Chars(CharEstimator::default());
    let o200k = Counter::Tiktoken(Encoding::O200kBase);
    for &(kind, text, floor) in ESTIMATOR_SAMPLES {
        let estimate = tokens::count_text(estimator, text).unwrap() as f64;
        let exact = tokens::count_text(o200k, text).unwrap() as f64;
        assert!(
            estimate >= floor * exact,
            "{kind}: estimate {estimate} is below {floor} × {exact} o200k tokens"
        );
    }
}

#[test]
fn char_estimate_counts_bytes_so_non_latin_scripts_are_not_underestimated() {
    // Counted as characters, 32 Chinese characters would be ⌈32 / 3.5 × 1.1⌉
    // = 11 tokens against o200k's 21; counted as UTF-8 bytes (96) they are 31.
    let text = ESTIMATOR_SAMPLES
        .iter()
        .find(|(kind, ..)| *kind == "chinese")
        .unwrap()
        .1;
    let estimate = tokens::count_text(Counter::Chars(CharEstimator::default()), text).unwrap();
    let exact = tokens::count_text(Counter::Tiktoken(Encoding::O200kBase), text).unwrap();
    let by_characters = CharEstimator::default().estimate(text.chars().count() as u64, 0);
    assert!(by_characters < exact, "{by_characters} vs {exact}");
    assert_eq!(
        estimate,
        CharEstimator::default().estimate(text.len() as u64, 0)
    );
    assert!(estimate >= exact, "{estimate} vs {exact}");
}

#[test]
fn char_estimate_of_the_cookbook_example_is_close_above() {
    // Not wildly above either: within 1.6× of the real count for English.
    let request = cookbook_example_messages();
    let estimate = tokens::count_messages(Counter::Chars(CharEstimator::default()), &request)
        .unwrap()
        .total;
    assert!((129..=129 * 16 / 10).contains(&estimate), "{estimate}");
}

#[test]
fn oversized_prompts_are_refused_before_counting() {
    let counter = Counter::Tiktoken(Encoding::O200kBase);
    let max = Bounds::DEFAULT.max_text_bytes;
    let huge = chat(vec![message("user", None, &"a".repeat(max))], None);
    assert_eq!(
        tokens::count_messages(counter, &huge),
        Err(TokenError::TextTooLarge { max })
    );
    let many = chat(
        vec![message("user", None, ""); Bounds::DEFAULT.max_messages + 1],
        None,
    );
    assert_eq!(
        tokens::count_messages(counter, &many),
        Err(TokenError::TooManyMessages {
            count: Bounds::DEFAULT.max_messages + 1,
            max: Bounds::DEFAULT.max_messages
        })
    );
    assert_eq!(
        tokens::count_text(counter, &"a".repeat(max + 1)),
        Err(TokenError::TextTooLarge { max })
    );
}

#[test]
fn preload_builds_exactly_the_encodings_the_models_need() {
    // Only models without a tokenizer: nothing to build.
    assert_eq!(
        tokens::preload(["claude-sonnet-4-5", "gemini-2.5-flash"]),
        Ok(vec![])
    );
    let loaded = tokens::preload(["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5"]).unwrap();
    let encodings: Vec<Encoding> = loaded.iter().map(|p| p.encoding).collect();
    assert_eq!(encodings, vec![Encoding::O200kBase]);
    assert!(Encoding::O200kBase.is_loaded());
    // Built once: a second preload finds it ready.
    let again = tokens::preload(["gpt-4.1"]).unwrap();
    assert_eq!(again[0].build_time, std::time::Duration::ZERO);
}

#[tokio::test]
async fn count_messages_runs_in_spawn_blocking() {
    let request = cookbook_example_messages();
    let counter = Counter::for_model("gpt-4o", CharEstimator::default());
    let count: PromptCount =
        tokio::task::spawn_blocking(move || tokens::count_messages(counter, &request))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(count.total, 124);
}

#[test]
fn model_map_agrees_with_tiktoken_rs() {
    // Wherever tiktoken-rs knows a chat model's encoding, ours is the same.
    use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
    let models = [
        "gpt-5",
        "gpt-5-mini",
        "gpt-5.2-codex",
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-4.5-preview",
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4o-2024-05-13",
        "chatgpt-4o-latest",
        "o1",
        "o1-mini",
        "o3",
        "o3-mini",
        "o4-mini",
        "o4-mini-2025-04-16",
        "codex-mini-latest",
        "gpt-4",
        "gpt-4-0613",
        "gpt-4-turbo",
        "gpt-4-32k-0314",
        "gpt-3.5-turbo",
        "gpt-3.5-turbo-0125",
        "gpt-35-turbo",
        "text-embedding-3-small",
        "text-embedding-3-large",
        "text-embedding-ada-002",
        "davinci-002",
        "ft:gpt-4o:org:name:id",
        "ft:gpt-3.5-turbo:org:x:1",
    ];
    for model in models {
        let theirs = match get_tokenizer(model) {
            Some(Tokenizer::O200kBase) | Some(Tokenizer::O200kHarmony) => Encoding::O200kBase,
            Some(Tokenizer::Cl100kBase) => Encoding::Cl100kBase,
            other => panic!("{model}: tiktoken-rs gives {other:?}"),
        };
        assert_eq!(tokens::encoding_for_model(model), Some(theirs), "{model}");
    }
}

#[test]
fn a_megabyte_of_whitespace_is_counted_not_a_panic() {
    // Unguarded, tiktoken-rs panics on a whitespace run of about a million
    // characters (fancy-regex's backtrack limit). The guard is the same for
    // both encodings.
    let text = " ".repeat(1_000_000) + "x";
    let count = tokens::count_text(Counter::Tiktoken(Encoding::O200kBase), &text).unwrap();
    assert!(count > 1_000_000 / 128, "{count}");
}

#[test]
fn long_text_is_counted_in_segments_exactly_as_tiktoken() {
    // Segments end before a space that follows a non-space character, where
    // no piece of the split pattern can span: the count of real text of any
    // length is tiktoken's. Whitespace runs shorter than half a segment
    // leave such places too.
    let run = " ".repeat(tokens::openai::SEGMENT_LEN / 4);
    let words = [
        "ratekeeper",
        "tokens,",
        "42",
        "naïve",
        "東京",
        "(quoted)",
        "end.\n\n",
        "x",
    ];
    let prose: String = (0..20_000)
        .map(|i| words[i * 7 % words.len()])
        .collect::<Vec<_>>()
        .join(" ");
    assert!(prose.len() > 8 * tokens::openai::SEGMENT_LEN);
    let texts = [
        format!("indented{run}code\n{run}\tmore"),
        format!("{run}x\n\n{run}x"),
        "plain words, numbers 12345 and\r\n  spaces".to_string(),
        prose,
    ];
    for (encoding, bpe) in [
        (Encoding::O200kBase, tiktoken_rs::o200k_base_singleton()),
        (Encoding::Cl100kBase, tiktoken_rs::cl100k_base_singleton()),
    ] {
        for text in &texts {
            let ours = tokens::count_text(Counter::Tiktoken(encoding), text).unwrap();
            assert_eq!(ours, bpe.encode_ordinary(text).len() as u64, "{encoding:?}");
        }
    }
}
