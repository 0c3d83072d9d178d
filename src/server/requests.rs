//! What a connection does with each decoded frame: the `Hello` exchange,
//! its own requests (`Ping`, `Cancel`), the refusals (duplicate id, too many
//! in flight), and the start of every service call, which the connection
//! then drives itself. Answers are encoded into the connection's output
//! buffer; nothing here awaits.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::leases::Usage;
use crate::proto::{
    self, CONNECTION_REQUEST_ID, ClientFrame, Cost, ErrorCode, FrameError, FrameReader,
    MAX_FRAME_LEN, MAX_IN_FLIGHT, PROTOCOL_VERSION, Request, Response, ServerFrame,
};
use crate::service::{Call, Caller, ConnectionId, Reported, Service, off_loop};

/// Payloads above this size are decoded on the blocking pool, never on the
/// socket loop: a 4 MiB prompt of 65,536 parts takes milliseconds to decode
/// (its allocations, UTF-8 checks and copies), which every other
/// connection would wait for (issue 27). Below it a decode takes
/// microseconds, less than the hop.
pub(crate) const DECODE_OFF_LOOP_BYTES: usize = 64 * 1024;

/// What [`Requests::process_buffered`] took from the buffer.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// Frames taken, including `to_decode`.
    pub frames: usize,
    /// A payload above [`DECODE_OFF_LOOP_BYTES`], for the caller to decode
    /// off the socket loop; the frames behind it wait in the buffer.
    pub to_decode: Option<Bytes>,
}

/// Large payloads decoded at once, all connections together: a decode may
/// claim eight times its payload (32 MiB for the largest) before the
/// prompt's memory is counted anywhere, so this bounds what decoding holds.
pub(crate) const DECODE_SLOTS: usize = 2;

/// The slots of [`DECODE_SLOTS`].
static DECODING: Semaphore = Semaphore::const_new(DECODE_SLOTS);

/// A payload's frame, or the error of one that did not decode with its
/// payload.
pub(crate) type Decoded = Result<ClientFrame, (FrameError, Bytes)>;

/// Decodes `payload`; on success the payload is dropped here.
fn decode_client_frame(payload: Bytes) -> Decoded {
    proto::decode_payload::<ClientFrame>(&payload).map_err(|frame_error| (frame_error, payload))
}

/// Decodes a payload handed back as [`Taken::to_decode`] off the socket
/// loop, once one of the [`DECODE_SLOTS`] is free.
pub(crate) async fn decode_off_loop(payload: Bytes) -> Result<Decoded, String> {
    let slot = DECODING
        .acquire()
        .await
        .map_err(|closed| closed.to_string())?;
    // The slot goes with the decode: a connection that closes meanwhile
    // stops waiting for it, but the decode still holds its slot to the end.
    off_loop(move || {
        let _slot = slot;
        decode_client_frame(payload)
    })
    .await
    .map_err(|failed| failed.to_string())
}

/// How the daemon names itself in `Hello` and in messages.
const SERVER: &str = concat!("ratekeeper ", env!("CARGO_PKG_VERSION"));

/// The `Error` answer for `code`.
pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::error(code, message)
}

/// One service call as the connection drives it: the answer and the id it
/// goes to. It holds the drain's count of requests in flight until it ends.
pub(crate) async fn answer_call(
    service: Arc<Service>,
    connection: ConnectionId,
    request_id: u64,
    call: Call,
    cancel: CancellationToken,
    _in_flight: TaskTrackerToken,
) -> (u64, Response) {
    let _counted = service.metrics().request_started();
    // A bug must cost one request an error, never leave it unanswered.
    let response = AssertUnwindSafe(service.handle(connection, call, cancel))
        .catch_unwind()
        .await
        .map(|answer| answer.unwrap_or_else(|failure| failure.into_response()))
        .unwrap_or_else(|_| {
            tracing::error!(
                connection,
                request_id,
                "a request handler panicked; answered Internal"
            );
            error(
                ErrorCode::Internal,
                "the daemon failed while answering this request (a bug: please report it)",
            )
        });
    (request_id, response)
}

/// A `UsageReport`'s usage as settlement and budgets price it: the same
/// four disjoint kinds of token, by their domain names.
fn billed(usage: proto::Usage) -> Usage {
    Usage {
        input: usage.input_tokens,
        cached_input: usage.cached_input_tokens,
        cache_write: usage.cache_write_tokens,
        output: usage.output_tokens,
    }
}

/// The protocol state of one connection and the answers it has to send.
pub(crate) struct Requests {
    pub connection: ConnectionId,
    /// Set by `Hello`; `None` until then.
    pub client_name: Option<Arc<str>>,
    /// The peer's uid, from the kernel (`SO_PEERCRED`), when it could be read.
    pub peer_uid: Option<u32>,
    /// Unanswered service calls, each with its cancellation.
    pub in_flight: HashMap<u64, CancellationToken>,
    /// Encoded answers not yet written.
    pub out: Vec<u8>,
    /// Set once the drain deadline passed: calls still starting are
    /// cancelled at once.
    cancelled: bool,
}

impl Requests {
    pub(crate) fn new(connection: ConnectionId) -> Self {
        Requests {
            connection,
            client_name: None,
            peer_uid: None,
            in_flight: HashMap::new(),
            out: Vec::new(),
            cancelled: false,
        }
    }

    /// Cancels every call in flight and every call still to start: waiting
    /// acquires return their reservations.
    pub(crate) fn cancel_all(&mut self) {
        self.cancelled = true;
        self.in_flight.values().for_each(CancellationToken::cancel);
    }

    /// Handles the complete frames `frames` holds, in order, pushing the
    /// service calls they start onto `running` (built by `start`), up to
    /// the first payload too large to decode on the socket loop, which it
    /// hands back instead ([`Taken::to_decode`]): the caller decodes it off
    /// the loop, passes the result to [`decoded`](Self::decoded), and only
    /// then takes the frames behind it. Returns what it took, or the reason
    /// the connection must close.
    pub(crate) fn process_buffered<F>(
        &mut self,
        frames: &mut FrameReader,
        running: &mut FuturesUnordered<F>,
        start: &impl Fn(u64, Call, CancellationToken) -> F,
    ) -> Result<Taken, String> {
        let mut taken = Taken::default();
        loop {
            let payload = match frames.next_payload() {
                Ok(Some(payload)) => payload,
                Ok(None) => return Ok(taken),
                Err(frame_error) => {
                    let reason = frame_error.to_string();
                    let refusal = error(ErrorCode::FrameTooLarge, reason.clone());
                    self.answer(CONNECTION_REQUEST_ID, refusal);
                    return Err(reason);
                }
            };
            taken.frames += 1;
            if payload.len() > DECODE_OFF_LOOP_BYTES {
                taken.to_decode = Some(payload);
                return Ok(taken);
            }
            self.decoded(decode_client_frame(payload), running, start)?;
        }
    }

    /// Handles one decoded frame, or the error of one that did not decode
    /// with its payload (whose first bytes address the answer); `Err` is
    /// the reason the connection must close.
    pub(crate) fn decoded<F>(
        &mut self,
        frame: Decoded,
        running: &mut FuturesUnordered<F>,
        start: &impl Fn(u64, Call, CancellationToken) -> F,
    ) -> Result<(), String> {
        match frame {
            Ok(frame) => {
                if let Some((request_id, call)) = self.handle_frame(frame)? {
                    self.start(request_id, call, running, start);
                }
                Ok(())
            }
            Err((FrameError::Malformed(reason), payload)) if self.client_name.is_some() => {
                self.refuse_malformed(&payload, reason);
                Ok(())
            }
            Err((frame_error, payload)) => {
                let id = proto::request_id_hint(&payload).unwrap_or(CONNECTION_REQUEST_ID);
                let version = proto::hello_version_hint(&payload);
                if let Some(version) = version.filter(|&v| v != PROTOCOL_VERSION) {
                    return Err(self.refuse_version(id, version));
                }
                // Before Hello we cannot trust the peer speaks our protocol.
                let reason = format!("first frame is not a valid Hello: {frame_error}");
                self.answer(id, error(ErrorCode::HelloRequired, reason.clone()));
                Err(reason)
            }
        }
    }

    /// A payload that did not decode after `Hello`: a request of a later
    /// revision (`Unsupported`) or a broken one (`MalformedMessage`).
    fn refuse_malformed(&mut self, payload: &[u8], reason: String) {
        let id = proto::request_id_hint(payload).unwrap_or(CONNECTION_REQUEST_ID);
        let answer = match proto::request_tag_hint(payload) {
            // The client can tell that this daemon predates it (PROTOCOL.md §10).
            Some(tag) if tag >= Request::KNOWN_TAGS => {
                tracing::debug!(
                    connection = self.connection,
                    client = self.client(),
                    tag,
                    "request of a later protocol revision"
                );
                error(
                    ErrorCode::Unsupported,
                    format!(
                        "request tag {tag} is not known to {SERVER}, which knows tags 0 to {}",
                        Request::KNOWN_TAGS - 1
                    ),
                )
            }
            _ => match proto::cost_tag_hint(payload) {
                Some(tag) if tag >= Cost::KNOWN_TAGS => {
                    tracing::debug!(
                        connection = self.connection,
                        client = self.client(),
                        tag,
                        "cost of a later protocol revision"
                    );
                    error(
                        ErrorCode::Unsupported,
                        format!(
                            "cost tag {tag} is not known to {SERVER}, which knows tags 0 to {}",
                            Cost::KNOWN_TAGS - 1
                        ),
                    )
                }
                _ => {
                    tracing::warn!(
                        connection = self.connection,
                        client = self.client(),
                        reason,
                        "malformed message"
                    );
                    error(ErrorCode::MalformedMessage, reason)
                }
            },
        };
        self.answer(id, answer);
    }

    /// Answers what the connection answers itself; returns the service call
    /// to start, if the frame is one.
    fn handle_frame(&mut self, frame: ClientFrame) -> Result<Option<(u64, Call)>, String> {
        let ClientFrame {
            request_id,
            request,
        } = frame;
        if self.client_name.is_none() {
            return self.handle_hello(request_id, request).map(|()| None);
        }
        let refusal = if request_id == CONNECTION_REQUEST_ID {
            Some(error(ErrorCode::InvalidRequest, "request id 0 is reserved"))
        } else if self.in_flight.contains_key(&request_id) {
            Some(error(
                ErrorCode::DuplicateRequestId,
                format!("request id {request_id} is already in flight on this connection"),
            ))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.answer(request_id, refusal);
            return Ok(None);
        }
        let call = match request {
            Request::Ping => {
                self.answer(request_id, Response::Pong);
                return Ok(None);
            }
            Request::Hello { .. } => {
                let refusal = error(
                    ErrorCode::InvalidRequest,
                    "Hello was already exchanged on this connection",
                );
                self.answer(request_id, refusal);
                return Ok(None);
            }
            Request::Cancel { request_id: target } => {
                let token = self.in_flight.get(&target);
                if let Some(token) = token {
                    token.cancel();
                }
                let found = token.is_some();
                self.answer(request_id, Response::Cancelled { found });
                return Ok(None);
            }
            Request::Acquire(acquire) => Call::Acquire(acquire, self.caller()),
            Request::Report {
                lease,
                input_tokens,
                output_tokens,
            } => Call::Report {
                lease,
                usage: Reported::Tokens {
                    input: input_tokens,
                    output: output_tokens,
                },
            },
            Request::UsageReport { lease, usage } => Call::Report {
                lease,
                usage: Reported::Billed(billed(usage)),
            },
            Request::Release { lease } => Call::Release { lease },
            Request::Estimate { limit, cost } => Call::Estimate { limit, cost },
            Request::Status { limit } => Call::Status { limit },
            Request::Health => Call::Health,
            Request::Inspect { limit } => Call::Inspect { limit },
            Request::Budgets { limit } => Call::Budgets { limit },
            Request::Feedback(feedback) => Call::Feedback(feedback, None, self.caller()),
            Request::LeaseFeedback { lease, feedback } => {
                Call::Feedback(feedback, Some(lease), self.caller())
            }
        };
        Ok(Some((request_id, call)))
    }

    fn handle_hello(&mut self, request_id: u64, request: Request) -> Result<(), String> {
        let reason = match request {
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name,
            } if client_name.len() <= proto::MAX_NAME_LEN => {
                tracing::debug!(
                    connection = self.connection,
                    client = client_name.as_str(),
                    "client said hello"
                );
                self.client_name = Some(client_name.into());
                let hello = Response::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    server: SERVER.to_string(),
                    max_frame_len: MAX_FRAME_LEN,
                    max_in_flight: MAX_IN_FLIGHT,
                };
                self.answer(request_id, hello);
                return Ok(());
            }
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name,
            } => {
                let reason = format!(
                    "client name of {} bytes exceeds the maximum of {}",
                    client_name.len(),
                    proto::MAX_NAME_LEN
                );
                self.answer(request_id, error(ErrorCode::InvalidRequest, reason.clone()));
                reason
            }
            Request::Hello {
                protocol_version, ..
            } => self.refuse_version(request_id, protocol_version),
            _ => {
                let reason = "the first frame on a connection must be Hello".to_string();
                self.answer(request_id, error(ErrorCode::HelloRequired, reason.clone()));
                reason
            }
        };
        Err(reason)
    }

    /// Answers a `Hello` of another protocol version; returns the reason to
    /// close the connection.
    fn refuse_version(&mut self, request_id: u64, protocol_version: u16) -> String {
        let reason = format!(
            "protocol version {protocol_version} is not supported; this daemon speaks version {PROTOCOL_VERSION}"
        );
        self.answer(
            request_id,
            error(ErrorCode::UnsupportedVersion, reason.clone()),
        );
        reason
    }

    /// Registers the call as in flight and pushes it onto `running`, where
    /// the connection polls it beside everything else, so a long acquire
    /// wait holds up nothing behind it.
    fn start<F>(
        &mut self,
        request_id: u64,
        call: Call,
        running: &mut FuturesUnordered<F>,
        start: &impl Fn(u64, Call, CancellationToken) -> F,
    ) {
        if self.in_flight.len() >= MAX_IN_FLIGHT as usize {
            let refusal = error(
                ErrorCode::TooManyInFlight,
                format!("this connection already has {MAX_IN_FLIGHT} unanswered requests"),
            );
            return self.answer(request_id, refusal);
        }
        let cancel = CancellationToken::new();
        if self.cancelled {
            cancel.cancel();
        }
        self.in_flight.insert(request_id, cancel.clone());
        running.push(start(request_id, call, cancel));
    }

    /// A call ended: its id is free again, and its answer goes out (the
    /// service has logged it).
    pub(crate) fn finished(&mut self, request_id: u64, response: Response) {
        self.in_flight.remove(&request_id);
        self.encode(request_id, response);
    }

    /// Answers a request the connection refused or answered itself.
    pub(crate) fn answer(&mut self, request_id: u64, response: Response) {
        if let Response::Error { code, message } = &response {
            tracing::debug!(
                connection = self.connection,
                client = self.client(),
                request_id,
                code,
                reason = message.as_str(),
                "request failed"
            );
        }
        self.encode(request_id, response);
    }

    /// Encodes `response` for `request_id` into the output buffer.
    fn encode(&mut self, request_id: u64, response: Response) {
        let frame = ServerFrame {
            request_id,
            response,
        };
        if let Err(encode_error) = proto::encode_frame(&frame, &mut self.out) {
            // Only a status listing too many limits could exceed the frame bound.
            tracing::error!(%encode_error, request_id, "answer could not be encoded");
            let fallback = ServerFrame {
                request_id,
                response: error(ErrorCode::Internal, encode_error.to_string()),
            };
            let _ = proto::encode_frame(&fallback, &mut self.out);
        }
    }

    /// The client's name, for logs.
    pub(crate) fn client(&self) -> &str {
        self.client_name.as_deref().unwrap_or("?")
    }

    /// Who sends this connection's calls.
    fn caller(&self) -> Caller {
        Caller {
            name: self.client_name.clone().unwrap_or_else(|| Arc::from("?")),
            uid: self.peer_uid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Acquire, ChatMessage, ChatRequest};

    fn frame(request_id: u64, request: Request) -> Vec<u8> {
        let mut out = Vec::new();
        let frame = ClientFrame {
            request_id,
            request,
        };
        proto::encode_frame(&frame, &mut out).unwrap();
        out
    }

    fn acquire_by_messages(text_bytes: usize) -> Request {
        Request::Acquire(Acquire {
            limit: "gpt".into(),
            tenant: None,
            priority: None,
            cost: Cost::Messages(ChatRequest {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    name: None,
                    content: vec!["a".repeat(text_bytes)],
                    tool_calls_json: None,
                }],
                tools_json: None,
                max_output_tokens: None,
            }),
            max_wait_ms: None,
        })
    }

    /// The request ids of the answers `state` has encoded so far.
    fn answered(state: &Requests) -> Vec<u64> {
        let mut answers = FrameReader::new();
        answers.read_space().extend_from_slice(&state.out);
        std::iter::from_fn(|| answers.next_payload().unwrap())
            .map(|payload| {
                proto::decode_payload::<ServerFrame>(&payload)
                    .unwrap()
                    .request_id
            })
            .collect()
    }

    /// Issue 27: a large payload is not decoded on the socket loop. It is
    /// handed back to be decoded off it, and the frames behind it wait, so
    /// a connection's requests still start in the order they were sent.
    #[test]
    fn a_large_payload_is_handed_back_undecoded_and_the_frames_behind_it_wait() {
        let mut state = Requests::new(1);
        let mut frames = FrameReader::new();
        let hello = Request::Hello {
            protocol_version: PROTOCOL_VERSION,
            client_name: "test".into(),
        };
        let buffer = frames.read_space();
        buffer.extend_from_slice(&frame(1, hello));
        buffer.extend_from_slice(&frame(2, acquire_by_messages(DECODE_OFF_LOOP_BYTES)));
        buffer.extend_from_slice(&frame(3, acquire_by_messages(100)));
        buffer.extend_from_slice(&frame(4, Request::Ping));
        let mut running = FuturesUnordered::new();
        let start = |request_id, _call, _cancel| std::future::ready(request_id);

        let taken = state
            .process_buffered(&mut frames, &mut running, &start)
            .unwrap();
        assert_eq!(taken.frames, 2);
        let payload = taken.to_decode.expect("the large payload is handed back");
        assert!(payload.len() > DECODE_OFF_LOOP_BYTES);
        assert_eq!(answered(&state), [1]);
        assert!(running.is_empty());

        state
            .decoded(decode_client_frame(payload), &mut running, &start)
            .unwrap();
        let taken = state
            .process_buffered(&mut frames, &mut running, &start)
            .unwrap();
        assert_eq!(taken.frames, 2);
        assert!(taken.to_decode.is_none());
        assert_eq!(answered(&state), [1, 4]);
        let mut started: Vec<u64> = state.in_flight.keys().copied().collect();
        started.sort_unstable();
        assert_eq!(started, [2, 3]);
    }

    /// A large payload that does not decode is answered as a small one is.
    #[test]
    fn a_large_malformed_payload_is_refused_by_its_request_id() {
        let mut state = Requests::new(1);
        state.client_name = Some("test".into());
        let mut payload = frame(7, acquire_by_messages(DECODE_OFF_LOOP_BYTES));
        payload.push(0);
        let payload = Bytes::copy_from_slice(&payload[proto::LENGTH_PREFIX_LEN..]);
        let mut running = FuturesUnordered::new();
        let start = |request_id, _call, _cancel| std::future::ready(request_id);
        state
            .decoded(decode_client_frame(payload), &mut running, &start)
            .unwrap();
        assert_eq!(answered(&state), [7]);
        assert!(running.is_empty());
    }

    /// The large payloads being decoded, all connections together, hold at
    /// most [`DECODE_SLOTS`] slots.
    #[tokio::test]
    async fn large_payloads_are_decoded_in_a_bounded_number_of_slots() {
        let held = DECODING.acquire_many(DECODE_SLOTS as u32).await.unwrap();
        let payload = Bytes::from(frame(1, Request::Ping)[proto::LENGTH_PREFIX_LEN..].to_vec());
        let mut decoding = Box::pin(decode_off_loop(payload));
        assert!(
            decoding.as_mut().now_or_never().is_none(),
            "no slot is free: nothing is decoded"
        );
        drop(held);
        let frame = decoding.await.unwrap().unwrap();
        assert_eq!(frame.request, Request::Ping);
    }
}
