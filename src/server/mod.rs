//! The Unix-socket server: accepts connections up to a cap (closing the
//! idlest to admit a new one, `registry`), checks peer credentials, serves
//! each connection in its own task (which drives that connection's requests
//! itself) and drains on shutdown.

mod buffer;
mod connection;
pub mod listener;
mod registry;
mod requests;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::proto::{self, CONNECTION_REQUEST_ID, ErrorCode, ServerFrame};
use crate::service::Service;
use buffer::BufferBudget;
use connection::ConnectionContext;
pub use listener::{BindError, bind};
use registry::Registry;

/// How long refunds may take once the drain deadline cancelled what waited.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// What the server needs besides its listener.
pub struct ServerSettings {
    /// Removed when the server stops, so clients fail fast instead of hanging.
    pub socket_path: PathBuf,
    /// Peers whose uid (or gid) is not listed are refused; empty lists allow all.
    pub allowed_uids: Vec<u32>,
    pub allowed_gids: Vec<u32>,
    /// How long in-flight requests may take to finish after `shutdown` fires.
    pub drain_timeout: Duration,
    /// What one client, or all of them together, can make the daemon hold.
    pub bounds: Bounds,
}

/// The resource bounds of the socket (`[server]` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at once. At the cap a new connection closes the
    /// one idle the longest; it is refused `Overloaded` only when every
    /// open connection has a request in flight.
    pub max_connections: usize,
    /// Connections the peers of one uid may hold open at once, by the same
    /// rule among that uid's own connections; `None`: no cap but the above.
    pub max_connections_per_uid: Option<usize>,
    /// Bytes all connections together may buffer for frames still arriving,
    /// beyond each connection's read chunk.
    pub max_buffered_bytes: usize,
    /// How long a connection may take to send `Hello`.
    pub hello_timeout: Duration,
    /// How long a frame may take to arrive from its first byte to its last,
    /// and answers may wait for the client to take them.
    pub frame_timeout: Duration,
}

/// Serves `listener` until `shutdown` completes, then drains: refuses new
/// acquires, stops accepting, removes the socket file, lets in-flight
/// requests finish within the drain timeout and cancels (refunding) the rest.
pub async fn run(
    listener: UnixListener,
    service: Arc<Service>,
    settings: ServerSettings,
    shutdown: impl Future<Output = ()>,
) {
    let requests = TaskTracker::new();
    let lease_sweeper = tokio::spawn(service.clone().expire_leases_periodically());
    let cancel_all = CancellationToken::new();
    let close_all = CancellationToken::new();
    let connections = TaskTracker::new();
    let budget = Arc::new(BufferBudget::new(settings.bounds.max_buffered_bytes));
    let registry = Arc::new(Registry::new());
    let mut at_cap = false;
    let mut refusing = false;
    // When a refusal under a uid's cap was last logged as a warning.
    let mut uid_warned_at: Option<tokio::time::Instant> = None;
    let mut next_connection = 1u64;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(accept_error) => {
                    // Out of file descriptors and the like: wait, don't spin.
                    tracing::error!(%accept_error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let id = next_connection;
        next_connection += 1;
        let Some(uid) = peer_allowed(&stream, &settings, id) else {
            continue;
        };
        if let Some(cap) = settings.bounds.max_connections_per_uid {
            let at = UidCap {
                uid,
                cap,
                connection: id,
            };
            if !room_for_uid(&registry, &stream, at, &service, &mut uid_warned_at) {
                continue;
            }
        }
        let open = registry.len();
        if open >= settings.bounds.max_connections {
            match registry.evict_idlest() {
                Some(evicted) => {
                    service.metrics().connection_evicted();
                    if !at_cap {
                        tracing::warn!(
                            open,
                            "server.max_connections are open: closing the connection idle \
                             the longest to admit each new one"
                        );
                    }
                    tracing::debug!(
                        connection = evicted.connection,
                        idle_ms = evicted.idle.as_millis() as u64,
                        admitted = id,
                        "connection closed to make room"
                    );
                }
                None => {
                    if !refusing {
                        tracing::warn!(
                            open,
                            "refusing connections: server.max_connections are open, \
                             each with a request in flight"
                        );
                    }
                    refusing = true;
                    refuse_connection(&stream, id, open);
                    continue;
                }
            }
            at_cap = true;
            refusing = false;
        } else if at_cap {
            tracing::info!(open, "below server.max_connections again");
            at_cap = false;
            refusing = false;
        }
        let context = ConnectionContext {
            id,
            service: service.clone(),
            cancel: cancel_all.child_token(),
            requests: requests.clone(),
            close: close_all.child_token(),
            budget: budget.clone(),
            bounds: settings.bounds,
            activity: registry.register(id, uid),
        };
        let open = service.metrics().connection_opened();
        let registry = registry.clone();
        connections.spawn(async move {
            connection::serve(stream, context).await;
            registry.unregister(id);
            drop(open);
        });
    }

    tracing::info!(
        in_flight = requests.len(),
        drain_timeout_ms = settings.drain_timeout.as_millis() as u64,
        "shutting down: no new acquires, draining in-flight requests"
    );
    service.begin_drain();
    drop(listener);
    listener::remove_socket(&settings.socket_path);
    requests.close();
    if !finished_within(&requests, settings.drain_timeout).await {
        tracing::warn!(
            still_waiting = requests.len(),
            "drain timeout passed; cancelling waiting acquires and returning their reservations"
        );
        cancel_all.cancel();
        finished_within(&requests, CANCEL_GRACE).await;
    }
    // Every answer made is written before the process exits: close each
    // connection, which flushes what its writer still holds.
    close_all.cancel();
    connections.close();
    if !finished_within(&connections, CANCEL_GRACE).await {
        tracing::warn!(
            connections = connections.len(),
            "some clients did not take their last answers in time"
        );
    }
    lease_sweeper.abort();
}

/// Tells a connection beyond the cap why it is closed: `Overloaded` on
/// request id 0. A new connection's send buffer is empty, so the frame
/// goes out without waiting; the connection is then dropped.
fn refuse_connection(stream: &UnixStream, connection: u64, open: usize) {
    refuse_with(
        stream,
        connection,
        format!(
            "the daemon already serves {open} connections (server.max_connections), \
             each with a request in flight"
        ),
    );
    tracing::debug!(connection, open, "connection refused: too many open");
}

/// Sends a new connection `Overloaded` on request id 0 with `reason`.
fn refuse_with(stream: &UnixStream, connection: u64, reason: String) {
    let refusal = ServerFrame {
        request_id: CONNECTION_REQUEST_ID,
        response: requests::error(ErrorCode::Overloaded, reason),
    };
    let mut bytes = Vec::new();
    if proto::encode_frame(&refusal, &mut bytes).is_ok() {
        let _ = stream.try_write(&bytes);
    } else {
        tracing::debug!(connection, "the refusal could not be encoded");
    }
}

/// How often a refusal under a uid's cap is logged as a warning (the
/// others at DEBUG), so that a uid connecting in a loop cannot flood the log.
const UID_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A new connection of a peer of `uid`, whose cap is `cap`.
#[derive(Debug, Clone, Copy)]
struct UidCap {
    uid: u32,
    cap: usize,
    connection: u64,
}

/// Makes room for one more connection of a peer of `uid` under its cap
/// (`server.max_connections_per_uid`), by the rule of `max_connections`
/// among that uid's own connections: its idlest is closed, and only when
/// every one of them has a request in flight is the new one refused
/// `Overloaded`. So one uid cannot fill the daemon's connections, and the
/// connections it leaks cost only itself. False when refused.
fn room_for_uid(
    registry: &Registry,
    stream: &UnixStream,
    at: UidCap,
    service: &Service,
    warned_at: &mut Option<tokio::time::Instant>,
) -> bool {
    let UidCap {
        uid,
        cap,
        connection,
    } = at;
    let open = registry.len_of(uid);
    if open < cap {
        return true;
    }
    match registry.evict_idlest_of(uid) {
        Some(evicted) => {
            service.metrics().connection_evicted();
            tracing::debug!(
                connection = evicted.connection,
                uid,
                idle_ms = evicted.idle.as_millis() as u64,
                admitted = connection,
                "connection closed to make room under server.max_connections_per_uid"
            );
            true
        }
        None => {
            let now = tokio::time::Instant::now();
            if warned_at.is_none_or(|at| now.duration_since(at) >= UID_WARNING_INTERVAL) {
                *warned_at = Some(now);
                tracing::warn!(
                    connection,
                    uid,
                    open,
                    "refusing connections: a uid has server.max_connections_per_uid open, \
                     each with a request in flight"
                );
            } else {
                tracing::debug!(
                    connection,
                    uid,
                    open,
                    "connection refused: its uid is at its cap"
                );
            }
            refuse_with(
                stream,
                connection,
                format!(
                    "uid {uid} already has {open} connections open \
                     (server.max_connections_per_uid), each with a request in flight"
                ),
            );
            false
        }
    }
}

/// Waits for every task of `tracker` up to `timeout`; false if some are left.
async fn finished_within(tracker: &TaskTracker, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, tracker.wait()).await.is_ok()
}

/// The peer's uid when `allowed_uids`/`allowed_gids` admit it; `None`
/// (logged) when they do not or its credentials cannot be read.
fn peer_allowed(stream: &UnixStream, settings: &ServerSettings, connection: u64) -> Option<u32> {
    let credentials = match stream.peer_cred() {
        Ok(credentials) => credentials,
        Err(cred_error) => {
            tracing::warn!(connection, %cred_error, "refusing a connection whose peer credentials cannot be read");
            return None;
        }
    };
    let uid_ok =
        settings.allowed_uids.is_empty() || settings.allowed_uids.contains(&credentials.uid());
    let gid_ok =
        settings.allowed_gids.is_empty() || settings.allowed_gids.contains(&credentials.gid());
    let (uid, gid, pid) = (credentials.uid(), credentials.gid(), credentials.pid());
    if uid_ok && gid_ok {
        tracing::debug!(connection, uid, gid, pid, "connection opened");
    } else {
        tracing::warn!(
            connection,
            uid,
            gid,
            pid,
            "refusing a connection from a peer not in allowed_uids/allowed_gids"
        );
    }
    (uid_ok && gid_ok).then_some(uid)
}
