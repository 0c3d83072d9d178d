//! Hostile and broken input over the real socket: each case gets a clear
//! error (or a clean close), and the daemon keeps serving other connections.

use crate::support;

use ratekeeper::proto::{
    Acquire, ClientFrame, Cost, ErrorCode, MAX_FRAME_LEN, MAX_IN_FLIGHT, Request, Response, Usage,
};
use support::{Daemon, acquire, error_code, frame_of, hello, receive, send, send_bytes};

const CONFIG: &str = r#"
# Acquires here may wait up to an hour, the protocol's longest wait.
[[priorities]]
name = "patient"
max_wait_ms = 3600000

[[limits]]
name = "gpt"
tokens_per_minute = 60
burst_tokens = 1000
max_request_tokens = 900
"#;

/// The payload of a valid frame, for corrupting.
fn payload_of(request_id: u64, request: Request) -> Vec<u8> {
    let mut bytes = Vec::new();
    ratekeeper::proto::encode_frame(
        &ClientFrame {
            request_id,
            request,
        },
        &mut bytes,
    )
    .unwrap();
    bytes.split_off(4)
}

#[tokio::test]
async fn oversized_length_gets_an_error_and_a_close() {
    let daemon = Daemon::start(CONFIG);
    for declared in [MAX_FRAME_LEN + 1, u32::MAX] {
        let mut stream = daemon.raw_after_hello().await;
        send_bytes(&mut stream, &declared.to_le_bytes()).await;
        let answer = receive(&mut stream).await.expect("an error frame");
        assert_eq!(answer.request_id, 0);
        assert_eq!(error_code(&answer.response), ErrorCode::FrameTooLarge);
        assert!(
            receive(&mut stream).await.is_none(),
            "connection should close"
        );
    }
    // Before Hello, too.
    let mut stream = daemon.raw().await;
    send_bytes(&mut stream, &u32::MAX.to_le_bytes()).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(error_code(&answer.response), ErrorCode::FrameTooLarge);
    daemon.assert_serving().await;
}

#[tokio::test]
async fn a_truncated_frame_then_close_harms_nobody() {
    let daemon = Daemon::start(CONFIG);
    let mut stream = daemon.raw_after_hello().await;
    let whole = frame_of(&payload_of(2, Request::Ping));
    send_bytes(&mut stream, &whole[..whole.len() - 3]).await;
    drop(stream);
    daemon.assert_serving().await;
    // The connection's task notices the close on its own time.
    daemon.wait_for_log("in the middle of a frame").await;
}

#[tokio::test]
async fn undecodable_payloads_are_answered_and_the_connection_goes_on() {
    let daemon = Daemon::start(CONFIG);
    let mut stream = daemon.raw_after_hello().await;

    let mut trailing = payload_of(2, Request::Ping);
    trailing.extend_from_slice(b"xyz");
    let mut unknown_tag = 3u64.to_le_bytes().to_vec();
    unknown_tag.extend_from_slice(&99u32.to_le_bytes());
    let mut truncated_field = payload_of(4, acquire("gpt", 1, 0));
    truncated_field.truncate(truncated_field.len() - 5);
    // A client name claiming 2^40 bytes inside a 26-byte payload: bincode's
    // decode limit makes this an error instead of a terabyte allocation.
    let mut hostile_length = 5u64.to_le_bytes().to_vec();
    hostile_length.extend_from_slice(&0u32.to_le_bytes());
    hostile_length.extend_from_slice(&1u16.to_le_bytes());
    hostile_length.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let mut invalid_utf8 = payload_of(
        6,
        Request::Status {
            limit: Some("ab".into()),
        },
    );
    let len = invalid_utf8.len();
    invalid_utf8[len - 1] = 0xff;

    // A request of a later protocol revision (a tag this daemon does not
    // know, with fields of its own): Unsupported, not malformed.
    let mut future_request = 7u64.to_le_bytes().to_vec();
    future_request.extend_from_slice(&Request::KNOWN_TAGS.to_le_bytes());
    future_request.extend_from_slice(b"fields of a later revision");

    // An acquire whose cost is of a later revision (a cost tag this daemon
    // does not know, after a tenant and no priority): Unsupported too.
    let mut future_cost = 8u64.to_le_bytes().to_vec();
    future_cost.extend_from_slice(&1u32.to_le_bytes());
    for field in [&b"gpt"[..], b"acme"] {
        if field == b"acme" {
            future_cost.push(1);
        }
        future_cost.extend_from_slice(&(field.len() as u64).to_le_bytes());
        future_cost.extend_from_slice(field);
    }
    future_cost.push(0);
    future_cost.extend_from_slice(&Cost::KNOWN_TAGS.to_le_bytes());
    future_cost.extend_from_slice(b"fields of a later revision");

    for (expected_id, payload, code) in [
        (2, trailing, ErrorCode::MalformedMessage),
        (3, unknown_tag, ErrorCode::Unsupported),
        (4, truncated_field, ErrorCode::MalformedMessage),
        (5, hostile_length, ErrorCode::MalformedMessage),
        (6, invalid_utf8, ErrorCode::MalformedMessage),
        (7, future_request, ErrorCode::Unsupported),
        (8, future_cost, ErrorCode::Unsupported),
    ] {
        send_bytes(&mut stream, &frame_of(&payload)).await;
        let answer = receive(&mut stream).await.expect("an error frame");
        assert_eq!(answer.request_id, expected_id);
        assert_eq!(error_code(&answer.response), code, "request {expected_id}");
    }
    // Too short to carry a request id: answered on id 0.
    send_bytes(&mut stream, &frame_of(&[1, 2, 3])).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(
        (answer.request_id, error_code(&answer.response)),
        (0, ErrorCode::MalformedMessage)
    );

    send(&mut stream, 9, Request::Ping).await;
    let answer = receive(&mut stream).await.expect("pong");
    assert_eq!((answer.request_id, answer.response), (9, Response::Pong));
    daemon.assert_serving().await;
}

#[tokio::test]
async fn protocol_version_and_hello_are_enforced() {
    let daemon = Daemon::start(CONFIG);

    let mut stream = daemon.raw().await;
    send(
        &mut stream,
        1,
        Request::Hello {
            protocol_version: 99,
            client_name: "future".into(),
        },
    )
    .await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(error_code(&answer.response), ErrorCode::UnsupportedVersion);
    assert!(
        receive(&mut stream).await.is_none(),
        "connection should close"
    );

    // A later version's Hello may carry more fields: still UnsupportedVersion.
    let mut stream = daemon.raw().await;
    let mut future_hello = 1u64.to_le_bytes().to_vec();
    future_hello.extend_from_slice(&0u32.to_le_bytes());
    future_hello.extend_from_slice(&2u16.to_le_bytes());
    future_hello.extend_from_slice(b"new fields");
    send_bytes(&mut stream, &frame_of(&future_hello)).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(answer.request_id, 1);
    assert_eq!(error_code(&answer.response), ErrorCode::UnsupportedVersion);
    assert!(
        receive(&mut stream).await.is_none(),
        "connection should close"
    );

    let mut stream = daemon.raw().await;
    send(&mut stream, 1, Request::Ping).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(error_code(&answer.response), ErrorCode::HelloRequired);
    assert!(
        receive(&mut stream).await.is_none(),
        "connection should close"
    );

    let mut stream = daemon.raw().await;
    send_bytes(&mut stream, &frame_of(b"GET / HTTP/1.1\r\n")).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(error_code(&answer.response), ErrorCode::HelloRequired);
    assert!(
        receive(&mut stream).await.is_none(),
        "connection should close"
    );

    let mut stream = daemon.raw_after_hello().await;
    send(&mut stream, 2, hello()).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(error_code(&answer.response), ErrorCode::InvalidRequest);
    send(&mut stream, 0, Request::Ping).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(error_code(&answer.response), ErrorCode::InvalidRequest);
    daemon.assert_serving().await;
}

#[tokio::test]
async fn bad_requests_get_their_error_codes() {
    let daemon = Daemon::start(CONFIG);
    let client = daemon.client().await;
    let long_name = "x".repeat(129);
    let cases = [
        (acquire("nope", 1, 0), ErrorCode::UnknownLimit),
        (acquire("gpt", 0, 0), ErrorCode::InvalidRequest),
        (acquire("gpt", 901, 0), ErrorCode::CostExceedsCapacity),
        (acquire(&long_name, 1, 0), ErrorCode::InvalidRequest),
        (acquire("gpt", 1, 3_600_001), ErrorCode::InvalidRequest),
        (
            Request::Acquire(Acquire {
                limit: "gpt".into(),
                tenant: None,
                priority: Some("vip".into()),
                cost: Cost::Tokens {
                    input_tokens: 1,
                    output_tokens: 0,
                },
                max_wait_ms: None,
            }),
            ErrorCode::UnknownPriority,
        ),
        (
            Request::Acquire(Acquire {
                limit: "gpt".into(),
                tenant: None,
                priority: None,
                cost: Cost::Tokens {
                    input_tokens: u64::MAX,
                    output_tokens: 1,
                },
                max_wait_ms: None,
            }),
            ErrorCode::CostExceedsCapacity,
        ),
        (
            Request::Report {
                lease: 42,
                input_tokens: 1,
                output_tokens: 0,
            },
            ErrorCode::UnknownLease,
        ),
        (
            Request::UsageReport {
                lease: 42,
                usage: Usage {
                    input_tokens: 1,
                    cached_input_tokens: 2,
                    cache_write_tokens: 3,
                    output_tokens: 4,
                },
            },
            ErrorCode::UnknownLease,
        ),
        (Request::Release { lease: 42 }, ErrorCode::UnknownLease),
        (
            Request::Status {
                limit: Some("nope".into()),
            },
            ErrorCode::UnknownLimit,
        ),
        (feedback("nope", 429, vec![]), ErrorCode::UnknownLimit),
        (
            feedback("gpt", 429, vec![("retry-after", "1"); 65]),
            ErrorCode::InvalidRequest,
        ),
        (
            feedback("gpt", 429, vec![("retry-after", &"9".repeat(257))]),
            ErrorCode::InvalidRequest,
        ),
    ];
    for (request, expected) in cases {
        let response = client.call(request.clone()).await.unwrap();
        assert_eq!(
            error_code(&response),
            expected,
            "{request:?} → {response:?}"
        );
    }
    // None of it reserved anything.
    let (lease, tokens) = match client.call(acquire("gpt", 900, 0)).await.unwrap() {
        Response::Granted { lease, tokens, .. } => (lease, tokens),
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(tokens, 900);
    client.call(Request::Release { lease }).await.unwrap();
    daemon.assert_serving().await;
}

fn feedback(limit: &str, status: u16, headers: Vec<(&str, &str)>) -> Request {
    Request::Feedback(ratekeeper::proto::Feedback {
        limit: limit.into(),
        status,
        since_grant_ms: 0,
        headers: headers
            .into_iter()
            .map(|(name, value)| ratekeeper::proto::Header {
                name: name.into(),
                value: value.into(),
            })
            .collect(),
    })
}

#[tokio::test]
async fn a_request_id_in_flight_cannot_be_reused() {
    let daemon = Daemon::start(CONFIG);
    let mut stream = daemon.raw_after_hello().await;
    send(&mut stream, 7, acquire("gpt", 900, 0)).await;
    let answer = receive(&mut stream).await.expect("grant");
    assert!(
        matches!(answer.response, Response::Granted { .. }),
        "{answer:?}"
    );
    // The bucket is now nearly empty: this one waits about 900 s.
    send(&mut stream, 8, acquire("gpt", 900, 3_600_000)).await;
    send(&mut stream, 8, Request::Ping).await;
    let answer = receive(&mut stream).await.expect("an error frame");
    assert_eq!(answer.request_id, 8);
    assert_eq!(error_code(&answer.response), ErrorCode::DuplicateRequestId);
    // Once answered, the id is free again.
    send(&mut stream, 9, Request::Cancel { request_id: 8 }).await;
    let mut answers = [
        receive(&mut stream).await.expect("answer"),
        receive(&mut stream).await.expect("answer"),
    ];
    answers.sort_by_key(|frame| frame.request_id);
    assert_eq!(error_code(&answers[0].response), ErrorCode::Cancelled);
    assert_eq!(answers[1].response, Response::Cancelled { found: true });
    send(&mut stream, 8, Request::Ping).await;
    assert_eq!(
        receive(&mut stream).await.expect("pong").response,
        Response::Pong
    );
    daemon.assert_serving().await;
}

#[tokio::test]
async fn more_in_flight_requests_than_allowed_are_refused() {
    let daemon = Daemon::start(CONFIG);
    let mut stream = daemon.raw_after_hello().await;
    // Empty the bucket; at one token per second every acquire below waits.
    for id in 1..=2 {
        send(&mut stream, id, acquire("gpt", 500, 0)).await;
        let answer = receive(&mut stream).await.unwrap();
        assert!(
            matches!(answer.response, Response::Granted { .. }),
            "{answer:?}"
        );
    }
    let mut frames = Vec::new();
    for id in 0..=MAX_IN_FLIGHT as u64 {
        let request = acquire("gpt", 1, 3_600_000);
        ratekeeper::proto::encode_frame(
            &ClientFrame {
                request_id: 100 + id,
                request,
            },
            &mut frames,
        )
        .unwrap();
    }
    send_bytes(&mut stream, &frames).await;
    let answer = receive(&mut stream).await.expect("the refusal");
    assert_eq!(answer.request_id, 100 + MAX_IN_FLIGHT as u64);
    assert_eq!(error_code(&answer.response), ErrorCode::TooManyInFlight);
    daemon.assert_serving().await;
}
