//! Readiness: whether the daemon can serve acquires now, and why — the one
//! judgement behind `/readyz`, the `Health` request and `ratekeeper health`
//! — and the watch that notices a dead store without waiting for traffic.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::StoreCalls;
use crate::proto::HealthStatus;

use super::shapes::ShapeConflicts;
use super::{FailurePolicy, FallbackStore, Store};

/// How often the watch looks at the store.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// A store that answered a call this recently needs no ping: an idle
/// sidecar pings about four times a second, a busy one never.
pub const FRESH_FOR: Duration = WATCH_INTERVAL;

/// Where the store's state is read: the failure policy store when the
/// daemon shares its buckets through Redis.
#[derive(Clone)]
pub struct StoreHealth {
    kind: &'static str,
    fallback: Option<Arc<FallbackStore>>,
    /// Buckets other sidecars draw with another shape (Redis only).
    shapes: Option<Arc<ShapeConflicts>>,
}

/// The store's state at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreState {
    /// `"embedded"` or `"redis"`.
    pub kind: &'static str,
    pub up: bool,
    /// How long it has been failing, while it is.
    pub down_for: Option<Duration>,
    /// The failure policy; `None` for the embedded store.
    pub policy: Option<FailurePolicy>,
}

impl StoreHealth {
    /// The state of `store`, with `fallback` its failure policy layer.
    pub fn new(store: &dyn Store, fallback: Option<Arc<FallbackStore>>) -> Self {
        StoreHealth {
            kind: store.kind(),
            fallback,
            shapes: None,
        }
    }

    /// The same, with where a shared store notes buckets that other
    /// sidecars draw with another shape.
    pub fn with_shapes(self, shapes: Option<Arc<ShapeConflicts>>) -> Self {
        StoreHealth { shapes, ..self }
    }

    /// Buckets another sidecar lately drew with another shape.
    pub fn shape_conflicts(&self) -> Option<&Arc<ShapeConflicts>> {
        self.shapes.as_ref()
    }

    /// The failure policy layer, when there is one.
    pub fn fallback(&self) -> Option<&Arc<FallbackStore>> {
        self.fallback.as_ref()
    }

    /// The store's state now.
    pub fn state(&self) -> StoreState {
        match &self.fallback {
            None => StoreState {
                kind: self.kind,
                up: true,
                down_for: None,
                policy: None,
            },
            Some(fallback) => StoreState {
                kind: self.kind,
                up: !fallback.is_failing(),
                down_for: fallback.failing_since().map(|since| since.elapsed()),
                policy: Some(fallback.policy()),
            },
        }
    }
}

/// Judges readiness: the socket is bound, the daemon is not draining, and
/// the store answers — or its failure policy grants in its place.
pub fn judge(socket_bound: bool, draining: bool, store: StoreState) -> HealthStatus {
    let down_for = store.down_for.unwrap_or_default();
    let policy = store.policy.map_or("", FailurePolicy::name);
    let (ready, reason) = if draining {
        (false, "shutting down: no new acquires".to_string())
    } else if !socket_bound {
        (false, "the socket is not bound yet".to_string())
    } else if store.up {
        (true, format!("the {} store answers", store.kind))
    } else {
        let down = format!(
            "the {} store has not answered for {:.1} s",
            store.kind,
            down_for.as_secs_f64()
        );
        match store.policy {
            Some(FailurePolicy::FailClosed) | None => (
                false,
                format!("{down}; on_failure = \"fail_closed\" refuses every acquire"),
            ),
            Some(policy) => (
                true,
                format!(
                    "serving on the failure policy: {down}; on_failure = \"{}\" answers acquires",
                    policy.name()
                ),
            ),
        }
    };
    HealthStatus {
        ready,
        store: store.kind.to_string(),
        store_up: store.up,
        store_down_ms: down_for.as_millis() as u64,
        policy: policy.to_string(),
        reason,
    }
}

/// Pings `store` whenever no call has succeeded for [`FRESH_FOR`], so that
/// a dead store is noticed (and a recovered one too) within a second even
/// without traffic; forever, the caller aborts it.
pub async fn watch_store(store: Arc<dyn Store>, calls: Arc<StoreCalls>) {
    let mut ticks = tokio::time::interval(WATCH_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let fresh = calls
            .since_last_success()
            .is_some_and(|since| since < FRESH_FOR);
        if !fresh {
            // The failure policy layer notes the outcome; it logs transitions.
            let _ = store.ping().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_socket_the_drain_and_the_store_with_its_policy() {
        let up = StoreState {
            kind: "redis",
            up: true,
            down_for: None,
            policy: Some(FailurePolicy::FailClosed),
        };
        let down = |policy| StoreState {
            up: false,
            down_for: Some(Duration::from_millis(1500)),
            policy: Some(policy),
            ..up
        };
        let cases = [
            (true, false, up, true, "the redis store answers"),
            (false, false, up, false, "the socket is not bound yet"),
            (true, true, up, false, "shutting down"),
            (
                true,
                false,
                down(FailurePolicy::FailClosed),
                false,
                "has not answered for 1.5 s; on_failure = \"fail_closed\" refuses",
            ),
            (
                true,
                false,
                down(FailurePolicy::Local),
                true,
                "serving on the failure policy: the redis store has not answered for 1.5 s; on_failure = \"local\"",
            ),
            (
                true,
                false,
                down(FailurePolicy::FailOpen),
                true,
                "on_failure = \"fail_open\" answers acquires",
            ),
        ];
        for (bound, draining, store, ready, reason) in cases {
            let judged = judge(bound, draining, store);
            assert_eq!(judged.ready, ready, "{judged:?}");
            assert!(judged.reason.contains(reason), "{judged:?}");
            assert_eq!(judged.store_up, store.up);
        }
        let judged = judge(true, false, down(FailurePolicy::Local));
        assert_eq!(
            (judged.store_down_ms, judged.policy.as_str()),
            (1500, "local")
        );
    }
}
