//! A bounded queue of work that waits for the shared store, drained by one
//! task at a time: the cancels of calls whose answer was lost, and the
//! settlements made during an outage. Past its bound the oldest entry goes,
//! and is counted.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries waiting, and whether a task is draining them.
pub struct Backlog<T> {
    state: Mutex<State<T>>,
    max: usize,
    /// Entries dropped for room.
    pub evicted: AtomicU64,
}

struct State<T> {
    entries: VecDeque<T>,
    draining: bool,
}

impl<T> Backlog<T> {
    pub fn new(max: usize) -> Self {
        Backlog {
            state: Mutex::new(State {
                entries: VecDeque::new(),
                draining: false,
            }),
            max,
            evicted: AtomicU64::new(0),
        }
    }

    /// Queues `entry`; true when the caller must start the draining task.
    pub fn push(&self, entry: T) -> bool {
        let mut state = self.lock();
        if state.entries.len() >= self.max {
            state.entries.pop_front();
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        state.entries.push_back(entry);
        // Under the lock, so that a task finding the queue empty and a push
        // never miss each other.
        !std::mem::replace(&mut state.draining, true)
    }

    /// The oldest entry; `None` when there is none, and then the draining
    /// task must stop.
    pub fn pop(&self) -> Option<T> {
        let mut state = self.lock();
        let entry = state.entries.pop_front();
        state.draining = entry.is_some();
        entry
    }

    /// Puts back an entry the store did not take, to go first next time.
    pub fn retry_later(&self, entry: T) {
        self.lock().entries.push_front(entry);
    }

    /// Entries waiting now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether nothing waits and no task is draining.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.entries.is_empty() && !state.draining
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        // Only whole pushes and pops happen under the lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_drainer_at_a_time_and_the_oldest_go_first() {
        let backlog = Backlog::new(2);
        assert!(backlog.push(1), "the first push starts a drainer");
        assert!(!backlog.push(2));
        assert!(!backlog.push(3));
        assert_eq!(backlog.evicted.load(Ordering::Relaxed), 1);
        assert_eq!(backlog.pop(), Some(2));
        backlog.retry_later(2);
        assert_eq!(backlog.pop(), Some(2));
        assert_eq!(backlog.pop(), Some(3));
        assert!(!backlog.is_idle(), "the drainer still runs");
        assert_eq!(backlog.pop(), None);
        assert!(backlog.is_idle());
        assert!(
            backlog.push(4),
            "a push after the drainer stopped starts one"
        );
    }
}
