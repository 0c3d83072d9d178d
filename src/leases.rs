//! Granted reservations awaiting their report: the lease table, and what
//! happens to leases nobody reports (a worker crashed, or forgot).
//!
//! Memory stays bounded under any client behaviour: leases older than
//! `expire_after` are forgotten, and past `max_open` the oldest go first.
//! Forgetting a lease keeps its reservation — the tokens were most likely
//! spent — and is counted.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::limiter::{Adjustment, Draw, Origin};

/// Identifies the connection that owns a lease.
pub type ConnectionId = u64;

/// What one bucket of a lease holds.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// The bucket's role name (`"tokens"`, `"requests"`, …).
    pub role: &'static str,
    pub draw: Draw,
    /// Whether a usage report settles this bucket (token buckets do, request
    /// buckets are spent once the provider is called).
    pub settles_with_usage: bool,
}

/// A granted reservation.
#[derive(Debug, Clone)]
pub struct Lease {
    pub owner: ConnectionId,
    /// Where the reservation was made, so settlement adjusts the same buckets.
    pub origin: Origin,
    /// Tokens reserved in the token buckets.
    pub tokens: u64,
    pub reserved: Vec<Reserved>,
    pub granted_at: Instant,
}

/// Gives back every bucket's whole cost: a release, or a cancelled wait.
pub fn refund_all(reserved: &[Reserved]) -> Vec<Adjustment> {
    reserved
        .iter()
        .map(|reserved| Adjustment {
            bucket: reserved.draw.bucket.clone(),
            tokens: reserved.draw.cost as i64,
        })
        .collect()
}

/// Adds `tokens` (negative: takes) to the buckets that usage settles.
pub fn adjust_usage_buckets(reserved: &[Reserved], tokens: i64) -> Vec<Adjustment> {
    reserved
        .iter()
        .filter(|reserved| reserved.settles_with_usage)
        .map(|reserved| Adjustment {
            bucket: reserved.draw.bucket.clone(),
            tokens,
        })
        .collect()
}

/// Counts of leases that ended without a report.
#[derive(Debug, Default)]
pub struct LeaseCounters {
    /// Forgotten when their connection closed, reservation kept.
    pub kept_on_disconnect: AtomicU64,
    /// Partly refunded after their connection closed.
    pub refunded_on_disconnect: AtomicU64,
    /// Forgotten for age or for room, reservation kept.
    pub expired: AtomicU64,
}

/// Leases by id. Ids grow, so the first entry is always the oldest.
pub struct LeaseTable {
    leases: Mutex<BTreeMap<u64, Lease>>,
    next_id: AtomicU64,
    expire_after: Duration,
    max_open: usize,
    pub counters: LeaseCounters,
}

impl LeaseTable {
    pub fn new(expire_after: Duration, max_open: usize) -> Self {
        LeaseTable {
            leases: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            expire_after,
            max_open: max_open.max(1),
            counters: LeaseCounters::default(),
        }
    }

    /// Records a grant and returns its lease id, making room first if the
    /// table is full.
    pub fn insert(&self, lease: Lease) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut leases = self.lock();
        while leases.len() >= self.max_open {
            leases.pop_first();
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
        }
        leases.insert(id, lease);
        id
    }

    /// Takes a lease out to settle it; `None` if unknown or already settled.
    pub fn take(&self, id: u64) -> Option<Lease> {
        self.lock().remove(&id)
    }

    /// Puts back a lease whose settlement failed, so it can be retried.
    pub fn restore(&self, id: u64, lease: Lease) {
        self.lock().insert(id, lease);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every lease of a closed connection.
    pub fn take_owned_by(&self, connection: ConnectionId) -> Vec<(u64, Lease)> {
        let mut leases = self.lock();
        let ids: Vec<u64> = leases
            .iter()
            .filter(|(_, lease)| lease.owner == connection)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| leases.remove(&id).map(|lease| (id, lease)))
            .collect()
    }

    /// Forgets leases granted before `now - expire_after`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let Some(cutoff) = now.checked_sub(self.expire_after) else {
            return 0;
        };
        let mut leases = self.lock();
        let mut expired = 0;
        while leases
            .first_key_value()
            .is_some_and(|(_, lease)| lease.granted_at < cutoff)
        {
            leases.pop_first();
            expired += 1;
        }
        self.counters
            .expired
            .fetch_add(expired as u64, Ordering::Relaxed);
        expired
    }

    /// How often [`expire`](Self::expire) should run.
    pub fn sweep_interval(&self) -> Duration {
        (self.expire_after / 10).clamp(Duration::from_millis(100), Duration::from_secs(60))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Lease>> {
        // Every update is a single insert or removal, so a poisoned map is whole.
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::BucketSpec;

    fn lease(owner: ConnectionId, granted_at: Instant) -> Lease {
        Lease {
            owner,
            origin: Origin::Store,
            tokens: 10,
            reserved: vec![Reserved {
                role: "tokens",
                draw: Draw {
                    bucket: BucketSpec {
                        key: "k".into(),
                        capacity: 100,
                        per_minute: 60,
                    },
                    cost: 10,
                    floor: 0,
                },
                settles_with_usage: true,
            }],
            granted_at,
        }
    }

    #[test]
    fn old_leases_expire_and_a_full_table_drops_the_oldest() {
        let start = Instant::now();
        let table = LeaseTable::new(Duration::from_secs(60), 3);
        let first = table.insert(lease(1, start));
        let second = table.insert(lease(1, start + Duration::from_secs(30)));
        assert_eq!(table.expire(start + Duration::from_secs(61)), 1);
        assert!(table.take(first).is_none());
        table.insert(lease(2, start + Duration::from_secs(40)));
        table.insert(lease(2, start + Duration::from_secs(50)));
        table.insert(lease(2, start + Duration::from_secs(55)));
        assert_eq!(table.len(), 3);
        assert!(table.take(second).is_none(), "the oldest made room");
        assert_eq!(table.counters.expired.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_closed_connection_takes_only_its_own_leases() {
        let now = Instant::now();
        let table = LeaseTable::new(Duration::from_secs(60), 100);
        let mine = table.insert(lease(7, now));
        let theirs = table.insert(lease(8, now));
        let taken = table.take_owned_by(7);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, mine);
        assert!(table.take(theirs).is_some());
        assert!(table.is_empty());
    }
}
