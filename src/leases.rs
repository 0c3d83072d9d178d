//! Granted reservations awaiting their report: the lease table, and what
//! happens to leases nobody reports (a worker crashed, or forgot).
//!
//! Memory stays bounded under any client behaviour: leases older than
//! `expire_after` are forgotten, and past `max_open` the oldest go first.
//! Forgetting a lease keeps its reservation — the tokens were most likely
//! spent — and is counted.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::limiter::BucketRole;
use crate::limiter::{Adjustment, Draw, Origin};

/// Identifies the connection that owns a lease.
pub type ConnectionId = u64;

/// Which reported figure a bucket settles to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Never by usage: request buckets (the request was made), and token
    /// buckets of a limit that keeps its up-front charge (`settle = "none"`).
    Never,
    /// To the reported input tokens: a separate input bucket.
    Input,
    /// To the reported output tokens: a separate output bucket.
    Output,
    /// To input + output: combined, tenant and group token buckets.
    Total,
}

/// What one bucket of a lease holds.
#[derive(Debug, Clone)]
pub struct Reserved {
    pub role: BucketRole,
    pub draw: Draw,
    /// How a usage report settles this bucket.
    pub settle: Settle,
}

/// A granted reservation.
#[derive(Debug, Clone)]
pub struct Lease {
    pub owner: ConnectionId,
    /// Where the reservation was made, so settlement adjusts the same buckets.
    pub origin: Origin,
    /// Tokens reserved in the limit's own token buckets (`Granted.tokens`).
    pub tokens: u64,
    /// Each bucket's reservation, which carries the input and output
    /// figures apart where the limit has separate buckets.
    pub reserved: Vec<Reserved>,
    pub granted_at: Instant,
    /// The key under which the reported output tokens are learned, when
    /// the limit learns its default max output (`learn_max_output`).
    pub learn_as: Option<Arc<str>>,
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

/// What a report changes: the adjustments, and what the limit's own token
/// buckets got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// One per bucket whose level changes.
    pub adjustments: Vec<Adjustment>,
    /// The sum of the adjustments of the limit's own token buckets
    /// (`Settled.tokens_returned`): reserved − used, negative for an
    /// overrun; 0 when they keep the up-front charge.
    pub tokens_returned: i64,
}

/// Settles a report of `input` and `output` tokens: each bucket that
/// settles gets back what it reserved less its matching figure (negative:
/// the overrun is taken, at most the bucket's capacity).
pub fn settle_usage(reserved: &[Reserved], input: u64, output: u64) -> Settlement {
    let as_i64 = |tokens: u64| tokens.min(i64::MAX as u64) as i64;
    let mut settlement = Settlement {
        adjustments: Vec::new(),
        tokens_returned: 0,
    };
    for reserved in reserved {
        let used = match reserved.settle {
            Settle::Never => continue,
            Settle::Input => input,
            Settle::Output => output,
            Settle::Total => input.saturating_add(output),
        };
        // An overrun is taken, but never more than one full bucket: usage
        // beyond that is a client bug or a hostile report, and must neither
        // lock the limit for everyone nor push levels out of exact range.
        let tokens = as_i64(reserved.draw.cost)
            .saturating_sub(as_i64(used))
            .max(-as_i64(reserved.draw.bucket.capacity));
        if reserved.role.is_limit_tokens() {
            settlement.tokens_returned = settlement.tokens_returned.saturating_add(tokens);
        }
        if tokens != 0 {
            settlement.adjustments.push(Adjustment {
                bucket: reserved.draw.bucket.clone(),
                tokens,
            });
        }
    }
    settlement
}

/// Gives back `fraction` of each settling bucket's reservation: the refund
/// rule for leases of a closed connection, which treats the lease as if it
/// had been reported with that fraction unused.
pub fn refund_fraction(reserved: &[Reserved], fraction: f64) -> Vec<Adjustment> {
    reserved
        .iter()
        .filter(|reserved| reserved.settle != Settle::Never)
        .map(|reserved| Adjustment {
            bucket: reserved.draw.bucket.clone(),
            tokens: (reserved.draw.cost as f64 * fraction).floor() as i64,
        })
        .filter(|adjustment| adjustment.tokens != 0)
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

/// Granted leases: by id, by age (for expiry and eviction) and by owning
/// connection (so that closing a connection costs in proportion to its own
/// leases, not to every open lease).
///
/// Lease ids are random 64-bit numbers from a cryptographic generator, so a
/// client cannot settle another client's lease by guessing; any connection
/// that knows an id may settle it (a reconnecting worker reports its own).
pub struct LeaseTable {
    inner: Mutex<Leases>,
    expire_after: Duration,
    max_open: usize,
    pub counters: LeaseCounters,
}

#[derive(Default)]
struct Leases {
    by_id: HashMap<u64, Lease>,
    /// (grant time, id), oldest first.
    by_age: BTreeSet<(Instant, u64)>,
    /// Ids of each connection's leases.
    by_owner: HashMap<ConnectionId, HashSet<u64>>,
}

impl Leases {
    fn add(&mut self, id: u64, lease: Lease) {
        self.by_age.insert((lease.granted_at, id));
        self.by_owner.entry(lease.owner).or_default().insert(id);
        self.by_id.insert(id, lease);
    }

    fn remove(&mut self, id: u64) -> Option<Lease> {
        let lease = self.by_id.remove(&id)?;
        self.by_age.remove(&(lease.granted_at, id));
        if let Some(owned) = self.by_owner.get_mut(&lease.owner) {
            owned.remove(&id);
            if owned.is_empty() {
                self.by_owner.remove(&lease.owner);
            }
        }
        Some(lease)
    }

    /// Removes the oldest lease granted before `cutoff` (any, without one);
    /// false when there is none.
    fn remove_oldest(&mut self, cutoff: Option<Instant>) -> bool {
        match self.by_age.first() {
            Some(&(granted_at, id)) if cutoff.is_none_or(|cutoff| granted_at < cutoff) => {
                self.remove(id).is_some()
            }
            _ => false,
        }
    }

    /// A fresh, unguessable, non-zero id.
    fn new_id(&self) -> u64 {
        loop {
            let id: u64 = rand::random();
            if id != 0 && !self.by_id.contains_key(&id) {
                return id;
            }
        }
    }
}

impl LeaseTable {
    pub fn new(expire_after: Duration, max_open: usize) -> Self {
        LeaseTable {
            inner: Mutex::new(Leases::default()),
            expire_after,
            max_open: max_open.max(1),
            counters: LeaseCounters::default(),
        }
    }

    /// Records a grant and returns its lease id, making room first if the
    /// table is full.
    pub fn insert(&self, lease: Lease) -> u64 {
        let mut leases = self.lock();
        while leases.by_id.len() >= self.max_open && leases.remove_oldest(None) {
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
        }
        let id = leases.new_id();
        leases.add(id, lease);
        id
    }

    /// Takes a lease out to settle it; `None` if unknown or already settled.
    pub fn take(&self, id: u64) -> Option<Lease> {
        self.lock().remove(id)
    }

    /// Puts back a lease whose settlement failed, so it can be retried.
    pub fn restore(&self, id: u64, lease: Lease) {
        self.lock().add(id, lease);
    }

    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every lease of a closed connection.
    pub fn take_owned_by(&self, connection: ConnectionId) -> Vec<(u64, Lease)> {
        let mut leases = self.lock();
        let Some(ids) = leases.by_owner.remove(&connection) else {
            return Vec::new();
        };
        ids.into_iter()
            .filter_map(|id| leases.remove(id).map(|lease| (id, lease)))
            .collect()
    }

    /// Forgets leases granted before `now - expire_after`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let Some(cutoff) = now.checked_sub(self.expire_after) else {
            return 0;
        };
        let mut leases = self.lock();
        let mut expired = 0;
        while leases.remove_oldest(Some(cutoff)) {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Leases> {
        // Every update completes under the lock without a panic point
        // between its steps, so a poisoned table is whole.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::BucketSpec;

    fn reserved(role: BucketRole, cost: u64, settle: Settle) -> Reserved {
        Reserved {
            role,
            draw: Draw {
                bucket: BucketSpec {
                    key: role.name().into(),
                    capacity: 10_000,
                    per_minute: 60,
                },
                cost,
                floor: 0,
            },
            settle,
        }
    }

    fn lease(owner: ConnectionId, granted_at: Instant) -> Lease {
        Lease {
            owner,
            origin: Origin::Store,
            tokens: 10,
            reserved: vec![reserved(BucketRole::Tokens, 10, Settle::Total)],
            granted_at,
            learn_as: None,
        }
    }

    /// (buckets as role, cost, settle; report input, output) → (adjustment
    /// per bucket key, tokens_returned)
    #[test]
    fn reports_settle_each_bucket_from_its_figure() {
        use BucketRole::*;
        use Settle::*;
        type Buckets = &'static [(BucketRole, u64, Settle)];
        type Adjusted = &'static [(&'static str, i64)];
        type Case = (&'static str, Buckets, (u64, u64), Adjusted, i64);
        let cases: [Case; 6] = [
            (
                "combined, refunded; the request stays spent",
                &[
                    (Tokens, 1_500, Total),
                    (Requests, 1, Never),
                    (Tenant, 1_500, Total),
                ],
                (300, 200),
                &[("tokens", 1_000), ("tenant", 1_000)],
                1_000,
            ),
            (
                "combined, overrun debited",
                &[(Tokens, 1_500, Total)],
                (1_200, 800),
                &[("tokens", -500)],
                -500,
            ),
            (
                "exact usage changes nothing",
                &[(Tokens, 1_500, Total)],
                (1_000, 500),
                &[],
                0,
            ),
            (
                "charge kept (openai); the tenant still settles",
                &[
                    (Tokens, 1_000, Never),
                    (Tenant, 1_000, Total),
                    (GroupTokens, 1_000, Never),
                ],
                (500, 100),
                &[("tenant", 400)],
                0,
            ),
            (
                "separate buckets: input overrun debited, output refunded",
                &[
                    (InputTokens, 500, Input),
                    (OutputTokens, 1_000, Output),
                    (Tenant, 1_500, Total),
                ],
                (700, 300),
                &[
                    ("input_tokens", -200),
                    ("output_tokens", 700),
                    ("tenant", 500),
                ],
                500,
            ),
            (
                "an overrun beyond one full bucket takes one full bucket",
                &[(Tokens, 10, Total)],
                (u64::MAX, u64::MAX),
                &[("tokens", -10_000)],
                -10_000,
            ),
        ];
        for (what, buckets, (input, output), adjustments, returned) in cases {
            let buckets: Vec<Reserved> = buckets
                .iter()
                .map(|&(role, cost, settle)| reserved(role, cost, settle))
                .collect();
            let settlement = settle_usage(&buckets, input, output);
            let got: Vec<(&str, i64)> = settlement
                .adjustments
                .iter()
                .map(|a| (&*a.bucket.key, a.tokens))
                .collect();
            assert_eq!(got, adjustments, "{what}");
            assert_eq!(settlement.tokens_returned, returned, "{what}");
        }
    }

    #[test]
    fn a_disconnect_refund_is_a_fraction_of_each_settling_bucket() {
        use BucketRole::*;
        use Settle::*;
        let buckets = vec![
            reserved(InputTokens, 501, Input),
            reserved(OutputTokens, 1_000, Output),
            reserved(Requests, 1, Never),
            reserved(GroupTokens, 1_501, Never),
        ];
        let refunds: Vec<(String, i64)> = refund_fraction(&buckets, 0.5)
            .into_iter()
            .map(|a| (a.bucket.key.to_string(), a.tokens))
            .collect();
        assert_eq!(
            refunds,
            [
                ("input_tokens".to_string(), 250),
                ("output_tokens".to_string(), 500)
            ]
        );
        let all: Vec<i64> = refund_all(&buckets).iter().map(|a| a.tokens).collect();
        assert_eq!(all, [501, 1_000, 1, 1_501]);
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
    fn lease_ids_cannot_be_guessed_from_earlier_ones() {
        let now = Instant::now();
        let table = LeaseTable::new(Duration::from_secs(60), 10_000);
        let ids: Vec<u64> = (0..1000).map(|_| table.insert(lease(1, now))).collect();
        assert!(ids.iter().all(|&id| id != 0));
        let distinct: HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), ids.len());
        let next_is_previous_plus_small = ids
            .windows(2)
            .filter(|pair| pair[1].wrapping_sub(pair[0]) < 1 << 20)
            .count();
        assert_eq!(next_is_previous_plus_small, 0, "ids follow each other");
    }

    #[test]
    fn a_restored_lease_keeps_its_age() {
        let start = Instant::now();
        let after = |seconds| start + Duration::from_secs(seconds);
        let table = LeaseTable::new(Duration::from_secs(60), 100);
        let (old, young) = (
            table.insert(lease(1, start)),
            table.insert(lease(1, after(30))),
        );
        let taken = table.take(old).unwrap();
        table.restore(old, taken);
        assert_eq!(table.expire(after(61)), 1);
        assert!(table.take(old).is_none(), "the old lease expired first");
        assert!(table.take(young).is_some());
    }

    #[test]
    fn a_closed_connection_takes_only_its_own_leases() {
        let now = Instant::now();
        let table = LeaseTable::new(Duration::from_secs(60), 100);
        let mine = table.insert(lease(7, now));
        let theirs = table.insert(lease(8, now));
        let settled = table.insert(lease(7, now));
        assert!(table.take(settled).is_some());
        let taken = table.take_owned_by(7);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, mine);
        assert!(table.take_owned_by(7).is_empty());
        assert!(table.take(theirs).is_some());
        assert!(table.is_empty());
    }
}
