//! Every message of the protocol, as Rust types.
//!
//! Field order is wire order: bincode writes struct fields in declaration
//! order and enum variants as a `u32` index in declaration order. A protocol
//! revision only appends variants (a new request bumps
//! [`Request::KNOWN_TAGS`], a new cost [`Cost::KNOWN_TAGS`]); changing, removing or reordering anything that
//! exists needs a new [`super::PROTOCOL_VERSION`] (PROTOCOL.md §10). Either
//! way the vectors are regenerated.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

/// A frame sent by a client: one request and the id its answer will carry.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct ClientFrame {
    /// Chosen by the client, non-zero, unique among its unanswered requests.
    pub request_id: u64,
    pub request: Request,
}

/// A frame sent by the daemon: the answer to the request with `request_id`,
/// or a connection-level error when `request_id` is zero.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct ServerFrame {
    pub request_id: u64,
    pub response: Response,
}

/// What a client can ask.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub enum Request {
    /// Must be the first frame of every connection.
    Hello {
        protocol_version: u16,
        /// Shown in the daemon's logs, e.g. `"celery-worker-3 pid=4711"`.
        client_name: String,
    },
    /// Reserve `cost` in every bucket of `limit`, waiting up to `max_wait_ms`.
    Acquire(Acquire),
    /// Settle a granted lease with the usage the provider reported.
    Report {
        lease: u64,
        input_tokens: u64,
        output_tokens: u64,
    },
    /// Give a granted lease back unused: the provider was never called.
    Release { lease: u64 },
    /// Abandon the unanswered `Acquire` with this request id on this connection.
    Cancel { request_id: u64 },
    /// Count the tokens `cost` would reserve on `limit`, reserving nothing.
    Estimate { limit: String, cost: Cost },
    /// Levels of one limit's buckets, or of every limit when `limit` is `None`.
    Status { limit: Option<String> },
    /// Liveness check; answered with `Pong`.
    Ping,
    /// Readiness: can this daemon serve acquires now, and why (revision 2).
    Health,
    /// The store's state and the buckets of one limit, or of every limit,
    /// tenant buckets included; answers even while the store is down
    /// (revision 2).
    Inspect { limit: Option<String> },
    /// What the provider answered a call on `limit` (revision 3): its
    /// rate-limit headers, so that the daemon lowers the shared buckets to
    /// the provider's view and pauses the limit after a 429.
    Feedback(Feedback),
    /// The same as `Feedback`, naming the lease of the call it answers
    /// (revision 5): the daemon then places the provider's counts exactly,
    /// against what was granted after that lease, instead of by
    /// `since_grant_ms`.
    LeaseFeedback { lease: u64, feedback: Feedback },
    /// Settle a granted lease as `Report` does, with the usage split as the
    /// provider bills it, cache reads and writes apart (revision 6): spend
    /// budgets price each kind of token. Answered by `Settled`.
    UsageReport { lease: u64, usage: Usage },
    /// Each spend budget of one limit, or of every limit: what was spent,
    /// what is reserved, what remains and when it resets (revision 6).
    Budgets { limit: Option<String> },
}

/// What a call used, in four disjoint kinds of token as the providers bill
/// them (revision 6). No token is counted in two fields: `input_tokens` is
/// the input billed at the full price, neither read from nor written to the
/// prompt cache. OpenAI's `prompt_tokens` include its cached tokens, so
/// `input_tokens` is their difference; Anthropic's `input_tokens` map one
/// to one (PROTOCOL.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Usage {
    /// Input billed at the full price.
    pub input_tokens: u64,
    /// Input read from the provider's prompt cache.
    pub cached_input_tokens: u64,
    /// Input written to the prompt cache.
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
}

/// A provider's answer, forwarded by a worker.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Feedback {
    /// The limit the call was made under.
    pub limit: String,
    /// The provider's HTTP status: 200, 429, 529, …
    pub status: u16,
    /// Milliseconds since the call this answers was granted, as the client
    /// measured them: grants made since are ones the provider may not have
    /// seen yet when it wrote its headers.
    pub since_grant_ms: u64,
    /// The provider's rate-limit headers, names in lower case (others may
    /// be left out): `retry-after`, `retry-after-ms`, `x-ratelimit-*`,
    /// `anthropic-ratelimit-*`.
    pub headers: Vec<Header>,
}

/// One HTTP header.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// The fields of an acquire request.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Acquire {
    /// A limit name from the daemon's configuration.
    pub limit: String,
    /// Draw also from this tenant's share, when the limit declares one.
    pub tenant: Option<String>,
    /// A priority class name; `None` is the configured default class.
    pub priority: Option<String>,
    pub cost: Cost,
    /// Longest acceptable wait; `None` takes the priority class default.
    pub max_wait_ms: Option<u64>,
}

/// What a request will consume.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub enum Cost {
    /// Token counts known to the client. Limits without separate input and
    /// output buckets reserve the sum.
    Tokens {
        input_tokens: u64,
        output_tokens: u64,
    },
    /// Chat messages for the daemon to count with the limit's tokenizer.
    Messages(ChatRequest),
    /// A conversation of content blocks — text, images — in a provider's
    /// shape, counted with the limit's tokenizer and the provider's image
    /// rule (revision 4).
    Conversation(Conversation),
}

/// A request of content blocks (revision 4): what [`ChatRequest`] cannot
/// say — a top-level system prompt, images and their size, the provider
/// whose rules count them.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Conversation {
    /// Whose request shape and image rule: `"anthropic"` (Messages API) or
    /// `"openai"` (Chat Completions); others are `InvalidRequest`.
    pub api: String,
    /// The top-level system prompt's text blocks (Anthropic's `system`).
    pub system: Vec<String>,
    pub messages: Vec<Turn>,
    /// The request's tool definitions as JSON text, if any.
    pub tools_json: Option<String>,
    /// The request's `max_tokens`; `None` takes the limit's default.
    pub max_output_tokens: Option<u64>,
}

/// One message of a [`Conversation`].
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub name: Option<String>,
    pub blocks: Vec<Block>,
    /// OpenAI's tool calls of the message as JSON text, if any.
    pub tool_calls_json: Option<String>,
}

/// One content block of a [`Turn`].
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub enum Block {
    /// Text to count: a text block, a tool's name or its input as JSON, a
    /// tool result's text, a plain-text document.
    Text { text: String },
    /// An image, counted by the provider's rule from its size in pixels;
    /// `0 × 0` when the size is not known.
    Image {
        width: u32,
        height: u32,
        /// OpenAI's `detail`: `"low"`, `"high"`, `"auto"` or `""`; ignored
        /// for Anthropic.
        detail: String,
    },
}

/// A chat completion request, as far as counting its tokens needs it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// The request's tool definitions as JSON text, if any.
    pub tools_json: Option<String>,
    /// The request's `max_tokens`; `None` takes the limit's default.
    pub max_output_tokens: Option<u64>,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub name: Option<String>,
    /// The text content; a plain string content is one part.
    pub content: Vec<String>,
    /// The message's tool calls as JSON text, if any.
    pub tool_calls_json: Option<String>,
}

/// What the daemon answers.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub enum Response {
    /// Answer to `Hello`: the version in use and the bounds this daemon enforces.
    Hello {
        protocol_version: u16,
        /// Daemon name and version, e.g. `"ratekeeper 0.1.0"`.
        server: String,
        max_frame_len: u32,
        max_in_flight: u32,
    },
    /// The cost is reserved; call the provider now, then `Report` or `Release`.
    Granted {
        lease: u64,
        /// Tokens reserved in the limit's token buckets.
        tokens: u64,
        /// How long the daemon held the answer back so the reservation was due.
        waited_ms: u64,
    },
    /// Not granted within `max_wait_ms`; nothing was reserved.
    Denied {
        /// Earliest delay after which the same acquire can be granted.
        retry_after_ms: u64,
        /// The bucket that refused, e.g. `"tokens"`, `"requests"`, `"tenant"`.
        bucket: String,
    },
    /// Answer to `Report` and `UsageReport`: tokens given back (negative:
    /// debited for an overrun).
    Settled { tokens_returned: i64 },
    /// Answer to `Release`: tokens given back.
    Released { tokens_returned: u64 },
    /// Answer to `Cancel`: whether an unanswered acquire with that id existed.
    Cancelled { found: bool },
    /// Answer to `Estimate`: what an acquire with that cost would reserve.
    Estimated {
        input_tokens: u64,
        output_tokens: u64,
    },
    /// Answer to `Status`.
    Status {
        /// `"embedded"` (per-process) or `"redis"` (shared by every sidecar).
        store: String,
        limits: Vec<LimitStatus>,
    },
    /// Answer to `Ping`.
    Pong,
    /// The request failed; see [`super::ErrorCode`] for `code`.
    Error { code: u16, message: String },
    /// Answer to `Health`.
    Health(HealthStatus),
    /// Answer to `Inspect`.
    Inspection(Inspection),
    /// Answer to `Feedback`: what the daemon did with it.
    Noted {
        /// How long the limit is paused for every worker (a 429's
        /// `retry-after`); 0 when it is not.
        paused_ms: u64,
        /// Buckets lowered to the provider's view.
        lowered: u32,
    },
    /// Answer to `Budgets` (revision 6).
    Budgets { budgets: Vec<BudgetStatus> },
}

/// One spend budget now. Amounts are in micro-units of the currency (a
/// dollar is 1,000,000).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct BudgetStatus {
    /// The limit whose budget it is, or the group (see `group`).
    pub owner: String,
    /// Whether `owner` is a group: its limits spend the budget together.
    pub group: bool,
    /// The tenant of a tenant's budget.
    pub tenant: Option<String>,
    /// As in `Denied.bucket`: `"budget_day"`, `"tenant_budget_month"`, …
    pub name: String,
    /// The calendar period (`"2026-12-07"`, `"2026-W50"`, `"2026-12"`);
    /// empty for a rolling budget.
    pub period: String,
    /// The budget's amount.
    pub amount: u64,
    /// What reported calls cost. A rolling budget does not count reports
    /// apart: everything its window holds is `spent`.
    pub spent: u64,
    /// What calls not yet reported hold (and calls never reported keep).
    pub reserved: u64,
    /// What acquires may still take; negative after overruns.
    pub remaining: i64,
    /// When the period ends, Unix ms; 0 for a rolling budget.
    pub resets_at_ms: u64,
}

impl ChatMessage {
    /// A message of plain text parts, without a name or tool calls.
    pub fn text(role: &str, parts: &[&str]) -> ChatMessage {
        ChatMessage {
            role: role.to_string(),
            name: None,
            content: parts.iter().map(|part| part.to_string()).collect(),
            tool_calls_json: None,
        }
    }
}

impl Request {
    /// Request tags this build knows: `0..KNOWN_TAGS`. A later protocol
    /// revision appends variants; a tag at or above this is `Unsupported`.
    pub const KNOWN_TAGS: u32 = 14;
}

impl Cost {
    /// Cost tags this build knows: `0..KNOWN_TAGS`. A later protocol
    /// revision may append costs; an `Acquire` or `Estimate` with a cost tag
    /// at or above this is `Unsupported`.
    pub const KNOWN_TAGS: u32 = 3;
}

impl Response {
    /// The `Error` answer with `code` and a message for humans.
    pub fn error(code: super::ErrorCode, message: impl Into<String>) -> Response {
        Response::Error {
            code: code.as_u16(),
            message: message.into(),
        }
    }
}

/// The state of one configured limit.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct LimitStatus {
    pub name: String,
    /// Acquires this daemon is currently holding back until their reservation is due.
    pub waiters: u64,
    pub buckets: Vec<BucketStatus>,
}

/// The state of one bucket of a limit.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct BucketStatus {
    /// `"tokens"`, `"requests"`, `"input_tokens"`, `"output_tokens"`.
    pub name: String,
    pub capacity: u64,
    /// Whole units available now; negative while reservations are waiting.
    pub level: i64,
    /// Refill rate in units per minute.
    pub per_minute: u64,
}

/// Whether a daemon can serve acquires now, and why.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct HealthStatus {
    /// Acquires are answered: the store answers, or the failure policy
    /// grants in its place (`fail_open`, `local`).
    pub ready: bool,
    /// `"embedded"` or `"redis"`, as in `Status.store`.
    pub store: String,
    /// Whether the store answered its last call.
    pub store_up: bool,
    /// How long the store has been failing; 0 while it answers.
    pub store_down_ms: u64,
    /// The failure policy: `"fail_closed"`, `"fail_open"`, `"local"`, or
    /// `""` for the embedded store, which has none.
    pub policy: String,
    /// Why, for people.
    pub reason: String,
}

/// The store's state and the buckets asked for.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Inspection {
    pub health: HealthStatus,
    /// Where the levels come from: `"store"`; `"local"`, the buckets of the
    /// `local` failure policy while the store is down; `"none"`, unknown.
    pub levels_from: String,
    pub limits: Vec<LimitInspection>,
}

/// One limit, inspected.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct LimitInspection {
    pub name: String,
    /// Acquires this daemon is holding back until their reservation is due.
    pub waiters: u64,
    /// The limit's buckets, then the buckets of tenants seen recently.
    pub buckets: Vec<BucketInspection>,
}

/// One bucket, inspected.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct BucketInspection {
    /// `"tokens"`, `"requests"`, `"tenant"`, … as in `BucketStatus.name`.
    pub name: String,
    /// The tenant of a `"tenant"` bucket.
    pub tenant: Option<String>,
    pub capacity: u64,
    /// Refill rate in units per minute.
    pub per_minute: u64,
    /// Whole units available now; `None` when unknown (the store is down).
    pub level: Option<i64>,
}
