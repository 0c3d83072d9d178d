//! `Feedback`: what the provider answered a call, applied to the shared
//! buckets. A 429 pauses the limit for every worker until its
//! `retry-after`; a `remaining` header lowers the matching bucket to the
//! provider's view, less what this daemon reserved to be due since the
//! answered call (requests the provider had not seen yet, including those
//! still waiting for their reservation to come due). Buckets are never
//! raised.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use rustc_hash::FxHashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{Caller, Service, ServiceError};
use crate::feedback::{self, Dimension};
use crate::limiter::{BucketRole, DrawMarks, FleetView, Lowering, StoreOps};
use crate::proto::{Feedback, Response};

/// Most headers one `Feedback` may carry.
pub const MAX_HEADERS: usize = 64;
/// Longest header name or value, in bytes.
pub const MAX_HEADER_LEN: usize = 256;

/// The reservations of one limit by the time they come due, over the last
/// [`WINDOW`] and the next [`AHEAD`], in slots of [`SLOT`].
///
/// A reservation counts from the moment the buckets make it, filed under
/// its due time: one still waiting has left the buckets already and will
/// reach the provider after any call answered now, so feedback must count
/// it as unseen (forgetting it let a correction hand its tokens out twice).
pub(super) struct RecentGrants {
    slots: Mutex<Slots>,
}

/// How far back reservations are remembered.
const WINDOW: Duration = Duration::from_secs(10);
/// How far ahead due times are told apart; later ones count as due then.
const AHEAD: Duration = Duration::from_secs(10);
/// The resolution of that memory.
const SLOT: Duration = Duration::from_millis(25);
const SLOTS: usize = ((WINDOW.as_millis() + AHEAD.as_millis()) / SLOT.as_millis()) as usize;

struct Slots {
    start: Instant,
    /// Per slot: its number since `start`, the reservations due in it, and
    /// when the earliest of them was made.
    counts: Box<[(u64, Granted, Instant); SLOTS]>,
    /// Exact placement of feedback that names its lease.
    placed: Placements,
}

/// This sidecar's reservations of one limit in the order it made them, each
/// with the running total after it: what was granted after a lease is the
/// total now less the total after it, exactly (no slot rounding). Bounded:
/// entries older than [`WINDOW`] or past [`MAX_PLACED`] are forgotten, and
/// feedback naming such a lease is placed by its `since_grant_ms`.
#[derive(Default)]
struct Placements {
    /// Everything noted, summed (saturating).
    total: Granted,
    /// The sequence number of `log[0]`.
    first: u64,
    log: VecDeque<Placed>,
    /// Each named lease's sequence number.
    by_lease: FxHashMap<u64, u64>,
}

/// One reservation as [`Placements`] keeps it.
struct Placed {
    noted_at: Instant,
    due: Instant,
    granted: Granted,
    /// `Placements.total` right after it.
    after: Granted,
    /// Its lease, once granted (0 before, or if it never was).
    lease: u64,
    /// Where the shared store drew it, when it says.
    marks: Option<DrawMarks>,
}

/// Most reservations a limit's [`Placements`] remembers.
const MAX_PLACED: usize = 16_384;
/// How much earlier a reservation may come due than the one a count answers
/// and still reach the provider after it: the client's way from the answer
/// to the provider (a thread's turn to run, the HTTP request) varies by
/// this much. Such reservations count as unseen, which errs low.
const REORDER: Duration = Duration::from_millis(20);
/// How many reservations before a lease [`REORDER`] looks at.
const REORDER_LOOKBACK: usize = 64;

/// Where a feedback's lease stands among this sidecar's reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
    /// What this sidecar reserved that the provider may not have seen when
    /// it counted: everything after the lease, and what came due up to
    /// [`REORDER`] before it.
    pub unseen: Granted,
    /// The part of `unseen` reserved before the lease.
    pub reordered: Granted,
    /// What the lease itself reserved.
    pub own: Granted,
    /// How long ago the lease's reservation was made.
    pub reserved_ago: Duration,
    /// Where the shared store drew it.
    pub marks: Option<DrawMarks>,
}

/// What some grants reserved in the limit's own buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Granted {
    pub requests: u64,
    /// The charge of the combined token bucket (`Granted.tokens`).
    pub tokens: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Granted {
    /// Saturating: the figures come from clients' costs.
    fn add(&mut self, other: Granted) {
        self.requests = self.requests.saturating_add(other.requests);
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }

    /// What `self` holds beyond `earlier`, a running total it grew from.
    fn since(&self, earlier: Granted) -> Granted {
        Granted {
            requests: self.requests.saturating_sub(earlier.requests),
            tokens: self.tokens.saturating_sub(earlier.tokens),
            input_tokens: self.input_tokens.saturating_sub(earlier.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(earlier.output_tokens),
        }
    }

    fn of(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Requests => self.requests,
            Dimension::Tokens => self.tokens,
            Dimension::InputTokens => self.input_tokens,
            Dimension::OutputTokens => self.output_tokens,
        }
    }
}

impl RecentGrants {
    pub(super) fn new() -> Self {
        RecentGrants {
            slots: Mutex::new(Slots {
                start: Instant::now(),
                counts: Box::new([(u64::MAX, Granted::default(), Instant::now()); SLOTS]),
                placed: Placements::default(),
            }),
        }
    }

    /// Notes a reservation made now that comes due at `due`, and where the
    /// shared store drew it; the number returned names it to
    /// [`RecentGrants::name`] once it is granted.
    pub(super) fn note(&self, granted: Granted, due: Instant, marks: Option<DrawMarks>) -> u64 {
        let mut slots = self.lock();
        let now = Instant::now();
        let slot = slots.slot_of(due.min(now + AHEAD));
        let entry = &mut slots.counts[(slot % SLOTS as u64) as usize];
        if entry.0 != slot {
            *entry = (slot, Granted::default(), now);
        }
        entry.1.add(granted);
        slots.placed.note(granted, now, due, marks)
    }

    /// Gives the reservation `noted` (what [`RecentGrants::note`] returned)
    /// its lease, so that feedback naming the lease finds it.
    pub(super) fn name(&self, noted: u64, lease: u64) {
        self.lock().placed.name(noted, lease);
    }

    /// Where `lease` stands, if it is still remembered.
    pub(super) fn placement(&self, lease: u64) -> Option<Placement> {
        self.lock().placed.placement(lease, Instant::now())
    }

    /// How long ago the earliest reservation due `since` ago was made:
    /// about when the call answered then was reserved (at most a slot's
    /// worth of reservations earlier). `None` when none is remembered.
    pub(super) fn reserved_ago(&self, since: Duration) -> Option<Duration> {
        self.reserved_ago_at(since, Instant::now())
    }

    fn reserved_ago_at(&self, since: Duration, now: Instant) -> Option<Duration> {
        let slots = self.lock();
        let due = now.checked_sub(since).filter(|due| *due >= slots.start)?;
        // The client measures `since` from a moment after the daemon noted
        // the grant (the answer's way back, whole milliseconds): the call
        // may sit at the end of the slot before. Earlier only counts more.
        let slot = slots.slot_of(due);
        [slot, slot.saturating_sub(1)].into_iter().find_map(|slot| {
            let (number, _, reserved_at) = slots.counts[(slot % SLOTS as u64) as usize];
            (number == slot).then(|| now.saturating_duration_since(reserved_at))
        })
    }

    /// The reservations due from `since` ago (at most the window, slot-
    /// rounded up) on, including those not due yet.
    pub(super) fn since(&self, since: Duration) -> Granted {
        let slots = self.lock();
        let now = Instant::now();
        let from = now.checked_sub(since.min(WINDOW)).unwrap_or(slots.start);
        let (first, last) = (slots.slot_of(from), slots.slot_of(now + AHEAD));
        let mut total = Granted::default();
        for (slot, granted, _) in slots.counts.iter() {
            if (first..=last).contains(slot) {
                total.add(*granted);
            }
        }
        total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // Plain counters: a poisoned lock holds whole values.
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Placements {
    fn note(
        &mut self,
        granted: Granted,
        now: Instant,
        due: Instant,
        marks: Option<DrawMarks>,
    ) -> u64 {
        while let Some(oldest) = self.log.front() {
            if self.log.len() < MAX_PLACED && now.duration_since(oldest.noted_at) <= WINDOW {
                break;
            }
            if oldest.lease != 0 {
                self.by_lease.remove(&oldest.lease);
            }
            self.log.pop_front();
            self.first += 1;
        }
        self.total.add(granted);
        self.log.push_back(Placed {
            noted_at: now,
            due,
            granted,
            after: self.total,
            lease: 0,
            marks,
        });
        self.first + self.log.len() as u64 - 1
    }

    fn name(&mut self, noted: u64, lease: u64) {
        let Some(index) = noted.checked_sub(self.first) else {
            return; // forgotten meanwhile (it waited longer than the window)
        };
        if let Some(placed) = self.log.get_mut(index as usize)
            && placed.lease == 0
        {
            placed.lease = lease;
            self.by_lease.insert(lease, noted);
        }
    }

    fn placement(&self, lease: u64, now: Instant) -> Option<Placement> {
        let index = (self.by_lease.get(&lease)? - self.first) as usize;
        let placed = self.log.get(index)?;
        let mut unseen = self.total.since(placed.after);
        let mut reordered = Granted::default();
        let reordered_after = placed.due.checked_sub(REORDER).unwrap_or(placed.due);
        for earlier in self
            .log
            .range(index.saturating_sub(REORDER_LOOKBACK)..index)
        {
            if earlier.due > reordered_after {
                reordered.add(earlier.granted);
            }
        }
        unseen.add(reordered);
        Some(Placement {
            unseen,
            reordered,
            own: placed.granted,
            reserved_ago: now.saturating_duration_since(placed.noted_at),
            marks: placed.marks.clone(),
        })
    }
}

impl Slots {
    fn slot_of(&self, at: Instant) -> u64 {
        (at.duration_since(self.start).as_millis() / SLOT.as_millis()) as u64
    }
}

/// The provider limits already warned about, per limit and dimension: one
/// warning per value, not per answer.
#[derive(Default)]
pub(super) struct Warned(Mutex<HashMap<(String, Dimension), u64>>);

/// Most entries [`Warned`] keeps before it forgets them all.
const MAX_WARNED: usize = 1024;

/// Most limits [`Pauses`] remembers before it forgets the pauses that ended.
const MAX_PAUSES: usize = 1024;

/// The provider pause this sidecar set last for each limit: when, and
/// until when. While one is in force, a 429 does not pause the limit again
/// (issue 27: a flood of `Feedback` frames with `retry-after` re-extended
/// the pause with every frame); its counts still lower the buckets. So a
/// limit has at most one pause in force per sidecar, at most
/// the limit's `max_pause_ms` long.
#[derive(Default)]
pub(super) struct Pauses(Mutex<HashMap<String, (Instant, Instant)>>);

impl Pauses {
    /// Records a pause of `limit` for `length` from `now` unless one is in
    /// force: then returns how long ago that one was set.
    fn set(&self, limit: &str, now: Instant, length: Duration) -> Result<(), Duration> {
        let mut pauses = self.lock();
        if let Some(&(set_at, until)) = pauses.get(limit)
            && now < until
        {
            return Err(now.saturating_duration_since(set_at));
        }
        if pauses.len() >= MAX_PAUSES {
            pauses.retain(|_, (_, until)| now < *until);
        }
        pauses.insert(limit.to_string(), (now, now + length));
        Ok(())
    }

    /// Forgets the pause of `limit` set at `set_at`, which did not happen
    /// after all (every bucket had room by the provider's count).
    fn unset(&self, limit: &str, set_at: Instant) {
        let mut pauses = self.lock();
        if pauses.get(limit).is_some_and(|&(at, _)| at == set_at) {
            pauses.remove(limit);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Instant)>> {
        // Entries are only inserted or removed whole.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Warned {
    /// True the first time `provider_limit` is seen for `limit`'s `dimension`.
    fn first(&self, limit: &str, dimension: Dimension, provider_limit: u64) -> bool {
        let mut warned = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if warned.len() >= MAX_WARNED {
            warned.clear();
        }
        warned.insert((limit.to_string(), dimension), provider_limit) != Some(provider_limit)
    }
}

impl Service {
    /// Applies `feedback`, placed by `lease` when the client named it and
    /// this sidecar still remembers it, else by its `since_grant_ms`.
    /// `caller` is named in the log of a pause.
    pub(super) async fn feedback(
        &self,
        feedback: Feedback,
        lease: Option<u64>,
        caller: &Caller,
    ) -> Result<Response, ServiceError> {
        check_headers(&feedback)?;
        let snapshot = self.snapshot();
        let limit = snapshot.planner.find_limit(&feedback.limit)?;
        let mut view = feedback::read(feedback.status, &feedback.headers, SystemTime::now());
        // No longer than the limit allows (a minute by default); 0: none.
        let longest = Duration::from_millis(limit.max_pause_ms);
        view.pause = view
            .pause
            .map(|pause| pause.min(longest))
            .filter(|pause| !pause.is_zero());
        // One pause of a limit at a time: a 429 while it is in force
        // neither extends nor stacks it.
        let pause_set_at = Instant::now();
        if let Some(pause) = view.pause
            && let Err(ago) = self.pauses.set(&limit.name, pause_set_at, pause)
        {
            tracing::debug!(
                limit = limit.name.as_str(),
                client = &*caller.name,
                uid = caller.uid,
                pause_ms = pause.as_millis() as u64,
                set_ms_ago = ago.as_millis() as u64,
                "a 429 while the limit's pause is in force: not paused again"
            );
            view.pause = None;
        }
        let recent = &snapshot.grants[&limit.name];
        let since_grant = Duration::from_millis(feedback.since_grant_ms);
        let placement = lease.and_then(|lease| recent.placement(lease));
        // What a refused call (a 429) keeps in the buckets: the client
        // settles it as rejected, keeping its request and input.
        let refused = placement
            .as_ref()
            .filter(|_| feedback.status == 429)
            .map_or(Granted::default(), |placement| placement.own);
        let (unseen, reserved_ms_ago, marks) = match placement {
            Some(placement) => (
                placement.unseen,
                Some(placement.reserved_ago.as_millis() as u64),
                placement.marks.map(|marks| (marks, placement.reordered)),
            ),
            None => (
                recent.since(since_grant),
                recent
                    .reserved_ago(since_grant)
                    .map(|ago| ago.as_millis() as u64),
                None,
            ),
        };
        let mut lowerings: Vec<Lowering> = Vec::new();
        let mut paused_any = false;
        for (role, spec) in snapshot.planner.buckets(limit) {
            let dimension = match role {
                BucketRole::Requests => Dimension::Requests,
                BucketRole::Tokens => Dimension::Tokens,
                BucketRole::InputTokens => Dimension::InputTokens,
                BucketRole::OutputTokens => Dimension::OutputTokens,
                // The group's and tenants' buckets are ratekeeper's own.
                _ => continue,
            };
            let provider_limit = view
                .limits
                .iter()
                .find(|(reported, _)| *reported == dimension);
            if let Some(&(_, provider_limit)) = provider_limit
                && provider_limit < spec.refill.per_minute_rounded()
                && self.warned.first(&limit.name, dimension, provider_limit)
            {
                tracing::warn!(
                    limit = limit.name.as_str(),
                    bucket = role.name(),
                    configured_per_minute = spec.refill.per_minute_rounded(),
                    provider_per_minute = provider_limit,
                    "the provider's limit is lower than the configured one: lower it in the config \
                     (provider feedback keeps the bucket down meanwhile)"
                );
            }
            // A count older than the memory of reservations cannot be
            // placed: too much has happened since.
            let reported = view
                .remaining
                .iter()
                .find(|(reported, _)| *reported == dimension)
                .map(|(_, remaining)| *remaining)
                .filter(|_| since_grant <= WINDOW);
            // The count was the provider's when the call arrived; it has
            // refilled since, at most at the configured rate.
            let now_remaining = reported.map(|count| {
                let refilled = spec.refilled_in(feedback.since_grant_ms);
                count.saturating_add(refilled).min(i64::MAX as u64) as i64
            });
            // A 429 pauses the buckets the provider did not say have room
            // left: they refill to empty only when the pause ends. One with
            // room (the 429 was for another dimension, or for a request
            // larger than the room) is placed by its count alone.
            let paused = view
                .pause
                .filter(|_| reported.is_none_or(|count| count == 0))
                .map(|pause| {
                    let refill = spec.refilled_in(pause.as_millis() as u64);
                    -(refill.min(i64::MAX as u64) as i64)
                });
            // A count of 0 (OpenAI floors it) says nothing of a bucket in
            // debt, which a request larger than the window leaves; its reset
            // says when it is full again. Taken as if counted now, which it
            // was at the latest, it never puts the bucket's refill ahead of
            // the provider's, however long the answer took.
            let from_reset = view
                .resets
                .iter()
                .find(|(reported, _)| *reported == dimension)
                .filter(|_| reported == Some(0))
                .map(|(_, reset)| {
                    let refill = spec.refilled_in(reset.as_millis() as u64);
                    (spec.capacity as i64).saturating_sub(refill.min(i64::MAX as u64) as i64)
                });
            let provider = now_remaining
                .map(|count| count.min(from_reset.unwrap_or(i64::MAX)))
                .map(|count| count.saturating_sub(unseen.of(dimension) as i64));
            if paused.is_some() {
                paused_any = true;
            }
            tracing::debug!(
                limit = limit.name.as_str(),
                bucket = role.name(),
                status = feedback.status,
                remaining = reported,
                unseen = unseen.of(dimension),
                since_grant_ms = feedback.since_grant_ms,
                paused = paused,
                "provider feedback"
            );
            if let Some(level) = paused.into_iter().chain(provider).min() {
                // A pause is this sidecar's to set; a count is checked
                // against the whole fleet's reservations where the store
                // keeps them.
                let fleet = now_remaining
                    .filter(|_| paused.is_none())
                    .map(|remaining| FleetView {
                        remaining,
                        reserved_ms_ago,
                        counted_ms_ago: feedback.since_grant_ms,
                        drawn: marks.as_ref().and_then(|(marks, reordered)| {
                            let mark = marks.of(&spec.key)?;
                            Some(mark.saturating_sub(spec.units(reordered.of(dimension))))
                        }),
                        refused: match dimension {
                            Dimension::Tokens | Dimension::InputTokens => refused.of(dimension),
                            Dimension::Requests | Dimension::OutputTokens => 0,
                        },
                    });
                lowerings.push(Lowering {
                    bucket: spec.clone(),
                    level,
                    fleet,
                });
            }
        }
        let lowered = match self.store.lower(&lowerings).await {
            Ok(()) => lowerings.len() as u32,
            Err(store_error) => {
                tracing::debug!(limit = limit.name.as_str(), %store_error, "provider feedback not applied");
                0
            }
        };
        if view.pause.is_some() && (!paused_any || lowered == 0) {
            self.pauses.unset(&limit.name, pause_set_at);
        }
        let pause = view.pause.filter(|_| paused_any);
        if let Some(pause) = pause {
            tracing::info!(
                limit = limit.name.as_str(),
                pause_ms = pause.as_millis() as u64,
                client = &*caller.name,
                uid = caller.uid,
                "the provider answered 429: the limit is paused for every worker"
            );
        }
        Ok(Response::Noted {
            paused_ms: pause.map_or(0, |pause| pause.as_millis() as u64),
            lowered,
        })
    }
}

fn check_headers(feedback: &Feedback) -> Result<(), ServiceError> {
    let too_long = feedback
        .headers
        .iter()
        .any(|header| header.name.len() > MAX_HEADER_LEN || header.value.len() > MAX_HEADER_LEN);
    if feedback.headers.len() > MAX_HEADERS || too_long {
        return Err(ServiceError::FeedbackTooLarge {
            headers: feedback.headers.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_has_one_pause_in_force_at_a_time() {
        let pauses = Pauses::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let two_s = Duration::from_secs(2);
        assert_eq!(pauses.set("gpt", at(0), two_s), Ok(()));
        // In force: neither extended nor stacked, whatever it asks.
        assert_eq!(
            pauses.set("gpt", at(500), Duration::from_secs(60)),
            Err(Duration::from_millis(500))
        );
        assert_eq!(
            pauses.set("gpt", at(1999), two_s),
            Err(Duration::from_millis(1999))
        );
        // Another limit has its own.
        assert_eq!(pauses.set("claude", at(500), two_s), Ok(()));
        // Ended: a new one may start.
        assert_eq!(pauses.set("gpt", at(2000), two_s), Ok(()));
        // A pause that did not happen is forgotten, but only that one.
        pauses.unset("gpt", at(0));
        assert!(pauses.set("gpt", at(2100), two_s).is_err());
        pauses.unset("gpt", at(2000));
        assert_eq!(pauses.set("gpt", at(2100), two_s), Ok(()));
    }

    #[test]
    fn recent_grants_sum_the_window_asked_for() {
        let recent = RecentGrants::new();
        let one = Granted {
            requests: 1,
            tokens: 10,
            input_tokens: 4,
            output_tokens: 6,
        };
        let now = Instant::now();
        recent.note(one, now, None);
        recent.note(one, now, None);
        // Still waiting: unseen by the provider whatever the window.
        recent.note(one, now + Duration::from_secs(2), None);
        recent.note(one, now + Duration::from_secs(3600), None);
        let seen = recent.since(Duration::from_millis(0));
        assert_eq!(seen.of(Dimension::Requests), 4);
        assert_eq!(seen.of(Dimension::Tokens), 40);
        assert_eq!(seen.of(Dimension::OutputTokens), 24);
        // Longer than the window: still only what was noted.
        assert_eq!(recent.since(Duration::from_secs(3600)), seen);
    }

    fn tokens(tokens: u64) -> Granted {
        Granted {
            requests: 1,
            tokens,
            input_tokens: 0,
            output_tokens: 0,
        }
    }

    #[test]
    fn a_named_lease_counts_exactly_what_came_after_it_and_what_may_overtake_it() {
        let recent = RecentGrants::new();
        let now = Instant::now();
        let early = recent.note(tokens(1), now, None);
        // Due 10 ms before the answered call: it may reach the provider after it.
        let close = recent.note(tokens(20), now + Duration::from_millis(90), None);
        let answered = recent.note(tokens(300), now + Duration::from_millis(100), None);
        let after = recent.note(tokens(4000), now + Duration::from_millis(100), None);
        recent.note(tokens(50_000), now + Duration::from_secs(5), None);
        for (noted, lease) in [(early, 7), (close, 8), (answered, 9), (after, 10)] {
            recent.name(noted, lease);
        }
        let placement = recent.placement(9).expect("remembered");
        assert_eq!(placement.unseen.of(Dimension::Tokens), 54_020);
        assert_eq!(placement.unseen.of(Dimension::Requests), 3);
        assert_eq!(placement.reordered.of(Dimension::Tokens), 20);
        assert_eq!(
            recent.placement(10).unwrap().unseen.tokens,
            50_000 + 300 + 20
        );
        assert_eq!(recent.placement(11), None, "never granted");
    }

    #[test]
    fn placements_are_bounded_and_forget_the_oldest_first() {
        let recent = RecentGrants::new();
        let now = Instant::now();
        for lease in 1..=(MAX_PLACED as u64 + 10) {
            let noted = recent.note(tokens(1), now, None);
            recent.name(noted, lease);
        }
        let slots = recent.lock();
        assert_eq!(slots.placed.log.len(), MAX_PLACED);
        assert!(slots.placed.by_lease.len() <= MAX_PLACED);
        drop(slots);
        assert_eq!(recent.placement(10), None, "the oldest went first");
        assert_eq!(
            recent.placement(11).unwrap().unseen.tokens,
            MAX_PLACED as u64 - 1
        );
    }

    #[test]
    fn running_totals_saturate_instead_of_overflowing() {
        let recent = RecentGrants::new();
        let now = Instant::now();
        let first = recent.note(tokens(u64::MAX), now, None);
        recent.name(first, 1);
        recent.note(tokens(u64::MAX), now, None);
        let placement = recent.placement(1).unwrap();
        assert_eq!(
            placement.unseen.tokens, 0,
            "nothing beyond the saturated total"
        );
    }

    /// Issue 27, item 9: two grants whose tokens add up past `u64::MAX`
    /// (costs are the client's) overflowed, a panic in a debug build.
    #[test]
    fn sums_of_grants_saturate_instead_of_overflowing() {
        let recent = RecentGrants::new();
        let huge = Granted {
            requests: 1,
            tokens: u64::MAX / 2 + 1,
            input_tokens: u64::MAX,
            output_tokens: 0,
        };
        let now = Instant::now();
        recent.note(huge, now, None);
        recent.note(huge, now, None);
        let seen = recent.since(Duration::ZERO);
        assert_eq!(
            (seen.tokens, seen.input_tokens, seen.requests),
            (u64::MAX, u64::MAX, 2)
        );
    }

    /// A flake of `a_correction_subtracts_what_every_sidecar_reserved_since`:
    /// a call noted at the end of a slot, asked about a millisecond later
    /// than it was noted, was not found, and the correction fell back to
    /// this sidecar's reservations alone.
    #[test]
    fn a_call_noted_just_before_a_slot_boundary_is_found() {
        let recent = RecentGrants::new();
        let start = recent.lock().start;
        let noted = start + SLOT - Duration::from_millis(1);
        recent.note(Granted::default(), noted, None);
        let since = Duration::from_millis(30);
        let now = noted + Duration::from_millis(2) + since;
        assert!(recent.reserved_ago_at(since, now).is_some());
        // Nothing was reserved two slots before.
        let long_after = noted + 3 * SLOT + since;
        assert_eq!(recent.reserved_ago_at(since, long_after), None);
    }
}
