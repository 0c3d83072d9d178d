//! Concurrency slots: at most `max` of a limit's requests in flight at once.
//!
//! A slot is taken by a holder (a lease, named uniquely across the fleet)
//! and given back when the lease ends. A holder that never gives its slot
//! back (its sidecar crashed) is presumed lost `timeout_ms` after it took
//! it, so a crash costs the fleet a slot for at most that long.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Origin, Store, StoreOps};

/// Pauses between attempts to give a slot back while the store fails.
const GIVE_RETRY: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));

/// A limit's slots: where they are kept and how many there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSpec {
    /// The store key (in Redis, a sorted set of holders by expiry).
    pub key: Arc<str>,
    /// Slots in all.
    pub max: u64,
    /// How long a holder keeps its slot at most.
    pub timeout_ms: u64,
}

/// The holders of one limit's slots and when each is presumed lost: the
/// in-memory form of `lua/slots.lua`'s sorted set.
#[derive(Debug, Default)]
pub(crate) struct Holders {
    expiries: HashMap<Box<str>, i64>,
}

impl Holders {
    /// Takes a slot for `holder` at `now_ms` unless every slot is held; a
    /// holder that has one already keeps it (a retried take).
    pub fn take(&mut self, spec: &SlotSpec, holder: &str, now_ms: i64) -> bool {
        self.forget_lost(now_ms);
        if self.expiries.contains_key(holder) {
            return true;
        }
        if self.expiries.len() as u64 >= spec.max {
            return false;
        }
        let expires = now_ms.saturating_add(spec.timeout_ms as i64);
        self.expiries.insert(holder.into(), expires);
        true
    }

    /// Gives `holder`'s slot back; a holder without one changes nothing.
    pub fn give(&mut self, holder: &str) {
        self.expiries.remove(holder);
    }

    /// Slots held at `now_ms`.
    pub fn held(&mut self, now_ms: i64) -> u64 {
        self.forget_lost(now_ms);
        self.expiries.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.expiries.is_empty()
    }

    fn forget_lost(&mut self, now_ms: i64) {
        self.expiries.retain(|_, expires| *expires > now_ms);
    }
}

/// Takes slots under fleet-unique holder names and gives them back when
/// their guards drop, telling this sidecar's waiters.
pub struct SlotKeeper {
    store: Arc<dyn Store>,
    /// Random per process: holders of two sidecars never share a name.
    instance: u64,
    next: AtomicU64,
    /// Woken after a slot was given back through this sidecar.
    given_back: Notify,
}

impl SlotKeeper {
    pub fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(SlotKeeper {
            store,
            instance: rand::random(),
            next: AtomicU64::new(0),
            given_back: Notify::new(),
        })
    }

    /// A holder name no other take in the fleet uses.
    pub fn new_holder(&self) -> Box<str> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}:{n:x}", self.instance).into_boxed_str()
    }

    /// Notified after a slot was given back through this sidecar.
    pub fn given_back(&self) -> &Notify {
        &self.given_back
    }

    /// Takes a slot for `holder`; `None` while every one is held.
    pub async fn take(
        self: &Arc<Self>,
        spec: &SlotSpec,
        holder: &str,
    ) -> Result<Option<SlotGuard>, super::StoreError> {
        let taken = self.store.take_slot(spec, holder).await?;
        Ok(taken.map(|origin| SlotGuard {
            keeper: self.clone(),
            spec: spec.clone(),
            holder: holder.into(),
            origin,
            taken_at: Instant::now(),
        }))
    }

    /// Gives a slot back in the background, trying again while the store
    /// fails until the slot would have timed out anyway.
    fn give_back(self: Arc<Self>, guard: &SlotGuard) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // shutting down: the slot times out
        };
        let (spec, holder, origin) = (guard.spec.clone(), guard.holder.clone(), guard.origin);
        let expires = guard.taken_at + Duration::from_millis(spec.timeout_ms);
        runtime.spawn(async move {
            let (mut pause, longest) = GIVE_RETRY;
            loop {
                match self.store.give_slot(&spec, &holder, origin).await {
                    Ok(()) => {
                        self.given_back.notify_waiters();
                        return;
                    }
                    Err(error) if Instant::now() + pause >= expires => {
                        tracing::warn!(key = %spec.key, %error, "a slot could not be given back; it times out");
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(key = %spec.key, %error, "a slot waits to be given back");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(longest);
                    }
                }
            }
        });
    }
}

/// A slot held: given back when dropped (the lease settled, expired or
/// was given up, or the acquire that took it failed).
pub struct SlotGuard {
    keeper: Arc<SlotKeeper>,
    spec: SlotSpec,
    holder: Box<str>,
    origin: Origin,
    taken_at: Instant,
}

impl SlotGuard {
    /// Where the slot was taken (the shared store, or a failure policy).
    pub fn origin(&self) -> Origin {
        self.origin
    }
}

impl std::fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotGuard")
            .field("key", &self.spec.key)
            .field("holder", &self.holder)
            .field("origin", &self.origin)
            .finish()
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.keeper.clone().give_back(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max: u64) -> SlotSpec {
        SlotSpec {
            key: Arc::from("slots"),
            max,
            timeout_ms: 1000,
        }
    }

    #[test]
    fn at_most_max_holders_and_a_retried_take_keeps_its_slot() {
        let spec = spec(2);
        let mut holders = Holders::default();
        assert!(holders.take(&spec, "a", 0));
        assert!(holders.take(&spec, "b", 0));
        assert!(!holders.take(&spec, "c", 0));
        assert!(holders.take(&spec, "a", 10), "a retry of a's take");
        holders.give("a");
        holders.give("a");
        assert_eq!(holders.held(10), 1);
        assert!(holders.take(&spec, "c", 10));
        assert!(!holders.take(&spec, "d", 10));
    }

    #[test]
    fn a_holder_is_presumed_lost_after_the_timeout() {
        let spec = spec(1);
        let mut holders = Holders::default();
        assert!(holders.take(&spec, "crashed", 0));
        assert!(!holders.take(&spec, "next", 999));
        assert!(holders.take(&spec, "next", 1000));
        assert_eq!(holders.held(1000), 1);
    }
}
