//! The shared wire vectors in `proto-spec/vectors/`, held against the codec.
//!
//! Every file there is read back: each case's hex is split and decoded, must
//! equal the case's JSON value, and must re-encode to the same bytes; invalid
//! cases must fail the way they say. The vectors must cover every `Request`,
//! `Cost` and `Response` variant and every error code, and the variant tags
//! must be the ones `PROTOCOL.md` tabulates.
//!
//! The files are generated from [`catalogue`]; after changing it (or the
//! messages) run `RATEKEEPER_WRITE_VECTORS=1 cargo test --test it vectors::` to
//! rewrite them, and review the diff: a changed byte is a protocol change.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bincode::error::DecodeError;
use bincode::{Decode, Encode};
use ratekeeper::proto::{
    Acquire, Block, BucketInspection, BucketStatus, BudgetStatus, ChatMessage, ChatRequest,
    ClientFrame, Conversation, Cost, ErrorCode, Feedback, FrameError, Header, HealthStatus,
    Inspection, LimitInspection, LimitStatus, MAX_FRAME_LEN, MAX_IN_FLIGHT, PROTOCOL_VERSION,
    Request, Response, ServerFrame, Turn, Usage, decode_payload, encode_frame, split_frame,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Set to `1` to rewrite the vector files from [`catalogue`].
const WRITE_ENV: &str = "RATEKEEPER_WRITE_VECTORS";

const CLIENT_FRAME: &str = "ClientFrame";
const SERVER_FRAME: &str = "ServerFrame";
/// `error` of a case whose payload must fail to decode (frame boundary intact).
const MALFORMED: &str = "malformed";
/// `error` of a case whose length prefix must be refused before buffering.
const FRAME_TOO_LARGE: &str = "frame_too_large";
/// `error` of a request of a later protocol revision (PROTOCOL.md §10).
const UNSUPPORTED: &str = "unsupported";

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto-spec/vectors")
}

// ---------------------------------------------------------------------------
// The file format, shared by the writer and the reader.
// ---------------------------------------------------------------------------

/// One vector file: every case in it is a frame of type `frame_type`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorFile<V> {
    /// `"ClientFrame"` or `"ServerFrame"`.
    #[serde(rename = "type")]
    frame_type: String,
    /// The message the file is about, e.g. `"Request::Acquire"`.
    message: String,
    description: String,
    cases: Vec<VectorCase<V>>,
}

/// One frame: either a valid one with its decoded `value`, or bytes that must
/// be refused with `error`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorCase<V> {
    name: String,
    description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<V>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The whole frame, length prefix included, as lowercase hex.
    hex: String,
}

/// A frame of either direction, serialized without a wrapper so the JSON
/// keeps the struct's field (= wire) order.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum AnyFrame {
    Client(ClientFrame),
    Server(ServerFrame),
}

// ---------------------------------------------------------------------------
// The catalogue: every vector, as Rust values.
// ---------------------------------------------------------------------------

struct FileSpec {
    file: &'static str,
    frame_type: &'static str,
    message: &'static str,
    description: &'static str,
    cases: Vec<CaseSpec>,
}

struct CaseSpec {
    name: &'static str,
    description: &'static str,
    expect: Expect,
}

enum Expect {
    Client(ClientFrame),
    Server(ServerFrame),
    /// Raw frame bytes whose payload must fail to decode.
    Malformed(Vec<u8>),
    /// Raw frame bytes of a request tag this revision does not know: they
    /// fail to decode, and the daemon answers `Unsupported`.
    Unsupported(Vec<u8>),
    /// Raw bytes whose length prefix must be refused.
    TooLarge(Vec<u8>),
}

fn case(name: &'static str, description: &'static str, expect: Expect) -> CaseSpec {
    CaseSpec {
        name,
        description,
        expect,
    }
}

fn client(request_id: u64, request: Request) -> Expect {
    Expect::Client(ClientFrame {
        request_id,
        request,
    })
}

fn server(request_id: u64, response: Response) -> Expect {
    Expect::Server(ServerFrame {
        request_id,
        response,
    })
}

fn s(text: &str) -> String {
    text.to_owned()
}

fn tokens(input_tokens: u64, output_tokens: u64) -> Cost {
    Cost::Tokens {
        input_tokens,
        output_tokens,
    }
}

fn acquire(limit: &str, tenant: Option<&str>, priority: Option<&str>, cost: Cost) -> Acquire {
    Acquire {
        limit: s(limit),
        tenant: tenant.map(s),
        priority: priority.map(s),
        cost,
        max_wait_ms: None,
    }
}

fn usage(input: u64, cached_input: u64, cache_write: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        cached_input_tokens: cached_input,
        cache_write_tokens: cache_write,
        output_tokens: output,
    }
}

fn usage_report(lease: u64, usage: Usage) -> Request {
    Request::UsageReport { lease, usage }
}

fn message(role: &str, content: &[&str]) -> ChatMessage {
    ChatMessage {
        role: s(role),
        name: None,
        content: content.iter().copied().map(s).collect(),
        tool_calls_json: None,
    }
}

fn bucket(name: &str, capacity: u64, level: i64, per_minute: u64) -> BucketStatus {
    BucketStatus {
        name: s(name),
        capacity,
        level,
        per_minute,
    }
}

/// A frame built from raw parts: length prefix computed from the payload.
fn header(name: &str, value: &str) -> Header {
    Header {
        name: s(name),
        value: s(value),
    }
}

fn health_ok() -> HealthStatus {
    HealthStatus {
        ready: true,
        store: s("redis"),
        store_up: true,
        store_down_ms: 0,
        policy: s("fail_closed"),
        reason: s("the redis store answers"),
    }
}

fn inspected(
    name: &str,
    tenant: Option<&str>,
    capacity: u64,
    level: Option<i64>,
) -> BucketInspection {
    BucketInspection {
        name: s(name),
        tenant: tenant.map(s),
        capacity,
        per_minute: capacity,
        level,
    }
}

fn raw_frame(parts: &[&[u8]]) -> Vec<u8> {
    let payload: Vec<u8> = parts.concat();
    let mut frame = u32::try_from(payload.len())
        .expect("small payload")
        .to_le_bytes()
        .to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// A multi-part conversation with names, tool definitions and tool calls.
fn rich_chat() -> ChatRequest {
    ChatRequest {
        messages: vec![
            message("system", &["You are terse."]),
            ChatMessage {
                role: s("user"),
                name: Some(s("alice")),
                content: vec![s("Describe this image:"), s("Résumé of 東京 ☕")],
                tool_calls_json: None,
            },
            ChatMessage {
                role: s("assistant"),
                name: None,
                content: vec![],
                tool_calls_json: Some(s(
                    r#"[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]"#,
                )),
            },
            ChatMessage {
                role: s("tool"),
                name: Some(s("weather")),
                content: vec![s(r#"{"temp_c":-3}"#)],
                tool_calls_json: None,
            },
        ],
        tools_json: Some(s(
            r#"[{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}]"#,
        )),
        max_output_tokens: Some(512),
    }
}

fn text(text: &str) -> Block {
    Block::Text { text: s(text) }
}

fn turn(role: &str, blocks: Vec<Block>) -> Turn {
    Turn {
        role: s(role),
        name: None,
        blocks,
        tool_calls_json: None,
    }
}

/// An Anthropic Messages request: a system prompt in two blocks, an image,
/// a tool use and its result, tool definitions.
fn anthropic_conversation() -> Conversation {
    Conversation {
        api: s("anthropic"),
        system: vec![s("You are terse."), s("Cite sources.")],
        messages: vec![
            turn(
                "user",
                vec![
                    Block::Image {
                        width: 1000,
                        height: 1000,
                        detail: s(""),
                    },
                    text("Weather in 東京?"),
                ],
            ),
            turn(
                "assistant",
                vec![text("get_weather"), text(r#"{"city":"Tokyo"}"#)],
            ),
            turn("user", vec![text("18°C, clear")]),
        ],
        tools_json: Some(s(
            r#"[{"name":"get_weather","input_schema":{"type":"object"}}]"#,
        )),
        max_output_tokens: Some(1024),
    }
}

/// The worked example of PROTOCOL.md §9.
fn small_conversation() -> Conversation {
    Conversation {
        api: s("anthropic"),
        system: vec![s("Hi")],
        messages: vec![turn(
            "user",
            vec![
                text("Yo"),
                Block::Image {
                    width: 200,
                    height: 200,
                    detail: s(""),
                },
            ],
        )],
        tools_json: None,
        max_output_tokens: Some(64),
    }
}

fn catalogue() -> Vec<FileSpec> {
    vec![
        FileSpec {
            file: "request_hello.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Hello",
            description: "The first frame of every connection: protocol version and client name.",
            cases: vec![
                case(
                    "typical",
                    "Protocol version 1; the worked example of PROTOCOL.md.",
                    client(
                        1,
                        Request::Hello {
                            protocol_version: PROTOCOL_VERSION,
                            client_name: s("celery-3"),
                        },
                    ),
                ),
                case(
                    "empty_client_name",
                    "An empty string is a u64 length of zero and no bytes.",
                    client(
                        1,
                        Request::Hello {
                            protocol_version: PROTOCOL_VERSION,
                            client_name: s(""),
                        },
                    ),
                ),
                case(
                    "multibyte_client_name",
                    "String lengths count UTF-8 bytes, not characters: 'wörker-東京-🚀' is 19 bytes.",
                    client(
                        2,
                        Request::Hello {
                            protocol_version: PROTOCOL_VERSION,
                            client_name: s("wörker-東京-🚀"),
                        },
                    ),
                ),
                case(
                    "max_values",
                    "Largest request id and protocol version; the daemon would answer UnsupportedVersion.",
                    client(
                        u64::MAX,
                        Request::Hello {
                            protocol_version: u16::MAX,
                            client_name: s("gunicorn-worker pid=4711"),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_acquire.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Acquire",
            description: "Reserve a cost in every bucket of a limit, waiting up to max_wait_ms.",
            cases: vec![
                case(
                    "all_options_none",
                    "No tenant, default priority, the priority class's default wait.",
                    client(
                        2,
                        Request::Acquire(acquire("gpt-4o", None, None, tokens(1200, 800))),
                    ),
                ),
                case(
                    "all_options_some",
                    "Tenant, priority class and an explicit wait of 5 s; the worked example of PROTOCOL.md.",
                    client(
                        2,
                        Request::Acquire(Acquire {
                            max_wait_ms: Some(5000),
                            ..acquire("gpt-4o", Some("acme"), Some("batch"), tokens(1200, 800))
                        }),
                    ),
                ),
                case(
                    "no_wait",
                    "max_wait_ms Some(0): grant only if the reservation is due at once.",
                    client(
                        3,
                        Request::Acquire(Acquire {
                            max_wait_ms: Some(0),
                            ..acquire("gpt-4o", None, Some("interactive"), tokens(10, 0))
                        }),
                    ),
                ),
                case(
                    "some_empty_strings",
                    "Some(\"\") is byte 1 then a zero length, distinct from None (byte 0).",
                    client(
                        4,
                        Request::Acquire(acquire("", Some(""), Some(""), tokens(1, 1))),
                    ),
                ),
                case(
                    "max_values",
                    "u64::MAX everywhere a u64 appears.",
                    client(
                        u64::MAX,
                        Request::Acquire(Acquire {
                            max_wait_ms: Some(u64::MAX),
                            ..acquire("gpt-4o", None, None, tokens(u64::MAX, u64::MAX))
                        }),
                    ),
                ),
                case(
                    "multibyte_names",
                    "Limit and tenant names with multi-byte UTF-8.",
                    client(
                        5,
                        Request::Acquire(acquire(
                            "claude-3.5-sonnet-ü",
                            Some("客户-42"),
                            None,
                            tokens(300, 0),
                        )),
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_report.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Report",
            description: "Settle a granted lease with the usage the provider reported.",
            cases: vec![
                case(
                    "typical",
                    "Lease 42 used 1150 input and 230 output tokens.",
                    client(
                        6,
                        Request::Report {
                            lease: 42,
                            input_tokens: 1150,
                            output_tokens: 230,
                        },
                    ),
                ),
                case(
                    "zero_usage",
                    "The provider reported no usage at all.",
                    client(
                        7,
                        Request::Report {
                            lease: 1,
                            input_tokens: 0,
                            output_tokens: 0,
                        },
                    ),
                ),
                case(
                    "max_values",
                    "u64::MAX lease and token counts.",
                    client(
                        u64::MAX,
                        Request::Report {
                            lease: u64::MAX,
                            input_tokens: u64::MAX,
                            output_tokens: u64::MAX,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_release.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Release",
            description: "Give a granted lease back unused.",
            cases: vec![
                case(
                    "typical",
                    "Release lease 42.",
                    client(8, Request::Release { lease: 42 }),
                ),
                case(
                    "max_values",
                    "u64::MAX request id and lease.",
                    client(u64::MAX, Request::Release { lease: u64::MAX }),
                ),
            ],
        },
        FileSpec {
            file: "request_cancel.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Cancel",
            description: "Abandon an unanswered Acquire on the same connection.",
            cases: vec![
                case(
                    "typical",
                    "Request 9 cancels the acquire sent as request 2.",
                    client(9, Request::Cancel { request_id: 2 }),
                ),
                case(
                    "max_values",
                    "u64::MAX request ids.",
                    client(
                        u64::MAX - 1,
                        Request::Cancel {
                            request_id: u64::MAX,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_estimate.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Estimate",
            description: "Count the tokens a cost would reserve on a limit, reserving nothing.",
            cases: vec![
                case(
                    "tokens",
                    "A token cost.",
                    client(
                        10,
                        Request::Estimate {
                            limit: s("gpt-4o"),
                            cost: tokens(100, 50),
                        },
                    ),
                ),
                case(
                    "messages",
                    "A chat cost: one user message of one part, no tools, the limit's default max_tokens.",
                    client(
                        11,
                        Request::Estimate {
                            limit: s("gpt-4o"),
                            cost: Cost::Messages(ChatRequest {
                                messages: vec![message("user", &["Hello!"])],
                                tools_json: None,
                                max_output_tokens: None,
                            }),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_status.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Status",
            description: "Bucket levels of one limit, or of every limit when limit is None.",
            cases: vec![
                case(
                    "every_limit",
                    "limit None: byte 0.",
                    client(12, Request::Status { limit: None }),
                ),
                case(
                    "one_limit",
                    "limit Some(\"gpt-4o\").",
                    client(
                        13,
                        Request::Status {
                            limit: Some(s("gpt-4o")),
                        },
                    ),
                ),
                case(
                    "empty_limit_name",
                    "limit Some(\"\"): byte 1 then a zero length, not the same as None.",
                    client(14, Request::Status { limit: Some(s("")) }),
                ),
            ],
        },
        FileSpec {
            file: "request_ping.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Ping",
            description: "Liveness check: a unit variant, just the tag.",
            cases: vec![
                case(
                    "typical",
                    "Request id 7; the worked example of PROTOCOL.md.",
                    client(7, Request::Ping),
                ),
                case(
                    "max_request_id",
                    "Request id u64::MAX.",
                    client(u64::MAX, Request::Ping),
                ),
            ],
        },
        FileSpec {
            file: "request_health.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Health",
            description: "Readiness (revision 2): a unit variant, just the tag.",
            cases: vec![case(
                "typical",
                "Request id 15.",
                client(15, Request::Health),
            )],
        },
        FileSpec {
            file: "request_inspect.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Inspect",
            description: "The store's state and the buckets of one limit or all (revision 2).",
            cases: vec![
                case(
                    "all_limits",
                    "limit None: every configured limit.",
                    client(16, Request::Inspect { limit: None }),
                ),
                case(
                    "one_limit",
                    "limit Some(\"gpt-4o\").",
                    client(
                        17,
                        Request::Inspect {
                            limit: Some(s("gpt-4o")),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_feedback.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Feedback",
            description: "What the provider answered a call on a limit: its status and rate-limit headers (revision 3).",
            cases: vec![
                case(
                    "openai_429",
                    "A 429 from OpenAI with retry-after-ms and the remaining counts.",
                    client(
                        18,
                        Request::Feedback(Feedback {
                            limit: s("gpt-4o"),
                            status: 429,
                            since_grant_ms: 180,
                            headers: vec![
                                header("retry-after-ms", "1250"),
                                header("x-ratelimit-remaining-requests", "0"),
                                header("x-ratelimit-reset-tokens", "6m0s"),
                            ],
                        }),
                    ),
                ),
                case(
                    "no_headers",
                    "A 200 whose headers said nothing this daemon uses: an empty list.",
                    client(
                        19,
                        Request::Feedback(Feedback {
                            limit: s("claude"),
                            status: 200,
                            since_grant_ms: 0,
                            headers: vec![],
                        }),
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_lease_feedback.json",
            frame_type: CLIENT_FRAME,
            message: "Request::LeaseFeedback",
            description: "Feedback that names the lease of the call it answers, so the daemon places the provider's counts exactly (revision 5).",
            cases: vec![case(
                "openai_200",
                "A 200 from OpenAI with its remaining counts, for lease 0x0123456789abcdef.",
                client(
                    37,
                    Request::LeaseFeedback {
                        lease: 0x0123_4567_89ab_cdef,
                        feedback: Feedback {
                            limit: s("gpt-4o"),
                            status: 200,
                            since_grant_ms: 95,
                            headers: vec![
                                header("x-ratelimit-remaining-requests", "2999"),
                                header("x-ratelimit-remaining-tokens", "4200"),
                            ],
                        },
                    },
                ),
            )],
        },
        FileSpec {
            file: "request_usage_report.json",
            frame_type: CLIENT_FRAME,
            message: "Request::UsageReport",
            description: "Settle a granted lease with the usage split as the provider bills it: full-price input, cache reads, cache writes, output (revision 6).",
            cases: vec![
                case(
                    "anthropic_cache",
                    "Lease 42 of an Anthropic call: 120 input_tokens, 1000 cache_read_input_tokens, 300 cache_creation_input_tokens, 230 output_tokens.",
                    client(38, usage_report(42, usage(120, 1000, 300, 230))),
                ),
                case(
                    "openai_cache",
                    "Lease 43 of an OpenAI call: prompt_tokens 1150 of which 1024 cached_tokens, 230 completion_tokens; input is their difference, 126, and nothing is written to a cache.",
                    client(39, usage_report(43, usage(126, 1024, 0, 230))),
                ),
                case(
                    "zero_usage",
                    "The provider reported no usage at all.",
                    client(40, usage_report(1, usage(0, 0, 0, 0))),
                ),
                case(
                    "max_values",
                    "u64::MAX request id, lease and token counts.",
                    client(
                        u64::MAX,
                        usage_report(u64::MAX, usage(u64::MAX, u64::MAX, u64::MAX, u64::MAX)),
                    ),
                ),
            ],
        },
        FileSpec {
            file: "request_budgets.json",
            frame_type: CLIENT_FRAME,
            message: "Request::Budgets",
            description: "Each spend budget of one limit, or of every limit (revision 6).",
            cases: vec![
                case(
                    "every_limit",
                    "Every limit's budgets.",
                    client(41, Request::Budgets { limit: None }),
                ),
                case(
                    "one_limit",
                    "The budgets of limit \"gpt-4o\".",
                    client(
                        42,
                        Request::Budgets {
                            limit: Some(s("gpt-4o")),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "cost_tokens.json",
            frame_type: CLIENT_FRAME,
            message: "Cost::Tokens",
            description: "Token counts known to the client, inside Acquire and Estimate.",
            cases: vec![
                case(
                    "acquire",
                    "Input and output tokens.",
                    client(
                        20,
                        Request::Acquire(acquire("gpt-4o", None, None, tokens(1200, 800))),
                    ),
                ),
                case(
                    "output_only",
                    "No input tokens, 256 output tokens.",
                    client(
                        21,
                        Request::Acquire(acquire("gpt-4o", None, None, tokens(0, 256))),
                    ),
                ),
                case(
                    "estimate_max_values",
                    "u64::MAX input and output tokens in an Estimate.",
                    client(
                        22,
                        Request::Estimate {
                            limit: s("gpt-4o"),
                            cost: tokens(u64::MAX, u64::MAX),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "cost_messages.json",
            frame_type: CLIENT_FRAME,
            message: "Cost::Messages",
            description: "Chat messages for the daemon to count, inside Acquire and Estimate.",
            cases: vec![
                case(
                    "empty",
                    "No messages, no tools, no max_tokens: the smallest Messages cost.",
                    client(
                        30,
                        Request::Acquire(acquire(
                            "gpt-4o",
                            None,
                            None,
                            Cost::Messages(ChatRequest {
                                messages: vec![],
                                tools_json: None,
                                max_output_tokens: None,
                            }),
                        )),
                    ),
                ),
                case(
                    "single_message",
                    "One user message whose content is one plain string.",
                    client(
                        31,
                        Request::Acquire(acquire(
                            "gpt-4o",
                            None,
                            None,
                            Cost::Messages(ChatRequest {
                                messages: vec![message("user", &["What is 2+2?"])],
                                tools_json: None,
                                max_output_tokens: Some(16),
                            }),
                        )),
                    ),
                ),
                case(
                    "several_messages_and_parts",
                    "Four messages: several content parts, a message without content, names, tool calls, tool definitions, multi-byte text.",
                    client(
                        32,
                        Request::Acquire(Acquire {
                            max_wait_ms: Some(30_000),
                            ..acquire(
                                "gpt-4o",
                                Some("acme"),
                                Some("interactive"),
                                Cost::Messages(rich_chat()),
                            )
                        }),
                    ),
                ),
                case(
                    "empty_part_vs_no_part",
                    "content [\"\"] (count 1, one empty string) next to content [] (count 0).",
                    client(
                        33,
                        Request::Estimate {
                            limit: s("gpt-4o"),
                            cost: Cost::Messages(ChatRequest {
                                messages: vec![message("user", &[""]), message("user", &[])],
                                tools_json: Some(s("")),
                                max_output_tokens: Some(u64::MAX),
                            }),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "cost_conversation.json",
            frame_type: CLIENT_FRAME,
            message: "Cost::Conversation",
            description: "A request of content blocks (revision 4): a system prompt, text and image blocks, the provider whose rules count them; inside Acquire and Estimate.",
            cases: vec![
                case(
                    "anthropic",
                    "Anthropic's shape: system in two blocks, an image of 1000 × 1000 px, a tool use (name, input) and its result, tool definitions.",
                    client(
                        34,
                        Request::Acquire(acquire(
                            "claude",
                            None,
                            None,
                            Cost::Conversation(anthropic_conversation()),
                        )),
                    ),
                ),
                case(
                    "worked_example",
                    "A system prompt, a text and a 200 × 200 px image; the worked example of PROTOCOL.md.",
                    client(
                        3,
                        Request::Estimate {
                            limit: s("claude"),
                            cost: Cost::Conversation(small_conversation()),
                        },
                    ),
                ),
                case(
                    "openai_images",
                    "OpenAI's shape: a named message with a low-detail image and one of unknown size (0 × 0), and a tool call.",
                    client(
                        35,
                        Request::Estimate {
                            limit: s("gpt-4o"),
                            cost: Cost::Conversation(Conversation {
                                api: s("openai"),
                                system: vec![],
                                messages: vec![
                                    Turn {
                                        role: s("user"),
                                        name: Some(s("alice")),
                                        blocks: vec![
                                            text("Compare:"),
                                            Block::Image {
                                                width: 4096,
                                                height: 8192,
                                                detail: s("low"),
                                            },
                                            Block::Image {
                                                width: 0,
                                                height: 0,
                                                detail: s("auto"),
                                            },
                                        ],
                                        tool_calls_json: None,
                                    },
                                    Turn {
                                        role: s("assistant"),
                                        name: None,
                                        blocks: vec![],
                                        tool_calls_json: Some(s(
                                            r#"[{"id":"call_1","type":"function","function":{"name":"zoom","arguments":"{}"}}]"#,
                                        )),
                                    },
                                ],
                                tools_json: None,
                                max_output_tokens: None,
                            }),
                        },
                    ),
                ),
                case(
                    "empty",
                    "No system, no messages, no tools, no max_tokens: the smallest Conversation cost.",
                    client(
                        36,
                        Request::Estimate {
                            limit: s("claude"),
                            cost: Cost::Conversation(Conversation {
                                api: s("anthropic"),
                                system: vec![],
                                messages: vec![],
                                tools_json: None,
                                max_output_tokens: None,
                            }),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_hello.json",
            frame_type: SERVER_FRAME,
            message: "Response::Hello",
            description: "Answer to Hello: the version in use and the bounds this daemon enforces.",
            cases: vec![case(
                "typical",
                "Version 1, 4 MiB frames, 1024 requests in flight.",
                server(
                    1,
                    Response::Hello {
                        protocol_version: PROTOCOL_VERSION,
                        server: s("ratekeeper 0.1.0"),
                        max_frame_len: MAX_FRAME_LEN,
                        max_in_flight: MAX_IN_FLIGHT,
                    },
                ),
            )],
        },
        FileSpec {
            file: "response_granted.json",
            frame_type: SERVER_FRAME,
            message: "Response::Granted",
            description: "Answer to Acquire: the cost is reserved under a lease.",
            cases: vec![
                case(
                    "immediate",
                    "Granted at once.",
                    server(
                        2,
                        Response::Granted {
                            lease: 42,
                            tokens: 2000,
                            waited_ms: 0,
                        },
                    ),
                ),
                case(
                    "after_wait",
                    "Held back 1.5 s until the reservation was due.",
                    server(
                        3,
                        Response::Granted {
                            lease: 43,
                            tokens: 10,
                            waited_ms: 1500,
                        },
                    ),
                ),
                case(
                    "max_values",
                    "u64::MAX everywhere.",
                    server(
                        u64::MAX,
                        Response::Granted {
                            lease: u64::MAX,
                            tokens: u64::MAX,
                            waited_ms: u64::MAX,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_denied.json",
            frame_type: SERVER_FRAME,
            message: "Response::Denied",
            description: "Answer to Acquire: not grantable within max_wait_ms; nothing was reserved.",
            cases: vec![
                case(
                    "tokens",
                    "The token bucket refused; retry after 2.5 s.",
                    server(
                        2,
                        Response::Denied {
                            retry_after_ms: 2500,
                            bucket: s("tokens"),
                        },
                    ),
                ),
                case(
                    "requests",
                    "The request bucket refused.",
                    server(
                        3,
                        Response::Denied {
                            retry_after_ms: 120,
                            bucket: s("requests"),
                        },
                    ),
                ),
                case(
                    "tenant",
                    "The tenant's share refused.",
                    server(
                        4,
                        Response::Denied {
                            retry_after_ms: 60_000,
                            bucket: s("tenant"),
                        },
                    ),
                ),
                case(
                    "edge_values",
                    "u64::MAX retry delay and an empty bucket name.",
                    server(
                        u64::MAX,
                        Response::Denied {
                            retry_after_ms: u64::MAX,
                            bucket: s(""),
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_settled.json",
            frame_type: SERVER_FRAME,
            message: "Response::Settled",
            description: "Answer to Report and UsageReport: tokens given back (an i64; negative means debited).",
            cases: vec![
                case(
                    "returned",
                    "620 reserved tokens were not used and went back.",
                    server(
                        6,
                        Response::Settled {
                            tokens_returned: 620,
                        },
                    ),
                ),
                case(
                    "exact",
                    "The usage matched the reservation.",
                    server(7, Response::Settled { tokens_returned: 0 }),
                ),
                case(
                    "overrun",
                    "The usage exceeded the reservation by 250 tokens, which were debited: two's complement.",
                    server(
                        8,
                        Response::Settled {
                            tokens_returned: -250,
                        },
                    ),
                ),
                case(
                    "i64_min",
                    "The most negative value.",
                    server(
                        9,
                        Response::Settled {
                            tokens_returned: i64::MIN,
                        },
                    ),
                ),
                case(
                    "i64_max",
                    "The most positive value.",
                    server(
                        10,
                        Response::Settled {
                            tokens_returned: i64::MAX,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_released.json",
            frame_type: SERVER_FRAME,
            message: "Response::Released",
            description: "Answer to Release: tokens given back (a u64).",
            cases: vec![
                case(
                    "typical",
                    "The whole reservation of 2000 tokens went back.",
                    server(
                        8,
                        Response::Released {
                            tokens_returned: 2000,
                        },
                    ),
                ),
                case(
                    "max_values",
                    "u64::MAX.",
                    server(
                        u64::MAX,
                        Response::Released {
                            tokens_returned: u64::MAX,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_cancelled.json",
            frame_type: SERVER_FRAME,
            message: "Response::Cancelled",
            description: "Answer to Cancel (not the error code Cancelled): whether an unanswered acquire with that id existed.",
            cases: vec![
                case(
                    "found",
                    "found true: bool byte 1.",
                    server(9, Response::Cancelled { found: true }),
                ),
                case(
                    "not_found",
                    "found false: bool byte 0.",
                    server(10, Response::Cancelled { found: false }),
                ),
            ],
        },
        FileSpec {
            file: "response_estimated.json",
            frame_type: SERVER_FRAME,
            message: "Response::Estimated",
            description: "Answer to Estimate: what an acquire with that cost would reserve.",
            cases: vec![
                case(
                    "typical",
                    "100 input and 50 output tokens.",
                    server(
                        10,
                        Response::Estimated {
                            input_tokens: 100,
                            output_tokens: 50,
                        },
                    ),
                ),
                case(
                    "max_values",
                    "u64::MAX.",
                    server(
                        u64::MAX,
                        Response::Estimated {
                            input_tokens: u64::MAX,
                            output_tokens: u64::MAX,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_status.json",
            frame_type: SERVER_FRAME,
            message: "Response::Status",
            description: "Answer to Status: the store kind and the state of each limit's buckets.",
            cases: vec![
                case(
                    "no_limits",
                    "An empty list: a u64 count of zero.",
                    server(
                        12,
                        Response::Status {
                            store: s("embedded"),
                            limits: vec![],
                        },
                    ),
                ),
                case(
                    "one_limit",
                    "One limit with a token and a request bucket.",
                    server(
                        13,
                        Response::Status {
                            store: s("redis"),
                            limits: vec![LimitStatus {
                                name: s("gpt-4o"),
                                waiters: 0,
                                buckets: vec![
                                    bucket("tokens", 30_000, 30_000, 30_000),
                                    bucket("requests", 500, 499, 500),
                                ],
                            }],
                        },
                    ),
                ),
                case(
                    "several_limits",
                    "Three limits: separate input/output buckets, a negative level while acquires wait, a limit with no buckets, extreme values.",
                    server(
                        14,
                        Response::Status {
                            store: s("redis"),
                            limits: vec![
                                LimitStatus {
                                    name: s("claude-3.5-sonnet"),
                                    waiters: 3,
                                    buckets: vec![
                                        bucket("input_tokens", 40_000, -1_250, 40_000),
                                        bucket("output_tokens", 8_000, 7_999, 8_000),
                                        bucket("requests", 50, 0, 50),
                                    ],
                                },
                                LimitStatus {
                                    name: s("embeddings-東京"),
                                    waiters: 0,
                                    buckets: vec![],
                                },
                                LimitStatus {
                                    name: s("edge"),
                                    waiters: u64::MAX,
                                    buckets: vec![
                                        bucket("tokens", u64::MAX, i64::MIN, u64::MAX),
                                        bucket("", 0, i64::MAX, 0),
                                    ],
                                },
                            ],
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_pong.json",
            frame_type: SERVER_FRAME,
            message: "Response::Pong",
            description: "Answer to Ping: a unit variant, just the tag.",
            cases: vec![
                case("typical", "Answer to ping 7.", server(7, Response::Pong)),
                case(
                    "max_request_id",
                    "Request id u64::MAX.",
                    server(u64::MAX, Response::Pong),
                ),
            ],
        },
        FileSpec {
            file: "response_error.json",
            frame_type: SERVER_FRAME,
            message: "Response::Error",
            description: "A failed request: a u16 code from the error table and a message for humans.",
            cases: error_cases(),
        },
        FileSpec {
            file: "response_health.json",
            frame_type: SERVER_FRAME,
            message: "Response::Health",
            description: "Answer to Health: ready or not, the store's state and policy, and why.",
            cases: vec![
                case(
                    "ready",
                    "The Redis store answers.",
                    server(15, Response::Health(health_ok())),
                ),
                case(
                    "serving_on_policy",
                    "Redis has failed for 2.5 s; the local policy grants, so the daemon is ready.",
                    server(
                        16,
                        Response::Health(HealthStatus {
                            ready: true,
                            store_up: false,
                            store_down_ms: 2_500,
                            policy: s("local"),
                            reason: s("serving on the failure policy"),
                            ..health_ok()
                        }),
                    ),
                ),
                case(
                    "embedded_not_ready",
                    "The embedded store (no policy: an empty string) while draining.",
                    server(
                        u64::MAX,
                        Response::Health(HealthStatus {
                            ready: false,
                            store: s("embedded"),
                            store_up: true,
                            store_down_ms: u64::MAX,
                            policy: s(""),
                            reason: s("shutting down"),
                        }),
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_inspection.json",
            frame_type: SERVER_FRAME,
            message: "Response::Inspection",
            description: "Answer to Inspect: the health fields, where the levels come from, and each limit's buckets with tenant buckets; a level is None when unknown.",
            cases: vec![
                case(
                    "no_limits",
                    "Nothing configured: an empty list.",
                    server(
                        16,
                        Response::Inspection(Inspection {
                            health: health_ok(),
                            levels_from: s("store"),
                            limits: vec![],
                        }),
                    ),
                ),
                case(
                    "tenants_and_unknown_levels",
                    "A limit with a request bucket and a tenant bucket, levels known; one whose levels are unknown.",
                    server(
                        17,
                        Response::Inspection(Inspection {
                            health: health_ok(),
                            levels_from: s("none"),
                            limits: vec![
                                LimitInspection {
                                    name: s("gpt-4o"),
                                    waiters: 2,
                                    buckets: vec![
                                        inspected("tokens", None, 30_000, Some(-120)),
                                        inspected("tenant", Some("acme"), 7_500, Some(7_500)),
                                    ],
                                },
                                LimitInspection {
                                    name: s("claude"),
                                    waiters: u64::MAX,
                                    buckets: vec![inspected("requests", None, u64::MAX, None)],
                                },
                            ],
                        }),
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_budgets.json",
            frame_type: SERVER_FRAME,
            message: "Response::Budgets",
            description: "Answer to Budgets: each budget's owner, tenant, bucket name, period, amount, spent, reserved, remaining (micro-units) and reset time (revision 6).",
            cases: vec![
                case(
                    "none",
                    "No budget is configured: an empty list.",
                    server(43, Response::Budgets { budgets: vec![] }),
                ),
                case(
                    "limit_tenant_and_group",
                    "A limit's daily budget of $1.00 with $0.25 spent and $0.05 reserved; tenant acme's on the group, overrun by $0.01, its month resetting at 2027-01-01T00:00Z; a rolling budget.",
                    server(
                        44,
                        Response::Budgets {
                            budgets: vec![
                                BudgetStatus {
                                    owner: s("gpt-4o"),
                                    group: false,
                                    tenant: None,
                                    name: s("budget_day"),
                                    period: s("2026-12-07"),
                                    amount: 1_000_000,
                                    spent: 250_000,
                                    reserved: 50_000,
                                    remaining: 700_000,
                                    resets_at_ms: 1_796_688_000_000,
                                },
                                BudgetStatus {
                                    owner: s("org"),
                                    group: true,
                                    tenant: Some(s("acme")),
                                    name: s("group_tenant_budget_month"),
                                    period: s("2026-12"),
                                    amount: 5_000_000,
                                    spent: 5_010_000,
                                    reserved: 0,
                                    remaining: -10_000,
                                    resets_at_ms: 1_798_761_600_000,
                                },
                                BudgetStatus {
                                    owner: s("gpt-4o"),
                                    group: false,
                                    tenant: None,
                                    name: s("budget_rolling_hour"),
                                    period: s(""),
                                    amount: u64::MAX,
                                    spent: 0,
                                    reserved: 0,
                                    remaining: i64::MIN,
                                    resets_at_ms: 0,
                                },
                            ],
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "response_noted.json",
            frame_type: SERVER_FRAME,
            message: "Response::Noted",
            description: "Answer to Feedback: the pause applied and how many buckets were lowered.",
            cases: vec![
                case(
                    "paused",
                    "A 429 paused the limit 1 250 ms and lowered its two buckets.",
                    server(
                        18,
                        Response::Noted {
                            paused_ms: 1250,
                            lowered: 2,
                        },
                    ),
                ),
                case(
                    "nothing_to_do",
                    "Headers that changed nothing.",
                    server(
                        19,
                        Response::Noted {
                            paused_ms: 0,
                            lowered: 0,
                        },
                    ),
                ),
            ],
        },
        FileSpec {
            file: "invalid_client_frames.json",
            frame_type: CLIENT_FRAME,
            message: "invalid",
            description: "Client frames the daemon must refuse: error malformed (answer MalformedMessage, keep the connection), unsupported (a request tag of a later revision: no decoder of this revision decodes it; the daemon answers Unsupported and keeps the connection) or frame_too_large (answer FrameTooLarge with request id 0, close).",
            cases: invalid_client_cases(),
        },
        FileSpec {
            file: "invalid_server_frames.json",
            frame_type: SERVER_FRAME,
            message: "invalid",
            description: "Server frames a client decoder must refuse.",
            cases: invalid_server_cases(),
        },
    ]
}

/// One error per code, a connection-level one and one with a code this build
/// does not know.
fn error_cases() -> Vec<CaseSpec> {
    let error = |request_id, code: u16, message: &str| {
        server(
            request_id,
            Response::Error {
                code,
                message: s(message),
            },
        )
    };
    let mut cases: Vec<CaseSpec> = ErrorCode::ALL
        .iter()
        .map(|&code| {
            let (name, description, message) = match code {
                ErrorCode::UnsupportedVersion => (
                    "unsupported_version",
                    "Code 1, answering a Hello of version 2; the daemon then closes.",
                    "protocol version 2 is not supported; this daemon speaks 1",
                ),
                ErrorCode::HelloRequired => (
                    "hello_required",
                    "Code 2, answering a first frame that is not Hello; the daemon then closes.",
                    "the first frame must be Hello",
                ),
                ErrorCode::FrameTooLarge => (
                    "frame_too_large",
                    "Code 3, connection-level: request id 0; the daemon then closes.",
                    "frame of 4194305 bytes exceeds the maximum of 4194304 bytes",
                ),
                ErrorCode::MalformedMessage => (
                    "malformed_message",
                    "Code 4, addressed to the id in the payload's first 8 bytes.",
                    "malformed message: UnexpectedVariant",
                ),
                ErrorCode::InvalidRequest => (
                    "invalid_request",
                    "Code 5.",
                    "limit name is 200 bytes; the maximum is 128",
                ),
                ErrorCode::UnknownLimit => ("unknown_limit", "Code 6.", "no limit named \"gpt-5\""),
                ErrorCode::UnknownPriority => (
                    "unknown_priority",
                    "Code 7.",
                    "no priority class named \"urgent\"",
                ),
                ErrorCode::CostExceedsCapacity => (
                    "cost_exceeds_capacity",
                    "Code 8.",
                    "cost of 50000 tokens exceeds the capacity 30000 of bucket \"tokens\"",
                ),
                ErrorCode::DuplicateRequestId => (
                    "duplicate_request_id",
                    "Code 9.",
                    "request id 2 is already in flight",
                ),
                ErrorCode::TooManyInFlight => (
                    "too_many_in_flight",
                    "Code 10, retryable.",
                    "1024 requests are already in flight on this connection",
                ),
                ErrorCode::UnknownLease => {
                    ("unknown_lease", "Code 11.", "lease 42 is not outstanding")
                }
                ErrorCode::Cancelled => (
                    "cancelled",
                    "Code 12, answering the acquire a Cancel abandoned.",
                    "cancelled by request 9",
                ),
                ErrorCode::StoreUnavailable => (
                    "store_unavailable",
                    "Code 13, retryable.",
                    "redis timed out after 50 ms; failure policy fail_closed",
                ),
                ErrorCode::ShuttingDown => (
                    "shutting_down",
                    "Code 14, retryable.",
                    "the daemon is shutting down",
                ),
                ErrorCode::Internal => (
                    "internal",
                    "Code 15.",
                    "internal error: lease table poisoned",
                ),
                ErrorCode::Unsupported => (
                    "unsupported",
                    "Code 16: something this build does not provide.",
                    "this build does not provide that",
                ),
                ErrorCode::Overloaded => (
                    "overloaded",
                    "Code 17: a resource bound of the daemon; retryable.",
                    "too many prompts are waiting to be counted; retry later",
                ),
            };
            let request_id = if code == ErrorCode::FrameTooLarge {
                0
            } else {
                2 + u64::from(code.as_u16())
            };
            case(name, description, error(request_id, code.as_u16(), message))
        })
        .collect();
    cases.push(case(
        "unknown_code",
        "A code this client may not know (codes are only added): treat as a non-retryable failure of the request.",
        error(5, 999, "from a newer daemon"),
    ));
    cases.push(case(
        "empty_message",
        "An empty message string.",
        error(6, ErrorCode::Internal.as_u16(), ""),
    ));
    cases.push(case(
        "multibyte_message",
        "A message with multi-byte UTF-8.",
        error(
            7,
            ErrorCode::UnknownLimit.as_u16(),
            "no limit named \"東京-ü\"",
        ),
    ));
    cases
}

fn invalid_client_cases() -> Vec<CaseSpec> {
    let id = 9u64.to_le_bytes();
    let tag = |tag: u32| tag.to_le_bytes();
    vec![
        case(
            "unknown_request_tag",
            "Request tag 14 is not known in this revision: a decoder refuses it, and the daemon answers Unsupported to request id 9 and keeps the connection (a request of a later revision).",
            Expect::Unsupported(raw_frame(&[&id, &tag(14)])),
        ),
        case(
            "unknown_cost_tag",
            "An Estimate for limit \"a\" with Cost tag 3, not known in this revision: a decoder refuses it, and the daemon answers Unsupported to request id 9 and keeps the connection (a cost of a later revision).",
            Expect::Unsupported(raw_frame(&[
                &id,
                &tag(5),
                &1u64.to_le_bytes(),
                b"a",
                &tag(3),
            ])),
        ),
        case(
            "unknown_block_tag",
            "An Estimate whose Conversation (api \"openai\", no system) has one message with a Block of tag 2, unknown: malformed.",
            Expect::Malformed(raw_frame(&[
                &id,
                &tag(5),
                &1u64.to_le_bytes(),
                b"a",
                &tag(2),
                &6u64.to_le_bytes(),
                b"openai",
                &0u64.to_le_bytes(),
                &1u64.to_le_bytes(),
                &4u64.to_le_bytes(),
                b"user",
                &[0],
                &1u64.to_le_bytes(),
                &tag(2),
            ])),
        ),
        case(
            "trailing_bytes",
            "A Ping followed by one extra byte: a payload holds exactly one message.",
            Expect::Malformed(raw_frame(&[&id, &tag(7), &[0]])),
        ),
        case(
            "truncated",
            "A Release whose lease has only 4 of its 8 bytes.",
            Expect::Malformed(raw_frame(&[&id, &tag(3), &[42, 0, 0, 0]])),
        ),
        case(
            "option_tag_2",
            "Status with Option tag 2: only 0 and 1 are valid.",
            Expect::Malformed(raw_frame(&[&id, &tag(6), &[2]])),
        ),
        case(
            "truncated_conversation",
            "Estimate on limit \"\" with Cost tag 2 (Conversation) and none of its fields.",
            Expect::Malformed(raw_frame(&[&id, &tag(5), &0u64.to_le_bytes(), &tag(2)])),
        ),
        case(
            "invalid_utf8",
            "Hello whose client name is the byte ff.",
            Expect::Malformed(raw_frame(&[
                &id,
                &tag(0),
                &1u16.to_le_bytes(),
                &1u64.to_le_bytes(),
                &[0xff],
            ])),
        ),
        case(
            "string_longer_than_payload",
            "Hello whose client name claims 2^40 bytes: refused, never allocated.",
            Expect::Malformed(raw_frame(&[
                &id,
                &tag(0),
                &1u16.to_le_bytes(),
                &(1u64 << 40).to_le_bytes(),
            ])),
        ),
        case(
            "short_payload",
            "A 3-byte payload cannot carry a request id: the error goes to request id 0.",
            Expect::Malformed(raw_frame(&[&[1, 2, 3]])),
        ),
        case(
            "empty_payload",
            "A zero-length payload: the error goes to request id 0.",
            Expect::Malformed(raw_frame(&[])),
        ),
        case(
            "frame_too_large",
            "A length prefix of 4 MiB + 1: refused as soon as the 4 prefix bytes arrive.",
            Expect::TooLarge((MAX_FRAME_LEN + 1).to_le_bytes().to_vec()),
        ),
        case(
            "frame_too_large_max",
            "A length prefix of 2^32 - 1.",
            Expect::TooLarge(u32::MAX.to_le_bytes().to_vec()),
        ),
    ]
}

fn invalid_server_cases() -> Vec<CaseSpec> {
    let id = 2u64.to_le_bytes();
    let tag = |tag: u32| tag.to_le_bytes();
    vec![
        case(
            "unknown_response_tag",
            "Response tag 12 does not exist.",
            Expect::Malformed(raw_frame(&[&id, &tag(12)])),
        ),
        case(
            "bool_2",
            "Cancelled with found byte 2: only 0 and 1 are valid.",
            Expect::Malformed(raw_frame(&[&id, &tag(5), &[2]])),
        ),
        case(
            "trailing_bytes",
            "A Pong followed by one extra byte.",
            Expect::Malformed(raw_frame(&[&id, &tag(8), &[0]])),
        ),
        case(
            "truncated",
            "A Granted without its waited_ms.",
            Expect::Malformed(raw_frame(&[
                &id,
                &tag(1),
                &42u64.to_le_bytes(),
                &2000u64.to_le_bytes(),
            ])),
        ),
        case(
            "invalid_utf8",
            "An Error whose message is the bytes c3 28 (not UTF-8).",
            Expect::Malformed(raw_frame(&[
                &id,
                &tag(9),
                &4u16.to_le_bytes(),
                &2u64.to_le_bytes(),
                &[0xc3, 0x28],
            ])),
        ),
        case(
            "frame_too_large",
            "A length prefix of 4 MiB + 1.",
            Expect::TooLarge((MAX_FRAME_LEN + 1).to_le_bytes().to_vec()),
        ),
    ]
}

// ---------------------------------------------------------------------------
// Writing the files.
// ---------------------------------------------------------------------------

/// The text of one vector file, exactly as it is stored.
fn render(spec: &FileSpec) -> String {
    let cases = spec
        .cases
        .iter()
        .map(|case| {
            let (value, error, bytes) = match &case.expect {
                Expect::Client(frame) => {
                    (Some(AnyFrame::Client(frame.clone())), None, encode(frame))
                }
                Expect::Server(frame) => {
                    (Some(AnyFrame::Server(frame.clone())), None, encode(frame))
                }
                Expect::Malformed(bytes) => (None, Some(MALFORMED.to_owned()), bytes.clone()),
                Expect::Unsupported(bytes) => (None, Some(UNSUPPORTED.to_owned()), bytes.clone()),
                Expect::TooLarge(bytes) => (None, Some(FRAME_TOO_LARGE.to_owned()), bytes.clone()),
            };
            VectorCase {
                name: case.name.to_owned(),
                description: case.description.to_owned(),
                value,
                error,
                hex: hex::encode(bytes),
            }
        })
        .collect();
    let file = VectorFile {
        frame_type: spec.frame_type.to_owned(),
        message: spec.message.to_owned(),
        description: spec.description.to_owned(),
        cases,
    };
    let mut text = serde_json::to_string_pretty(&file).expect("vectors serialize");
    text.push('\n');
    text
}

fn encode<T: Encode>(frame: &T) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_frame(frame, &mut bytes).expect("vector frames encode");
    bytes
}

/// Rewrites the vector directory from [`catalogue`] when [`WRITE_ENV`] is
/// `1`, once per test run, before any test reads it.
fn write_vectors_if_asked() {
    static WRITTEN: OnceLock<()> = OnceLock::new();
    WRITTEN.get_or_init(|| {
        if std::env::var(WRITE_ENV).as_deref() != Ok("1") {
            return;
        }
        let dir = vectors_dir();
        std::fs::create_dir_all(&dir).expect("create the vectors directory");
        let specs = catalogue();
        let keep: BTreeSet<&str> = specs.iter().map(|spec| spec.file).collect();
        for entry in std::fs::read_dir(&dir).expect("list the vectors directory") {
            let path = entry.expect("directory entry").path();
            let stale = path.extension().is_some_and(|ext| ext == "json")
                && !keep.contains(path.file_name().and_then(|n| n.to_str()).unwrap_or(""));
            if stale {
                std::fs::remove_file(&path).expect("remove a stale vector file");
            }
        }
        for spec in &specs {
            std::fs::write(dir.join(spec.file), render(spec)).expect("write a vector file");
        }
    });
}

// ---------------------------------------------------------------------------
// Reading and checking the files.
// ---------------------------------------------------------------------------

/// Every vector file on disk, by file name, with its text.
fn files_on_disk() -> Vec<(String, String)> {
    write_vectors_if_asked();
    let dir = vectors_dir();
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("cannot list {}: {error}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
            (name, text)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no vector files in {}", dir.display());
    files
}

/// What the vector files hold, once checked.
#[derive(Default)]
struct Checked {
    client_frames: Vec<ClientFrame>,
    server_frames: Vec<ServerFrame>,
}

/// Checks every case of every file and returns the valid frames.
fn check_all_files() -> Checked {
    let mut checked = Checked::default();
    for (file, text) in files_on_disk() {
        let parsed: VectorFile<serde_json::Value> = serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("{file}: not a vector file: {error}"));
        assert!(!parsed.cases.is_empty(), "{file}: no cases");
        let mut names = BTreeSet::new();
        for case in parsed.cases {
            let at = format!("{file} case {:?}", case.name);
            assert!(names.insert(case.name.clone()), "{at}: duplicate name");
            let bytes = hex::decode(&case.hex).unwrap_or_else(|error| panic!("{at}: hex: {error}"));
            assert_eq!(case.hex, hex::encode(&bytes), "{at}: hex must be lowercase");
            match (case.value, case.error.as_deref()) {
                (Some(value), None) => match parsed.frame_type.as_str() {
                    CLIENT_FRAME => checked.client_frames.push(check_valid(&at, &bytes, value)),
                    SERVER_FRAME => checked.server_frames.push(check_valid(&at, &bytes, value)),
                    other => panic!("{file}: unknown type {other:?}"),
                },
                (None, Some(MALFORMED)) => match parsed.frame_type.as_str() {
                    CLIENT_FRAME => check_malformed::<ClientFrame>(&at, &bytes),
                    SERVER_FRAME => check_malformed::<ServerFrame>(&at, &bytes),
                    other => panic!("{file}: unknown type {other:?}"),
                },
                (None, Some(UNSUPPORTED)) => {
                    assert_eq!(parsed.frame_type, CLIENT_FRAME, "{at}: only requests");
                    check_malformed::<ClientFrame>(&at, &bytes);
                    let (payload, _) = split_frame(&bytes).unwrap().unwrap();
                    let request_tag = ratekeeper::proto::request_tag_hint(payload);
                    let cost_tag = ratekeeper::proto::cost_tag_hint(payload);
                    assert!(
                        request_tag.is_some_and(|tag| tag >= Request::KNOWN_TAGS)
                            || cost_tag.is_some_and(|tag| tag >= Cost::KNOWN_TAGS),
                        "{at}: the request or cost tag must be one this revision does not know"
                    );
                }
                (None, Some(FRAME_TOO_LARGE)) => assert!(
                    matches!(split_frame(&bytes), Err(FrameError::TooLarge { .. })),
                    "{at}: the length prefix must be refused"
                ),
                (value, error) => {
                    panic!("{at}: needs a value or a known error, got {value:?} / {error:?}")
                }
            }
        }
    }
    checked
}

/// Decodes `bytes` as one whole frame, compares it with `value` and checks
/// that it encodes back to the same bytes.
fn check_valid<T>(at: &str, bytes: &[u8], value: serde_json::Value) -> T
where
    T: Decode<()> + Encode + DeserializeOwned + PartialEq + Debug,
{
    let expected: T =
        serde_json::from_value(value).unwrap_or_else(|error| panic!("{at}: value: {error}"));
    let (payload, used) = split_frame(bytes)
        .unwrap_or_else(|error| panic!("{at}: split: {error}"))
        .unwrap_or_else(|| panic!("{at}: the hex is not a whole frame"));
    assert_eq!(used, bytes.len(), "{at}: bytes after the frame");
    let decoded: T = decode_payload(payload).unwrap_or_else(|error| panic!("{at}: {error}"));
    assert_eq!(decoded, expected, "{at}: decoded value");
    assert_eq!(
        hex::encode(encode(&decoded)),
        hex::encode(bytes),
        "{at}: re-encoded bytes"
    );
    decoded
}

fn check_malformed<T: Decode<()> + Debug>(at: &str, bytes: &[u8]) {
    let (payload, used) = split_frame(bytes)
        .unwrap_or_else(|error| panic!("{at}: split: {error}"))
        .unwrap_or_else(|| panic!("{at}: the hex is not a whole frame"));
    assert_eq!(used, bytes.len(), "{at}: bytes after the frame");
    let result = decode_payload::<T>(payload);
    assert!(
        matches!(result, Err(FrameError::Malformed(_))),
        "{at}: must be malformed, got {result:?}"
    );
}

// ---------------------------------------------------------------------------
// Variant tags: an exhaustive match, so a new variant fails to compile here.
// ---------------------------------------------------------------------------

/// Number of `Request` variants; tag `REQUEST_VARIANTS` must be unknown.
const REQUEST_VARIANTS: u32 = Request::KNOWN_TAGS;
/// Number of `Cost` variants.
const COST_VARIANTS: u32 = 3;
/// Number of `Response` variants.
const RESPONSE_VARIANTS: u32 = 14;

/// The wire tag of a request, as tabulated in PROTOCOL.md.
fn request_tag(request: &Request) -> u32 {
    match request {
        Request::Hello { .. } => 0,
        Request::Acquire(_) => 1,
        Request::Report { .. } => 2,
        Request::Release { .. } => 3,
        Request::Cancel { .. } => 4,
        Request::Estimate { .. } => 5,
        Request::Status { .. } => 6,
        Request::Ping => 7,
        Request::Health => 8,
        Request::Inspect { .. } => 9,
        Request::Feedback(_) => 10,
        Request::LeaseFeedback { .. } => 11,
        Request::UsageReport { .. } => 12,
        Request::Budgets { .. } => 13,
    }
}

/// The wire tag of a cost, as tabulated in PROTOCOL.md.
fn cost_tag(cost: &Cost) -> u32 {
    match cost {
        Cost::Tokens { .. } => 0,
        Cost::Messages(_) => 1,
        Cost::Conversation(_) => 2,
    }
}

/// The wire tag of a response, as tabulated in PROTOCOL.md.
fn response_tag(response: &Response) -> u32 {
    match response {
        Response::Hello { .. } => 0,
        Response::Granted { .. } => 1,
        Response::Denied { .. } => 2,
        Response::Settled { .. } => 3,
        Response::Released { .. } => 4,
        Response::Cancelled { .. } => 5,
        Response::Estimated { .. } => 6,
        Response::Status { .. } => 7,
        Response::Pong => 8,
        Response::Error { .. } => 9,
        Response::Health(_) => 10,
        Response::Inspection(_) => 11,
        Response::Noted { .. } => 12,
        Response::Budgets { .. } => 13,
    }
}

fn cost_of(request: &Request) -> Option<&Cost> {
    match request {
        Request::Acquire(acquire) => Some(&acquire.cost),
        Request::Estimate { cost, .. } => Some(cost),
        _ => None,
    }
}

/// The `u32` at bytes 12..16 of a frame: the tag of its request or response.
fn wire_tag(frame: &[u8]) -> u32 {
    u32::from_le_bytes(frame[12..16].try_into().unwrap())
}

/// Whether bincode refuses `payload` because of an unknown variant tag.
fn is_unknown_variant<T: Decode<()> + Debug>(payload: &[u8]) -> bool {
    let result = bincode::decode_from_slice::<T, _>(payload, bincode::config::legacy());
    matches!(result, Err(DecodeError::UnexpectedVariant { .. }))
}

#[test]
fn every_vector_decodes_to_its_value_and_encodes_to_its_bytes() {
    let checked = check_all_files();
    assert!(!checked.client_frames.is_empty() && !checked.server_frames.is_empty());
}

#[test]
fn vectors_cover_every_variant_and_every_error_code() {
    let checked = check_all_files();
    let requests: BTreeSet<u32> = checked
        .client_frames
        .iter()
        .map(|frame| request_tag(&frame.request))
        .collect();
    let costs: BTreeSet<u32> = checked
        .client_frames
        .iter()
        .filter_map(|frame| cost_of(&frame.request).map(cost_tag))
        .collect();
    let responses: BTreeSet<u32> = checked
        .server_frames
        .iter()
        .map(|frame| response_tag(&frame.response))
        .collect();
    let codes: BTreeSet<u16> = checked
        .server_frames
        .iter()
        .filter_map(|frame| match frame.response {
            Response::Error { code, .. } => Some(code),
            _ => None,
        })
        .collect();
    assert_eq!(
        requests,
        (0..REQUEST_VARIANTS).collect(),
        "Request variants"
    );
    assert_eq!(costs, (0..COST_VARIANTS).collect(), "Cost variants");
    assert_eq!(
        responses,
        (0..RESPONSE_VARIANTS).collect(),
        "Response variants"
    );
    for code in ErrorCode::ALL {
        assert!(codes.contains(&code.as_u16()), "no vector for {code:?}");
    }
}

#[test]
fn variant_tags_are_the_ones_the_spec_tabulates() {
    let checked = check_all_files();
    for frame in &checked.client_frames {
        let bytes = encode(frame);
        assert_eq!(wire_tag(&bytes), request_tag(&frame.request), "{frame:?}");
    }
    for frame in &checked.server_frames {
        let bytes = encode(frame);
        assert_eq!(wire_tag(&bytes), response_tag(&frame.response), "{frame:?}");
    }
    // Estimate { limit: "", cost }: the cost tag sits at bytes 20..24 of the payload.
    let estimate = |cost_tag: u32| {
        let mut payload = 1u64.to_le_bytes().to_vec();
        payload.extend_from_slice(&5u32.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.extend_from_slice(&cost_tag.to_le_bytes());
        payload
    };
    for (cost, tag) in [
        (tokens(1, 2), 0),
        (Cost::Messages(rich_chat()), 1),
        (Cost::Conversation(anthropic_conversation()), 2),
    ] {
        let frame = ClientFrame {
            request_id: 1,
            request: Request::Estimate {
                limit: s(""),
                cost: cost.clone(),
            },
        };
        assert_eq!(cost_tag(&cost), tag);
        assert_eq!(&encode(&frame)[4..28], &estimate(tag)[..], "{cost:?}");
    }
    // The counts are right: the first tag past them is unknown to the decoder.
    let unknown_request = [&1u64.to_le_bytes()[..], &REQUEST_VARIANTS.to_le_bytes()].concat();
    assert!(is_unknown_variant::<ClientFrame>(&unknown_request));
    let unknown_response = [&1u64.to_le_bytes()[..], &RESPONSE_VARIANTS.to_le_bytes()].concat();
    assert!(is_unknown_variant::<ServerFrame>(&unknown_response));
    assert!(is_unknown_variant::<ClientFrame>(&estimate(COST_VARIANTS)));
}

#[test]
fn files_are_what_the_generator_writes() {
    let on_disk = files_on_disk();
    let generated: Vec<(String, String)> = catalogue()
        .iter()
        .map(|spec| (spec.file.to_owned(), render(spec)))
        .collect();
    let names = |files: &[(String, String)]| -> Vec<String> {
        files.iter().map(|(name, _)| name.clone()).collect()
    };
    let mut expected_names = names(&generated);
    expected_names.sort();
    assert_eq!(
        names(&on_disk),
        expected_names,
        "the vector files differ from the catalogue; run {WRITE_ENV}=1 cargo test --test it vectors::"
    );
    for (name, text) in &generated {
        let stored = &on_disk.iter().find(|(file, _)| file == name).unwrap().1;
        assert!(
            stored == text,
            "{name} differs from the catalogue; run {WRITE_ENV}=1 cargo test --test it vectors::"
        );
    }
}

// ---------------------------------------------------------------------------
// PROTOCOL.md stays in step with the code.
// ---------------------------------------------------------------------------

fn protocol_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto-spec/PROTOCOL.md");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

#[test]
fn worked_examples_in_the_spec_are_vectors() {
    let spec = protocol_md();
    let checked = check_all_files();
    let examples = [
        encode(&ClientFrame {
            request_id: 1,
            request: Request::Hello {
                protocol_version: 1,
                client_name: s("celery-3"),
            },
        }),
        encode(&ClientFrame {
            request_id: 7,
            request: Request::Ping,
        }),
        encode(&ClientFrame {
            request_id: 2,
            request: Request::Acquire(Acquire {
                max_wait_ms: Some(5000),
                ..acquire("gpt-4o", Some("acme"), Some("batch"), tokens(1200, 800))
            }),
        }),
        encode(&ClientFrame {
            request_id: 3,
            request: Request::Estimate {
                limit: s("claude"),
                cost: Cost::Conversation(small_conversation()),
            },
        }),
        encode(&ClientFrame {
            request_id: 38,
            request: usage_report(42, usage(120, 1000, 300, 230)),
        }),
    ];
    for bytes in examples {
        let hex = hex::encode(&bytes);
        assert!(
            spec.contains(&format!("`{hex}`")),
            "PROTOCOL.md lacks the worked example `{hex}`"
        );
        let (payload, _) = split_frame(&bytes).unwrap().unwrap();
        let frame: ClientFrame = decode_payload(payload).unwrap();
        assert!(
            checked.client_frames.contains(&frame),
            "{frame:?} is no vector"
        );
    }
}

#[test]
fn error_table_in_the_spec_matches_the_codes() {
    let spec = protocol_md();
    for code in ErrorCode::ALL {
        let prefix = format!("| {} | `{code:?}` |", code.as_u16());
        let row = spec
            .lines()
            .find(|line| line.starts_with(&prefix))
            .unwrap_or_else(|| panic!("PROTOCOL.md has no error table row starting {prefix:?}"));
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let yes_no = |flag: bool| if flag { "yes" } else { "no" };
        assert_eq!(
            cells.len(),
            5,
            "row {row:?}: code | name | meaning | retryable | closes"
        );
        assert_eq!(
            cells[3],
            yes_no(code.is_retryable()),
            "retryable of {code:?}"
        );
        let closes = match (code.closes_connection(0), code.closes_connection(1)) {
            (true, true) => "yes",
            (true, false) => "on request id 0",
            (false, false) => "no",
            (false, true) => unreachable!("{code:?} closes on requests but not on id 0"),
        };
        assert_eq!(cells[4], closes, "closes connection of {code:?}");
    }
}
