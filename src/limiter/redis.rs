//! The shared store: buckets in Redis, changed only by the scripts in `lua/`.
//!
//! This is the only module that touches redis types. Each acquire, settlement
//! and status read is one `EVALSHA` on one of a few multiplexed connections;
//! `redis::Script` reloads a script after `NOSCRIPT` (a flush, a restart, a
//! failover), so callers never see it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisError, Script, ScriptInvocation};
use tokio::sync::Mutex;

use super::bucket::{BucketSpec, Draw, Plan};
use super::{Adjustment, Decision, Origin, Store, StoreError, decision_from_plan};
use crate::config::RedisConfig;

/// Each script is the shared bucket library followed by its own body.
const ACQUIRE_LUA: &str = concat!(
    include_str!("../../lua/bucket.lua"),
    include_str!("../../lua/acquire.lua")
);
const ADJUST_LUA: &str = concat!(
    include_str!("../../lua/bucket.lua"),
    include_str!("../../lua/adjust.lua")
);
const LEVELS_LUA: &str = concat!(
    include_str!("../../lua/bucket.lua"),
    include_str!("../../lua/levels.lua")
);

/// The script argument that makes a script read Redis `TIME`.
const REDIS_CLOCK: &str = "";

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

/// Buckets in Redis (one node or a cluster), shared by every sidecar using it.
pub struct RedisStore {
    pool: Pool,
    next: AtomicUsize,
    timeout: Duration,
    acquire: Script,
    adjust: Script,
    levels: Script,
}

/// A fixed number of lazily (re)connected multiplexed connections.
enum Pool {
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

impl RedisStore {
    /// Builds the pool; connections open on first use, so the daemon starts
    /// (and applies its failure policy) even while Redis is down.
    pub fn new(config: &RedisConfig) -> Result<Self, RedisSetupError> {
        // redis's TLS uses rustls, which needs a process-wide crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = Duration::from_millis(config.timeout_ms);
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
        let size = config.pool_size.max(1) as usize;
        let certificates = match &config.tls_ca_file {
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
        let pool = match &config.url {
            Some(url) => Pool::Single {
                client: match certificates {
                    Some(certificates) => redis::Client::build_with_tls(url.as_str(), certificates),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(|source| RedisSetupError::InvalidNode {
                    node: crate::config::mask_redis_url(url),
                    source,
                })?,
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(timeout)),
                slots: (0..size).map(|_| Slot::new()).collect(),
            },
            None => Pool::Cluster {
                client: certificates
                    .into_iter()
                    .fold(
                        redis::cluster::ClusterClientBuilder::new(config.cluster_nodes.clone()),
                        |builder, certificates| builder.certs(certificates),
                    )
                    .connection_timeout(connect_timeout)
                    .response_timeout(timeout)
                    .build()
                    .map_err(|source| RedisSetupError::InvalidNode {
                        node: config.masked_nodes(),
                        source,
                    })?,
                slots: (0..size).map(|_| Slot::new()).collect(),
            },
        };
        Ok(RedisStore {
            pool,
            next: AtomicUsize::new(0),
            timeout,
            acquire: Script::new(ACQUIRE_LUA),
            adjust: Script::new(ADJUST_LUA),
            levels: Script::new(LEVELS_LUA),
        })
    }

    /// [`Store::acquire`] at a given script time instead of Redis `TIME`:
    /// lets tests drive the script and the embedded store in lockstep.
    pub async fn acquire_at(
        &self,
        draws: &[Draw],
        max_wait_ms: u64,
        now_ms: Option<i64>,
    ) -> Result<Decision, StoreError> {
        let mut invocation = self.acquire.prepare_invoke();
        invocation.arg(max_wait_ms).arg(clock_arg(now_ms));
        for draw in draws {
            invocation
                .key(&draw.bucket.key)
                .arg(draw.bucket.capacity)
                .arg(draw.bucket.per_minute)
                .arg(draw.cost)
                .arg(draw.floor);
        }
        let reply: Vec<i64> = self.run(&invocation).await?;
        let plan = match reply.as_slice() {
            [1, wait_ms] => Plan::Grant {
                wait_ms: non_negative(*wait_ms),
            },
            [0, retry_after_ms, bucket] => Plan::Deny {
                retry_after_ms: non_negative(*retry_after_ms),
                bucket: bucket_index(*bucket, draws.len())?,
            },
            [-1, bucket] => Plan::Impossible {
                bucket: bucket_index(*bucket, draws.len())?,
            },
            other => return Err(unexpected_reply("acquire", other)),
        };
        decision_from_plan(draws, plan)
    }

    /// [`Store::adjust`] at a given script time (tests only; see `acquire_at`).
    pub async fn adjust_at(
        &self,
        adjustments: &[Adjustment],
        now_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        if adjustments.is_empty() {
            return Ok(());
        }
        let mut invocation = self.adjust.prepare_invoke();
        invocation.arg(clock_arg(now_ms));
        for adjustment in adjustments {
            invocation
                .key(&adjustment.bucket.key)
                .arg(adjustment.bucket.capacity)
                .arg(adjustment.bucket.per_minute)
                .arg(adjustment.tokens);
        }
        let _: i64 = self.run(&invocation).await?;
        Ok(())
    }

    /// [`Store::levels`] at a given script time (tests only; see `acquire_at`).
    pub async fn levels_at(
        &self,
        buckets: &[BucketSpec],
        now_ms: Option<i64>,
    ) -> Result<Vec<i64>, StoreError> {
        if buckets.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.levels.prepare_invoke();
        invocation.arg(clock_arg(now_ms));
        for bucket in buckets {
            invocation
                .key(&bucket.key)
                .arg(bucket.capacity)
                .arg(bucket.per_minute);
        }
        let levels: Vec<i64> = self.run(&invocation).await?;
        if levels.len() != buckets.len() {
            return Err(unexpected_reply("levels", &levels));
        }
        Ok(levels)
    }

    /// Runs one script on the next pooled connection within the deadline.
    /// A connection that failed is dropped so the next call reconnects.
    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let attempt = async {
            match &self.pool {
                Pool::Single {
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
                Pool::Cluster { client, slots } => {
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
        if redis_error.is_unrecoverable_error()
            || redis_error.is_connection_dropped()
            || redis_error.is_io_error()
        {
            slot.discard().await;
        }
    }
    result
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn acquire(&self, draws: &[Draw], max_wait_ms: u64) -> Result<Decision, StoreError> {
        self.acquire_at(draws, max_wait_ms, None).await
    }

    async fn adjust(&self, adjustments: &[Adjustment], _origin: Origin) -> Result<(), StoreError> {
        self.adjust_at(adjustments, None).await
    }

    async fn levels(&self, buckets: &[BucketSpec]) -> Result<Vec<i64>, StoreError> {
        self.levels_at(buckets, None).await
    }
}

fn clock_arg(now_ms: Option<i64>) -> String {
    now_ms.map_or_else(|| REDIS_CLOCK.to_string(), |now| now.to_string())
}

fn non_negative(value: i64) -> u64 {
    value.max(0) as u64
}

fn bucket_index(one_based: i64, buckets: usize) -> Result<usize, StoreError> {
    usize::try_from(one_based - 1)
        .ok()
        .filter(|&index| index < buckets)
        .ok_or_else(|| unexpected_reply("acquire", &[one_based]))
}

fn unexpected_reply(script: &str, reply: &[i64]) -> StoreError {
    StoreError::Unavailable(format!(
        "unexpected reply from the {script} script: {reply:?}"
    ))
}
