//! Counting prompts off the socket loop, fairly and boundedly: counts run on
//! tokio's blocking pool in two lanes — small prompts, one slot per CPU, and
//! large ones, one slot — so a client's huge prompts never hold up another
//! client's small one; each lane's queue is bounded, with its own error when
//! full; what the waiting prompts hold in memory is bounded too, all lanes
//! together (issue 27: 16,384 empty messages make a small frame but a
//! 2-3 MiB prompt once decoded, so a bound by count alone let 260 of them
//! hold 0.8 GB); and a count is abandoned, segment by segment, as soon as
//! its request is cancelled or its client leaves.

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
        let _slot = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(TokenError::Cancelled.into()),
            slot = self.enter(lane, held_bytes(&request)) => slot?,
        };
        let cancel = cancel.clone();
        let counted = tokio::task::spawn_blocking(move || {
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
