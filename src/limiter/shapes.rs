//! Sidecars that disagree about a bucket's shape: what `lua/batch.lua`
//! reported, kept so that `status` and `/metrics` show it and the log warns
//! once per disagreement.
//!
//! Every sidecar sharing a Redis draws each bucket with the capacity and
//! rate of its own config. While two configs differ (a rolling update, a
//! sidecar someone forgot), the script draws with the smaller capacity,
//! rate and largest cost of the two: the safer shape holds until they agree.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a disagreement is shown after the script last reported it: as
/// long as the script remembers another sidecar's shape (`SHAPE_WINDOW` in
/// `lua/batch.lua`).
pub const SHOWN_FOR: Duration = Duration::from_secs(30);

/// The suffix of a `Status` or `Inspection` row that shows the shape
/// another sidecar draws a bucket with (`tokens:elsewhere`), right after
/// the bucket's own row, while the configs differ.
pub const ELSEWHERE: &str = ":elsewhere";

/// Shapes kept before expired ones are pruned.
const PRUNE_AT: usize = 1024;

/// A bucket's shape, in tokens (or requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub capacity: u64,
    pub per_minute: u64,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "capacity {} refilled {} a minute",
            self.capacity, self.per_minute
        )
    }
}

/// One bucket drawn with two shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    pub key: Arc<str>,
    /// This sidecar's shape.
    pub ours: Shape,
    /// The shape another sidecar drew the bucket with.
    pub theirs: Shape,
}

/// Disagreements the store met lately.
#[derive(Debug, Default)]
pub struct ShapeConflicts {
    seen: Mutex<HashMap<Arc<str>, (Disagreement, Instant)>>,
    calls: AtomicU64,
}

impl ShapeConflicts {
    /// Notes that a call drew `key` with both shapes; warns when this
    /// disagreement is new.
    pub fn note(&self, disagreement: Disagreement) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut seen = self.lock();
        let known = seen
            .get(&disagreement.key)
            .is_some_and(|(known, at)| *known == disagreement && now - *at < SHOWN_FOR);
        if !known {
            tracing::warn!(
                bucket = %disagreement.key,
                ours = %disagreement.ours,
                theirs = %disagreement.theirs,
                "another sidecar draws this bucket with another shape (configs differ, as during a rollout): \
                 both draw with the smaller capacity and rate until they agree"
            );
        }
        if seen.len() >= PRUNE_AT {
            seen.retain(|_, (_, at)| now - *at < SHOWN_FOR);
        }
        seen.insert(disagreement.key.clone(), (disagreement, now));
    }

    /// The disagreements reported within [`SHOWN_FOR`].
    pub fn current(&self) -> Vec<Disagreement> {
        let now = Instant::now();
        self.lock()
            .values()
            .filter(|(_, at)| now - *at < SHOWN_FOR)
            .map(|(disagreement, _)| disagreement.clone())
            .collect()
    }

    /// Calls that drew a bucket with another sidecar's shape as well.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, (Disagreement, Instant)>> {
        // Entries are only inserted or removed whole.
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
