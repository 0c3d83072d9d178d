//! A fixed number of lazily (re)connected multiplexed connections to one
//! Redis node or a Redis Cluster, and the deadline of every call on them.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisError, Script, ScriptInvocation};
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

/// One node, or the seed nodes of a cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisNodes {
    /// `redis://`, `rediss://` or `unix://` URL of a single node.
    Single(String),
    /// Seed node URLs of a Redis Cluster.
    Cluster(Vec<String>),
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
    nodes: Nodes,
    next: AtomicUsize,
    timeout: Duration,
    connect_timeout: Duration,
}

enum Nodes {
    Single {
        client: redis::Client,
        config: AsyncConnectionConfig,
        slots: Vec<Slot<MultiplexedConnection>>,
    },
    Cluster {
        client: redis::cluster::ClusterClient,
        slots: Vec<Slot<ClusterConnection>>,
    },
}

/// One pooled connection: absent until first use and after it broke.
struct Slot<C> {
    connection: Mutex<Option<C>>,
}

impl<C: Clone> Slot<C> {
    fn new() -> Self {
        Slot {
            connection: Mutex::new(None),
        }
    }

    /// The live connection, connecting first if there is none. Concurrent
    /// callers wait for one connect instead of each opening their own.
    async fn get<F, Fut>(&self, connect: F) -> Result<C, RedisError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, RedisError>>,
    {
        let mut connection = self.connection.lock().await;
        if let Some(live) = connection.as_ref() {
            return Ok(live.clone());
        }
        let fresh = connect().await?;
        *connection = Some(fresh.clone());
        Ok(fresh)
    }

    /// Drops a connection that failed so the next call reconnects.
    async fn discard(&self) {
        *self.connection.lock().await = None;
    }
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
        let nodes = match &settings.nodes {
            RedisNodes::Single(url) => Nodes::Single {
                client: match certificates {
                    Some(certificates) => redis::Client::build_with_tls(url.as_str(), certificates),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(invalid)?,
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(settings.connect_timeout))
                    .set_response_timeout(Some(settings.timeout)),
                slots: (0..size).map(|_| Slot::new()).collect(),
            },
            RedisNodes::Cluster(seeds) => Nodes::Cluster {
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
                slots: (0..size).map(|_| Slot::new()).collect(),
            },
        };
        Ok(Pool {
            nodes,
            next: AtomicUsize::new(0),
            timeout: settings.timeout,
            connect_timeout: settings.connect_timeout,
        })
    }

    /// Opens every pooled connection (authenticating as configured) and
    /// loads `scripts` on it, so that the first request finds both ready.
    pub(super) async fn warm_up(&self, scripts: &[&Script]) -> Result<(), StoreError> {
        let attempt = async {
            match &self.nodes {
                Nodes::Single {
                    client,
                    config,
                    slots,
                } => {
                    for slot in slots {
                        let mut connection = slot
                            .get(|| client.get_multiplexed_async_connection_with_config(config))
                            .await?;
                        load(&mut connection, scripts, slot).await?;
                    }
                }
                Nodes::Cluster { client, slots } => {
                    for slot in slots {
                        let mut connection = slot.get(|| client.get_async_connection()).await?;
                        load(&mut connection, scripts, slot).await?;
                    }
                }
            }
            Ok::<(), RedisError>(())
        };
        let deadline = self.connect_timeout + self.timeout;
        match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(redis_error)) => Err(StoreError::Unavailable(redis_error.to_string())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer from Redis within {} ms",
                deadline.as_millis()
            ))),
        }
    }

    /// Runs one script on the next pooled connection within the deadline.
    /// A connection that failed is dropped so the next call reconnects.
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let attempt = async {
            match &self.nodes {
                Nodes::Single {
                    client,
                    config,
                    slots,
                } => {
                    let slot = &slots[index % slots.len()];
                    let mut connection = slot
                        .get(|| client.get_multiplexed_async_connection_with_config(config))
                        .await?;
                    invoke(invocation, &mut connection, slot).await
                }
                Nodes::Cluster { client, slots } => {
                    let slot = &slots[index % slots.len()];
                    let mut connection = slot.get(|| client.get_async_connection()).await?;
                    invoke(invocation, &mut connection, slot).await
                }
            }
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(redis_error)) => Err(StoreError::Unavailable(redis_error.to_string())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer from Redis within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// Loads every script on one connection; a failed connection is dropped.
async fn load<C>(connection: &mut C, scripts: &[&Script], slot: &Slot<C>) -> Result<(), RedisError>
where
    C: ConnectionLike + Clone + Send,
{
    for script in scripts {
        if let Err(redis_error) = script.load_async(connection).await {
            discard_if_broken(&redis_error, slot).await;
            return Err(redis_error);
        }
    }
    Ok(())
}

async fn invoke<C, T>(
    invocation: &ScriptInvocation<'_>,
    connection: &mut C,
    slot: &Slot<C>,
) -> Result<T, RedisError>
where
    C: ConnectionLike + Clone + Send,
    T: redis::FromRedisValue,
{
    let result = invocation.invoke_async(connection).await;
    if let Err(redis_error) = &result {
        discard_if_broken(redis_error, slot).await;
    }
    result
}

/// Drops the slot's connection after an error that leaves it unusable, so
/// the next call reconnects.
async fn discard_if_broken<C: Clone>(redis_error: &RedisError, slot: &Slot<C>) {
    if redis_error.is_unrecoverable_error()
        || redis_error.is_connection_dropped()
        || redis_error.is_io_error()
    {
        slot.discard().await;
    }
}
