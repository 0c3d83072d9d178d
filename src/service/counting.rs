//! Counting prompts off the socket loop, fairly and boundedly: counts run on
//! tokio's blocking pool below the loop's CPU priority ([`off_loop`], which
//! the server's large decodes use too), in two lanes — small prompts, one
//! slot per CPU, and large ones, one slot — so a client's huge prompts
//! never hold up another client's small one; each lane's queue is bounded,
//! with its own error when full; what the waiting prompts hold in memory is
//! bounded too, all lanes together (issue 27: 16,384 empty messages make a
//! small frame but a 2-3 MiB prompt once decoded, so a bound by count alone
//! let 260 of them hold 0.8 GB); and a count is abandoned, segment by
//! segment, as soon as its request is cancelled or its client leaves.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::ServiceError;
use crate::proto::{ChatMessage, ChatRequest};
use crate::tokens::{self, Bounds, Counter, PromptCount, TokenError};

/// Prompts with more text than this count in the large lane.
pub(super) const LARGE_PROMPT_BYTES: usize = 64 * 1024;

/// Counts that may wait for a small slot; beyond, `Overloaded`.
const MAX_WAITING_SMALL: usize = 256;

/// Counts that may wait for the large slot; beyond, `Overloaded`.
const MAX_WAITING_LARGE: usize = 4;

/// Memory the prompts waiting for a slot may hold, all lanes together, as
/// `held_bytes` measures it; beyond, `Overloaded`. Two of the largest
/// prompts a frame can decode to (32 MiB, `src/proto/frame.rs`) fit.
pub(super) const MAX_WAITING_BYTES: usize = 64 * 1024 * 1024;

/// The two lanes and what their queues hold.
pub(super) struct Counting {
    small: Lane,
    large: Lane,
    waiting_bytes: AtomicUsize,
    max_waiting_bytes: usize,
}

struct Lane {
    name: &'static str,
    slots: Semaphore,
    waiting: AtomicUsize,
    max_waiting: usize,
}

impl Counting {
    pub(super) fn new() -> Self {
        Self::with_budget(MAX_WAITING_BYTES)
    }

    fn with_budget(max_waiting_bytes: usize) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Counting {
            small: Lane::new("small", cpus, MAX_WAITING_SMALL),
            large: Lane::new("large", 1, MAX_WAITING_LARGE),
            waiting_bytes: AtomicUsize::new(0),
            max_waiting_bytes,
        }
    }

    /// Counts `request` with `counter`, or gives up when `cancel` fires.
    pub(super) async fn count(
        &self,
        counter: Counter,
        request: ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<PromptCount, ServiceError> {
        Bounds::DEFAULT.check(&request)?;
        let large = text_bytes(&request) > LARGE_PROMPT_BYTES;
        let inline = match counter {
            // Adds up string lengths: a few µs within the bounds, less
            // than the hop to a blocking thread.
            Counter::Chars(_) => true,
            // Counts characters: as cheap up to a large prompt's size.
            Counter::OpenaiChars(_) => !large,
            Counter::Tiktoken(_) => false,
        };
        if inline {
            return Ok(tokens::count_messages(counter, &request)?);
        }
        let lane = if large { &self.large } else { &self.small };
        let held = held_bytes(&request);
        // A prompt refused or abandoned before its count is freed off the
        // loop too, when freeing it takes long (many allocations).
        let mut request = DropOffLoop::new(request, held);
        let _slot = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(TokenError::Cancelled.into()),
            slot = self.enter(lane, held) => slot?,
        };
        let request = request.take();
        let cancel = cancel.clone();
        let counted = off_loop(move || {
            let cancelled = || cancel.is_cancelled();
            tokens::count_messages_until(counter, &request, &Bounds::DEFAULT, &cancelled)
        })
        .await;
        match counted {
            Ok(Err(TokenError::Cancelled)) => {
                tracing::debug!(
                    lane = lane.name,
                    "counting abandoned: its request was cancelled or its client left"
                );
                Err(TokenError::Cancelled.into())
            }
            Ok(count) => Ok(count?),
            Err(failed) => Err(ServiceError::Internal(format!(
                "counting the prompt failed: {failed}"
            ))),
        }
    }
}

/// Nice value of the threads that decode and count prompts: below the
/// socket loop's, so that when the cores are busy the scheduler runs the
/// loop (pings, small acquires, answers) first, and the counts take what is
/// left. Within the daemon's own cgroup it only orders the daemon's threads.
pub(crate) const OFF_LOOP_NICE: i32 = 10;

/// Runs CPU-heavy work on a prompt — decoding a large frame, counting —
/// on tokio's blocking pool at [`OFF_LOOP_NICE`], never on the socket loop
/// (issue 27: decoding 4 MiB prompts on the loop delayed every other
/// connection's pings, to a p99 of 23 ms in the issue). The blocking pool
/// runs nothing else but the tokenizer preload and the Redis client's host
/// name lookups, which wait more than they compute, so lowering a blocking
/// thread's priority for good (an unprivileged thread cannot raise it back)
/// slows nothing that matters.
pub(crate) async fn off_loop<T, W>(work: W) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    W: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        lower_thread_priority();
        work()
    })
    .await
}

/// Lowers the calling thread's CPU priority to [`OFF_LOOP_NICE`], once per
/// thread. Linux only: there `setpriority(PRIO_PROCESS, 0)` names the
/// calling thread, elsewhere the whole process.
fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        use std::cell::Cell;
        thread_local! {
            static LOWERED: Cell<bool> = const { Cell::new(false) };
        }
        if !LOWERED.replace(true) {
            if let Err(errno) = rustix::process::setpriority_process(None, OFF_LOOP_NICE) {
                tracing::debug!(%errno, "could not lower a counting thread's priority");
            }
        }
    }
}

/// Prompts that take at least this much memory are freed on the blocking
/// pool when they are dropped unanswered: 65,536 parts take milliseconds to
/// free.
const FREE_OFF_LOOP_BYTES: usize = 1024 * 1024;

/// A prompt waiting for its count; if it is dropped instead (refused,
/// cancelled) and holds [`FREE_OFF_LOOP_BYTES`] or more, it is freed off
/// the loop.
struct DropOffLoop(Option<ChatRequest>, usize);

impl DropOffLoop {
    fn new(request: ChatRequest, held: usize) -> Self {
        DropOffLoop(Some(request), held)
    }

    fn take(&mut self) -> ChatRequest {
        self.0.take().expect("a prompt is taken once")
    }
}

impl Drop for DropOffLoop {
    fn drop(&mut self) {
        if let Some(request) = self.0.take() {
            if self.1 >= FREE_OFF_LOOP_BYTES && tokio::runtime::Handle::try_current().is_ok() {
                tokio::task::spawn_blocking(move || {
                    lower_thread_priority();
                    drop(request)
                });
            }
        }
    }
}

impl Counting {
    /// A slot of `lane` for a prompt holding `bytes`, once one is free;
    /// refused at once when the lane's queue, or the memory all queues
    /// hold, is full. The bytes count only while the prompt waits: counts
    /// in progress are bounded by the slots.
    async fn enter<'a>(
        &self,
        lane: &'a Lane,
        bytes: usize,
    ) -> Result<tokio::sync::SemaphorePermit<'a>, ServiceError> {
        if let Ok(slot) = lane.slots.try_acquire() {
            return Ok(slot);
        }
        let held = self.waiting_bytes.fetch_add(bytes, Ordering::AcqRel);
        let _release = Release(&self.waiting_bytes, bytes);
        if held.saturating_add(bytes) > self.max_waiting_bytes {
            return Err(ServiceError::CountingMemoryBusy {
                held_mib: held / (1024 * 1024),
                bytes,
                max_mib: self.max_waiting_bytes / (1024 * 1024),
            });
        }
        lane.enter().await
    }
}

/// Gives back what a waiting prompt held when dropped.
struct Release<'a>(&'a AtomicUsize, usize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

impl Lane {
    fn new(name: &'static str, slots: usize, max_waiting: usize) -> Self {
        Lane {
            name,
            slots: Semaphore::new(slots),
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// A slot, once one is free; refused at once when the queue is full.
    async fn enter(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ServiceError> {
        if let Ok(slot) = self.slots.try_acquire() {
            return Ok(slot);
        }
        let waiting = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _leave = Leave(&self.waiting);
        if waiting >= self.max_waiting {
            return Err(ServiceError::CountingBusy {
                size: self.name,
                waiting,
                max: self.max_waiting,
            });
        }
        self.slots
            .acquire()
            .await
            .map_err(|closed| ServiceError::Internal(closed.to_string()))
    }
}

/// Leaves a lane's queue when dropped.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a decoded prompt holds in memory: its text, and every string's and
/// message's own size, which for many empty messages is most of it.
fn held_bytes(request: &ChatRequest) -> usize {
    use std::mem::size_of;
    let strings = |count: usize| count * size_of::<String>();
    let messages: usize = request
        .messages
        .iter()
        .map(|message| {
            size_of::<ChatMessage>()
                + message.role.capacity()
                + message.name.as_ref().map_or(0, String::capacity)
                + strings(message.content.capacity())
                + message.content.iter().map(String::capacity).sum::<usize>()
                + message.tool_calls_json.as_ref().map_or(0, String::capacity)
        })
        .sum();
    size_of::<ChatRequest>()
        + request
            .messages
            .capacity()
            .saturating_sub(request.messages.len())
            * size_of::<ChatMessage>()
        + messages
        + request.tools_json.as_ref().map_or(0, String::capacity)
}

/// Bytes of text a prompt asks to count.
fn text_bytes(request: &ChatRequest) -> usize {
    let messages: usize = request
        .messages
        .iter()
        .map(|message| {
            message.role.len()
                + message.name.as_ref().map_or(0, String::len)
                + message.content.iter().map(String::len).sum::<usize>()
                + message.tool_calls_json.as_ref().map_or(0, String::len)
        })
        .sum();
    messages + request.tools_json.as_ref().map_or(0, String::len)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn empty_messages(count: usize) -> ChatRequest {
        ChatRequest {
            messages: (0..count)
                .map(|_| ChatMessage {
                    role: "user".into(),
                    name: None,
                    content: vec![String::new()],
                    tool_calls_json: None,
                })
                .collect(),
            tools_json: None,
            max_output_tokens: None,
        }
    }

    #[test]
    fn a_prompt_of_empty_messages_holds_what_its_messages_take() {
        let request = empty_messages(16_384);
        assert_eq!(text_bytes(&request), 16_384 * "user".len());
        let held = held_bytes(&request);
        let structs = 16_384 * (std::mem::size_of::<ChatMessage>() + std::mem::size_of::<String>());
        assert!(held >= structs, "{held} < {structs}");
        // 64 KiB of text, but near 2 MiB held: the bound must see the latter.
        assert!(held > 25 * text_bytes(&request), "{held}");
    }

    /// Issue 27: counts (and large decodes) run on another thread than the
    /// socket loop, at a lower priority, and the loop keeps its own.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn work_off_the_loop_runs_below_the_loop_s_priority() {
        use rustix::process::getpriority_process;
        let loop_nice = getpriority_process(None).unwrap();
        let (nice, thread) = off_loop(|| {
            (
                getpriority_process(None).unwrap(),
                std::thread::current().id(),
            )
        })
        .await
        .unwrap();
        assert_ne!(thread, std::thread::current().id());
        assert!(nice >= OFF_LOOP_NICE, "{nice}");
        assert_eq!(getpriority_process(None).unwrap(), loop_nice);
    }

    /// Issue 27, item 7: prompts waiting for a counting slot were bounded by
    /// count only. Now the memory they hold is bounded too: one more than
    /// the budget holds is refused at once, and what a prompt held is given
    /// back when it stops waiting.
    #[tokio::test]
    async fn the_waiting_prompts_hold_no_more_than_the_budget() {
        let counting = Arc::new(Counting::with_budget(1000));
        // Every small slot is taken: new prompts wait.
        let busy = counting
            .small
            .slots
            .acquire_many(counting.small.slots.available_permits() as u32)
            .await
            .unwrap();
        let waiter = {
            let counting = counting.clone();
            tokio::spawn(async move {
                let lane = &counting.small;
                counting.enter(lane, 600).await.map(drop)
            })
        };
        while counting.waiting_bytes.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = counting.enter(&counting.small, 600).await.map(drop);
        assert!(
            matches!(
                refused,
                Err(ServiceError::CountingMemoryBusy { bytes: 600, .. })
            ),
            "{refused:?}"
        );
        assert_eq!(counting.waiting_bytes.load(Ordering::Acquire), 600);
        drop(busy);
        waiter
            .await
            .unwrap()
            .expect("the waiting prompt gets its slot");
        assert_eq!(counting.waiting_bytes.load(Ordering::Acquire), 0);
    }
}
