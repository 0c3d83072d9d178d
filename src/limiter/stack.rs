//! The store stack one daemon answers from, and its order: counted calls
//! nearest the store, local fail-fast above them, the failure policy on top.

use std::sync::Arc;
use std::time::Duration;

use super::{
    EmbeddedStore, FailFastStore, FailurePolicy, FallbackStore, InstrumentedStore, RedisStore,
    Store,
};
use crate::metrics::StoreCalls;

/// The stores one daemon answers from, each kept by its own type so that
/// its counters stay readable.
#[derive(Clone)]
pub struct Stores {
    /// What the service calls: the whole stack.
    pub store: Arc<dyn Store>,
    /// The Redis store itself, when Redis is configured.
    pub redis: Option<Arc<RedisStore>>,
    /// The failure policy over Redis, when Redis is configured.
    pub fallback: Option<Arc<FallbackStore>>,
    /// The local fail-fast layer under the policy, when Redis is configured.
    pub fail_fast: Option<Arc<FailFastStore>>,
}

impl Stores {
    /// The embedded store, its calls counted into `calls`.
    pub fn embedded(calls: Arc<StoreCalls>) -> Stores {
        let embedded = Arc::new(EmbeddedStore::new());
        Stores {
            store: Arc::new(InstrumentedStore::new(embedded, calls, Duration::MAX)),
            redis: None,
            fallback: None,
            fail_fast: None,
        }
    }

    /// Redis with its calls counted into `calls` (a failure after `timeout`
    /// counts as a timeout), under `policy` while it fails.
    pub fn over_redis(
        redis: Arc<RedisStore>,
        calls: Arc<StoreCalls>,
        timeout: Duration,
        policy: FailurePolicy,
        local_share: f64,
    ) -> Stores {
        let instrumented = Arc::new(InstrumentedStore::new(redis.clone(), calls, timeout));
        // Denials this sidecar can prove from Redis's last answer are
        // repeated locally instead of costing a script call; the failure
        // policy wraps both, so only Redis's own answers teach it.
        let fail_fast = Arc::new(FailFastStore::new(instrumented));
        let fallback = Arc::new(FallbackStore::new(fail_fast.clone(), policy, local_share));
        Stores {
            store: fallback.clone(),
            redis: Some(redis),
            fallback: Some(fallback),
            fail_fast: Some(fail_fast),
        }
    }
}
