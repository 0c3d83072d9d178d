//! Real `redis-server` processes for tests: one node, or a Redis Cluster of
//! three, each on free ports with no persistence, killed on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server (or a cluster) may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// One `redis-server`, killed on drop; its log printed if the test failed.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_attempt(extra, 5)
    }

    fn start_attempt(extra: &[&str], attempts_left: u32) -> RedisServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        let mut server = RedisServer { child, port, dir };
        if !server.wait_ready() {
            // Another process took the port between free_port and bind?
            assert!(
                attempts_left > 1,
                "redis-server would not start:\n{}",
                server.log()
            );
            drop(server);
            return Self::start_attempt(extra, attempts_left - 1);
        }
        server
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.child.try_wait().expect("poll redis-server").is_some() {
                return false;
            }
            if self
                .cli(&["PING"])
                .map(|reply| reply == "PONG")
                .unwrap_or(false)
            {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Runs `redis-cli` against this server; the reply, trimmed.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        redis_cli(self.port, args)
    }

    /// Calls of one command since the last `CONFIG RESETSTAT`, from INFO commandstats.
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]).unwrap_or_default();
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// Starts the server again on the same port, after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        self.child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        assert!(
            self.wait_ready(),
            "redis-server did not restart:\n{}",
            self.log()
        );
    }

    /// Stops the server (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- redis log (port {}) ---\n{}", self.port, self.log());
        }
    }
}

/// `redis-cli -p PORT ARGS...`, trimmed, or `None` if it could not connect.
pub fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let reply = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !reply.starts_with("Could not connect")).then_some(reply)
}

/// Three `redis-server --cluster-enabled yes` nodes joined into one cluster
/// with every slot assigned.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + READY_TIMEOUT;
        while !cluster.nodes.iter().all(|node| {
            node.cli(&["CLUSTER", "INFO"])
                .is_some_and(|info| info.contains("cluster_state:ok"))
        }) {
            assert!(
                Instant::now() < deadline,
                "cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// Seed node URLs, as `cluster_nodes` takes them.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}", node.port))
            .collect()
    }

    /// The hash slot of `key`.
    pub fn keyslot(&self, key: &str) -> u16 {
        self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .and_then(|slot| slot.parse().ok())
            .expect("CLUSTER KEYSLOT")
    }
}

/// A primary, a replica of it and three Sentinels watching them (quorum
/// two), all on free ports, for failover tests. Sentinels decide fast: a
/// primary is down after 500 ms without an answer.
pub struct RedisSentinels {
    pub primary: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<Sentinel>,
}

/// Name under which the Sentinels know the primary.
pub const SENTINEL_MASTER: &str = "mymaster";

struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisSentinels {
    pub fn start() -> RedisSentinels {
        let primary = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        wait_until("the replica to sync", || {
            replica
                .cli(&["INFO", "replication"])
                .is_some_and(|info| info.contains("master_link_status:up"))
        });
        let sentinels = (0..3).map(|_| Sentinel::start(primary.port)).collect();
        let set = RedisSentinels {
            primary,
            replica,
            sentinels,
        };
        wait_until("the Sentinels to see the replica", || {
            set.sentinels.iter().all(|sentinel| {
                redis_cli(sentinel.port, &["SENTINEL", "REPLICAS", SENTINEL_MASTER])
                    .is_some_and(|replicas| replicas.contains(&set.replica.port.to_string()))
            })
        });
        set
    }

    /// The Sentinels' URLs, as `[redis] sentinels` takes them.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("redis://127.0.0.1:{}", sentinel.port))
            .collect()
    }

    /// The port of the node the Sentinels currently call the primary.
    pub fn master_port(&self) -> Option<u16> {
        let reply = redis_cli(
            self.sentinels[0].port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
        )?;
        reply.lines().nth(1)?.trim().parse().ok()
    }
}

impl Sentinel {
    fn start(primary: u16) -> Sentinel {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = free_port();
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 500\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 2000\n",
                dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        wait_until("a Sentinel to answer", || {
            redis_cli(port, &["PING"]).is_some_and(|reply| reply == "PONG")
        });
        Sentinel {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
