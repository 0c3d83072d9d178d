//! Granted reservations awaiting their report: the lease table, and what
//! happens to leases nobody reports (a worker crashed, or forgot).
//!
//! Memory stays bounded under any client behaviour: leases older than
//! `expire_after` are forgotten, and past `max_open` the oldest go first.
//! Forgetting a lease keeps its reservation — the tokens were most likely
//! spent — and is counted.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use slab::Slab;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::budget::money::{Price, Usage};
pub use crate::limiter::BucketRole;
use crate::limiter::{Adjustment, BucketSpec, Draw, Origin, SlotGuard};

/// Identifies the connection that owns a lease.
pub type ConnectionId = u64;

/// What a report says a provider call used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// `Report`: the input and output tokens the provider's rate limit
    /// counts, as the client worked them out.
    Tokens { input: u64, output: u64 },
    /// `UsageReport` (protocol revision 6): the call's tokens split as the
    /// provider bills them, cache reads and writes apart.
    Billed(Usage),
}

impl Reported {
    /// The input and output tokens the provider's rate limit counts: every
    /// input token, cache writes included, and cache reads only where the
    /// provider counts them (`cache_reads_count`: OpenAI does, Anthropic
    /// does not for current models).
    pub fn rate_tokens(self, cache_reads_count: bool) -> (u64, u64) {
        match self {
            Reported::Tokens { input, output } => (input, output),
            Reported::Billed(usage) => {
                let cached = if cache_reads_count {
                    usage.cached_input
                } else {
                    0
                };
                let input = usage
                    .input
                    .saturating_add(usage.cache_write)
                    .saturating_add(cached);
                (input, usage.output)
            }
        }
    }
}

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
    /// To what the reported usage costs at this price: spend budgets.
    Price(Price),
}

/// What one bucket of a lease holds.
#[derive(Debug, Clone)]
pub struct Reserved {
    pub role: BucketRole,
    pub draw: Draw,
    /// How a usage report settles this bucket.
    pub settle: Settle,
    /// When the calendar period of a budget's bucket ends (Unix ms): a
    /// denial by it can succeed no sooner.
    pub resets_at_ms: Option<i64>,
    /// A calendar budget's count of settled spend: a bucket of the same
    /// capacity that only reports take from, so that `status` can tell
    /// what was spent from what is still reserved.
    pub spent_counter: Option<BucketSpec>,
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
    /// The limit's concurrency slot this request holds (`max_concurrent`),
    /// given back when the last copy of the lease is dropped.
    pub slot: Option<Arc<SlotGuard>>,
    /// Whether the provider's rate limits count cache reads (see
    /// [`Reported::rate_tokens`]).
    pub cache_reads_count: bool,
}

impl Reserved {
    /// When a retry of an acquire this bucket denied can succeed, in ms
    /// from `now_ms`: what the store said, or for a calendar budget the
    /// time to its period's end (waiting refills it nothing).
    pub fn retry_after_ms(&self, store_said: u64, now_ms: i64) -> u64 {
        match self.resets_at_ms {
            Some(resets_at) if !self.draw.bucket.refill.refills() => {
                resets_at.saturating_sub(now_ms).max(1) as u64
            }
            _ => store_said,
        }
    }
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
    /// What the usage cost at the limit's price, in micro-units; 0 when no
    /// budget applies.
    pub spent: u64,
}

/// Settles a report: each bucket that settles gets back what it reserved
/// less its matching figure (negative: the overrun is taken, at most the
/// bucket's capacity). Token buckets settle to the tokens the provider's
/// rate limit counts (`cache_reads_count`: whether cache reads are among
/// them); budgets to what the usage costs. A `Report` carries no cache
/// figures (a client with any sends a `UsageReport`), so its input is
/// priced as full-price input.
pub fn settle_usage(reserved: &[Reserved], usage: Reported, cache_reads_count: bool) -> Settlement {
    let (input, output) = usage.rate_tokens(cache_reads_count);
    let as_i64 = |tokens: u64| tokens.min(i64::MAX as u64) as i64;
    let mut settlement = Settlement {
        adjustments: Vec::new(),
        tokens_returned: 0,
        spent: 0,
    };
    // A limit with tokens only over a longer window reports that bucket's.
    let mut per_minute_seen = false;
    let mut longer_window: Option<i64> = None;
    for reserved in reserved {
        let used = match reserved.settle {
            Settle::Never => continue,
            Settle::Input => input,
            Settle::Output => output,
            Settle::Total => input.saturating_add(output),
            Settle::Price(price) => {
                let cost = match usage {
                    Reported::Tokens { input, output } => price.cost(&Usage {
                        input,
                        output,
                        ..Usage::default()
                    }),
                    Reported::Billed(billed) => price.cost(&billed),
                };
                settlement.spent = settlement.spent.max(cost);
                cost
            }
        };
        // An overrun is taken, but never more than one full bucket: usage
        // beyond that is a client bug or a hostile report, and must neither
        // lock the limit for everyone nor push levels out of exact range.
        // (Usage is clamped before any arithmetic; the store then keeps all
        // overruns together within one capacity of debt per bucket, see
        // `BucketState::overrun`, so many such reports cannot add up.)
        let tokens = as_i64(reserved.draw.cost)
            .saturating_sub(as_i64(used))
            .max(-as_i64(reserved.draw.bucket.capacity));
        if reserved.role.is_limit_tokens() {
            per_minute_seen = true;
            settlement.tokens_returned = settlement.tokens_returned.saturating_add(tokens);
        } else if let BucketRole::TokensPer(_) = reserved.role {
            longer_window.get_or_insert(tokens);
        }
        if tokens != 0 {
            settlement.adjustments.push(Adjustment {
                bucket: reserved.draw.bucket.clone(),
                tokens,
            });
        }
        if let Some(counter) = &reserved.spent_counter {
            let spent = as_i64(used).min(as_i64(counter.capacity));
            if spent != 0 {
                settlement.adjustments.push(Adjustment {
                    bucket: counter.clone(),
                    tokens: -spent,
                });
            }
        }
    }
    if !per_minute_seen {
        settlement.tokens_returned = longer_window.unwrap_or(0);
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

/// What metrics and the decision log say about a lease: the label of its
/// limit and what it reserved, recorded when it is granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTag {
    /// The `limit` label (a configured name).
    pub limit: Arc<str>,
    /// `Granted.tokens`.
    pub tokens: u64,
    /// The `tenant` label: the tenant's name if `[metrics] tenants` lists
    /// it, else the shared one (empty without a tenant).
    pub tenant: Arc<str>,
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

/// An open lease, with its tag once the grant was observed (kept together,
/// so that tagging, evicting and expiring touch one entry), and its place
/// among its owner's leases.
struct Open {
    id: u64,
    lease: Lease,
    tag: Option<LeaseTag>,
    /// The owner's next newer and next older open lease (slab keys).
    newer: Option<usize>,
    older: Option<usize>,
}

/// A lease's entry in the age queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Queued {
    granted_at: Instant,
    /// Where the lease is in the slab while it is open; a settled lease's
    /// key may since hold another lease, whose id differs.
    key: usize,
    id: u64,
}

/// The leases live in a slab, and everything else refers to them by slab
/// key: a key freed by a settlement or an eviction is the next grant's, so a
/// full table (a client that never reports, at `max_open`) writes each grant
/// where its eviction just read, and eviction walks the slab in sequence.
/// Keyed by their random ids, leases were spread over a map many times the
/// cache, and each grant at `max_open` missed it three times (10 % of the
/// daemon's time under `ratekeeper-loadgen`, which never reports).
#[derive(Default)]
struct Leases {
    slots: Slab<Open>,
    /// The slab key of each open lease's id (16 bytes an entry).
    by_id: FxHashMap<u64, usize>,
    /// Every open lease, oldest first, in the order of the grants:
    /// appending is all a grant costs (leases come in age order). A settled
    /// lease's entry stays until it reaches the front or the queue is
    /// compacted (when most of it is such entries), so that settling costs
    /// nothing here either.
    by_age: VecDeque<Queued>,
    /// Each connection's newest open lease; the others follow through
    /// [`Open::older`].
    newest_of: FxHashMap<ConnectionId, usize>,
    /// Tags of leases taken out to be settled, until the settlement is
    /// observed (untagged), or put back with the lease when it failed (to be
    /// retried). An open lease's tag is in its entry and goes with it when
    /// it expires, is evicted or loses its connection.
    tags: FxHashMap<u64, LeaseTag>,
}

impl Leases {
    /// Slabs and hash maps keep the capacity of their peak: once a burst of
    /// leases has been settled, give most of it back (the soak's memory floor
    /// stepped up after its busiest minute and stayed there). The slab cannot
    /// shrink around the leases still open, so they move to a new table, in
    /// age order.
    fn shrink_after_peak(&mut self) {
        if self.slots.capacity() > 1024 && self.slots.len() < self.slots.capacity() / 4 {
            let mut old = std::mem::take(self);
            let open = old.slots.len();
            self.slots = Slab::with_capacity(open * 2);
            self.by_id = FxHashMap::with_capacity_and_hasher(open * 2, Default::default());
            self.by_age = VecDeque::with_capacity(open * 2);
            self.tags = std::mem::take(&mut old.tags);
            for queued in std::mem::take(&mut old.by_age) {
                if old.is_open(&queued) {
                    let Open { lease, tag, .. } = old.slots.remove(queued.key);
                    self.add(queued.id, lease, tag);
                }
            }
        }
        fn shrink<K: std::hash::Hash + Eq, V>(map: &mut FxHashMap<K, V>) {
            if map.capacity() > 1024 && map.len() < map.capacity() / 4 {
                map.shrink_to(map.len() * 2);
            }
        }
        shrink(&mut self.by_id);
        shrink(&mut self.newest_of);
        shrink(&mut self.tags);
        if self.by_age.capacity() > 1024 && self.by_age.len() < self.by_age.capacity() / 4 {
            self.by_age.shrink_to(self.by_age.len() * 2);
        }
    }

    /// Records a new lease under a fresh, unguessable, non-zero id.
    fn add_new(&mut self, lease: Lease) -> u64 {
        loop {
            let id: u64 = rand::random();
            if id != 0 && !self.by_id.contains_key(&id) {
                self.add(id, lease, None);
                return id;
            }
        }
    }

    /// Records an open lease, the newest of its owner's, at the back of the
    /// age queue.
    fn add(&mut self, id: u64, lease: Lease, tag: Option<LeaseTag>) {
        let granted_at = lease.granted_at;
        let key = self.link(id, lease, tag);
        self.by_age.push_back(Queued {
            granted_at,
            key,
            id,
        });
    }

    /// Puts a taken lease back, with its age: its queue entry is most
    /// likely still there (and now points to its new key); if a compaction
    /// dropped it, it goes back in its place.
    fn add_back(&mut self, id: u64, lease: Lease) {
        let granted_at = lease.granted_at;
        let tag = self.tags.remove(&id);
        let key = self.link(id, lease, tag);
        let from = self
            .by_age
            .partition_point(|queued| queued.granted_at < granted_at);
        let queued = self
            .by_age
            .range_mut(from..)
            .take_while(|queued| queued.granted_at == granted_at)
            .find(|queued| queued.id == id);
        match queued {
            Some(queued) => queued.key = key,
            // Among leases granted at the same instant, any place is its age.
            None => self.by_age.insert(
                from,
                Queued {
                    granted_at,
                    key,
                    id,
                },
            ),
        }
    }

    /// Stores an open lease in the slab as its owner's newest, and indexes
    /// its id; returns its key.
    fn link(&mut self, id: u64, lease: Lease, tag: Option<LeaseTag>) -> usize {
        let owner = lease.owner;
        let older = self.newest_of.get(&owner).copied();
        let key = self.slots.insert(Open {
            id,
            lease,
            tag,
            newer: None,
            older,
        });
        if let Some(older) = older.and_then(|older| self.slots.get_mut(older)) {
            older.newer = Some(key);
        }
        self.newest_of.insert(owner, key);
        self.by_id.insert(id, key);
        key
    }

    /// Takes the open lease at `key` out of the slab, its id's index and its
    /// owner's leases.
    fn unlink(&mut self, key: usize) -> Option<Open> {
        let open = self.slots.try_remove(key)?;
        self.by_id.remove(&open.id);
        match open.newer.and_then(|newer| self.slots.get_mut(newer)) {
            Some(newer) => newer.older = open.older,
            None => match open.older {
                Some(older) => {
                    self.newest_of.insert(open.lease.owner, older);
                }
                None => {
                    self.newest_of.remove(&open.lease.owner);
                }
            },
        }
        if let Some(older) = open.older.and_then(|older| self.slots.get_mut(older)) {
            older.newer = open.newer;
        }
        Some(open)
    }

    /// Whether a queue entry is an open lease's (not a settled one's).
    fn is_open(&self, queued: &Queued) -> bool {
        self.slots
            .get(queued.key)
            .is_some_and(|open| open.id == queued.id)
    }

    /// The open lease `id`.
    fn get(&self, id: u64) -> Option<&Open> {
        self.slots.get(*self.by_id.get(&id)?)
    }

    /// The open lease `id`, to change.
    fn get_mut(&mut self, id: u64) -> Option<&mut Open> {
        let key = *self.by_id.get(&id)?;
        self.slots.get_mut(key)
    }

    /// Takes an open lease out with its tag.
    fn remove(&mut self, id: u64) -> Option<(Lease, Option<LeaseTag>)> {
        let key = *self.by_id.get(&id)?;
        let Open { lease, tag, .. } = self.unlink(key)?;
        // Mostly entries of settled leases: drop them (amortized: at least
        // half the queue was settled since the last compaction).
        if self.by_age.len() > 2 * self.by_id.len() + 1024 {
            let mut queue = std::mem::take(&mut self.by_age);
            queue.retain(|queued| self.is_open(queued));
            self.by_age = queue;
        }
        Some((lease, tag))
    }

    /// Forgets the oldest lease granted before `cutoff` (any, without one);
    /// false when there is none.
    fn remove_oldest(&mut self, cutoff: Option<Instant>) -> bool {
        while let Some(&queued) = self.by_age.front() {
            if cutoff.is_some_and(|cutoff| queued.granted_at >= cutoff) {
                return false;
            }
            self.by_age.pop_front();
            if self.is_open(&queued) {
                return self.unlink(queued.key).is_some();
            }
        }
        false
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
        leases.add_new(lease)
    }

    /// Takes a lease out to settle it; `None` if unknown or already settled.
    pub fn take(&self, id: u64) -> Option<Lease> {
        let mut leases = self.lock();
        let (lease, tag) = leases.remove(id)?;
        if let Some(tag) = tag {
            leases.tags.insert(id, tag);
        }
        Some(lease)
    }

    /// Puts back a lease whose settlement failed, so it can be retried.
    pub fn restore(&self, id: u64, lease: Lease) {
        self.lock().add_back(id, lease);
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
        let mut taken = Vec::new();
        while let Some(&newest) = leases.newest_of.get(&connection) {
            let Some(Open { id, lease, .. }) = leases.unlink(newest) else {
                break;
            };
            taken.push((id, lease));
        }
        taken
    }

    /// Tags the open lease `id`; nothing if it is already settled.
    pub fn tag(&self, id: u64, tag: LeaseTag) {
        if let Some(open) = self.lock().get_mut(id) {
            open.tag = Some(tag);
        }
    }

    /// The tag of lease `id`, if it was tagged and is not yet untagged.
    pub fn tag_of(&self, id: u64) -> Option<LeaseTag> {
        let leases = self.lock();
        match leases.get(id) {
            Some(open) => open.tag.clone(),
            None => leases.tags.get(&id).cloned(),
        }
    }

    /// Takes the tag of a settled lease out.
    pub fn untag(&self, id: u64) -> Option<LeaseTag> {
        self.lock().tags.remove(&id)
    }

    /// Forgets leases granted before `now - expire_after`, and the tags of
    /// settlements never observed; returns how many leases expired.
    pub fn expire(&self, now: Instant) -> usize {
        let mut leases = self.lock();
        if leases.tags.len() > leases.by_id.len() {
            let Leases { by_id, tags, .. } = &mut *leases;
            tags.retain(|id, _| by_id.contains_key(id));
        }
        let Some(cutoff) = now.checked_sub(self.expire_after) else {
            return 0;
        };
        let mut expired = 0;
        while leases.remove_oldest(Some(cutoff)) {
            expired += 1;
        }
        leases.shrink_after_peak();
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
mod tests;
