//! How far provider feedback has lowered each shared bucket, as the store's
//! latest answer said: a reservation granted before a lowering must wait
//! for it too.
//!
//! A lowering moves a bucket's whole future down, and with it the moment at
//! which each reservation still waiting finds its units. Each bucket counts
//! the units lowerings took from it (`p` in `lua/batch.lua`; the embedded
//! store's entries alike); each grant carries that count as it drew (its
//! [`DrawMark`]), and every store answer says where it stands now. A
//! reservation then waits longer by what the count grew since its grant,
//! over the bucket's rate, whichever sidecar's feedback lowered it.
//!
//! Each lowering counts at most the provider's room when it counted (its
//! capacity less its count): a full provider passes the next calls anyway,
//! and postponing them further would only let its bucket overflow and waste
//! refill, which the next count shows as a shortfall, to postpone them
//! further still (a first version that postponed by every lowering did that
//! until the fleet used a third of the limit). The rule before this one
//! counted a lowering whole while the provider's count was below half its
//! bucket and not at all above: the first burst's lowerings postponed
//! nothing (issue 26).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rustc_hash::FxHashMap;

/// Where one grant drew one bucket of a shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawMark {
    pub key: Arc<str>,
    /// The bucket's running count of units drawn right after the grant's
    /// draw (`n` in `lua/batch.lua`): what the fleet drew after the grant
    /// is the count now less this. The embedded store keeps none (the one
    /// sidecar places feedback by its own grants).
    pub drawn: Option<i64>,
    /// The units lowerings had taken from the bucket when it drew (`p`).
    pub lowered: i64,
    /// The bucket's refill, in the same units a ms.
    pub units_per_ms: i64,
}

/// The latest count of lowered units each bucket's store replies gave.
#[derive(Debug, Default)]
pub struct LoweredTotals {
    /// Set once any bucket was lowered: until then a grant costs no lock.
    any: AtomicBool,
    latest: Mutex<FxHashMap<Arc<str>, i64>>,
}

impl LoweredTotals {
    /// Notes that a store reply gave `lowered` for `key`. The latest reply
    /// wins, not the largest count: a bucket that was full and deleted
    /// starts again at zero, and so must the count a grant is compared with.
    /// (A reply overtaken by an older one only delays a postponement until
    /// the next reply.)
    pub fn note(&self, key: &Arc<str>, lowered: i64) {
        if lowered == 0 && !self.any.load(Ordering::Relaxed) {
            return;
        }
        self.any.store(true, Ordering::Relaxed);
        let mut latest = self.lock();
        match latest.get_mut(key) {
            Some(count) => *count = lowered,
            None if lowered != 0 => {
                // Bounded by the buckets of the config, which feedback
                // lowers; a config reload can leave old keys: drop them all
                // once there are implausibly many.
                if latest.len() >= MAX_BUCKETS {
                    latest.clear();
                }
                latest.insert(key.clone(), lowered);
            }
            None => {}
        }
    }

    /// How much longer than promised a grant drawn at `marks` must wait:
    /// for each of its buckets, the units lowered since its draw over the
    /// bucket's rate; the longest of them, in ms, and its index in `marks`.
    pub fn postponement(&self, marks: &[DrawMark]) -> Option<(u64, usize)> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let latest = self.lock();
        marks
            .iter()
            .enumerate()
            .filter_map(|(at, mark)| {
                let grown = latest.get(&mark.key)?.checked_sub(mark.lowered)?;
                (grown > 0 && mark.units_per_ms > 0)
                    .then(|| ((grown as u64).div_ceil(mark.units_per_ms as u64), at))
            })
            .max_by_key(|&(ms, _)| ms)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<Arc<str>, i64>> {
        // Plain counts: a poisoned lock holds whole values.
        self.latest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// More buckets lowered than any config has: forget them all and start again.
const MAX_BUCKETS: usize = 65_536;

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(key: &str, lowered: i64, units_per_ms: i64) -> DrawMark {
        DrawMark {
            key: Arc::from(key),
            drawn: None,
            lowered,
            units_per_ms,
        }
    }

    #[test]
    fn a_grant_waits_for_what_was_lowered_after_it_over_the_rate() {
        let totals = LoweredTotals::default();
        let grant = [mark("a", 1_000, 300), mark("b", 0, 10)];
        assert_eq!(totals.postponement(&grant), None, "nothing lowered yet");
        totals.note(&Arc::from("a"), 1_000);
        assert_eq!(
            totals.postponement(&grant),
            None,
            "lowered before the grant"
        );
        totals.note(&Arc::from("a"), 1_601);
        // 601 units at 300 a ms: 3 ms, rounded up.
        assert_eq!(totals.postponement(&grant), Some((3, 0)));
        totals.note(&Arc::from("b"), 50);
        assert_eq!(
            totals.postponement(&grant),
            Some((5, 1)),
            "the longest bucket's"
        );
    }

    #[test]
    fn a_bucket_that_started_again_postpones_nothing() {
        let totals = LoweredTotals::default();
        totals.note(&Arc::from("a"), 5_000);
        let grant = [mark("a", 5_000, 1)];
        totals.note(&Arc::from("a"), 0);
        assert_eq!(totals.postponement(&grant), None);
    }

    #[test]
    fn zero_counts_of_unknown_buckets_are_not_kept() {
        let totals = LoweredTotals::default();
        totals.note(&Arc::from("a"), 7);
        totals.note(&Arc::from("b"), 0);
        assert_eq!(totals.lock().len(), 1);
    }
}
