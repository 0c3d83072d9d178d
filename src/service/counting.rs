//! Counting prompts off the socket loop, fairly and boundedly: counts run on
//! tokio's blocking pool in two lanes — small prompts, one slot per CPU, and
//! large ones, one slot — so a client's huge prompts never hold up another
//! client's small one; each lane's queue is bounded, with its own error when
//! full; and a count is abandoned, segment by segment, as soon as its
//! request is cancelled or its client leaves.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::ServiceError;
use crate::proto::ChatRequest;
use crate::tokens::{self, Bounds, Counter, PromptCount, TokenError};

/// Prompts with more text than this count in the large lane.
pub(super) const LARGE_PROMPT_BYTES: usize = 64 * 1024;

/// Counts that may wait for a small slot; beyond, `Overloaded`.
const MAX_WAITING_SMALL: usize = 256;

/// Counts that may wait for the large slot; beyond, `Overloaded`.
const MAX_WAITING_LARGE: usize = 4;

/// The two lanes.
pub(super) struct Counting {
    small: Lane,
    large: Lane,
}

struct Lane {
    name: &'static str,
    slots: Semaphore,
    waiting: AtomicUsize,
    max_waiting: usize,
}

impl Counting {
    pub(super) fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Counting {
            small: Lane::new("small", cpus, MAX_WAITING_SMALL),
            large: Lane::new("large", 1, MAX_WAITING_LARGE),
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
            slot = lane.enter() => slot?,
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
