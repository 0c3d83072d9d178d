//! One client connection: a reader that decodes frames, answers the
//! connection's own requests (`Hello`, `Ping`, `Cancel`) and starts one task
//! per service call, and a writer that sends answers in the order they
//! finish.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::proto::{
    self, CONNECTION_REQUEST_ID, ClientFrame, Cost, ErrorCode, FrameError, FrameReader,
    MAX_FRAME_LEN, MAX_IN_FLIGHT, PROTOCOL_VERSION, Request, Response, ServerFrame,
};
use crate::service::{Call, ConnectionId, Service};

/// The `Error` answer for `code`.
fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::error(code, message)
}

/// Bytes the writer makes room for before encoding its first answers.
const WRITE_CHUNK: usize = 16 * 1024;

/// How the daemon names itself in `Hello` and in messages.
const SERVER: &str = concat!("ratekeeper ", env!("CARGO_PKG_VERSION"));

/// The close reason of a connection that ended the way connections should.
const CLOSED_BY_CLIENT: &str = "closed by the client";

/// Unanswered requests of one connection, each with its cancellation.
type InFlight = Arc<Mutex<HashMap<u64, CancellationToken>>>;

/// Everything a connection needs from the server.
pub(crate) struct ConnectionContext {
    pub id: ConnectionId,
    pub service: Arc<Service>,
    /// Fires when the connection must give up its waiting requests
    /// (the drain deadline passed).
    pub cancel: CancellationToken,
    /// Tracks every request task of the daemon so shutdown can drain them.
    pub requests: TaskTracker,
    /// Fires once the daemon has drained: stop reading, flush the answers
    /// already made, and close.
    pub close: CancellationToken,
}

/// Serves one connection until the client closes it or breaks the protocol.
pub(crate) async fn serve(stream: UnixStream, context: ConnectionContext) {
    let (mut reader, writer) = stream.into_split();
    let (answers, pending) = mpsc::channel::<ServerFrame>(MAX_IN_FLIGHT as usize + 16);
    let writer_task = tokio::spawn(write_answers(writer, pending));
    let mut connection = Connection {
        context,
        answers,
        in_flight: Arc::new(Mutex::new(HashMap::new())),
        tasks: TaskTracker::new(),
        client_name: None,
    };

    let mut frames = FrameReader::new();
    let close_reason = loop {
        match connection.process_buffered(&mut frames).await {
            Ok(()) => {}
            Err(reason) => break reason,
        }
        let read = tokio::select! {
            read = reader.read_buf(frames.read_space()) => read,
            _ = connection.context.close.cancelled() => break "the daemon is shutting down".to_string(),
        };
        match read {
            Ok(0) if frames.buffered() == 0 => break CLOSED_BY_CLIENT.to_string(),
            Ok(0) => {
                break format!(
                    "closed by the client in the middle of a frame ({} bytes unread)",
                    frames.buffered()
                );
            }
            Ok(_) => {}
            Err(io_error) => break format!("read failed: {io_error}"),
        }
    };
    connection.close(close_reason).await;
    drop(connection.answers);
    let _ = writer_task.await;
}

struct Connection {
    context: ConnectionContext,
    answers: mpsc::Sender<ServerFrame>,
    in_flight: InFlight,
    /// This connection's request tasks, joined before its leases are dropped.
    tasks: TaskTracker,
    /// Set by `Hello`; `None` until then.
    client_name: Option<String>,
}

impl Connection {
    /// Handles every complete frame `frames` holds. An error means the
    /// connection must close, with the reason to log.
    async fn process_buffered(&mut self, frames: &mut FrameReader) -> Result<(), String> {
        loop {
            let payload = match frames.next_payload() {
                Ok(Some(payload)) => payload,
                Ok(None) => return Ok(()),
                Err(frame_error) => {
                    let reason = frame_error.to_string();
                    self.answer(
                        CONNECTION_REQUEST_ID,
                        error(ErrorCode::FrameTooLarge, reason.clone()),
                    )
                    .await;
                    return Err(reason);
                }
            };
            let decoded = proto::decode_payload::<ClientFrame>(&payload);
            let id_hint = proto::request_id_hint(&payload);
            let version_hint = proto::hello_version_hint(&payload);
            match decoded {
                Ok(frame) => self.handle_frame(frame).await?,
                Err(FrameError::Malformed(reason)) if self.client_name.is_some() => {
                    let id = id_hint.unwrap_or(CONNECTION_REQUEST_ID);
                    let answer = match proto::request_tag_hint(&payload) {
                        // A request of a later protocol revision: the client
                        // can tell that this daemon predates it (PROTOCOL.md §10).
                        Some(tag) if tag >= Request::KNOWN_TAGS => {
                            tracing::debug!(
                                connection = self.context.id,
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
                        _ => match proto::cost_tag_hint(&payload) {
                            Some(tag) if tag >= Cost::KNOWN_TAGS => {
                                tracing::debug!(
                                    connection = self.context.id,
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
                                    connection = self.context.id,
                                    client = self.client(),
                                    reason,
                                    "malformed message"
                                );
                                error(ErrorCode::MalformedMessage, reason)
                            }
                        },
                    };
                    self.answer(id, answer).await;
                }
                Err(frame_error) => {
                    if let Some(version) = version_hint.filter(|&v| v != PROTOCOL_VERSION) {
                        let id = id_hint.unwrap_or(CONNECTION_REQUEST_ID);
                        return Err(self.refuse_version(id, version).await);
                    }
                    // Before Hello we cannot trust the peer speaks our protocol.
                    let reason = format!("first frame is not a valid Hello: {frame_error}");
                    let id = id_hint.unwrap_or(CONNECTION_REQUEST_ID);
                    self.answer(id, error(ErrorCode::HelloRequired, reason.clone()))
                        .await;
                    return Err(reason);
                }
            }
        }
    }

    async fn handle_frame(&mut self, frame: ClientFrame) -> Result<(), String> {
        let ClientFrame {
            request_id,
            request,
        } = frame;
        if self.client_name.is_none() {
            return self.handle_hello(request_id, request).await;
        }
        if request_id == CONNECTION_REQUEST_ID {
            self.answer(
                request_id,
                error(ErrorCode::InvalidRequest, "request id 0 is reserved"),
            )
            .await;
            return Ok(());
        }
        if self.lock_in_flight().contains_key(&request_id) {
            self.answer(
                request_id,
                error(
                    ErrorCode::DuplicateRequestId,
                    format!("request id {request_id} is already in flight on this connection"),
                ),
            )
            .await;
            return Ok(());
        }
        match request {
            Request::Ping => self.answer(request_id, Response::Pong).await,
            Request::Hello { .. } => {
                self.answer(
                    request_id,
                    error(
                        ErrorCode::InvalidRequest,
                        "Hello was already exchanged on this connection",
                    ),
                )
                .await
            }
            Request::Cancel { request_id: target } => {
                let token = self.lock_in_flight().get(&target).cloned();
                if let Some(token) = &token {
                    token.cancel();
                }
                self.answer(
                    request_id,
                    Response::Cancelled {
                        found: token.is_some(),
                    },
                )
                .await
            }
            Request::Acquire(acquire) => self.start_call(request_id, Call::Acquire(acquire)).await,
            Request::Report {
                lease,
                input_tokens,
                output_tokens,
            } => {
                let call = Call::Report {
                    lease,
                    input_tokens,
                    output_tokens,
                };
                self.start_call(request_id, call).await
            }
            Request::Release { lease } => {
                self.start_call(request_id, Call::Release { lease }).await
            }
            Request::Estimate { limit, cost } => {
                self.start_call(request_id, Call::Estimate { limit, cost })
                    .await
            }
            Request::Status { limit } => self.start_call(request_id, Call::Status { limit }).await,
            Request::Health => self.start_call(request_id, Call::Health).await,
            Request::Inspect { limit } => {
                self.start_call(request_id, Call::Inspect { limit }).await
            }
            Request::Feedback(feedback) => {
                self.start_call(request_id, Call::Feedback(feedback)).await
            }
        }
        Ok(())
    }

    async fn handle_hello(&mut self, request_id: u64, request: Request) -> Result<(), String> {
        match request {
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name,
            } if client_name.len() <= proto::MAX_NAME_LEN => {
                tracing::debug!(
                    connection = self.context.id,
                    client = client_name.as_str(),
                    "client said hello"
                );
                self.client_name = Some(client_name);
                self.answer(
                    request_id,
                    Response::Hello {
                        protocol_version: PROTOCOL_VERSION,
                        server: SERVER.to_string(),
                        max_frame_len: MAX_FRAME_LEN,
                        max_in_flight: MAX_IN_FLIGHT,
                    },
                )
                .await;
                Ok(())
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
                self.answer(request_id, error(ErrorCode::InvalidRequest, reason.clone()))
                    .await;
                Err(reason)
            }
            Request::Hello {
                protocol_version, ..
            } => Err(self.refuse_version(request_id, protocol_version).await),
            _ => {
                let reason = "the first frame on a connection must be Hello".to_string();
                self.answer(request_id, error(ErrorCode::HelloRequired, reason.clone()))
                    .await;
                Err(reason)
            }
        }
    }

    /// Answers a `Hello` of another protocol version; returns the reason to
    /// close the connection.
    async fn refuse_version(&self, request_id: u64, protocol_version: u16) -> String {
        let reason = format!(
            "protocol version {protocol_version} is not supported; this daemon speaks version {PROTOCOL_VERSION}"
        );
        self.answer(
            request_id,
            error(ErrorCode::UnsupportedVersion, reason.clone()),
        )
        .await;
        reason
    }

    /// Registers the call as in flight and answers it from its own task,
    /// so a long acquire wait holds up nothing behind it.
    async fn start_call(&mut self, request_id: u64, call: Call) {
        let admitted = {
            let mut in_flight = self.lock_in_flight();
            if in_flight.len() >= MAX_IN_FLIGHT as usize {
                Err(error(
                    ErrorCode::TooManyInFlight,
                    format!("this connection already has {MAX_IN_FLIGHT} unanswered requests"),
                ))
            } else {
                let token = self.context.cancel.child_token();
                in_flight.insert(request_id, token.clone());
                Ok(token)
            }
        };
        let token = match admitted {
            Ok(token) => token,
            Err(refusal) => return self.answer(request_id, refusal).await,
        };
        let service = self.context.service.clone();
        let in_flight = self.in_flight.clone();
        let answers = self.answers.clone();
        let connection = self.context.id;
        let counted = service.metrics().request_started();
        let task = async move {
            let _counted = counted;
            // A bug must cost one request an error, never leave it unanswered.
            let response = AssertUnwindSafe(service.handle(connection, call, token))
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
            // Free the id before answering: a client may reuse it on receipt.
            in_flight
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .remove(&request_id);
            let _ = answers
                .send(ServerFrame {
                    request_id,
                    response,
                })
                .await;
        };
        self.tasks.spawn(self.context.requests.track_future(task));
    }

    /// Returns the waiting reservations of this connection, then forgets its
    /// unreported leases.
    async fn close(&mut self, reason: String) {
        let cancelled = {
            let in_flight = self.lock_in_flight();
            in_flight.values().for_each(CancellationToken::cancel);
            in_flight.len()
        };
        self.tasks.close();
        self.tasks.wait().await;
        let forgotten = self.context.service.connection_closed(self.context.id);
        // A connection that ended cleanly with nothing left behind (a probe,
        // a CLI command, a worker that settled everything) is routine.
        let routine = reason == CLOSED_BY_CLIENT && cancelled == 0 && forgotten == 0;
        let (connection, client) = (self.context.id, self.client());
        if routine {
            tracing::debug!(connection, client, reason, "connection closed");
        } else {
            tracing::info!(
                connection,
                client,
                reason,
                cancelled_requests = cancelled,
                unreported_leases = forgotten,
                "connection closed"
            );
        }
    }

    async fn answer(&self, request_id: u64, response: Response) {
        if let Response::Error { code, message } = &response {
            tracing::debug!(
                connection = self.context.id,
                client = self.client(),
                request_id,
                code,
                message = message.as_str(),
                "request failed"
            );
        }
        let _ = self
            .answers
            .send(ServerFrame {
                request_id,
                response,
            })
            .await;
    }

    fn client(&self) -> &str {
        self.client_name.as_deref().unwrap_or("?")
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<u64, CancellationToken>> {
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Encodes answers as they come, batching whatever is ready into one write.
async fn write_answers(mut writer: OwnedWriteHalf, mut pending: mpsc::Receiver<ServerFrame>) {
    let mut bytes = Vec::with_capacity(WRITE_CHUNK);
    while let Some(frame) = pending.recv().await {
        bytes.clear();
        encode_answer(&frame, &mut bytes);
        while let Ok(frame) = pending.try_recv() {
            encode_answer(&frame, &mut bytes);
        }
        if let Err(io_error) = writer.write_all(&bytes).await {
            tracing::debug!(%io_error, "could not write answers; the client is gone");
            return;
        }
    }
    let _ = writer.shutdown().await;
}

fn encode_answer(frame: &ServerFrame, bytes: &mut Vec<u8>) {
    if let Err(encode_error) = proto::encode_frame(frame, bytes) {
        // Only a status listing too many limits could exceed the frame bound.
        tracing::error!(%encode_error, request_id = frame.request_id, "answer could not be encoded");
        let fallback = ServerFrame {
            request_id: frame.request_id,
            response: error(ErrorCode::Internal, encode_error.to_string()),
        };
        let _ = proto::encode_frame(&fallback, bytes);
    }
}
