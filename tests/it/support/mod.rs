//! Shared helpers for the integration tests: the real daemon binary started
//! on a socket in a temporary directory, and raw frame I/O for bad input.

pub mod redis;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratekeeper::client::Client;
use ratekeeper::proto::{self, ClientFrame, PROTOCOL_VERSION, Request, Response, ServerFrame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long a daemon may take to create its socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `ratekeeper serve`, killed (and its log printed if the test
/// failed) on drop.
pub struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    pub socket: PathBuf,
}

impl Daemon {
    /// Starts the daemon with `config` (TOML without a `[server]` socket,
    /// which is set to a path in a fresh temporary directory).
    pub fn start(config: &str) -> Daemon {
        Daemon::start_with_env(config, &[])
    }

    /// As [`Daemon::start`], with these environment variables set.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn(config, env, None)
    }

    /// As [`Daemon::start`], with `args` after `serve` instead of
    /// `--log-level debug`, and `RUST_LOG` and `RATEKEEPER_LOG_LEVEL` only
    /// as `env` gives them: for tests of how the log level is chosen.
    pub fn start_with_log_settings(config: &str, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_with(config, args, env, None, true)
    }

    /// As [`Daemon::start`], but its stderr is a pipe whose reading end is
    /// already closed, as when the log shipper behind it died.
    pub fn start_with_closed_stderr(config: &str) -> Daemon {
        Daemon::spawn(config, &[], Some(Stdio::piped()))
    }

    fn spawn(config: &str, env: &[(&str, &str)], stderr: Option<Stdio>) -> Daemon {
        Daemon::spawn_with(config, &["--log-level", "debug"], env, stderr, false)
    }

    fn spawn_with(
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
        stderr: Option<Stdio>,
        clean_log_env: bool,
    ) -> Daemon {
        let dir = tempfile::tempdir().expect("temporary directory");
        let socket = dir.path().join("ratekeeper.sock");
        let config_path = dir.path().join("ratekeeper.toml");
        std::fs::write(&config_path, config).expect("write config");
        let log = std::fs::File::create(dir.path().join("daemon.log")).expect("log file");
        let closed_stderr = stderr.is_some();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratekeeper"));
        if clean_log_env {
            command
                .env_remove("RUST_LOG")
                .env_remove("RATEKEEPER_LOG_LEVEL");
        }
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .args(args)
            .env(ratekeeper::config::ENV_SOCKET, &socket)
            .env_remove("RATEKEEPER_REDIS_URL")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr.unwrap_or_else(|| log.into()))
            .spawn()
            .expect("spawn ratekeeper");
        if closed_stderr {
            drop(child.stderr.take());
        }
        let mut daemon = Daemon { child, dir, socket };
        daemon.wait_until_listening();
        daemon
    }

    fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.try_wait().expect("poll daemon") {
                panic!(
                    "daemon exited with {status} before listening:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not listen in time:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A client that has said hello.
    pub async fn client(&self) -> Client {
        Client::connect(&self.socket, "integration-test")
            .await
            .expect("connect to daemon")
    }

    /// A raw connection, nothing sent yet.
    pub async fn raw(&self) -> UnixStream {
        UnixStream::connect(&self.socket).await.expect("connect")
    }

    /// A raw connection that has exchanged Hello.
    pub async fn raw_after_hello(&self) -> UnixStream {
        let mut stream = self.raw().await;
        send(&mut stream, 1, hello()).await;
        let answer = receive(&mut stream).await.expect("hello answer");
        assert!(
            matches!(answer.response, Response::Hello { .. }),
            "{answer:?}"
        );
        stream
    }

    /// Whether the daemon still answers a ping on a new connection.
    pub async fn assert_serving(&self) {
        let client = self.client().await;
        assert_eq!(client.call(Request::Ping).await.unwrap(), Response::Pong);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        signal(&self.child, "TERM");
        self.wait_exit()
    }

    /// Waits (bounded) until the log shows `needle`.
    pub async fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "log never showed {needle:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends a signal by name (`"HUP"`, `"TERM"`).
    pub fn send_signal(&self, name: &str) {
        signal(&self.child, name);
    }

    /// The config file the daemon was started with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("ratekeeper.toml")
    }

    /// Waits for the daemon to exit by itself.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait for daemon")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The address of the metrics listener (`[metrics] listen`), as the
    /// daemon logged it once it listens.
    pub async fn metrics_address(&self) -> String {
        self.wait_for_log("serving /metrics").await;
        let log = self.log();
        let line = log
            .lines()
            .find(|line| line.contains("serving /metrics"))
            .expect("the line just seen");
        listen_address(line)
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

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- daemon log ---\n{}--- end of daemon log ---",
                self.log()
            );
        }
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success());
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
