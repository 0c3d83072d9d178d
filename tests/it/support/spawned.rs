//! The real `ratekeeper serve` binary in a process of its own, for the tests
//! that are about the process: signals, exit status, what it writes to
//! stderr and at which level, systemd's notifications, its memory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratekeeper::client::Client;
use tokio::net::UnixStream;

/// How long a daemon may take to create its socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `ratekeeper serve`, killed (and its log printed if the test
/// failed) on drop.
pub struct SpawnedDaemon {
    child: Child,
    dir: tempfile::TempDir,
    pub socket: PathBuf,
}

impl SpawnedDaemon {
    /// Starts the daemon with `config` (TOML without a `[server]` socket,
    /// which is set to a path in a fresh temporary directory).
    pub fn start(config: &str) -> SpawnedDaemon {
        SpawnedDaemon::start_with_env(config, &[])
    }

    /// As [`SpawnedDaemon::start`], with these environment variables set.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> SpawnedDaemon {
        SpawnedDaemon::spawn(config, env, None)
    }

    /// As [`SpawnedDaemon::start`], with `args` after `serve` instead of
    /// `--log-level debug`, and `RUST_LOG` and `RATEKEEPER_LOG_LEVEL` only
    /// as `env` gives them: for tests of how the log level is chosen.
    pub fn start_with_log_settings(
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> SpawnedDaemon {
        SpawnedDaemon::spawn_with(config, args, env, None, true)
    }

    /// As [`SpawnedDaemon::start`], but its stderr is a pipe whose reading end is
    /// already closed, as when the log shipper behind it died.
    pub fn start_with_closed_stderr(config: &str) -> SpawnedDaemon {
        SpawnedDaemon::spawn(config, &[], Some(Stdio::piped()))
    }

    fn spawn(config: &str, env: &[(&str, &str)], stderr: Option<Stdio>) -> SpawnedDaemon {
        SpawnedDaemon::spawn_with(config, &["--log-level", "debug"], env, stderr, false)
    }

    fn spawn_with(
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
        stderr: Option<Stdio>,
        clean_log_env: bool,
    ) -> SpawnedDaemon {
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
        let mut daemon = SpawnedDaemon { child, dir, socket };
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
        super::connect_client(&self.socket).await
    }

    /// A raw connection, nothing sent yet.
    pub async fn raw(&self) -> UnixStream {
        super::connect_raw(&self.socket).await
    }

    /// Whether the daemon still answers a ping on a new connection.
    pub async fn assert_serving(&self) {
        super::assert_serving_at(&self.socket).await;
    }

    /// What the daemon wrote to stderr so far.
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
        super::wait_until_logged(|| self.log(), needle).await;
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
        super::listen_address(line)
    }
}

impl Drop for SpawnedDaemon {
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
