//! A store that times and counts every call of the store it wraps: latency
//! per operation, errors by kind, and when a call last succeeded (so the
//! health watch pings only an idle store). It changes no answer.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Answer, Lifecycle, Op, Store, StoreError};
use crate::metrics::StoreCalls;

/// Times and counts the calls of `inner`.
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    calls: Arc<StoreCalls>,
    /// A failure that took at least this long is counted as a timeout.
    timeout: Duration,
}

impl InstrumentedStore {
    /// Records into `calls`; `timeout` is the inner store's own deadline
    /// (`Duration::MAX` for a store without one).
    pub fn new(inner: Arc<dyn Store>, calls: Arc<StoreCalls>, timeout: Duration) -> Self {
        InstrumentedStore {
            inner,
            calls,
            timeout,
        }
    }

    async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let outcome = call.await;
        let elapsed = started.elapsed();
        let failure = outcome.as_ref().err().map(|failure| match failure {
            StoreError::CostExceedsCapacity { .. } => "cost_exceeds_capacity",
            StoreError::Unavailable(_) if elapsed >= self.timeout => "timeout",
            StoreError::Unavailable(_) => "unavailable",
        });
        self.calls.observe(operation, elapsed, failure);
        outcome
    }
}

#[async_trait]
impl Store for InstrumentedStore {
    async fn call(&self, op: Op<'_>) -> Result<Answer, StoreError> {
        self.timed(op.name(), self.inner.call(op)).await
    }
}

#[async_trait]
impl Lifecycle for InstrumentedStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn warm_up(&self) -> Result<(), StoreError> {
        self.timed("warm_up", self.inner.warm_up()).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.timed("ping", self.inner.ping()).await
    }

    async fn reconciled(&self) {
        self.inner.reconciled().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::{BucketSpec, Draw};
    use crate::limiter::{EmbeddedStore, StoreOps};

    #[tokio::test]
    async fn every_call_is_timed_and_a_success_is_remembered() {
        let calls = Arc::new(StoreCalls::default());
        let store =
            InstrumentedStore::new(Arc::new(EmbeddedStore::new()), calls.clone(), Duration::MAX);
        assert_eq!(calls.since_last_success(), None);
        let bucket = BucketSpec::per_minute("k", 10, 60);
        let draw = Draw {
            bucket: bucket.clone(),
            cost: 11,
            floor: 0,
        };
        assert!(matches!(
            store.acquire(&[draw], 0).await,
            Err(StoreError::CostExceedsCapacity { .. })
        ));
        assert_eq!(calls.since_last_success(), None, "a failure is no success");
        assert_eq!(store.levels(&[bucket]).await.unwrap(), [10]);
        assert!(calls.since_last_success().unwrap() < Duration::from_secs(1));
        assert_eq!(store.kind(), "embedded");
    }
}
