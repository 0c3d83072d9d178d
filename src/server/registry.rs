//! The open connections and how long each has been idle, so that the cap on
//! connections is a bound on memory and never a lock-out: at the cap, the
//! connection that has had no request in flight for the longest is closed
//! to admit the new one (issue 27: 6,000 idle connections, the kind a worker
//! that opens a client per task and never closes it leaves behind, filled
//! the cap and cost well-behaved workers `Overloaded`). A connection is idle
//! from the last frame it sent or the last answer it was given, whichever is
//! later, while it has no request in flight. A new connection is refused
//! only when every open one has a request in flight.
//!
//! An evicted client loses nothing it is owed: it had no request in flight,
//! its leases outlive the connection by the `[leases]` rules, and the
//! clients reconnect on their next call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::service::ConnectionId;

/// `Activity::idle_since_us` of a connection with requests in flight.
/// Microseconds, not milliseconds: connections that act within the same
/// millisecond must still be told apart, or the least idle could go first.
const BUSY: u64 = u64::MAX;

/// What the server knows of one open connection.
#[derive(Debug)]
pub(crate) struct Activity {
    /// The peer's uid, for `server.max_connections_per_uid`.
    uid: u32,
    /// Microseconds from the registry's epoch since which the connection
    /// has had no request in flight, or `BUSY`.
    idle_since_us: AtomicU64,
    /// Fires when the server closes the connection to make room.
    evict: CancellationToken,
    epoch: Instant,
}

impl Activity {
    /// Notes how many requests the connection has in flight now (called on
    /// every event of the connection: reads the clock only when it turns idle).
    pub(crate) fn in_flight(&self, requests: usize) {
        self.in_flight_with(requests, || micros_since(self.epoch));
    }

    fn in_flight_with(&self, requests: usize, now_us: impl FnOnce() -> u64) {
        let was = self.idle_since_us.load(Ordering::Relaxed);
        if requests > 0 {
            if was != BUSY {
                self.idle_since_us.store(BUSY, Ordering::Relaxed);
            }
        } else if was == BUSY {
            self.idle_since_us.store(now_us(), Ordering::Relaxed);
        }
    }

    /// Notes that the client sent a frame: an idle connection is idle from now.
    pub(crate) fn frames_read(&self) {
        self.frames_read_at(micros_since(self.epoch));
    }

    fn frames_read_at(&self, now_us: u64) {
        if self.idle_since_us.load(Ordering::Relaxed) != BUSY {
            self.idle_since_us.store(now_us, Ordering::Relaxed);
        }
    }

    /// Completes when the server evicts the connection.
    pub(crate) async fn evicted(&self) {
        self.evict.cancelled().await;
    }
}

/// The connections the server holds open, by id.
#[derive(Debug)]
pub(crate) struct Registry {
    open: Mutex<HashMap<ConnectionId, Arc<Activity>>>,
    epoch: Instant,
}

/// The connection closed to make room, and how long it had been idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Evicted {
    pub connection: ConnectionId,
    pub idle: Duration,
}

impl Registry {
    pub(crate) fn new() -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }

    /// Connections open and not evicted.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Connections of peers of `uid` open and not evicted.
    pub(crate) fn len_of(&self, uid: u32) -> usize {
        self.lock().values().filter(|a| a.uid == uid).count()
    }

    /// Registers a new connection of a peer of `uid`, idle from now.
    pub(crate) fn register(&self, connection: ConnectionId, uid: u32) -> Arc<Activity> {
        self.register_at(connection, uid, micros_since(self.epoch))
    }

    fn register_at(&self, connection: ConnectionId, uid: u32, now_us: u64) -> Arc<Activity> {
        let activity = Arc::new(Activity {
            uid,
            idle_since_us: AtomicU64::new(now_us),
            evict: CancellationToken::new(),
            epoch: self.epoch,
        });
        self.lock().insert(connection, activity.clone());
        activity
    }

    /// Forgets a connection that has closed.
    pub(crate) fn unregister(&self, connection: ConnectionId) {
        self.lock().remove(&connection);
    }

    /// Closes the connection idle the longest, if any is idle: it no longer
    /// counts as open once this returns.
    pub(crate) fn evict_idlest(&self) -> Option<Evicted> {
        self.evict_idlest_at(None, micros_since(self.epoch))
    }

    /// As [`evict_idlest`](Self::evict_idlest), among the connections of
    /// peers of `uid` only: what `server.max_connections_per_uid` closes.
    pub(crate) fn evict_idlest_of(&self, uid: u32) -> Option<Evicted> {
        self.evict_idlest_at(Some(uid), micros_since(self.epoch))
    }

    fn evict_idlest_at(&self, uid: Option<u32>, now_us: u64) -> Option<Evicted> {
        let mut open = self.lock();
        let (&connection, activity) = open
            .iter()
            .filter(|(_, activity)| uid.is_none_or(|uid| activity.uid == uid))
            .filter(|(_, activity)| activity.idle_since_us.load(Ordering::Relaxed) != BUSY)
            .min_by_key(|(id, activity)| (activity.idle_since_us.load(Ordering::Relaxed), **id))?;
        let idle_since = activity.idle_since_us.load(Ordering::Relaxed);
        activity.evict.cancel();
        open.remove(&connection);
        let idle = now_us.saturating_sub(idle_since);
        Some(Evicted {
            connection,
            idle: Duration::from_micros(idle),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ConnectionId, Arc<Activity>>> {
        // The map is left consistent by every holder: a panic elsewhere
        // must not take the accept loop down with it.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn micros_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_micros()).unwrap_or(BUSY - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_idle_longest_is_evicted_and_a_busy_one_never() {
        let registry = Registry::new();
        let busy = registry.register_at(1, 1000, 0);
        let older = registry.register_at(2, 1000, 10);
        let newer = registry.register_at(3, 1000, 20);
        busy.in_flight_with(1, || 20);

        let evicted = registry
            .evict_idlest_at(None, 25)
            .expect("an idle connection");
        assert_eq!(
            evicted,
            Evicted {
                connection: 2,
                idle: Duration::from_micros(15)
            }
        );
        assert!(older.evict.is_cancelled());
        assert!(!newer.evict.is_cancelled() && !busy.evict.is_cancelled());
        assert_eq!(registry.len(), 2);

        assert_eq!(
            registry.evict_idlest_at(None, 25).map(|e| e.connection),
            Some(3)
        );
        assert_eq!(
            registry.evict_idlest_at(None, 25),
            None,
            "only a busy one is left"
        );
    }

    #[test]
    fn a_connection_is_idle_from_its_last_answer_not_its_first() {
        let registry = Registry::new();
        let worker = registry.register_at(1, 1000, 0);
        let _leaked = registry.register_at(2, 1000, 10);
        worker.in_flight_with(1, || 20);
        worker.in_flight_with(0, || 30);
        // Still idle: the moment it became idle does not move.
        worker.in_flight_with(0, || 40);
        assert_eq!(
            registry.evict_idlest_at(None, 40).map(|e| e.connection),
            Some(2)
        );
        assert_eq!(
            registry.evict_idlest_at(None, 40),
            Some(Evicted {
                connection: 1,
                idle: Duration::from_micros(10)
            })
        );
    }

    #[test]
    fn a_frame_from_an_idle_client_makes_it_the_least_idle() {
        let registry = Registry::new();
        let pinging = registry.register_at(1, 1000, 0);
        let _leaked = registry.register_at(2, 1000, 10);
        pinging.frames_read_at(20);
        assert_eq!(
            registry.evict_idlest_at(None, 30).map(|e| e.connection),
            Some(2)
        );
        let busy = registry.register_at(3, 1000, 30);
        busy.in_flight_with(1, || 30);
        busy.frames_read_at(40);
        assert_eq!(
            registry.evict_idlest_at(None, 50).map(|e| e.connection),
            Some(1)
        );
        assert_eq!(
            registry.evict_idlest_at(None, 50),
            None,
            "a frame does not end a wait"
        );
    }

    #[test]
    fn an_unregistered_connection_is_not_evicted() {
        let registry = Registry::new();
        registry.register_at(1, 1000, 0);
        registry.unregister(1);
        assert_eq!(registry.len(), 0);
        assert_eq!(registry.evict_idlest_at(None, 10), None);
    }

    #[test]
    fn a_uid_at_its_cap_loses_its_own_idlest_connection_not_another_uids() {
        let registry = Registry::new();
        let _other = registry.register_at(1, 2000, 0);
        let own_busy = registry.register_at(2, 1000, 5);
        let _own_idle = registry.register_at(3, 1000, 10);
        own_busy.in_flight_with(1, || 10);
        assert_eq!(registry.len_of(1000), 2);
        assert_eq!(
            registry.evict_idlest_at(Some(1000), 20),
            Some(Evicted {
                connection: 3,
                idle: Duration::from_micros(10)
            }),
            "the uid's own idle connection goes, though another uid's was idle longer"
        );
        assert_eq!(registry.len_of(1000), 1);
        assert_eq!(
            registry.evict_idlest_at(Some(1000), 20),
            None,
            "the uid's last connection is busy"
        );
        assert_eq!(registry.len(), 2);
    }
}
