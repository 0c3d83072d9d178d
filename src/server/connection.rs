//! One client connection, served by one task that does everything itself:
//! it reads frames (into a buffer allocated when the first byte arrives,
//! under the shared budget), drives every service call of the connection as
//! a future of its own loop, and writes the answers as they finish. No task
//! per request, no channel to a writer. A frame too large to decode on the
//! socket loop is decoded on the blocking pool meanwhile (issue 27), and
//! the connection takes nothing behind it until it is.
//!
//! Its bounds: a `Hello` within `hello_timeout`, each frame complete within
//! `frame_timeout` of its first byte, answers taken by the client within
//! `frame_timeout`, and no more read-ahead while answers pile up unread.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use futures_util::future::OptionFuture;
use futures_util::stream::FuturesUnordered;
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Bounds;
use super::buffer::{BufferBudget, ConnectionBuffer};
use super::registry::Activity;
use super::requests::{Decoded, Requests, answer_call, decode_off_loop, error};
use crate::proto::{CONNECTION_REQUEST_ID, ErrorCode, Response};
use crate::service::{ConnectionId, Service};

/// The close reason of a connection that ended the way connections should.
const CLOSED_BY_CLIENT: &str = "closed by the client";

/// Encoded answers above which the connection stops reading until the
/// client takes them.
const OUT_HIGH_WATER: usize = 64 * 1024;

/// Output capacity kept between answers; a buffer grown past it for one
/// large answer is given back.
const OUT_KEEP: usize = 16 * 1024;

/// Everything a connection needs from the server.
pub(crate) struct ConnectionContext {
    pub id: ConnectionId,
    pub service: Arc<Service>,
    /// Fires when the connection must give up its waiting requests
    /// (the drain deadline passed).
    pub cancel: CancellationToken,
    /// Counts every request in flight in the daemon so shutdown can drain
    /// them.
    pub requests: TaskTracker,
    /// Fires once the daemon has drained: stop reading, flush the answers
    /// already made, and close.
    pub close: CancellationToken,
    pub budget: Arc<BufferBudget>,
    pub bounds: Bounds,
    /// Its requests in flight, for the server; fires when the server closes
    /// it to admit another (it was idle the longest at the cap).
    pub activity: Arc<Activity>,
}

/// A large payload being decoded off the socket loop.
type Decoding = Pin<Box<dyn Future<Output = Result<Decoded, String>> + Send>>;

/// What woke the connection.
enum Event {
    Close,
    Evicted,
    CancelAll,
    Answered(u64, Response),
    Decoded(Result<Decoded, String>),
    Writable(io::Result<()>),
    Readable(io::Result<()>),
    Deadline,
}

/// Serves one connection until the client closes it, breaks the protocol or
/// a bound, or the daemon closes it.
pub(crate) async fn serve(stream: UnixStream, context: ConnectionContext) {
    let ConnectionContext {
        id,
        service,
        cancel,
        requests,
        close,
        budget,
        bounds,
        activity,
    } = context;
    let start = |request_id, call, cancel| {
        answer_call(
            service.clone(),
            id,
            request_id,
            call,
            cancel,
            requests.token(),
        )
    };
    let mut running = FuturesUnordered::new();
    let mut state = Requests::new(id);
    state.peer_uid = stream.peer_cred().ok().map(|credentials| credentials.uid());
    let mut buffer = ConnectionBuffer::new(budget);
    let mut timers = Timers::new(bounds);
    let closing = close.cancelled();
    let cancelling = cancel.cancelled();
    let evicted = activity.evicted();
    let deadline = tokio::time::sleep_until(timers.next());
    tokio::pin!(closing, cancelling, evicted, deadline);
    let mut cancelled_all = false;
    // A large payload being decoded off the loop; the frames behind it wait,
    // and nothing more is read, until it is handled.
    let mut decoding: Option<Decoding> = None;

    let reason = loop {
        activity.in_flight(running.len());
        let armed = timers.next_armed();
        if let Some(at) = armed {
            if deadline.deadline() != at {
                deadline.as_mut().reset(at);
            }
        }
        let reading = state.out.len() < OUT_HIGH_WATER && decoding.is_none();
        let event = tokio::select! {
            // Answers first, then writes, then reads; the daemon's own
            // signals last, so a busy connection does not lock their
            // tokens on every turn (they are seen once it has nothing to do).
            biased;
            Some((request_id, response)) = running.next(), if !running.is_empty() => {
                Event::Answered(request_id, response)
            }
            Some(decoded) = OptionFuture::from(decoding.as_mut()), if decoding.is_some() => {
                Event::Decoded(decoded)
            }
            ready = stream.writable(), if !state.out.is_empty() => Event::Writable(ready),
            ready = stream.readable(), if reading => Event::Readable(ready),
            () = &mut deadline, if armed.is_some() => Event::Deadline,
            () = &mut closing => Event::Close,
            () = &mut evicted => Event::Evicted,
            () = &mut cancelling, if !cancelled_all => Event::CancelAll,
        };
        let take_frames = matches!(event, Event::Readable(Ok(())) | Event::Decoded(_));
        match event {
            Event::Close => break "the daemon is shutting down".to_string(),
            Event::Evicted => {
                break "closed to admit a new connection: it was idle the longest \
                       at server.max_connections (or its uid's \
                       server.max_connections_per_uid)"
                    .to_string();
            }
            Event::CancelAll => {
                cancelled_all = true;
                state.cancel_all();
            }
            Event::Answered(request_id, response) => state.finished(request_id, response),
            Event::Writable(Err(io_error)) => break format!("write failed: {io_error}"),
            Event::Writable(Ok(())) => match write_some(&stream, &mut state.out) {
                Ok(true) => timers.write_progressed(!state.out.is_empty()),
                Ok(false) => timers.write_blocked(),
                Err(io_error) => break format!("write failed: {io_error}"),
            },
            Event::Readable(Err(io_error)) => break format!("read failed: {io_error}"),
            Event::Readable(Ok(())) => {
                let space = match buffer.read_space() {
                    Ok(space) => space,
                    Err(exhausted) => {
                        break refuse(
                            &mut state,
                            format!(
                                "no room for a frame of {} bytes: the daemon's buffer for \
                                 incomplete frames (server.max_buffered_bytes) is in use",
                                exhausted.frame_len
                            ),
                        );
                    }
                };
                match read_arrived(&stream, space) {
                    Ok(0) if buffer.buffered() == 0 => break CLOSED_BY_CLIENT.to_string(),
                    Ok(0) => {
                        break format!(
                            "closed by the client in the middle of a frame ({} bytes unread)",
                            buffer.buffered()
                        );
                    }
                    Ok(_) => {}
                    Err(io_error) if io_error.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(io_error) => break format!("read failed: {io_error}"),
                }
            }
            Event::Decoded(decoded) => {
                decoding = None;
                let frame = match decoded {
                    Ok(frame) => frame,
                    Err(failed) => break format!("decoding a frame failed: {failed}"),
                };
                if let Err(reason) = state.decoded(frame, &mut running, &start) {
                    break reason;
                }
            }
            Event::Deadline => {
                let now = Instant::now();
                if let Some(reason) = timers.expired(now, &mut state, buffer.buffered()) {
                    break reason;
                }
            }
        }
        // After a read or a decode: the frames that are in, in order, up to
        // the next one to decode off the loop.
        if !take_frames || decoding.is_some() {
            continue;
        }
        let taken = match state.process_buffered(buffer.frames(), &mut running, &start) {
            Ok(taken) => taken,
            Err(reason) => break reason,
        };
        buffer.shrink();
        if taken.frames > 0 {
            activity.frames_read();
        }
        timers.frames_read(taken.frames > 0, buffer.buffered() > 0);
        if state.client_name.is_some() {
            timers.hello_received();
        }
        decoding = taken
            .to_decode
            .map(|payload| -> Decoding { Box::pin(decode_off_loop(payload)) });
    };

    // Waiting acquires return their reservations, then the connection's
    // unreported leases are forgotten.
    let cancelled = state.in_flight.len();
    state.cancel_all();
    while let Some((request_id, response)) = running.next().await {
        state.finished(request_id, response);
    }
    let forgotten = service.connection_closed(id);
    flush(&stream, &mut state.out, bounds.frame_timeout).await;
    // A connection that ended cleanly with nothing left behind (a probe,
    // a CLI command, a worker that settled everything) is routine.
    let routine = reason == CLOSED_BY_CLIENT && cancelled == 0 && forgotten == 0;
    let client = state.client();
    if routine {
        tracing::debug!(connection = id, client, reason, "connection closed");
    } else {
        tracing::info!(
            connection = id,
            client,
            reason,
            cancelled_requests = cancelled,
            unreported_leases = forgotten,
            "connection closed"
        );
    }
}

/// Answers a connection-level refusal (`Overloaded`, request id 0) and
/// returns the reason to close.
fn refuse(state: &mut Requests, reason: String) -> String {
    state.answer(
        CONNECTION_REQUEST_ID,
        error(ErrorCode::Overloaded, reason.clone()),
    );
    reason
}

/// Reads what has arrived into `space`. A read that leaves room unused has
/// emptied the socket, and tells tokio so (as a `WouldBlock` would): the next
/// turn waits for more instead of asking the kernel again for nothing, which
/// saves a system call per request on a connection that sends one at a time.
/// (Data arriving meanwhile is not missed: tokio clears the readiness only if
/// no newer event came.)
fn read_arrived(stream: &UnixStream, space: &mut BytesMut) -> io::Result<usize> {
    let mut arrived = None;
    let result = stream.try_io(Interest::READABLE, || {
        let room = space.capacity() - space.len();
        let read = stream.try_read_buf(space)?;
        arrived = Some(read);
        if read > 0 && read < room {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(read)
    });
    match (result, arrived) {
        (Err(io_error), Some(read)) if io_error.kind() == io::ErrorKind::WouldBlock => Ok(read),
        (result, _) => result,
    }
}

/// Writes what the socket takes now; `Ok(false)` when it took nothing.
fn write_some(stream: &UnixStream, out: &mut Vec<u8>) -> io::Result<bool> {
    match stream.try_write(out) {
        Ok(written) => {
            out.drain(..written);
            if out.is_empty() && out.capacity() > OUT_KEEP {
                *out = Vec::new();
            }
            Ok(written > 0)
        }
        Err(io_error) if io_error.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(io_error) => Err(io_error),
    }
}

/// Writes the last answers, giving up after `timeout` or at an error.
async fn flush(stream: &UnixStream, out: &mut Vec<u8>, timeout: Duration) {
    let written = tokio::time::timeout(timeout, async {
        while !out.is_empty() {
            stream.writable().await?;
            write_some(stream, out)?;
        }
        io::Result::Ok(())
    });
    match written.await {
        Ok(Ok(())) => {}
        Ok(Err(io_error)) => {
            tracing::debug!(%io_error, "could not write answers; the client is gone")
        }
        Err(_) => tracing::debug!("the client did not take its last answers in time"),
    }
}

/// The connection's deadlines: its `Hello`, the frame arriving, the answers
/// being taken.
struct Timers {
    bounds: Bounds,
    hello_by: Option<Instant>,
    frame_by: Option<Instant>,
    answers_taken_by: Option<Instant>,
}

impl Timers {
    fn new(bounds: Bounds) -> Self {
        Timers {
            bounds,
            hello_by: Some(Instant::now() + bounds.hello_timeout),
            frame_by: None,
            answers_taken_by: None,
        }
    }

    /// The earliest armed deadline.
    fn next_armed(&self) -> Option<Instant> {
        [self.hello_by, self.frame_by, self.answers_taken_by]
            .into_iter()
            .flatten()
            .min()
    }

    /// The earliest armed deadline, or a far one.
    fn next(&self) -> Instant {
        self.next_armed()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400))
    }

    fn hello_received(&mut self) {
        self.hello_by = None;
    }

    /// After a read: a frame that started arriving must be complete within
    /// the frame timeout of its first byte.
    fn frames_read(&mut self, took_frames: bool, partial: bool) {
        if !partial {
            self.frame_by = None;
        } else if took_frames || self.frame_by.is_none() {
            self.frame_by = Some(Instant::now() + self.bounds.frame_timeout);
        }
    }

    fn write_blocked(&mut self) {
        if self.answers_taken_by.is_none() {
            self.answers_taken_by = Some(Instant::now() + self.bounds.frame_timeout);
        }
    }

    fn write_progressed(&mut self, more: bool) {
        self.answers_taken_by = None;
        if more {
            self.write_blocked();
        }
    }

    /// The reason to close if a deadline passed, after answering what can
    /// still be answered.
    fn expired(&self, now: Instant, state: &mut Requests, buffered: usize) -> Option<String> {
        let ms = |timeout: Duration| timeout.as_millis();
        if self.hello_by.is_some_and(|at| at <= now) {
            let reason = format!(
                "no Hello within {} ms of connecting (server.hello_timeout_ms)",
                ms(self.bounds.hello_timeout)
            );
            let refusal = error(ErrorCode::HelloRequired, reason.clone());
            state.answer(CONNECTION_REQUEST_ID, refusal);
            return Some(reason);
        }
        if self.frame_by.is_some_and(|at| at <= now) {
            return Some(refuse(
                state,
                format!(
                    "a frame did not arrive within {} ms of its first byte \
                     (server.frame_timeout_ms); {buffered} bytes of it came",
                    ms(self.bounds.frame_timeout)
                ),
            ));
        }
        if self.answers_taken_by.is_some_and(|at| at <= now) {
            return Some(format!(
                "the client took no answer for {} ms (server.frame_timeout_ms)",
                ms(self.bounds.frame_timeout)
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_short_read_leaves_the_socket_waiting_for_more_without_a_second_recv() {
        let (stream, mut peer) = UnixStream::pair().unwrap();
        let mut space = BytesMut::with_capacity(64);
        peer.write_all(b"first").await.unwrap();
        stream.readable().await.unwrap();
        assert_eq!(read_arrived(&stream, &mut space).unwrap(), 5);
        // Tokio knows the socket is empty: trying again asks the kernel nothing.
        let asked = std::cell::Cell::new(false);
        let again = stream.try_io(Interest::READABLE, || {
            asked.set(true);
            Ok(())
        });
        assert_eq!(again.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(!asked.get());
        // And what arrives next wakes it.
        peer.write_all(b"second").await.unwrap();
        stream.readable().await.unwrap();
        assert_eq!(read_arrived(&stream, &mut space).unwrap(), 6);
        assert_eq!(&space[..], b"firstsecond");
    }

    #[tokio::test]
    async fn a_read_that_fills_the_room_reads_again() {
        let (stream, mut peer) = UnixStream::pair().unwrap();
        let mut space = BytesMut::with_capacity(4);
        peer.write_all(b"abcdefg").await.unwrap();
        stream.readable().await.unwrap();
        assert_eq!(read_arrived(&stream, &mut space).unwrap(), 4);
        let mut rest = BytesMut::with_capacity(64);
        assert_eq!(read_arrived(&stream, &mut rest).unwrap(), 3);
        assert_eq!(&rest[..], b"efg");
    }
}
