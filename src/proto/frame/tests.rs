use super::*;
use crate::proto::{ClientFrame, Request};

fn ping_frame() -> Vec<u8> {
    let mut bytes = Vec::new();
    let frame = ClientFrame {
        request_id: 7,
        request: Request::Ping,
    };
    encode_frame(&frame, &mut bytes).unwrap();
    bytes
}

#[test]
fn ping_has_the_documented_layout() {
    // length 12 | request id 7 | variant index 7 (Ping)
    assert_eq!(hex(&ping_frame()), "0c000000070000000000000007000000");
}

#[test]
fn known_tags_end_with_budgets_the_last_request() {
    let frame = ClientFrame {
        request_id: 7,
        request: Request::Budgets { limit: None },
    };
    let mut bytes = Vec::new();
    encode_frame(&frame, &mut bytes).unwrap();
    assert_eq!(
        request_tag_hint(&bytes[LENGTH_PREFIX_LEN..]),
        Some(Request::KNOWN_TAGS - 1)
    );
}

#[test]
fn cost_tag_hint_finds_the_cost_behind_the_names() {
    use crate::proto::{Acquire, Conversation, Cost};
    let payload = |request: Request| {
        let mut bytes = Vec::new();
        encode_frame(
            &ClientFrame {
                request_id: 5,
                request,
            },
            &mut bytes,
        )
        .unwrap();
        bytes.split_off(LENGTH_PREFIX_LEN)
    };
    let tokens = Cost::Tokens {
        input_tokens: 1,
        output_tokens: 2,
    };
    let conversation = Cost::Conversation(Conversation {
        api: "anthropic".into(),
        system: vec![],
        messages: vec![],
        tools_json: None,
        max_output_tokens: None,
    });
    let acquire = |tenant: Option<&str>, priority: Option<&str>, cost: Cost| {
        Request::Acquire(Acquire {
            limit: "claude".into(),
            tenant: tenant.map(str::to_string),
            priority: priority.map(str::to_string),
            cost,
            max_wait_ms: Some(1),
        })
    };
    // (request, expected hint)
    let cases = [
        (acquire(None, None, tokens.clone()), Some(0)),
        (
            acquire(Some("acme"), Some("batch"), conversation.clone()),
            Some(2),
        ),
        (acquire(None, Some("batch"), tokens.clone()), Some(0)),
        (
            Request::Estimate {
                limit: "claude".into(),
                cost: conversation,
            },
            Some(2),
        ),
        (Request::Ping, None),
        (Request::Status { limit: None }, None),
    ];
    for (request, expected) in cases {
        assert_eq!(
            cost_tag_hint(&payload(request.clone())),
            expected,
            "{request:?}"
        );
    }
    // Truncated before the cost tag, or a bad option byte: no hint.
    let whole = payload(acquire(Some("acme"), None, tokens));
    // The cost tag sits at bytes 40..44 (id, tag, "claude", Some("acme"), None).
    assert_eq!(cost_tag_hint(&whole[..44]), Some(0));
    assert_eq!(cost_tag_hint(&whole[..43]), None);
    let mut bad_option = whole.clone();
    bad_option[12 + 8 + 6] = 2;
    assert_eq!(cost_tag_hint(&bad_option), None);
    // A length that claims more than the payload holds: no panic, no hint.
    let mut huge = whole;
    huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(cost_tag_hint(&huge), None);
}

#[test]
fn partial_frames_need_more_bytes() {
    let bytes = ping_frame();
    for end in 0..bytes.len() {
        assert_eq!(
            split_frame(&bytes[..end]),
            Ok(None),
            "prefix of {end} bytes"
        );
    }
    let (payload, used) = split_frame(&bytes).unwrap().unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(payload, &bytes[LENGTH_PREFIX_LEN..]);
}

#[test]
fn oversized_length_is_refused_before_buffering() {
    let declared = MAX_FRAME_LEN + 1;
    assert_eq!(
        split_frame(&declared.to_le_bytes()),
        Err(FrameError::TooLarge {
            declared,
            max: MAX_FRAME_LEN
        })
    );
}

#[test]
fn hostile_string_length_is_an_error_not_an_allocation() {
    // request id 1, Hello, protocol 1, client name claiming 2^40 bytes.
    let mut payload = 1u64.to_le_bytes().to_vec();
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(&1u16.to_le_bytes());
    payload.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let result = decode_payload::<ClientFrame>(&payload);
    assert!(
        matches!(result, Err(FrameError::Malformed(_))),
        "{result:?}"
    );
}

#[test]
fn trailing_bytes_are_malformed() {
    let mut bytes = ping_frame();
    bytes.push(0);
    let error = decode_payload::<ClientFrame>(&bytes[LENGTH_PREFIX_LEN..]).unwrap_err();
    assert_eq!(
        error,
        FrameError::Malformed("1 trailing bytes after the message".into())
    );
}

#[test]
fn unknown_tag_is_malformed_and_keeps_its_request_id() {
    let mut payload = 9u64.to_le_bytes().to_vec();
    payload.extend_from_slice(&200u32.to_le_bytes());
    assert!(matches!(
        decode_payload::<ClientFrame>(&payload),
        Err(FrameError::Malformed(_))
    ));
    assert_eq!(request_id_hint(&payload), Some(9));
    assert_eq!(request_id_hint(&payload[..7]), None);
}

#[test]
fn the_largest_lists_a_frame_can_hold_still_decode() {
    use crate::proto::{Acquire, ChatMessage, ChatRequest, Cost};
    let empty = ChatMessage {
        role: String::new(),
        name: None,
        content: Vec::new(),
        tool_calls_json: None,
    };
    let messages = vec![empty; (MAX_FRAME_LEN as usize - 100) / 18];
    let frame = ClientFrame {
        request_id: 1,
        request: Request::Acquire(Acquire {
            limit: "gpt".into(),
            tenant: None,
            priority: None,
            cost: Cost::Messages(ChatRequest {
                messages,
                tools_json: None,
                max_output_tokens: None,
            }),
            max_wait_ms: None,
        }),
    };
    let mut bytes = Vec::new();
    encode_frame(&frame, &mut bytes).unwrap();
    let (payload, _) = split_frame(&bytes).unwrap().unwrap();
    assert_eq!(decode_payload::<ClientFrame>(payload).unwrap(), frame);
}

/// Lists of the elements whose in-memory size is the largest multiple of
/// their wire size, filling payloads of every claim bound: each decodes.
#[test]
fn the_smallest_elements_decode_at_every_claim_bound() {
    use crate::proto::{Acquire, ChatMessage, ChatRequest, Conversation, Cost, Turn};
    let empty_message = ChatMessage {
        role: String::new(),
        name: None,
        content: Vec::new(),
        tool_calls_json: None,
    };
    let empty_turn = Turn {
        role: String::new(),
        name: None,
        blocks: Vec::new(),
        tool_calls_json: None,
    };
    let mut count = 1;
    while count * 18 < MAX_FRAME_LEN as usize - 100 {
        for cost in [
            Cost::Messages(ChatRequest {
                messages: vec![empty_message.clone(); count],
                tools_json: None,
                max_output_tokens: None,
            }),
            Cost::Conversation(Conversation {
                api: String::new(),
                system: vec![String::new(); count],
                messages: vec![empty_turn.clone(); count / 2],
                tools_json: None,
                max_output_tokens: None,
            }),
        ] {
            let frame = ClientFrame {
                request_id: 1,
                request: Request::Acquire(Acquire {
                    limit: "gpt".into(),
                    tenant: None,
                    priority: None,
                    cost,
                    max_wait_ms: None,
                }),
            };
            let mut bytes = Vec::new();
            encode_frame(&frame, &mut bytes).unwrap();
            let (payload, _) = split_frame(&bytes).unwrap().unwrap();
            assert_eq!(
                decode_payload::<ClientFrame>(payload).as_ref(),
                Ok(&frame),
                "{count} elements"
            );
        }
        count = count * 3 + 1;
    }
}

#[test]
fn a_payloads_claim_bound_is_a_power_of_two_under_sixteen_times_its_length() {
    for (len, bits) in [
        (0, 10),
        (12, 10),
        (128, 10),
        (129, 11),
        (4096, 15),
        (4097, 16),
        (MAX_FRAME_LEN as usize, MAX_CLAIM_BITS),
    ] {
        assert_eq!(claim_bits(len), bits, "{len} bytes");
    }
}

#[test]
fn a_payload_above_the_frame_bound_is_too_large_to_decode() {
    let payload = vec![0; MAX_FRAME_LEN as usize + 1];
    assert!(matches!(
        decode_payload::<ClientFrame>(&payload),
        Err(FrameError::TooLarge { .. })
    ));
}

#[test]
fn the_reader_hands_out_whole_frames_however_the_bytes_arrive() {
    let mut stream = ping_frame();
    stream.extend_from_slice(&ping_frame());
    let mut reader = FrameReader::new();
    let mut payloads = Vec::new();
    for byte in &stream {
        reader.read_space().extend_from_slice(&[*byte]);
        while let Some(payload) = reader.next_payload().unwrap() {
            payloads.push(payload);
        }
    }
    assert_eq!(payloads.len(), 2);
    assert!(
        payloads
            .iter()
            .all(|p| p[..] == ping_frame()[LENGTH_PREFIX_LEN..])
    );
    assert_eq!(reader.buffered(), 0);
    reader
        .read_space()
        .extend_from_slice(&(MAX_FRAME_LEN + 1).to_le_bytes());
    assert!(matches!(
        reader.next_payload(),
        Err(FrameError::TooLarge { .. })
    ));
}

#[test]
fn a_future_hello_is_recognised_by_its_prefix() {
    let mut payload = 1u64.to_le_bytes().to_vec();
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(&2u16.to_le_bytes());
    payload.extend_from_slice(b"fields of a later version");
    assert_eq!(hello_version_hint(&payload), Some(2));
    assert_eq!(hello_version_hint(&payload[..13]), None);
    payload[8] = 7;
    assert_eq!(hello_version_hint(&payload), None);
}

proptest::proptest! {
    /// Whatever the bytes, splitting and decoding answer with a value or
    /// an error: never a panic, never an allocation a length merely names.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = split_frame(&bytes);
        let _ = decode_payload::<ClientFrame>(&bytes);
        let _ = decode_payload::<crate::proto::ServerFrame>(&bytes);
    }

    /// Valid frames with a few bytes flipped: the decoder still only
    /// answers.
    #[test]
    fn corrupted_frames_never_panic(flips in proptest::collection::vec((0usize..64, proptest::num::u8::ANY), 1..6)) {
        let mut bytes = ping_frame();
        bytes.extend_from_slice(&[0u8; 52]);
        let len = bytes.len();
        for (at, value) in flips {
            bytes[at % len] = value;
        }
        if let Ok(Some((payload, _))) = split_frame(&bytes) {
            let _ = decode_payload::<ClientFrame>(payload);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
