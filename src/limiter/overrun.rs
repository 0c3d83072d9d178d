//! Overruns a bucket did not take: the floor on debt (issue 27).
//!
//! A report above its reservation is debited, but a bucket's overrun debt —
//! what overruns took that refill has not yet paid back — stays within one
//! capacity ([`super::bucket::BucketState::overrun`], `take_overrun` in
//! `lua/batch.lua`). What a store leaves untaken is counted here, process
//! wide like the log's write errors (every store, embedded or Redis, meets
//! it), and warned about at most once per [`WARN_EVERY`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::bucket::BucketSpec;

/// At most one warning this often, however many reports are clipped.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Tokens of overruns left untaken since start.
static CLIPPED_TOKENS: AtomicU64 = AtomicU64::new(0);
/// Milliseconds after [`start`] of the last warning, plus one (0: none yet).
static WARNED_AT: AtomicU64 = AtomicU64::new(0);

/// The process's reference instant for [`WARNED_AT`].
fn start() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Notes that `units` of an overrun of `bucket` were left untaken: counts
/// them, and warns naming the bucket (its key holds the limit's name)
/// unless a warning went out within [`WARN_EVERY`].
pub fn clipped(bucket: &BucketSpec, units: i64) {
    let tokens = (units.max(0) as u64).div_ceil(bucket.refill.units_per_token() as u64);
    CLIPPED_TOKENS.fetch_add(tokens, Ordering::Relaxed);
    let now = start().elapsed().as_millis() as u64 + 1;
    let last = WARNED_AT.load(Ordering::Relaxed);
    let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
    if due
        && WARNED_AT
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            bucket = %bucket.key,
            clipped_tokens = tokens,
            capacity = bucket.capacity,
            "a report's overrun was not wholly taken: overruns may hold a bucket at most one \
             capacity below where its reservations put it (a client reports usage far above \
             what it reserved; further such warnings within 10 s are only counted in \
             ratekeeper_overrun_clipped_tokens_total)"
        );
    }
}

/// Tokens of overruns left untaken since start
/// (`ratekeeper_overrun_clipped_tokens_total`).
pub fn clipped_tokens() -> u64 {
    CLIPPED_TOKENS.load(Ordering::Relaxed)
}
