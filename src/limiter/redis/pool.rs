//! A fixed number of lazily (re)connected multiplexed connections to one
//! Redis node or a Redis Cluster, and the deadline of every call on them.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, Script, ServerErrorKind};
use redis::{RedisFuture, Value};
use tokio::sync::Mutex;

use crate::limiter::StoreError;

/// Where Redis is and how long to wait for it: what the Redis store needs,
/// and nothing else of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    pub nodes: RedisNodes,
    /// The nodes as logs and errors may show them (passwords masked).
    pub display: String,
    /// PEM file of the CA that signed the server's TLS certificate.
    pub tls_ca_file: Option<PathBuf>,
    /// Multiplexed connections the calls are spread over.
    pub pool_size: usize,
    /// Deadline of one call.
    pub timeout: Duration,
    /// Deadline of connecting to a node.
    pub connect_timeout: Duration,
}

/// One node, the seed nodes of a cluster, or the Sentinels of a primary.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisNodes {
    /// `redis://`, `rediss://` or `unix://` URL of a single node.
    Single(String),
    /// Seed node URLs of a Redis Cluster.
    Cluster(Vec<String>),
    /// The primary that Sentinels (their URLs) know by `master`; every new
    /// connection asks them where it is, so a failover is followed.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        /// How to log in to the primary itself.
        auth: PrimaryAuth,
    },
}

/// Credentials and database of a primary found through Sentinel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PrimaryAuth {
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

/// Why the Redis store could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error("invalid Redis node {node}: {source}")]
    InvalidNode { node: String, source: RedisError },
    #[error("cannot read tls_ca_file {path}: {source}")]
    TlsCa {
        path: String,
        source: std::io::Error,
    },
}

/// The connections, and which one the next call takes.
pub(super) struct Pool {
    connector: Connector,
    slots: Vec<Slot>,
    next: AtomicUsize,
    timeout: Duration,
    connect_timeout: Duration,
}

/// How a slot opens its connection.
enum Connector {
    Single {
        client: redis::Client,
        config: AsyncConnectionConfig,
    },
    Cluster {
        client: redis::cluster::ClusterClient,
    },
    Sentinel {
        client: Mutex<redis::sentinel::SentinelClient>,
        config: AsyncConnectionConfig,
    },
}

/// A live connection to a node or to the cluster.
#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connector {
    async fn connect(&self) -> Result<Connection, RedisError> {
        match self {
            Connector::Single { client, config } => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Connection::Single),
            Connector::Cluster { client } => {
                client.get_async_connection().await.map(Connection::Cluster)
            }
            Connector::Sentinel { client, config } => client
                .lock()
                .await
                .get_async_connection_with_config(config)
                .await
                .map(Connection::Single),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

/// One pooled connection: absent until first use and after it broke.
struct Slot {
    connection: Mutex<Option<Connection>>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            connection: Mutex::new(None),
        }
    }

    /// The live connection, connecting first if there is none. Concurrent
    /// callers wait for one connect instead of each opening their own.
    async fn get(&self, connector: &Connector) -> Result<Connection, RedisError> {
        let mut connection = self.connection.lock().await;
        if let Some(live) = connection.as_ref() {
            return Ok(live.clone());
        }
        let fresh = connector.connect().await?;
        *connection = Some(fresh.clone());
        Ok(fresh)
    }

    /// Drops the connection, so the next call connects afresh.
    async fn reset(&self) {
        *self.connection.lock().await = None;
    }

    /// Drops the connection after an error that leaves it unusable, so the
    /// next call reconnects.
    async fn discard_if_broken(&self, redis_error: &RedisError) {
        // A node that became a replica (a failover) answers READONLY: the
        // next connection must ask the Sentinels for the new primary.
        let demoted = matches!(
            redis_error.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        );
        if demoted
            || redis_error.is_unrecoverable_error()
            || redis_error.is_connection_dropped()
            || redis_error.is_io_error()
        {
            *self.connection.lock().await = None;
        }
    }
}

/// The client that asks the Sentinels for the primary and connects to it.
/// Sentinels reached over TLS (`rediss://`) mean a primary reached over TLS
/// too, verified against the same CA: its password must not cross the
/// network in clear (issue 27). The Sentinels' own credentials come from
/// their URLs (the first that has any), the primary's from `auth`.
fn sentinel_client(
    sentinels: &[String],
    master: &str,
    auth: &PrimaryAuth,
    certificates: Option<redis::TlsCertificates>,
) -> redis::RedisResult<redis::sentinel::SentinelClient> {
    use redis::IntoConnectionInfo;
    let nodes = sentinels
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let over_tls = nodes
        .iter()
        .any(|node| matches!(node.addr(), redis::ConnectionAddr::TcpTls { .. }));
    let mut builder = redis::sentinel::SentinelClientBuilder::new(
        nodes.iter().map(|node| node.addr().clone()),
        master,
        redis::sentinel::SentinelServerType::Master,
    )?
    .set_client_to_redis_db(auth.db);
    if let Some(sentinel) = nodes
        .iter()
        .map(|node| node.redis_settings())
        .find(|settings| settings.password().is_some())
    {
        if let Some(username) = sentinel.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = sentinel.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if let Some(username) = &auth.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = &auth.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if over_tls {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_certificates(certificates);
        }
    }
    builder.build()
}

impl Pool {
    /// Builds the clients; connections open on first use, so the daemon
    /// starts (and applies its failure policy) even while Redis is down.
    pub(super) fn new(settings: &RedisSettings) -> Result<Self, RedisSetupError> {
        // redis's TLS uses rustls, which needs a process-wide crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let size = settings.pool_size.max(1);
        let certificates = match &settings.tls_ca_file {
            Some(path) => Some(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(
                    std::fs::read(path).map_err(|source| RedisSetupError::TlsCa {
                        path: path.display().to_string(),
                        source,
                    })?,
                ),
            }),
            None => None,
        };
        let invalid = |source| RedisSetupError::InvalidNode {
            node: settings.display.clone(),
            source,
        };
        let connector = match &settings.nodes {
            RedisNodes::Single(url) => Connector::Single {
                client: match certificates {
                    Some(certificates) => redis::Client::build_with_tls(url.as_str(), certificates),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(invalid)?,
                config: single_config(settings),
            },
            RedisNodes::Cluster(seeds) => Connector::Cluster {
                client: certificates
                    .into_iter()
                    .fold(
                        redis::cluster::ClusterClientBuilder::new(seeds.clone()),
                        |builder, certificates| builder.certs(certificates),
                    )
                    .connection_timeout(settings.connect_timeout)
                    .response_timeout(settings.timeout)
                    .build()
                    .map_err(invalid)?,
            },
            RedisNodes::Sentinel {
                sentinels,
                master,
                auth,
            } => Connector::Sentinel {
                client: Mutex::new(
                    sentinel_client(sentinels, master, auth, certificates).map_err(invalid)?,
                ),
                config: single_config(settings),
            },
        };
        Ok(Pool {
            connector,
            slots: (0..size).map(|_| Slot::new()).collect(),
            next: AtomicUsize::new(0),
            timeout: settings.timeout,
            connect_timeout: settings.connect_timeout,
        })
    }

    /// Opens every pooled connection (authenticating as configured) and
    /// loads `scripts` on it, so that the first request finds both ready.
    pub(super) async fn warm_up(&self, scripts: &[&Script]) -> Result<(), StoreError> {
        let attempt = async {
            for slot in &self.slots {
                let mut connection = slot.get(&self.connector).await?;
                for script in scripts {
                    if let Err(redis_error) = script.load_async(&mut connection).await {
                        slot.discard_if_broken(&redis_error).await;
                        return Err(redis_error);
                    }
                }
            }
            Ok(())
        };
        within(self.connect_timeout + self.timeout, attempt).await
    }

    /// Sends `PING` on the next pooled connection within the deadline.
    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[index % self.slots.len()];
        let attempt = async {
            let mut connection = slot.get(&self.connector).await?;
            let result: Result<String, RedisError> =
                redis::cmd("PING").query_async(&mut connection).await;
            if let Err(redis_error) = &result {
                slot.discard_if_broken(redis_error).await;
            }
            result.map(drop)
        };
        within(self.timeout, attempt).await
    }

    /// When a call started now must give up: `redis.timeout_ms` from now.
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Runs one script call (`cmd`, an `EVALSHA` of `script`) on the next
    /// pooled connection by `deadline`; `fresh` replaces that
    /// connection first (a retry after it broke). A script Redis does not
    /// have (a flush, a restart, a failover) is loaded and the call sent
    /// again. A connection that failed is dropped so the next call
    /// reconnects.
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
        script: &Script,
        fresh: bool,
        deadline: Instant,
    ) -> Result<T, Failure> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[index % self.slots.len()];
        let sent = AtomicBool::new(false);
        let attempt = async {
            if fresh {
                slot.reset().await;
            }
            let mut connection = slot
                .get(&self.connector)
                .await
                .map_err(|redis_error| Failure::NotSent(unavailable(&redis_error)))?;
            sent.store(true, Ordering::Relaxed);
            let mut result = cmd.query_async(&mut connection).await;
            if let Err(redis_error) = &result
                && redis_error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
            {
                result = match script.load_async(&mut connection).await {
                    Ok(_) => cmd.query_async(&mut connection).await,
                    Err(load_error) => Err(load_error),
                };
            }
            if let Err(redis_error) = &result {
                slot.discard_if_broken(redis_error).await;
            }
            result.map_err(|redis_error| Failure::classify(&redis_error))
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => {
                let error = StoreError::Unavailable(format!(
                    "no answer from Redis within {} ms",
                    self.timeout.as_millis()
                ));
                Err(if sent.load(Ordering::Relaxed) {
                    Failure::TimedOut(error)
                } else {
                    Failure::NotSent(error)
                })
            }
        }
    }
}

/// Why a script call got no reply, and what that says about whether it ran.
#[derive(Debug)]
pub(super) enum Failure {
    /// It never reached Redis (no connection): it did not run.
    NotSent(StoreError),
    /// Redis answered with an error (OOM, READONLY, BUSY, …): it did not run.
    Refused(StoreError),
    /// The connection broke after it was written: it may have run.
    Lost(StoreError),
    /// No reply within the deadline: it may have run, or may still run.
    TimedOut(StoreError),
}

impl Failure {
    fn classify(redis_error: &RedisError) -> Failure {
        let error = unavailable(redis_error);
        match redis_error.kind() {
            ErrorKind::Server(_) | ErrorKind::Extension => Failure::Refused(error),
            _ if redis_error.is_connection_refusal() => Failure::NotSent(error),
            _ => Failure::Lost(error),
        }
    }

    /// Whether the call may have changed buckets.
    pub(super) fn may_have_run(&self) -> bool {
        matches!(self, Failure::Lost(_) | Failure::TimedOut(_))
    }

    pub(super) fn into_error(self) -> StoreError {
        match self {
            Failure::NotSent(error)
            | Failure::Refused(error)
            | Failure::Lost(error)
            | Failure::TimedOut(error) => error,
        }
    }
}

fn unavailable(redis_error: &RedisError) -> StoreError {
    StoreError::Unavailable(redis_error.to_string())
}

/// How every connection to one node is set up.
fn single_config(settings: &RedisSettings) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.timeout))
}

/// `attempt`'s outcome, or `Unavailable` once `deadline` has passed.
async fn within<T>(
    deadline: Duration,
    attempt: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, attempt).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(redis_error)) => Err(StoreError::Unavailable(redis_error.to_string())),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer from Redis within {} ms",
            deadline.as_millis()
        ))),
    }
}
