//! Token counting and settlement through the real daemon over its real
//! socket: acquires and estimates by chat messages, the provider presets'
//! cost and settlement rules, separate input and output buckets (embedded
//! and on Redis), the bounds on what is counted, and the learned max output.

use crate::support;

use std::time::{Duration, Instant};

use ratekeeper::client::Client;
use ratekeeper::proto::{
    Acquire, Block, ChatMessage, ChatRequest, Conversation, Cost, ErrorCode, Request, Response,
    Turn,
};
use ratekeeper::tokens::{self, CharEstimator, Counter, OpenaiChars, PromptCount};
use support::redis::RedisServer;
use support::{Daemon, SpawnedDaemon, error_code, granted, level};

/// Every token bucket refills one token per second, so levels read by
/// `status` move by at most a token or two while a test looks at them.
const LIMITS: &str = r#"
[[groups]]
name = "org"
tokens_per_minute = 60
burst_tokens = 100000

[[limits]]
name = "gpt"
model = "gpt-4o"
tokens_per_minute = 60
burst_tokens = 100000
default_max_output_tokens = 500

[[limits]]
name = "openai"
provider = "openai"
model = "gpt-4o"
group = "org"
tokens_per_minute = 60
burst_tokens = 100000
tenant_share = 0.01

[[limits]]
name = "claude"
provider = "anthropic"
input_tokens_per_minute = 60
output_tokens_per_minute = 60
burst_input_tokens = 100000
burst_output_tokens = 50000
tenant_share = 0.5

[[limits]]
name = "learning"
model = "gpt-4o-mini"
tokens_per_minute = 60
burst_tokens = 1000000
default_max_output_tokens = 1000
learn_max_output = true

[[limits]]
name = "learning-capped"
model = "gpt-4o-mini"
tokens_per_minute = 60
burst_tokens = 1000000
max_request_tokens = 300
learn_max_output = true
"#;

/// Levels may rise by what refills between two `status` calls.
const DRIFT: i64 = 3;

fn message(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        name: None,
        content: vec![content.into()],
        tool_calls_json: None,
    }
}

/// A chat request of about `bytes` bytes of English-like text, with a
/// system message, a named user message and a tool definition.
fn chat(bytes: usize, max_output_tokens: Option<u64>) -> ChatRequest {
    let sentence = "The quarterly report shows 1,234 new users in 56 regions; growth is steady. ";
    let text: String = sentence.chars().cycle().take(bytes).collect();
    let mut user = message("user", &text);
    user.name = Some("analyst".into());
    ChatRequest {
        messages: vec![message("system", "Summarise in one line."), user],
        tools_json: Some(
            r#"[{"type":"function","function":{"name":"lookup","description":"Find a region.","parameters":{"type":"object","properties":{"region":{"type":"string","description":"Region name"}}}}}]"#
                .into(),
        ),
        max_output_tokens,
    }
}

fn by_messages(limit: &str, tenant: Option<&str>, request: ChatRequest) -> Request {
    Request::Acquire(Acquire {
        limit: limit.into(),
        tenant: tenant.map(str::to_string),
        priority: None,
        cost: Cost::Messages(request),
        max_wait_ms: Some(0),
    })
}

fn by_tokens(limit: &str, tenant: Option<&str>, input: u64, output: u64) -> Request {
    Request::Acquire(Acquire {
        limit: limit.into(),
        tenant: tenant.map(str::to_string),
        priority: None,
        cost: Cost::Tokens {
            input_tokens: input,
            output_tokens: output,
        },
        max_wait_ms: Some(0),
    })
}

fn estimate(limit: &str, request: ChatRequest) -> Request {
    Request::Estimate {
        limit: limit.into(),
        cost: Cost::Messages(request),
    }
}

fn report(lease: u64, input_tokens: u64, output_tokens: u64) -> Request {
    Request::Report {
        lease,
        input_tokens,
        output_tokens,
    }
}

/// `(input_tokens, output_tokens)` of an estimate, panicking on anything else.
fn estimated(response: &Response) -> (u64, u64) {
    match response {
        Response::Estimated {
            input_tokens,
            output_tokens,
        } => (*input_tokens, *output_tokens),
        other => panic!("expected an estimate, got {other:?}"),
    }
}

fn settled(response: &Response) -> i64 {
    match response {
        Response::Settled { tokens_returned } => *tokens_returned,
        other => panic!("expected a settlement, got {other:?}"),
    }
}

/// The prompt as the daemon's limit counts it, computed here with the
/// library directly.
fn counted(counter: Counter, request: &ChatRequest) -> PromptCount {
    tokens::count_messages(counter, request).unwrap()
}

/// Asserts that a level is `expected`, give or take the refill since.
fn assert_level(actual: i64, expected: i64, what: &str) {
    assert!(
        (expected..=expected + DRIFT).contains(&actual),
        "{what}: level {actual}, expected {expected} (+{DRIFT} refill)"
    );
}

#[tokio::test]
async fn acquire_by_messages_reserves_the_counted_prompt_plus_max_output() {
    let daemon = Daemon::start(LIMITS);
    let client = daemon.client().await;
    let tiktoken = Counter::for_model("gpt-4o", CharEstimator::default());
    // (request, output tokens the daemon must reserve)
    let cases = [
        (chat(2048, Some(300)), 300),
        (chat(200, None), 500), // the limit's default_max_output_tokens
        (chat(20_000, Some(0)), 0),
    ];
    for (request, output) in cases {
        let prompt = counted(tiktoken, &request);
        assert!(prompt.tools > 0 && prompt.messages > 0, "{prompt:?}");
        // Estimate says what Acquire will reserve, and Acquire reserves it.
        let (input, estimated_output) =
            estimated(&client.call(estimate("gpt", request.clone())).await.unwrap());
        assert_eq!((input, estimated_output), (prompt.total, output));
        let before = level(&client, "gpt", "tokens").await;
        let (lease, tokens, _) = granted(
            &client
                .call(by_messages("gpt", None, request))
                .await
                .unwrap(),
        );
        assert_eq!(tokens, prompt.total + output);
        let after = level(&client, "gpt", "tokens").await;
        assert_level(after, before - tokens as i64, "gpt after the acquire");
        // generic settles to usage: reserved − used comes back.
        let returned = settled(&client.call(report(lease, 100, 10)).await.unwrap());
        assert_eq!(returned, tokens as i64 - 110);
    }

    // The anthropic preset counts with the character estimate.
    let request = chat(3000, Some(700));
    let prompt = counted(Counter::Chars(CharEstimator::default()), &request);
    let estimate = estimated(
        &client
            .call(estimate("claude", request.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(estimate, (prompt.total, 700));
    let (_, tokens, _) = granted(
        &client
            .call(by_messages("claude", None, request))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, prompt.total + 700);
}

#[tokio::test]
async fn the_openai_preset_keeps_the_charge_but_refunds_the_tenant() {
    let daemon = Daemon::start(LIMITS);
    let client = daemon.client().await;
    let openai_rule = Counter::OpenaiChars(OpenaiChars::default());

    // Cost rule max: the charge is the larger of OpenAI's character
    // estimate of the prompt and max_tokens.
    let request = chat(2048, Some(100));
    let prompt = counted(openai_rule, &request).total;
    assert!(prompt > 100, "the prompt must be the larger figure here");
    let estimate = estimated(
        &client
            .call(estimate("openai", request.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(estimate, (prompt, 100));
    let (_, tokens, _) = granted(
        &client
            .call(by_messages("openai", None, request))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, prompt);
    let request = chat(200, Some(900));
    let (_, tokens, _) = granted(
        &client
            .call(by_messages("openai", None, request))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, 900);

    // tenant_share 0.01 of 100 000: the tenant holds 1000. Take 900 of it.
    let before = level(&client, "openai", "tokens").await;
    let group_before = level(&client, "openai", "group_tokens").await;
    let (lease, tokens, _) = granted(
        &client
            .call(by_tokens("openai", Some("acme"), 100, 900))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, 900);
    match client
        .call(by_tokens("openai", Some("acme"), 10, 800))
        .await
        .unwrap()
    {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "tenant"),
        other => panic!("the tenant bucket should be short, got {other:?}"),
    }
    // The report returns nothing to the limit's or the group's bucket…
    let returned = settled(&client.call(report(lease, 100, 50)).await.unwrap());
    assert_eq!(returned, 0);
    assert_level(
        level(&client, "openai", "tokens").await,
        before - 900,
        "openai tokens after the report",
    );
    assert_level(
        level(&client, "openai", "group_tokens").await,
        group_before - 900,
        "group tokens after the report",
    );
    // …but the tenant got 900 − 150 back, so 800 more fit at once.
    granted(
        &client
            .call(by_tokens("openai", Some("acme"), 10, 800))
            .await
            .unwrap(),
    );
}

/// The anthropic split buckets: one acquire reserves the prompt in the
/// input bucket and max output in the output bucket; a report debits the
/// input overrun and refunds the unused output, each from its own figure,
/// once.
async fn split_buckets_settle_each_from_its_figure(client: &Client) {
    let request = chat(4000, Some(2000));
    let prompt = counted(Counter::Chars(CharEstimator::default()), &request).total;
    let input_before = level(client, "claude", "input_tokens").await;
    let output_before = level(client, "claude", "output_tokens").await;
    let (lease, tokens, _) = granted(
        &client
            .call(by_messages("claude", None, request))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, prompt + 2000);
    let input_reserved = level(client, "claude", "input_tokens").await;
    let output_reserved = level(client, "claude", "output_tokens").await;
    assert_level(
        input_reserved,
        input_before - prompt as i64,
        "input after the acquire",
    );
    assert_level(
        output_reserved,
        output_before - 2000,
        "output after the acquire",
    );

    // The estimate was 150 tokens low; 500 of 2000 output tokens were used.
    let returned = settled(&client.call(report(lease, prompt + 150, 500)).await.unwrap());
    assert_eq!(returned, -150 + 1500);
    let input_settled = level(client, "claude", "input_tokens").await;
    let output_settled = level(client, "claude", "output_tokens").await;
    assert_level(
        input_settled,
        input_reserved - 150,
        "input after the report",
    );
    assert_level(
        output_settled,
        output_reserved + 1500,
        "output after the report",
    );

    // A second report is refused and changes nothing.
    let again = client.call(report(lease, 0, 0)).await.unwrap();
    assert_eq!(error_code(&again), ErrorCode::UnknownLease);
    assert_level(
        level(client, "claude", "input_tokens").await,
        input_settled,
        "input after a second report",
    );
    assert_level(
        level(client, "claude", "output_tokens").await,
        output_settled,
        "output after a second report",
    );

    // Token counts go to their own buckets too: 30 000 output tokens fit
    // the output bucket only once.
    granted(
        &client
            .call(by_tokens("claude", None, 10, 30_000))
            .await
            .unwrap(),
    );
    match client
        .call(by_tokens("claude", None, 10, 30_000))
        .await
        .unwrap()
    {
        Response::Denied { bucket, .. } => assert_eq!(bucket, "output_tokens"),
        other => panic!("expected the output bucket to refuse, got {other:?}"),
    }
    granted(
        &client
            .call(by_tokens("claude", None, 30_000, 10))
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn split_buckets_settle_each_from_its_figure_on_the_embedded_store() {
    let daemon = Daemon::start(LIMITS);
    split_buckets_settle_each_from_its_figure(&daemon.client().await).await;
}

#[tokio::test]
async fn split_buckets_settle_each_from_its_figure_on_redis() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&format!("[redis]\nurl = \"{}\"\n{LIMITS}", server.url()));
    let client = daemon.client().await;
    let (store, _) = support::status_of(&client, "claude").await;
    assert_eq!(store, "redis");
    split_buckets_settle_each_from_its_figure(&client).await;
    // The two buckets are two keys of the limit's hash tag.
    let keys = server.cli(&["KEYS", "*claude*"]).unwrap_or_default();
    assert!(
        keys.contains("ratekeeper:{l:claude}:claude:input_tokens"),
        "{keys}"
    );
    assert!(
        keys.contains("ratekeeper:{l:claude}:claude:output_tokens"),
        "{keys}"
    );
}

#[tokio::test]
async fn a_crashed_workers_split_lease_is_refunded_bucket_by_bucket() {
    let config = format!(
        "{LIMITS}\n[leases]\non_disconnect = \"refund\"\ndisconnect_refund_fraction = 0.5\ndisconnect_grace_ms = 100\n"
    );
    let daemon = Daemon::start(&config);
    let observer = daemon.client().await;
    let worker = daemon.client().await;
    granted(
        &worker
            .call(by_tokens("claude", None, 1000, 2000))
            .await
            .unwrap(),
    );
    let input = level(&observer, "claude", "input_tokens").await;
    let output = level(&observer, "claude", "output_tokens").await;
    drop(worker);
    let deadline = Instant::now() + Duration::from_secs(10);
    while level(&observer, "claude", "output_tokens").await < output + 1000 {
        assert!(
            Instant::now() < deadline,
            "no refund after the grace period"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_level(
        level(&observer, "claude", "input_tokens").await,
        input + 500,
        "input after the refund",
    );
}

#[tokio::test]
async fn prompts_beyond_the_bounds_are_invalid_requests() {
    let daemon = Daemon::start(LIMITS);
    let client = daemon.client().await;
    let with_messages = |messages: Vec<ChatMessage>| ChatRequest {
        messages,
        tools_json: None,
        max_output_tokens: Some(1),
    };
    let many_messages = with_messages(vec![message("user", ""); 16_385]);
    let mut many_parts = message("user", "");
    many_parts.content = vec![String::new(); 65_537];
    let many_parts = with_messages(vec![many_parts]);
    let long_role = with_messages(vec![message(&"r".repeat(129), "hi")]);
    for request in [many_messages, many_parts, long_role] {
        for limit in ["gpt", "claude"] {
            let answer = client
                .call(by_messages(limit, None, request.clone()))
                .await
                .unwrap();
            assert_eq!(error_code(&answer), ErrorCode::InvalidRequest, "{answer:?}");
            let answer = client.call(estimate(limit, request.clone())).await.unwrap();
            assert_eq!(error_code(&answer), ErrorCode::InvalidRequest, "{answer:?}");
        }
    }
    // Nothing was reserved.
    assert_level(
        level(&client, "gpt", "tokens").await,
        100_000 - DRIFT,
        "gpt",
    );
    daemon.assert_serving().await;
}

#[tokio::test]
async fn a_long_count_does_not_hold_up_other_requests() {
    let daemon = Daemon::start(LIMITS);
    let client = daemon.client().await;
    // One endless word: the slowest text to count, about half a second.
    let worst = ChatRequest {
        messages: vec![message("user", &"a".repeat(1 << 20))],
        tools_json: None,
        max_output_tokens: Some(1),
    };
    let expected = counted(
        Counter::for_model("gpt-4o", CharEstimator::default()),
        &worst,
    );
    let started = Instant::now();
    let counting = async {
        let answer = client.call(estimate("gpt", worst)).await.unwrap();
        (estimated(&answer), started.elapsed())
    };
    let ping = async {
        assert_eq!(client.call(Request::Ping).await.unwrap(), Response::Pong);
        let acquire = client.call(by_tokens("gpt", None, 10, 0)).await.unwrap();
        granted(&acquire);
        started.elapsed()
    };
    let (((input, _), counted_after), answered_after) = tokio::join!(counting, ping);
    assert_eq!(input, expected.total);
    assert!(
        answered_after < counted_after,
        "a ping and an acquire by count took {answered_after:?}, the count {counted_after:?}"
    );
}

#[tokio::test]
async fn learned_max_output_replaces_the_default_after_min_samples() {
    let daemon = Daemon::start(LIMITS);
    let client = daemon.client().await;
    let no_max = chat(100, None);
    // Reports without output tokens (a total reported as input) teach nothing.
    for _ in 0..60 {
        let (lease, _, _) = granted(
            &client
                .call(by_tokens("learning", None, 10, 10))
                .await
                .unwrap(),
        );
        client.call(report(lease, 20, 0)).await.unwrap();
    }
    // Until 50 reports (the learner's min_samples) the default is reserved.
    for report_number in 1..=50u64 {
        let (_, output) = estimated(
            &client
                .call(estimate("learning", no_max.clone()))
                .await
                .unwrap(),
        );
        assert_eq!(output, 1000, "before report {report_number}");
        let (lease, _, _) = granted(
            &client
                .call(by_messages("learning", None, no_max.clone()))
                .await
                .unwrap(),
        );
        client
            .call(report(lease, 50, report_number * 10))
            .await
            .unwrap();
    }
    // p95 (nearest rank) of 10, 20, …, 500 is the 48th: 480.
    let (prompt, output) = estimated(
        &client
            .call(estimate("learning", no_max.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(output, 480);
    let (_, tokens, _) = granted(
        &client
            .call(by_messages("learning", None, no_max.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, prompt + 480);
    // A request's own max_tokens still wins.
    let (_, output) = estimated(
        &client
            .call(estimate("learning", chat(100, Some(7))))
            .await
            .unwrap(),
    );
    assert_eq!(output, 7);
    // The samples are the model's: a limit of the same model learns them
    // too, capped at its max_request_tokens.
    let (_, output) = estimated(
        &client
            .call(estimate("learning-capped", no_max.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(output, 300);
    // Limits that do not learn keep their default.
    let (_, output) = estimated(&client.call(estimate("gpt", no_max)).await.unwrap());
    assert_eq!(output, 500);
}

/// The binary, because encoders are built once per process: in the test
/// process another daemon may have built them already.
#[tokio::test]
async fn encoders_are_built_at_start_and_for_new_models_on_reload() {
    let start = "[[limits]]\nname = \"gpt\"\nmodel = \"gpt-4o\"\ntokens_per_minute = 6000\n";
    let daemon = SpawnedDaemon::start(start);
    // Built before the socket appeared, and only the one the limits need.
    let log = daemon.log();
    assert!(
        log.contains("tokenizer ready encoding=o200k_base build_ms="),
        "{log}"
    );
    assert!(!log.contains("cl100k_base"), "{log}");

    let reloaded =
        format!("{start}[[limits]]\nname = \"old\"\nmodel = \"gpt-4\"\ntokens_per_minute = 6000\n");
    std::fs::write(daemon.config_path(), reloaded).unwrap();
    daemon.send_signal("HUP");
    daemon.wait_for_log("configuration reloaded").await;
    let log = daemon.log();
    let built = log
        .find("tokenizer ready encoding=cl100k_base")
        .unwrap_or_else(|| panic!("cl100k_base was not built on reload:\n{log}"));
    assert!(built < log.find("configuration reloaded").unwrap(), "{log}");
    let client = daemon.client().await;
    let request = chat(500, Some(10));
    let prompt = counted(
        Counter::for_model("gpt-4", CharEstimator::default()),
        &request,
    );
    let (_, tokens, _) = granted(
        &client
            .call(by_messages("old", None, request))
            .await
            .unwrap(),
    );
    assert_eq!(tokens, prompt.total + 10);
}

fn estimate_cost(limit: &str, cost: Cost) -> Request {
    Request::Estimate {
        limit: limit.into(),
        cost,
    }
}

/// A conversation of content blocks (revision 4) counts its text as the
/// equivalent chat request does with the limit's counter, plus what the
/// provider charges beyond text: Anthropic's image and tool-prompt figures,
/// OpenAI's image tiles.
#[tokio::test]
async fn conversations_count_text_images_and_tool_prompts() {
    let daemon = Daemon::start(LIMITS);
    let client = daemon.client().await;
    let image = |width, height, detail: &str| Block::Image {
        width,
        height,
        detail: detail.into(),
    };
    let text = |text: &str| Block::Text { text: text.into() };
    let tools = r#"[{"name":"get_weather","description":"Weather of a city.","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]"#;
    let anthropic = Conversation {
        api: "anthropic".into(),
        system: vec!["You are terse.".into(), "Cite sources.".into()],
        messages: vec![
            Turn {
                role: "user".into(),
                name: None,
                blocks: vec![image(1000, 1000, ""), text("What city is this?")],
                tool_calls_json: None,
            },
            Turn {
                role: "assistant".into(),
                name: None,
                blocks: vec![text("get_weather"), text(r#"{"city":"Oslo"}"#)],
                tool_calls_json: None,
            },
            Turn {
                role: "user".into(),
                name: None,
                blocks: vec![text("-3°C, snow")],
                tool_calls_json: None,
            },
        ],
        tools_json: Some(tools.into()),
        max_output_tokens: Some(300),
    };
    // The same text as a chat request: the system prompt first.
    let as_chat = ChatRequest {
        messages: vec![
            ChatMessage::text("system", &["You are terse.", "Cite sources."]),
            ChatMessage::text("user", &["What city is this?"]),
            ChatMessage::text("assistant", &["get_weather", r#"{"city":"Oslo"}"#]),
            ChatMessage::text("user", &["-3°C, snow"]),
        ],
        tools_json: Some(tools.into()),
        max_output_tokens: Some(300),
    };
    let text_only = counted(Counter::Chars(CharEstimator::default()), &as_chat).total;
    assert!(text_only > 0);
    // Anthropic's vision guide: a 1000 × 1000 px image is about 1334 tokens;
    // a request with tools carries 346 tokens of tool-use system prompt.
    assert_eq!(
        estimated(
            &client
                .call(estimate_cost(
                    "claude",
                    Cost::Conversation(anthropic.clone())
                ))
                .await
                .unwrap()
        ),
        (text_only + 1334 + 346, 300)
    );

    // OpenAI's vision guide: 2048 × 4096 at high detail is 1105 tokens, any
    // image at low detail 85; the text counts as before (the character rule).
    let mut user = ChatMessage::text("user", &["Compare these."]);
    user.name = Some("ann".into());
    let openai_chat = ChatRequest {
        messages: vec![ChatMessage::text("system", &["Be brief."]), user],
        tools_json: None,
        max_output_tokens: Some(50),
    };
    let openai = Conversation {
        api: "openai".into(),
        system: vec![],
        messages: vec![
            Turn {
                role: "system".into(),
                name: None,
                blocks: vec![text("Be brief.")],
                tool_calls_json: None,
            },
            Turn {
                role: "user".into(),
                name: Some("ann".into()),
                blocks: vec![
                    text("Compare these."),
                    image(2048, 4096, "high"),
                    image(4096, 8192, "low"),
                ],
                tool_calls_json: None,
            },
        ],
        tools_json: None,
        max_output_tokens: Some(50),
    };
    let openai_text = counted(Counter::OpenaiChars(OpenaiChars::default()), &openai_chat).total;
    assert_eq!(
        estimated(
            &client
                .call(estimate_cost("openai", Cost::Conversation(openai.clone())))
                .await
                .unwrap()
        ),
        (openai_text + 1105 + 85, 50)
    );
    // Acquire reserves what Estimate said.
    let (_, tokens, _) = granted(
        &client
            .call(Request::Acquire(Acquire {
                limit: "gpt".into(),
                tenant: None,
                priority: None,
                cost: Cost::Conversation(openai),
                max_wait_ms: Some(0),
            }))
            .await
            .unwrap(),
    );
    let tiktoken = Counter::for_model("gpt-4o", CharEstimator::default());
    assert_eq!(
        tokens,
        counted(tiktoken, &openai_chat).total + 1105 + 85 + 50
    );

    // An API the daemon does not know is refused, not counted as zero.
    let unknown = Conversation {
        api: "gemini".into(),
        ..anthropic
    };
    let answer = client
        .call(estimate_cost("claude", Cost::Conversation(unknown)))
        .await
        .unwrap();
    assert_eq!(error_code(&answer), ErrorCode::InvalidRequest);
}
