//! The store stack one daemon answers from, each layer kept by its own type
//! so that its counters stay readable (`crate::app` builds it from the
//! configuration).

use std::sync::Arc;

use super::{FailFastStore, FallbackStore, RedisStore, Store};

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
