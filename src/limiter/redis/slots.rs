//! Concurrency slots in Redis: one call of `lua/slots.lua` each. Taking and
//! giving back are idempotent per holder, so a call whose connection broke
//! is simply sent again on a fresh one.

use std::sync::Arc;

use redis::Script;

use super::batch::{self, unexpected_reply};
use super::pool::Failure;
use super::{Inner, REDIS_CLOCK};
use crate::limiter::{SlotSpec, StoreError};

/// What a call asks of a limit's slots.
pub(super) enum SlotOp<'a> {
    Take(&'a str),
    Give(&'a str),
    Held,
}

impl Inner {
    /// Runs `op` on `slots`: 1 or 0 for a take, 1 for a give, the count
    /// for held.
    pub(super) async fn slots(
        self: &Arc<Self>,
        slots: &SlotSpec,
        op: SlotOp<'_>,
        clock: &str,
    ) -> Result<u64, StoreError> {
        let mut cmd = batch::evalsha(&self.slots, &[&*slots.key]);
        cmd.arg(clock);
        match op {
            SlotOp::Take(holder) => cmd
                .arg("take")
                .arg(holder)
                .arg(slots.max)
                .arg(slots.timeout_ms),
            SlotOp::Give(holder) => cmd.arg("give").arg(holder),
            SlotOp::Held => cmd.arg("held"),
        };
        // One deadline for both attempts, as for a batch.
        let deadline = self.pool.deadline();
        let reply: i64 = match self.pool.run(&cmd, &self.slots, false, deadline).await {
            Ok(reply) => reply,
            Err(first @ (Failure::Refused(_) | Failure::TimedOut(_))) => {
                return Err(self.slot_failure(slots, &op, clock, first));
            }
            Err(_) => self
                .pool
                .run(&cmd, &self.slots, true, deadline)
                .await
                .map_err(|second| self.slot_failure(slots, &op, clock, second))?,
        };
        u64::try_from(reply).map_err(|_| unexpected_reply(&[reply]))
    }

    /// The error of a failed call; a take that may have run is given back
    /// in the background, so that its slot is not held until the timeout.
    fn slot_failure(
        self: &Arc<Self>,
        slots: &SlotSpec,
        op: &SlotOp<'_>,
        clock: &str,
        failure: Failure,
    ) -> StoreError {
        if let SlotOp::Take(holder) = op {
            if failure.may_have_run() && clock == REDIS_CLOCK {
                let (inner, slots, holder) = (self.clone(), slots.clone(), holder.to_string());
                tokio::spawn(async move {
                    let give = SlotOp::Give(&holder);
                    if let Err(error) = inner.slots(&slots, give, REDIS_CLOCK).await {
                        tracing::debug!(%error, "a slot whose take was lost waits for its timeout");
                    }
                });
            }
        }
        failure.into_error()
    }
}

/// The script, after the bucket library (for its clock).
pub(super) fn script() -> Script {
    Script::new(concat!(
        include_str!("../../../lua/bucket.lua"),
        include_str!("../../../lua/slots.lua")
    ))
}
