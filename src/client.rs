//! A small async client for the daemon's socket, used by the CLI and tests.
//!
//! Requests are pipelined on one connection: each call gets its own request
//! id and waits for the answer carrying it, whatever order answers arrive in.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;

use crate::proto::{
    self, ClientFrame, FrameReader, PROTOCOL_VERSION, Request, Response, ServerFrame,
};

/// Why a call got no answer. Each message says it all, cause included, and
/// names no `source`: the CLI prints error chains, which would repeat it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path}: {error}")]
    Connect { path: String, error: std::io::Error },
    #[error("connection to the daemon failed: {0}")]
    Io(std::io::Error),
    #[error("the daemon closed the connection{0}")]
    Closed(String),
    #[error("the daemon refused the connection: {0}")]
    Refused(String),
    #[error("protocol error: {0}")]
    Protocol(proto::FrameError),
}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> Self {
        ClientError::Io(error)
    }
}

impl From<proto::FrameError> for ClientError {
    fn from(error: proto::FrameError) -> Self {
        ClientError::Protocol(error)
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// A connection that has exchanged `Hello`.
pub struct Client {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    /// Why the reader stopped, once it has (e.g. a connection-level error).
    closed: Arc<Mutex<Option<String>>>,
    /// The daemon's answer to `Hello`.
    pub server_hello: Response,
}

impl Client {
    /// Connects to the socket at `path` and says hello as `client_name`.
    pub async fn connect(path: &Path, client_name: &str) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|error| ClientError::Connect {
                path: path.display().to_string(),
                error,
            })?;
        let (reader, writer) = stream.into_split();
        let pending: Pending = Arc::default();
        let closed = Arc::new(Mutex::new(None));
        tokio::spawn(read_answers(reader, pending.clone(), closed.clone()));
        let mut client = Client {
            writer: tokio::sync::Mutex::new(writer),
            pending,
            next_id: AtomicU64::new(1),
            closed,
            server_hello: Response::Pong,
        };
        let hello = client
            .call(Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name: client_name.to_string(),
            })
            .await?;
        if let Response::Error { code, message } = &hello {
            return Err(ClientError::Refused(format!("error {code}: {message}")));
        }
        client.server_hello = hello;
        Ok(client)
    }

    /// A fresh request id, for callers that must know it (to `Cancel` it).
    pub fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends `request` and waits for its answer.
    pub async fn call(&self, request: Request) -> Result<Response, ClientError> {
        self.call_with_id(self.next_request_id(), request).await
    }

    /// Sends `request` under a caller-chosen id and waits for its answer.
    pub async fn call_with_id(
        &self,
        request_id: u64,
        request: Request,
    ) -> Result<Response, ClientError> {
        let (answer_tx, answer_rx) = oneshot::channel();
        self.lock_pending().insert(request_id, answer_tx);
        if let Some(reason) = self.closed_reason() {
            self.lock_pending().remove(&request_id);
            return Err(ClientError::Closed(reason));
        }
        let mut bytes = Vec::new();
        proto::encode_frame(
            &ClientFrame {
                request_id,
                request,
            },
            &mut bytes,
        )?;
        if let Err(io_error) = self.writer.lock().await.write_all(&bytes).await {
            self.lock_pending().remove(&request_id);
            return Err(io_error.into());
        }
        answer_rx
            .await
            .map_err(|_| ClientError::Closed(self.closed_reason().unwrap_or_default()))
    }

    /// `": reason"` once the connection has ended.
    fn closed_reason(&self) -> Option<String> {
        self.closed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .map(|reason| format!(": {reason}"))
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Response>>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Routes each answer to the call waiting for its id until the stream ends.
async fn read_answers(
    mut reader: OwnedReadHalf,
    pending: Pending,
    closed: Arc<Mutex<Option<String>>>,
) {
    let mut frames = FrameReader::new();
    let reason = 'read: loop {
        loop {
            let frame = match frames.next_payload() {
                Ok(Some(payload)) => proto::decode_payload::<ServerFrame>(&payload),
                Ok(None) => break,
                Err(frame_error) => break 'read frame_error.to_string(),
            };
            match frame {
                Ok(ServerFrame {
                    request_id: proto::CONNECTION_REQUEST_ID,
                    response,
                }) => break 'read format!("{response:?}"),
                Ok(ServerFrame {
                    request_id,
                    response,
                }) => {
                    let waiter = pending
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .remove(&request_id);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(response);
                    }
                }
                Err(frame_error) => break 'read frame_error.to_string(),
            }
        }
        match reader.read_buf(frames.read_space()).await {
            Ok(0) => break "end of stream".to_string(),
            Ok(_) => {}
            Err(io_error) => break io_error.to_string(),
        }
    };
    *closed
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason);
    // Dropping the senders wakes every waiting call with `Closed`.
    pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clear();
}
