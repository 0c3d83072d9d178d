//! What a connection does with each decoded frame: the `Hello` exchange,
//! its own requests (`Ping`, `Cancel`), the refusals (duplicate id, too many
//! in flight), and the start of every service call, which the connection
//! then drives itself. Answers are encoded into the connection's output
//! buffer; nothing here awaits.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::proto::{
    self, CONNECTION_REQUEST_ID, ClientFrame, Cost, ErrorCode, FrameError, FrameReader,
    MAX_FRAME_LEN, MAX_IN_FLIGHT, PROTOCOL_VERSION, Request, Response, ServerFrame,
};
use crate::service::{Call, ConnectionId, Service};

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

/// The protocol state of one connection and the answers it has to send.
pub(crate) struct Requests {
    pub connection: ConnectionId,
    /// Set by `Hello`; `None` until then.
    pub client_name: Option<String>,
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

    /// Handles every complete frame `frames` holds, pushing the service
    /// calls they start onto `running` (built by `start`). Returns how many
    /// frames it took, or the reason the connection must close.
    pub(crate) fn process_buffered<F>(
        &mut self,
        frames: &mut FrameReader,
        running: &mut FuturesUnordered<F>,
        start: &impl Fn(u64, Call, CancellationToken) -> F,
    ) -> Result<usize, String> {
        let mut taken = 0;
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
            taken += 1;
            match proto::decode_payload::<ClientFrame>(&payload) {
                Ok(frame) => {
                    if let Some((request_id, call)) = self.handle_frame(frame)? {
                        self.start(request_id, call, running, start);
                    }
                }
                Err(FrameError::Malformed(reason)) if self.client_name.is_some() => {
                    self.refuse_malformed(&payload, reason)
                }
                Err(frame_error) => {
                    let id = proto::request_id_hint(&payload).unwrap_or(CONNECTION_REQUEST_ID);
                    let version = proto::hello_version_hint(&payload);
                    if let Some(version) = version.filter(|&v| v != PROTOCOL_VERSION) {
                        return Err(self.refuse_version(id, version));
                    }
                    // Before Hello we cannot trust the peer speaks our protocol.
                    let reason = format!("first frame is not a valid Hello: {frame_error}");
                    self.answer(id, error(ErrorCode::HelloRequired, reason.clone()));
                    return Err(reason);
                }
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
            Request::Acquire(acquire) => Call::Acquire(acquire),
            Request::Report {
                lease,
                input_tokens,
                output_tokens,
            } => Call::Report {
                lease,
                input_tokens,
                output_tokens,
            },
            Request::Release { lease } => Call::Release { lease },
            Request::Estimate { limit, cost } => Call::Estimate { limit, cost },
            Request::Status { limit } => Call::Status { limit },
            Request::Health => Call::Health,
            Request::Inspect { limit } => Call::Inspect { limit },
            Request::Feedback(feedback) => Call::Feedback(feedback, None),
            Request::LeaseFeedback { lease, feedback } => Call::Feedback(feedback, Some(lease)),
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
                self.client_name = Some(client_name);
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
}
