//! Framing: a `u32` little-endian payload length, then a bincode 2 payload in
//! the fixed-width little-endian layout (`bincode::config::legacy()`).

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};
use bincode::{Decode, Encode};
use bytes::{Buf, Bytes, BytesMut};

use super::{LENGTH_PREFIX_LEN, MAX_FRAME_LEN};

/// Bytes made room for before each read from a stream.
const READ_CHUNK: usize = 16 * 1024;

/// Most bytes one decode may claim. Without a limit a 12-byte payload
/// declaring a string of 2^40 bytes makes bincode try to allocate it and abort
/// the process. bincode counts list elements at their in-memory size, up to
/// about 5.3 times their smallest wire size (an empty `ChatMessage`: 18 bytes
/// on the wire, 96 in memory), so eight times the frame bound lets every valid
/// frame decode while still bounding what a hostile one can claim.
const DECODE_LIMIT: usize = 8 * MAX_FRAME_LEN as usize;

/// The bincode configuration of every payload.
type WireConfig = Configuration<LittleEndian, Fixint, Limit<DECODE_LIMIT>>;

const fn wire_config() -> WireConfig {
    bincode::config::legacy().with_limit::<DECODE_LIMIT>()
}

/// Why bytes could not be turned into a message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix declares more than the maximum. The stream cannot be
    /// resynchronised without reading that many bytes, so it must be closed.
    #[error("frame of {declared} bytes exceeds the maximum of {max} bytes")]
    TooLarge { declared: u32, max: u32 },
    /// The payload is not a valid message. The frame boundary is intact, so
    /// the connection can go on with the next frame.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Finds the first complete frame in `buffer`.
///
/// Returns `Ok(None)` while more bytes are needed, or the payload and the
/// number of bytes the whole frame occupies. The declared length is checked
/// against [`MAX_FRAME_LEN`] before anything is buffered for it.
pub fn split_frame(buffer: &[u8]) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(prefix) = buffer.first_chunk::<LENGTH_PREFIX_LEN>() else {
        return Ok(None);
    };
    let declared = u32::from_le_bytes(*prefix);
    if declared > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            declared,
            max: MAX_FRAME_LEN,
        });
    }
    let frame_len = LENGTH_PREFIX_LEN + declared as usize;
    Ok(buffer
        .get(LENGTH_PREFIX_LEN..frame_len)
        .map(|payload| (payload, frame_len)))
}

/// The bytes read from one stream, cut into frames: the framing codec of
/// both the server and the client. Pure: the caller reads into
/// [`read_space`](Self::read_space) and takes payloads out. Nothing is
/// allocated before the first read.
#[derive(Debug, Default)]
pub struct FrameReader {
    buffer: BytesMut,
}

impl FrameReader {
    pub fn new() -> Self {
        FrameReader::default()
    }

    /// The buffer the next read appends to, with room made for it.
    pub fn read_space(&mut self) -> &mut BytesMut {
        self.buffer.reserve(READ_CHUNK);
        &mut self.buffer
    }

    /// The buffer as it is, for a caller that manages its room itself
    /// ([`room`](Self::room), [`reclaim`](Self::reclaim),
    /// [`reallocate`](Self::reallocate)).
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// The payload of the next complete frame, `Ok(None)` while more bytes
    /// are needed, or the error of an oversized length (checked before
    /// anything is buffered for it).
    pub fn next_payload(&mut self) -> Result<Option<Bytes>, FrameError> {
        let Some((_, frame_len)) = split_frame(&self.buffer)? else {
            return Ok(None);
        };
        let mut frame = self.buffer.split_to(frame_len).freeze();
        frame.advance(LENGTH_PREFIX_LEN);
        Ok(Some(frame))
    }

    /// Bytes received but not yet taken as a frame.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Bytes the buffer can hold from the first byte not yet taken, without
    /// growing.
    pub fn room(&self) -> usize {
        self.buffer.capacity()
    }

    /// Length prefix included, the size of the frame whose bytes are
    /// arriving, once its prefix is in (and within [`MAX_FRAME_LEN`]); 0
    /// before that.
    pub fn incomplete_frame_len(&self) -> usize {
        match self.buffer.first_chunk::<LENGTH_PREFIX_LEN>() {
            Some(prefix) if u32::from_le_bytes(*prefix) <= MAX_FRAME_LEN => {
                LENGTH_PREFIX_LEN + u32::from_le_bytes(*prefix) as usize
            }
            _ => 0,
        }
    }

    /// Makes [`room`](Self::room) for `capacity` bytes inside the present
    /// allocation (moving what is buffered to its front); false when it
    /// cannot, without allocating.
    pub fn reclaim(&mut self, capacity: usize) -> bool {
        let additional = capacity.saturating_sub(self.buffer.len());
        self.buffer.try_reclaim(additional)
    }

    /// Moves what is buffered into a new allocation of exactly `capacity`
    /// bytes (at least what is buffered), letting the old one go: how a
    /// buffer grows for one large frame, and gives the memory back after.
    pub fn reallocate(&mut self, capacity: usize) {
        let mut buffer = BytesMut::with_capacity(capacity.max(self.buffer.len()));
        buffer.extend_from_slice(&self.buffer);
        self.buffer = buffer;
    }
}

/// Decodes one payload that must hold exactly one `T` and nothing after it.
pub fn decode_payload<T: Decode<()>>(payload: &[u8]) -> Result<T, FrameError> {
    let (message, consumed) = bincode::decode_from_slice(payload, wire_config())
        .map_err(|error| FrameError::Malformed(error.to_string()))?;
    if consumed != payload.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            payload.len() - consumed
        )));
    }
    Ok(message)
}

/// The request id of a payload that failed to decode, so the error can be
/// addressed to the request; every client frame starts with its `u64` id.
pub fn request_id_hint(payload: &[u8]) -> Option<u64> {
    payload.first_chunk::<8>().map(|id| u64::from_le_bytes(*id))
}

/// The request tag of a client payload that failed to decode, so that a
/// request this daemon does not know yet can be told apart from a broken one.
pub fn request_tag_hint(payload: &[u8]) -> Option<u32> {
    payload
        .get(8..12)
        .map(|tag| u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]]))
}

/// The `Cost` tag of an `Acquire` or `Estimate` payload that failed to
/// decode, so that a cost of a later protocol revision can be told apart
/// from a broken one. Reads only the fields in front of the cost.
pub fn cost_tag_hint(payload: &[u8]) -> Option<u32> {
    fn string(payload: &[u8], at: usize) -> Option<usize> {
        let length = u64::from_le_bytes(*payload.get(at..)?.first_chunk::<8>()?);
        (at + 8).checked_add(usize::try_from(length).ok()?)
    }
    fn optional_string(payload: &[u8], at: usize) -> Option<usize> {
        match payload.get(at)? {
            0 => Some(at + 1),
            1 => string(payload, at + 1),
            _ => None,
        }
    }
    let cost_at = match request_tag_hint(payload)? {
        // Acquire: limit, tenant, priority, cost.
        1 => {
            let at = string(payload, 12)?;
            let at = optional_string(payload, at)?;
            optional_string(payload, at)?
        }
        // Estimate: limit, cost.
        5 => string(payload, 12)?,
        _ => return None,
    };
    let tag = payload.get(cost_at..)?.first_chunk::<4>()?;
    Some(u32::from_le_bytes(*tag))
}

/// The `protocol_version` of a payload that starts like a `Hello` (request
/// id, tag 0, version), even if the rest does not decode: a future version may
/// extend `Hello`, and must still be told which version this daemon speaks.
pub fn hello_version_hint(payload: &[u8]) -> Option<u16> {
    let tag = payload.get(8..12)?;
    let version = payload.get(12..14)?;
    (tag == [0, 0, 0, 0]).then(|| u16::from_le_bytes([version[0], version[1]]))
}

/// Appends `message` to `out` as one frame (length prefix and payload).
pub fn encode_frame<T: Encode>(message: &T, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX_LEN]);
    bincode::encode_into_std_write(message, out, wire_config())
        .map_err(|error| FrameError::Malformed(error.to_string()))?;
    let payload_len = out.len() - start - LENGTH_PREFIX_LEN;
    match u32::try_from(payload_len) {
        Ok(len) if len <= MAX_FRAME_LEN => {
            out[start..start + LENGTH_PREFIX_LEN].copy_from_slice(&len.to_le_bytes());
            Ok(())
        }
        _ => {
            out.truncate(start);
            Err(FrameError::TooLarge {
                declared: u32::try_from(payload_len).unwrap_or(u32::MAX),
                max: MAX_FRAME_LEN,
            })
        }
    }
}

#[cfg(test)]
mod tests {
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
    fn known_tags_end_with_feedback_the_last_request() {
        let frame = ClientFrame {
            request_id: 7,
            request: Request::Feedback(crate::proto::Feedback {
                limit: "gpt".into(),
                status: 429,
                since_grant_ms: 0,
                headers: Vec::new(),
            }),
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
}
