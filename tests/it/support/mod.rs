//! Shared helpers for the integration tests. A test's daemon runs in this
//! process ([`Daemon`], through `ratekeeper::app::App`, as `main.rs`
//! assembles it) unless the test is about the process itself: then it is
//! the real binary ([`SpawnedDaemon`]). Both serve a Unix socket in a
//! temporary directory and are used through it; the helpers below speak
//! the protocol raw (for bad input), read the metrics listener, and start
//! real `redis-server`s on free ports ([`redis`]).

mod in_process;
pub mod redis;
mod spawned;

pub use in_process::Daemon;
pub use spawned::SpawnedDaemon;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ratekeeper::client::Client;
use ratekeeper::limiter::bucket::{BucketSpec, Draw};
use ratekeeper::proto::{self, ClientFrame, PROTOCOL_VERSION, Request, Response, ServerFrame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long a log line, a reload or a connection may take to appear.
const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that has said hello to the daemon at `socket`.
pub async fn connect_client(socket: &Path) -> Client {
    Client::connect(socket, "integration-test")
        .await
        .expect("connect to daemon")
}

/// A raw connection to `socket`, nothing sent yet.
pub async fn connect_raw(socket: &Path) -> UnixStream {
    UnixStream::connect(socket).await.expect("connect")
}

/// A raw connection to `socket` that has exchanged Hello.
pub async fn connect_after_hello(socket: &Path) -> UnixStream {
    let mut stream = connect_raw(socket).await;
    send(&mut stream, 1, hello()).await;
    let answer = receive(&mut stream).await.expect("hello answer");
    assert!(
        matches!(answer.response, Response::Hello { .. }),
        "{answer:?}"
    );
    stream
}

/// Asserts that the daemon at `socket` answers a ping on a new connection.
pub async fn assert_serving_at(socket: &Path) {
    let client = connect_client(socket).await;
    assert_eq!(client.call(Request::Ping).await.unwrap(), Response::Pong);
}

/// Waits (bounded) until `log()` shows `needle`.
async fn wait_until_logged(log: impl Fn() -> String, needle: &str) {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    while !log().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "log never showed {needle:?}:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `127.0.0.1:PORT` a log line names (tests listen on loopback).
pub fn listen_address(line: &str) -> String {
    let start = line.find("127.0.0.1:").expect("a loopback address");
    let port: String = line[start + "127.0.0.1:".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    format!("127.0.0.1:{port}")
}

/// `GET path` from an HTTP server at `address`: the status code and the body.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    try_http_get(address, path).expect("connect to the metrics listener")
}

/// As [`http_get`]; `None` when nothing listens at `address`.
pub fn try_http_get(address: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The value of one series in a Prometheus text exposition, e.g.
/// `ratekeeper_store_up` or `ratekeeper_acquires_total{limit="gpt",...}`.
pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

pub fn hello() -> Request {
    Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_name: "raw-test".into(),
    }
}

/// Writes one frame.
pub async fn send(stream: &mut UnixStream, request_id: u64, request: Request) {
    let mut bytes = Vec::new();
    proto::encode_frame(
        &ClientFrame {
            request_id,
            request,
        },
        &mut bytes,
    )
    .unwrap();
    stream.write_all(&bytes).await.expect("write frame");
}

/// Writes bytes as they are.
pub async fn send_bytes(stream: &mut UnixStream, bytes: &[u8]) {
    stream.write_all(bytes).await.expect("write bytes");
}

/// A frame around an arbitrary payload.
pub fn frame_of(payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// Reads one answer; `None` when the daemon closed the connection.
pub async fn receive(stream: &mut UnixStream) -> Option<ServerFrame> {
    let mut prefix = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut prefix))
        .await
        .expect("an answer or a close within 10 s");
    if read.is_err() {
        return None;
    }
    let len = u32::from_le_bytes(prefix);
    assert!(
        len <= proto::MAX_FRAME_LEN,
        "daemon sent an oversized frame"
    );
    let mut payload = vec![0; len as usize];
    stream
        .read_exact(&mut payload)
        .await
        .expect("frame payload");
    Some(proto::decode_payload(&payload).expect("daemon sent a valid frame"))
}

/// The error code of an answer, panicking on anything else.
pub fn error_code(response: &Response) -> proto::ErrorCode {
    match response {
        Response::Error { code, .. } => proto::ErrorCode::from_u16(*code).expect("known code"),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// An acquire of `tokens` input tokens from `limit`.
pub fn acquire(limit: &str, tokens: u64, max_wait_ms: u64) -> Request {
    Request::Acquire(ratekeeper::proto::Acquire {
        limit: limit.into(),
        tenant: None,
        priority: None,
        cost: ratekeeper::proto::Cost::Tokens {
            input_tokens: tokens,
            output_tokens: 0,
        },
        max_wait_ms: Some(max_wait_ms),
    })
}

/// A report of `used` input tokens for `lease`.
pub fn report(lease: u64, used: u64) -> Request {
    Request::Report {
        lease,
        input_tokens: used,
        output_tokens: 0,
    }
}

/// `(lease, tokens, waited_ms)` of a grant, panicking on anything else.
pub fn granted(response: &Response) -> (u64, u64, u64) {
    match response {
        Response::Granted {
            lease,
            tokens,
            waited_ms,
        } => (*lease, *tokens, *waited_ms),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The store kind and each bucket's `(name, level)` of one limit.
pub async fn status_of(client: &Client, limit: &str) -> (String, Vec<(String, i64)>) {
    let status = Request::Status {
        limit: Some(limit.into()),
    };
    match client.call(status).await.unwrap() {
        Response::Status { store, limits } => {
            let buckets = limits[0]
                .buckets
                .iter()
                .map(|bucket| (bucket.name.clone(), bucket.level))
                .collect();
            (store, buckets)
        }
        other => panic!("expected status, got {other:?}"),
    }
}

/// The level of one bucket of one limit.
pub async fn level(client: &Client, limit: &str, bucket: &str) -> i64 {
    let (_, buckets) = status_of(client, limit).await;
    buckets
        .into_iter()
        .find(|(name, _)| name == bucket)
        .unwrap_or_else(|| panic!("no bucket {bucket} in {limit}"))
        .1
}

/// `ratekeeper count-tokens ARGS` with `stdin` as its input.
pub fn count_tokens(args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .arg("count-tokens")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ratekeeper");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A draw of `cost` from `bucket`, with no priority floor (the store tests).
pub fn draw(bucket: &BucketSpec, cost: u64) -> Draw {
    Draw {
        bucket: bucket.clone(),
        cost,
        floor: 0,
    }
}
