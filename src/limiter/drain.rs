//! The margin a provider correction leaves below the provider's view, for
//! what drains the provider unseen between two corrections (another
//! application on the same API key, a provider slower than configured).
//!
//! The embedded store's copy of `margin_below` in `lua/batch.lua`, which the
//! Redis store runs; the arithmetic is the same, in the bucket's units.
//! Between corrections the gap between the provider's view and the bucket
//! shrinks by that drain; each correction measures how fast it shrank since
//! the last and keeps a smoothed rate. The margin is a lower level, never a
//! lower rate, so it costs no throughput once the limit is busy.

/// The smoothing window of the drain rate, ms.
pub const DRAIN_WINDOW_MS: f64 = 2000.0;
/// How far ahead the margin covers the drain, ms.
pub const DRAIN_HORIZON_MS: f64 = 1000.0;

/// One bucket's drain estimate (all zero before its first correction).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Drain {
    /// When the last correction was made, ms.
    last_ms: Option<i64>,
    /// Units per ms that drain the provider unseen, smoothed.
    per_ms: f64,
    /// The gap the last correction left: the provider's view less the level.
    left: i64,
}

impl Drain {
    /// The level to lower a bucket at `level` to, given the provider's view
    /// `seen` at `now_ms` (units) of a call reserved `since_ms` ago; updates
    /// the rate from the gap's shrinking.
    pub fn target(&mut self, seen: i64, level: i64, now_ms: i64, since_ms: i64) -> i64 {
        if let Some(last) = self.last_ms.filter(|last| now_ms > *last) {
            let elapsed = (now_ms - last) as f64;
            let weight = (elapsed / DRAIN_WINDOW_MS).min(1.0);
            let shrank = (self.left - (seen - level)) as f64 / elapsed;
            self.per_ms = (self.per_ms + weight * (shrank - self.per_ms)).max(0.0);
        }
        // The view adds the refill since the count at the configured rate:
        // the drain took its share of that too.
        let ahead = DRAIN_HORIZON_MS + since_ms.max(0) as f64;
        seen.saturating_sub((self.per_ms * ahead).floor() as i64)
    }

    /// Notes the correction: the level the bucket was left at.
    pub fn corrected(&mut self, seen: i64, level: i64, now_ms: i64) {
        self.last_ms = Some(now_ms);
        self.left = seen.saturating_sub(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same walk as `tests/redis_store.rs`'s drain test runs through the
    /// Lua: a provider drained by 200 units every 100 ms that the fleet does
    /// not see.
    #[test]
    fn a_steady_unseen_drain_becomes_a_second_of_margin() {
        for (drain_per_step, expected) in [(200, 1_800..=2_000), (0, 0..=0)] {
            let mut drain = Drain::default();
            let (mut level, mut provider) = (60_000i64, 60_000i64);
            let mut margin = 0;
            for step in 0..60 {
                let now = 1_000 + step * 100;
                provider -= drain_per_step;
                let target = drain.target(provider, level, now, 0);
                level = level.min(target);
                drain.corrected(provider, level, now);
                margin = provider - level;
            }
            assert!(
                expected.contains(&margin),
                "{drain_per_step}: margin {margin}"
            );
        }
    }
}
