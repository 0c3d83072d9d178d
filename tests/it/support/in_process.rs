//! The daemon in this process: `ratekeeper::app::App` assembled as
//! `main.rs` assembles it (config file loaded with the environment's
//! overrides, `App::new`, `warm_up`, `bind`, `serve` with a shutdown future
//! and a reload channel), serving a socket in a temporary directory.
//!
//! Each daemon runs on a tokio runtime of its own, on a thread of its own,
//! built as `main.rs` builds it (`server.threads`), not on the test's
//! runtime. Tests block their own thread (std HTTP scrapes of the metrics
//! listener, the CLI run with `Command::output`, `redis-cli`), which on a
//! `#[tokio::test]` current-thread runtime would stop a daemon sharing it;
//! and a runtime whose every thread belongs to one daemon lets its logs be
//! captured for that daemon alone: each of its threads, the blocking pool's
//! included, has the daemon's subscriber as its default. So the harness
//! works the same under `#[tokio::test]` and `flavor = "multi_thread"`.
//!
//! What stays process-wide, so that tests of it keep a process of their
//! own ([`super::SpawnedDaemon`]): the tokenizers (built once per process,
//! so "tokenizer ready" is logged by the first daemon only), the overrun
//! warning's once-per-10-s throttle, the stderr writer, the signals, and
//! the environment (`NOTIFY_SOCKET` for systemd's notify; the config's
//! overrides, refused here).

use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once, OnceLock, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ratekeeper::app::{self, App};
use ratekeeper::client::Client;
use ratekeeper::config;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tracing::dispatcher::{DefaultGuard, Dispatch};
use tracing::span;
use tracing::subscriber::Interest;

/// How long a daemon may take to assemble and bind its socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Margin beyond `server.drain_timeout_ms` for a drain to finish.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// A daemon serving in this process, stopped (and its log printed if the
/// test failed) on drop.
pub struct Daemon {
    pub socket: PathBuf,
    dir: tempfile::TempDir,
    log: LogBuffer,
    metrics_address: Option<SocketAddr>,
    drain_timeout: Duration,
    /// A message here is what SIGHUP is to the binary.
    reloads: mpsc::UnboundedSender<()>,
    /// Completes `serve`'s shutdown future: a drain, as SIGTERM starts.
    drain: Option<oneshot::Sender<()>>,
    /// Drops the daemon's runtime without a drain, as SIGKILL ends a process.
    kill: Option<oneshot::Sender<()>>,
    /// Told once the daemon's thread is done.
    finished: std_mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

/// What the daemon's thread reports once its socket is bound.
type Started = Result<Option<SocketAddr>, String>;

impl Daemon {
    /// Starts a daemon with `config` (TOML; `[server] socket` is set to a
    /// path in a fresh temporary directory) and waits until its socket is
    /// bound.
    pub fn start(config: &str) -> Daemon {
        refuse_environment_overrides();
        prepare_log_capture();
        let dir = tempfile::tempdir().expect("temporary directory");
        let socket = dir.path().join("ratekeeper.sock");
        let config_path = dir.path().join("ratekeeper.toml");
        std::fs::write(&config_path, with_socket(config, &socket)).expect("write config");
        let loaded = app::load_config(Some(&config_path))
            .unwrap_or_else(|problem| panic!("the test's config is invalid: {problem}"));
        let drain_timeout = Duration::from_millis(loaded.server.drain_timeout_ms);

        let log = LogBuffer::default();
        let (started_tx, started) = std_mpsc::channel::<Started>();
        let (finished_tx, finished) = std_mpsc::channel();
        let (reloads, reload_requests) = mpsc::unbounded_channel();
        let (drain, drain_requested) = oneshot::channel();
        let (kill, kill_requested) = oneshot::channel();
        let daemon_log = log.clone();
        let thread = std::thread::Builder::new()
            .name("in-process-daemon".into())
            .spawn(move || {
                let serving = Serving {
                    config: loaded,
                    config_path,
                    reload_requests,
                    drain_requested,
                    kill_requested,
                };
                serving.run(&daemon_log.dispatch(), started_tx);
                let _ = finished_tx.send(());
            })
            .expect("start the daemon's thread");
        let mut daemon = Daemon {
            socket,
            dir,
            log,
            metrics_address: None,
            drain_timeout,
            reloads,
            drain: Some(drain),
            kill: Some(kill),
            finished,
            thread: Some(thread),
        };
        // A panic here drops `daemon`, which prints its log.
        match started.recv_timeout(START_TIMEOUT) {
            Ok(Ok(metrics_address)) => daemon.metrics_address = metrics_address,
            Ok(Err(failure)) => panic!("the daemon did not start: {failure}"),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => panic!("the daemon's thread panicked"),
            Err(std_mpsc::RecvTimeoutError::Timeout) => {
                panic!("the daemon did not bind its socket within {START_TIMEOUT:?}")
            }
        }
        daemon
    }

    /// A client that has said hello.
    pub async fn client(&self) -> Client {
        super::connect_client(&self.socket).await
    }

    /// A raw connection, nothing sent yet.
    pub async fn raw(&self) -> UnixStream {
        super::connect_raw(&self.socket).await
    }

    /// A raw connection that has exchanged Hello.
    pub async fn raw_after_hello(&self) -> UnixStream {
        super::connect_after_hello(&self.socket).await
    }

    /// Whether the daemon still answers a ping on a new connection.
    pub async fn assert_serving(&self) {
        super::assert_serving_at(&self.socket).await;
    }

    /// What the daemon logged so far, as `serve --log-level debug` writes
    /// it in text.
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// Waits (bounded) until the log shows `needle`.
    pub async fn wait_for_log(&self, needle: &str) {
        super::wait_until_logged(|| self.log(), needle).await;
    }

    /// The address of the metrics listener (`[metrics] listen`).
    pub fn metrics_address(&self) -> String {
        self.metrics_address
            .expect("the config has a [metrics] listen address")
            .to_string()
    }

    /// The temporary directory of the socket and the config file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The config file the daemon was started with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("ratekeeper.toml")
    }

    /// Does what SIGHUP does after `config` is written to the config file
    /// (with the daemon's socket): reloads it. `Err` carries the line
    /// saying why the running configuration stays.
    pub async fn reload_with(&self, config: &str) -> Result<(), String> {
        const DONE: &str = "configuration reloaded";
        const REFUSED: &str = "configuration not reloaded";
        let outcomes = |log: &str| log.matches(DONE).count() + log.matches(REFUSED).count();
        let before = outcomes(&self.log());
        std::fs::write(self.config_path(), with_socket(config, &self.socket))
            .expect("rewrite the config");
        self.reloads.send(()).expect("the daemon is serving");
        let deadline = Instant::now() + super::WAIT_TIMEOUT;
        loop {
            let log = self.log();
            if outcomes(&log) > before {
                let last = log
                    .lines()
                    .rfind(|line| line.contains(DONE) || line.contains(REFUSED))
                    .expect("the line just counted");
                if last.contains(REFUSED) {
                    return Err(last.to_string());
                }
                return Ok(());
            }
            assert!(Instant::now() < deadline, "no reload logged:\n{log}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Shuts the daemon down as SIGTERM does (go unready, stop accepting,
    /// remove the socket, drain) and waits, bounded by its drain timeout,
    /// until `serve` has returned.
    pub async fn shut_down(&mut self) {
        if let Some(drain) = self.drain.take() {
            let _ = drain.send(());
        }
        let deadline = Instant::now() + self.drain_timeout + DRAIN_MARGIN;
        while self.finished.try_recv().is_err() {
            assert!(
                Instant::now() < deadline,
                "the daemon did not finish its drain:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the daemon's thread did not panic");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            if let Some(kill) = self.kill.take() {
                let _ = kill.send(());
            }
            // The runtime is dropped without waiting for its tasks, so this
            // is quick; a thread that does not end is left, not waited on.
            match self.finished.recv_timeout(START_TIMEOUT) {
                Ok(()) | Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    if thread.join().is_err() {
                        eprintln!("the in-process daemon's thread panicked");
                    }
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    eprintln!("the in-process daemon did not stop within {START_TIMEOUT:?}");
                }
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "--- daemon log ---\n{}--- end of daemon log ---",
                self.log()
            );
        }
    }
}

/// What the daemon's thread runs.
struct Serving {
    config: config::Config,
    config_path: PathBuf,
    reload_requests: mpsc::UnboundedReceiver<()>,
    drain_requested: oneshot::Receiver<()>,
    kill_requested: oneshot::Receiver<()>,
}

impl Serving {
    /// Assembles, binds and serves as `main.rs` does, with `log` the
    /// default subscriber of this thread and of every runtime thread;
    /// reports the bind (or why not) on `started`.
    fn run(self, log: &Dispatch, started: std_mpsc::Sender<Started>) {
        let _log_scope = tracing::dispatcher::set_default(log);
        let runtime = runtime(self.config.server.threads, log);
        let Serving {
            config,
            config_path,
            reload_requests,
            drain_requested,
            kill_requested,
        } = self;
        runtime.block_on(async move {
            let mut app = match App::new(config, Some(config_path)) {
                Ok(app) => app,
                Err(failure) => {
                    let _ = started.send(Err(failure.to_string()));
                    return;
                }
            };
            // Redis is connected to before the socket appears, as in main.rs.
            app.warm_up().await;
            let listener = match app.bind() {
                Ok(listener) => listener,
                Err(failure) => {
                    let _ = started.send(Err(failure.to_string()));
                    return;
                }
            };
            let _ = started.send(Ok(app.metrics_address()));
            let shutdown = async {
                let _ = drain_requested.await;
            };
            tokio::select! {
                () = app.serve(listener, shutdown, reload_requests) => {}
                _ = kill_requested => {}
            }
        });
        // Tasks still running (connections, a count in the blocking pool)
        // are dropped without being waited for.
        runtime.shutdown_background();
    }
}

/// The runtime `main.rs` builds for `threads` (`app::runtime_builder`),
/// with `log` as the default
/// subscriber of each thread it starts.
fn runtime(threads: usize, log: &Dispatch) -> tokio::runtime::Runtime {
    thread_local! {
        static LOG_SCOPE: RefCell<Option<DefaultGuard>> = const { RefCell::new(None) };
    }
    let log = log.clone();
    app::runtime_builder(threads)
        .thread_name("in-process-daemon")
        .on_thread_start(move || {
            let scope = tracing::dispatcher::set_default(&log);
            LOG_SCOPE.with(|slot| *slot.borrow_mut() = Some(scope));
        })
        .on_thread_stop(|| LOG_SCOPE.with(|slot| drop(slot.borrow_mut().take())))
        .build()
        .expect("the daemon's runtime")
}

/// `config` with `[server] socket` set to `socket`, as the binary's
/// harness sets `RATEKEEPER_SOCKET`: in the file, so that a reload (which
/// refuses a changed `[server]`) reads the same socket again.
fn with_socket(config: &str, socket: &Path) -> String {
    let mut table: toml::Table = config
        .parse()
        .unwrap_or_else(|problem| panic!("the test's config is not TOML: {problem}"));
    let server = table
        .entry("server")
        .or_insert_with(|| toml::Table::new().into());
    server
        .as_table_mut()
        .expect("[server] is a table")
        .insert("socket".into(), socket.display().to_string().into());
    toml::to_string(&table).expect("a table serializes")
}

/// The in-process daemon reads the config's environment overrides from
/// this process, as `ratekeeper serve` reads its own: one set in the
/// shell running the tests would point every daemon at it.
fn refuse_environment_overrides() {
    for name in [
        config::ENV_SOCKET,
        config::ENV_REDIS_URL,
        config::ENV_METRICS_LISTEN,
    ] {
        assert!(
            std::env::var_os(name).is_none(),
            "unset {name}: in-process daemons would take it as their config override"
        );
    }
}

/// Sets up, once per process, what every daemon's log capture needs:
///
/// - the binary's subscriber forwards the `log` crate's records (the redis
///   crate's) to tracing; here they go to the daemon whose thread made them;
/// - a dispatcher that lives as long as the process and answers "sometimes"
///   for every callsite. While one dispatcher alone is registered,
///   tracing-core 0.1 asks the *calling thread's* default whether a callsite
///   it meets for the first time is of interest (tokio-rs/tracing#3611):
///   a test thread without a subscriber (`tests/it/in_process.rs`, the
///   store tests) would cache "never" and silence that line in every daemon.
///   With two registered, interest is asked of both, and "sometimes" makes
///   each event ask the dispatcher of the thread it happens on.
fn prepare_log_capture() {
    static PREPARED: Once = Once::new();
    static ANCHOR: OnceLock<Dispatch> = OnceLock::new();
    PREPARED.call_once(|| {
        let _ = tracing_log::LogTracer::init();
        ANCHOR.get_or_init(|| Dispatch::new(AskEveryTime));
    });
}

/// A subscriber that records nothing and keeps every callsite's interest at
/// "sometimes" (see [`prepare_log_capture`]).
struct AskEveryTime;

impl tracing::Subscriber for AskEveryTime {
    fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// One daemon's log lines, kept in memory.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// The subscriber of `serve --log-level debug --log-format text`
    /// (`ratekeeper::logging::init`), writing here.
    fn dispatch(&self) -> Dispatch {
        let buffer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_ansi(false)
            .with_writer(move || buffer.clone())
            .finish();
        Dispatch::new(subscriber)
    }
}

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
