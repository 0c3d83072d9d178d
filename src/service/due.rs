//! Holding an acquire back until its reservation is due, to the
//! microsecond rather than the millisecond.
//!
//! tokio's timer counts whole milliseconds: it rounds a deadline up to the
//! next tick and parks in whole milliseconds, so a sleep ends 0–2 ms late,
//! about 1 ms on average, and at saturation every granted acquire waits.
//! [`DueTimer`] wakes them from one `timerfd` (nanosecond resolution)
//! registered with the runtime: one queue of deadlines, the fd armed for
//! the earliest, one task that wakes whoever is due when it fires. Every
//! wait also keeps a tokio sleep to the same deadline, so that a timer
//! that stopped firing (its runtime gone, say) can only make a wait as
//! late as before, never endless; and no wait ever ends before its
//! deadline, whichever of the two ends it.

use std::future::Future;

/// Sleeps until `due`: woken by `timer` when there is one, else by
/// tokio's own timer. (`due` is tokio's instant, so that a paused clock in
/// tests holds it back as it holds back everything else.)
pub(super) async fn sleep_until(timer: Option<&DueTimer>, due: tokio::time::Instant) {
    let coarse = tokio::time::sleep_until(due);
    match timer {
        Some(timer) => {
            tokio::select! {
                biased;
                () = timer.sleep_until(due.into_std()) => {}
                () = coarse => {}
            }
        }
        None => coarse.await,
    }
}

#[cfg(target_os = "linux")]
pub(super) use linux::DueTimer;

/// Where there is no `timerfd`, tokio's timer alone holds acquires back.
#[cfg(not(target_os = "linux"))]
pub(super) struct DueTimer(std::convert::Infallible);

#[cfg(not(target_os = "linux"))]
impl DueTimer {
    pub(super) fn new() -> std::io::Result<Self> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    fn sleep_until(&self, _due: Instant) -> impl Future<Output = ()> + '_ {
        std::future::pending()
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::BTreeMap;
    use std::io;
    use std::os::fd::OwnedFd;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use rustix::time::{
        Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
        timerfd_settime,
    };
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    use tokio_util::sync::CancellationToken;

    use super::Future;

    /// Wakes tasks at their deadlines from one `timerfd`. Made inside a
    /// tokio runtime, whose reactor the fd is registered with and on which
    /// the firing task runs until the timer is dropped.
    pub(in crate::service) struct DueTimer {
        shared: Arc<Shared>,
        stop: CancellationToken,
    }

    struct Shared {
        fd: AsyncFd<OwnedFd>,
        queue: Mutex<Queue>,
    }

    #[derive(Default)]
    struct Queue {
        /// Who waits, by deadline; the number tells apart equal deadlines.
        sleepers: BTreeMap<(Instant, u64), Waker>,
        next_id: u64,
        /// The deadline the fd is armed for, until it fires.
        armed: Option<Instant>,
    }

    impl DueTimer {
        /// A timer on the current runtime; fails outside one, or when no
        /// `timerfd` can be made (the fd limit reached, say).
        pub(in crate::service) fn new() -> io::Result<Self> {
            tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
            let fd = timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
            )?;
            // SAFETY: the OwnedFd is open, owned by the AsyncFd for its whole
            // life and never swapped for another.
            let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
            let shared = Arc::new(Shared {
                fd,
                queue: Mutex::default(),
            });
            let stop = CancellationToken::new();
            tokio::spawn(fire(shared.clone(), stop.clone()));
            Ok(DueTimer { shared, stop })
        }

        /// Completes at `due` or a few µs after it, never before.
        pub(in crate::service) fn sleep_until(
            &self,
            due: Instant,
        ) -> impl Future<Output = ()> + '_ {
            Sleep {
                shared: &self.shared,
                due,
                id: None,
            }
        }
    }

    #[cfg(test)]
    impl DueTimer {
        /// How many waits are queued.
        pub(in crate::service) fn waiting(&self) -> usize {
            self.shared.lock().sleepers.len()
        }
    }

    impl Drop for DueTimer {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    /// Wakes the due sleepers each time the fd fires, and arms it for the
    /// next deadline.
    async fn fire(shared: Arc<Shared>, stop: CancellationToken) {
        loop {
            let mut ready = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ready = shared.fd.readable() => match ready {
                    Ok(ready) => ready,
                    Err(error) => {
                        // The waits' tokio sleeps take over.
                        tracing::warn!(%error, "the wait timer stopped");
                        return;
                    }
                },
            };
            // Reading the expiry count takes the fd's readiness; once it is
            // read, the next expiry is a new edge.
            let mut count = [0u8; 8];
            if ready
                .try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut count)?))
                .is_ok()
            {
                ready.clear_ready();
            }
            let due: Vec<Waker> = {
                let mut queue = shared.lock();
                queue.armed = None;
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some(entry) = queue.sleepers.first_entry() {
                    if entry.key().0 > now {
                        let next = entry.key().0;
                        shared.arm(&mut queue, next, now);
                        break;
                    }
                    due.push(entry.remove());
                }
                due
            };
            due.into_iter().for_each(Waker::wake);
        }
    }

    impl Shared {
        fn lock(&self) -> MutexGuard<'_, Queue> {
            // Every change is a few field writes with no panic point between.
            self.queue
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// Arms the fd to fire at `due` (relative to `now`, so never before
        /// it), unless it is armed for an earlier time already.
        fn arm(&self, queue: &mut Queue, due: Instant, now: Instant) {
            if queue.armed.is_some_and(|armed| armed <= due) {
                return;
            }
            // A zero time would disarm the fd.
            let after = due
                .saturating_duration_since(now)
                .max(Duration::from_nanos(1));
            let Ok(it_value) = Timespec::try_from(after) else {
                return;
            };
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let time = Itimerspec {
                it_interval: zero,
                it_value,
            };
            // On failure the waits' tokio sleeps end them.
            if timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &time).is_ok() {
                queue.armed = Some(due);
            }
        }
    }

    /// One wait in the queue (once polled) until it is due or dropped.
    struct Sleep<'a> {
        shared: &'a Shared,
        due: Instant,
        id: Option<u64>,
    }

    impl Future for Sleep<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
            let this = self.get_mut();
            let (shared, due) = (this.shared, this.due);
            let now = Instant::now();
            let mut queue = shared.lock();
            if now >= due {
                if let Some(id) = this.id.take() {
                    queue.sleepers.remove(&(due, id));
                }
                return Poll::Ready(());
            }
            let id = *this.id.get_or_insert_with(|| {
                queue.next_id += 1;
                queue.next_id
            });
            match queue.sleepers.get_mut(&(due, id)) {
                // Polled again before it is due (its tokio sleep's wake).
                Some(waker) => waker.clone_from(context.waker()),
                None => {
                    queue.sleepers.insert((due, id), context.waker().clone());
                    shared.arm(&mut queue, due, now);
                }
            }
            Poll::Pending
        }
    }

    impl Drop for Sleep<'_> {
        fn drop(&mut self) {
            if let Some(id) = self.id {
                self.shared.lock().sleepers.remove(&(self.due, id));
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::{Duration, Instant};

    use super::{DueTimer, sleep_until};

    #[tokio::test]
    async fn the_timer_alone_ends_a_wait_and_never_before_its_deadline() {
        let timer = DueTimer::new().expect("a timerfd");
        // Deadlines out of order and some equal, so the queue rearms for
        // earlier ones and wakes several at one firing.
        let start = Instant::now();
        let dues: Vec<Instant> = (0..64u64)
            .map(|i| start + Duration::from_micros((i * 7_919) % 20_000))
            .collect();
        let timer = &timer;
        let waits = dues.iter().map(|&due| async move {
            // Without tokio's sleep beside it: only the timerfd can end it.
            tokio::time::timeout(Duration::from_secs(10), timer.sleep_until(due))
                .await
                .expect("the timer woke the wait");
            Instant::now()
        });
        let ended = futures_util::future::join_all(waits).await;
        for (due, ended) in dues.iter().zip(ended) {
            assert!(ended >= *due, "a wait ended {:?} early", *due - ended);
        }
        assert!(timer.waiting() == 0);
    }

    #[tokio::test]
    async fn a_wait_given_up_leaves_the_queue() {
        let timer = DueTimer::new().expect("a timerfd");
        let far = Instant::now() + Duration::from_secs(3600);
        let given_up = tokio::time::timeout(Duration::from_millis(5), timer.sleep_until(far)).await;
        assert!(given_up.is_err());
        assert!(timer.waiting() == 0);
        // The fd is still armed for the hour; a nearer wait rearms it.
        let near = Instant::now() + Duration::from_millis(2);
        tokio::time::timeout(Duration::from_secs(10), timer.sleep_until(near))
            .await
            .expect("the timer rearmed for the nearer wait");
    }

    #[tokio::test]
    async fn without_a_timer_tokio_ends_the_wait() {
        let due = tokio::time::Instant::now() + Duration::from_millis(3);
        sleep_until(None, due).await;
        assert!(tokio::time::Instant::now() >= due);
    }
}
