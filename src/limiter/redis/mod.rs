//! The shared store: buckets in Redis, changed only by the scripts in `lua/`.
//!
//! This is the only module that touches redis types. Each acquire, settlement
//! and status read is one `EVALSHA` on one of a few multiplexed connections;
//! `redis::Script` reloads a script after `NOSCRIPT` (a flush, a restart, a
//! failover), so callers never see it.

mod keys;
mod pool;

use async_trait::async_trait;
use redis::Script;

use super::bucket::{BucketSpec, Draw, Plan};
use super::{Adjustment, Decision, Origin, Store, StoreError, decision_from_plan};
pub use keys::{BucketOwner, bucket_key};
use pool::Pool;
pub use pool::{RedisNodes, RedisSettings, RedisSetupError};

/// Each script is the shared bucket library followed by its own body.
const ACQUIRE_LUA: &str = concat!(
    include_str!("../../../lua/bucket.lua"),
    include_str!("../../../lua/acquire.lua")
);
const ADJUST_LUA: &str = concat!(
    include_str!("../../../lua/bucket.lua"),
    include_str!("../../../lua/adjust.lua")
);
const LEVELS_LUA: &str = concat!(
    include_str!("../../../lua/bucket.lua"),
    include_str!("../../../lua/levels.lua")
);

/// The script argument that makes a script read Redis `TIME`.
const REDIS_CLOCK: &str = "";

/// Buckets in Redis (one node or a cluster), shared by every sidecar using it.
pub struct RedisStore {
    pool: Pool,
    acquire: Script,
    adjust: Script,
    levels: Script,
}

impl RedisStore {
    /// Builds the pool; connections open on first use, so the daemon starts
    /// (and applies its failure policy) even while Redis is down.
    pub fn new(settings: &RedisSettings) -> Result<Self, RedisSetupError> {
        Ok(RedisStore {
            pool: Pool::new(settings)?,
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
        let reply: Vec<i64> = self.pool.run(&invocation).await?;
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
        let _: i64 = self.pool.run(&invocation).await?;
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
        let levels: Vec<i64> = self.pool.run(&invocation).await?;
        if levels.len() != buckets.len() {
            return Err(unexpected_reply("levels", &levels));
        }
        Ok(levels)
    }
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

    async fn warm_up(&self) -> Result<(), StoreError> {
        self.pool
            .warm_up(&[&self.acquire, &self.adjust, &self.levels])
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.pool.ping().await
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
