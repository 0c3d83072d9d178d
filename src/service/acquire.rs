//! Acquire and estimate: turning a cost into input and output figures
//! (counting messages off the socket loop), reserving the plan in the store,
//! and holding the answer back until the reservation is due.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::due::{self, DueTimer};
use super::feedback::Granted;
use super::{Caller, ConnectionId, Service, ServiceError, Snapshot, unix_ms};
use crate::config::{LimitConfig, LimitMode};
use crate::leases::{Lease, refund_all};
use crate::limiter::{Decision, DrawMarks, Origin, SlotGuard, SlotSpec, StoreOps};
use crate::plan::{AcquirePlan, PlanError, check_name};
use crate::proto::{Acquire, ChatRequest, Cost, Response};
use crate::tokens::{self, Counter, PromptCount};

/// How often an acquire waiting for a concurrency slot asks the store
/// again, for slots given back through other sidecars.
const SLOT_POLL: Duration = Duration::from_millis(20);

/// The name of a limit's concurrency slots in `Denied.bucket` and `status`.
pub(super) const CONCURRENT: &str = "concurrent";

/// How a wait for a slot ended, short of an error.
enum SlotWait {
    /// And how long it waited for the slot.
    Taken(SlotGuard, Duration),
    /// Every slot stayed held past the acquire's wait.
    Denied(Response),
}

enum SlotWaitError {
    Store(crate::limiter::StoreError),
    Cancelled,
}

/// What a shadow acquire needs besides its plan.
struct ShadowAcquire<'a> {
    connection: ConnectionId,
    limit: &'a LimitConfig,
    max_wait_ms: u64,
    input: u64,
    output: u64,
}

impl Service {
    pub(super) async fn acquire(
        &self,
        connection: ConnectionId,
        acquire: Acquire,
        caller: &Caller,
        cancel: CancellationToken,
    ) -> Result<Response, ServiceError> {
        if self.is_draining() {
            return Err(ServiceError::ShuttingDown);
        }
        let snapshot = self.snapshot();
        let Acquire {
            limit,
            tenant,
            priority,
            cost,
            max_wait_ms,
        } = acquire;
        let planner = &snapshot.planner;
        let checked =
            planner.check_acquire(&limit, tenant.as_deref(), priority.as_deref(), max_wait_ms)?;
        planner.check_client(caller.uid, tenant.as_deref(), checked.class)?;
        let limit = checked.limit;
        let (input, output) = self.reservation(limit, cost, &cancel).await?;
        if cancel.is_cancelled() {
            return Err(ServiceError::CancelledBeforeReserving);
        }
        let plan = planner.plan_acquire(checked, tenant.as_deref(), (input, output), unix_ms());
        if limit.mode == LimitMode::Shadow {
            let shadow = ShadowAcquire {
                connection,
                limit,
                max_wait_ms: checked.max_wait_ms,
                input,
                output,
            };
            return self.shadow_acquire(&snapshot, shadow, plan).await;
        }
        let plan = plan?;
        let store_error = |source| ServiceError::Store {
            limit: limit.name.clone(),
            source,
        };
        // A slot first: the buckets are not drawn for a request that may
        // wait for one past its deadline.
        let mut slot_wait = Duration::ZERO;
        let slot = match snapshot.planner.slots(limit) {
            Some(spec) => {
                let waiters = &snapshot.waiters[&limit.name];
                match self
                    .take_slot(spec, checked.max_wait_ms, waiters, &cancel)
                    .await
                {
                    Ok(SlotWait::Taken(slot, waited)) => {
                        slot_wait = waited;
                        Some(slot)
                    }
                    Ok(SlotWait::Denied(denied)) => return Ok(denied),
                    Err(SlotWaitError::Store(source)) => return Err(store_error(source)),
                    Err(SlotWaitError::Cancelled) => return Err(self.cancelled_while_waiting()),
                }
            }
            None => None,
        };
        let max_wait_ms = checked
            .max_wait_ms
            .saturating_sub(slot_wait.as_millis() as u64);
        let decision = if plan.reserved.is_empty() {
            // A limit of concurrency only.
            Decision::Granted {
                wait_ms: 0,
                origin: slot.as_ref().map_or(Origin::Store, |slot| slot.origin()),
                marks: None,
            }
        } else {
            self.store
                .acquire(&plan.draws(), max_wait_ms)
                .await
                .map_err(store_error)?
        };
        let (wait_ms, origin, marks) = match decision {
            Decision::Granted {
                wait_ms,
                origin,
                marks,
            } => (wait_ms, origin, marks),
            Decision::Denied {
                retry_after_ms,
                bucket,
            } => {
                let denied_by = &plan.reserved[bucket];
                return Ok(Response::Denied {
                    retry_after_ms: denied_by.retry_after_ms(retry_after_ms, unix_ms()),
                    bucket: denied_by.role.name().to_string(),
                });
            }
        };
        let started = Instant::now();
        let due = started + Duration::from_millis(wait_ms);
        let noted = Self::note_reservation(
            &snapshot,
            limit,
            (input, output),
            plan.tokens,
            due,
            marks.clone(),
        );
        // Counted until the reservation is granted or given back, so that
        // status never shows a waiter gone while its tokens are still out.
        let _waiter = (wait_ms > 0).then(|| Waiter::enter(&snapshot.waiters[&limit.name]));
        let deadline = started + Duration::from_millis(max_wait_ms);
        let waited = self
            .wait_for_reservation(wait_ms, due, deadline, marks.as_ref(), &cancel)
            .await;
        if waited != Reservation::Due {
            let refunds = refund_all(&plan.reserved);
            if let Err(store_error) = self.store.adjust(&refunds, origin).await {
                tracing::warn!(limit = %limit.name, %store_error, "could not return a reservation given up");
            }
        }
        match waited {
            Reservation::Due => {}
            Reservation::Cancelled => return Err(self.cancelled_while_waiting()),
            Reservation::PastDeadline {
                retry_after_ms,
                draw,
            } => {
                return Ok(Response::Denied {
                    retry_after_ms,
                    bucket: plan.reserved[draw].role.name().to_string(),
                });
            }
        }
        let tokens = plan.tokens;
        let lease = self.grant(connection, limit, (plan, origin), slot);
        snapshot.grants[&limit.name].name(noted, lease);
        Ok(Response::Granted {
            lease,
            tokens,
            waited_ms: (slot_wait + started.elapsed()).as_millis() as u64,
        })
    }

    /// Notes a reservation for provider feedback: a call the provider will
    /// see from `due` on, drawn where `marks` say. Returns what names it to
    /// `RecentGrants::name`.
    fn note_reservation(
        snapshot: &Snapshot,
        limit: &LimitConfig,
        (input, output): (u64, u64),
        tokens: u64,
        due: Instant,
        marks: Option<DrawMarks>,
    ) -> u64 {
        let granted = Granted {
            requests: 1,
            tokens,
            input_tokens: input,
            output_tokens: output,
        };
        snapshot.grants[&limit.name].note(granted, due, marks)
    }

    /// Opens a grant's lease.
    fn grant(
        &self,
        connection: ConnectionId,
        limit: &LimitConfig,
        (plan, origin): (AcquirePlan, Origin),
        slot: Option<SlotGuard>,
    ) -> u64 {
        self.leases.insert(Lease {
            owner: connection,
            origin,
            tokens: plan.tokens,
            reserved: plan.reserved,
            granted_at: std::time::Instant::now(),
            learn_as: limit
                .learn_max_output
                .then(|| Arc::from(learning_key(limit))),
            slot: slot.map(Arc::new),
            cache_reads_count: limit.provider.counts_cache_reads(),
        })
    }

    fn cancelled_while_waiting(&self) -> ServiceError {
        if self.is_draining() {
            ServiceError::ShutDownWhileWaiting
        } else {
            ServiceError::CancelledWhileWaiting
        }
    }

    /// Takes one of a limit's concurrency slots, waiting up to
    /// `max_wait_ms` for one: woken when this sidecar gives a slot back,
    /// and asking the store again every [`SLOT_POLL`] for slots given back
    /// elsewhere.
    async fn take_slot(
        &self,
        spec: &SlotSpec,
        max_wait_ms: u64,
        waiters: &AtomicU64,
        cancel: &CancellationToken,
    ) -> Result<SlotWait, SlotWaitError> {
        let holder = self.slots.new_holder();
        let deadline = Instant::now() + Duration::from_millis(max_wait_ms);
        // Set when the first try finds every slot held: the wait it reports.
        let mut waiting_since: Option<(Instant, Waiter)> = None;
        loop {
            // Registered before asking, so a slot given back meanwhile wakes it.
            let given_back = self.slots.given_back().notified();
            tokio::pin!(given_back);
            given_back.as_mut().enable();
            let taken = self.slots.take(spec, &holder).await;
            if let Some(slot) = taken.map_err(SlotWaitError::Store)? {
                let waited = waiting_since.map_or(Duration::ZERO, |(since, _)| since.elapsed());
                return Ok(SlotWait::Taken(slot, waited));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(SlotWait::Denied(Response::Denied {
                    retry_after_ms: SLOT_POLL.as_millis() as u64,
                    bucket: CONCURRENT.to_string(),
                }));
            }
            waiting_since.get_or_insert_with(|| (now, Waiter::enter(waiters)));
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(SlotWaitError::Cancelled),
                _ = given_back => {}
                _ = tokio::time::sleep(SLOT_POLL.min(deadline - now)) => {}
            }
        }
    }

    /// An acquire of a shadow limit: decided as `enforce` would, counted
    /// and logged, and granted at once whatever the decision. A reservation
    /// the decision made stays (so the buckets keep modelling the traffic
    /// an enforced limit would have let through); a denial reserves nothing.
    async fn shadow_acquire(
        &self,
        snapshot: &Snapshot,
        shadow: ShadowAcquire<'_>,
        plan: Result<AcquirePlan, PlanError>,
    ) -> Result<Response, ServiceError> {
        let ShadowAcquire {
            connection,
            limit,
            max_wait_ms,
            input,
            output,
        } = shadow;
        // Granted.tokens is what an enforced grant would have reserved; the
        // lease holds what this one did (nothing, for a denial).
        let (decision, tokens, plan, origin) = match plan {
            Ok(plan) if plan.reserved.is_empty() => ("granted", 0, plan, Origin::Store),
            Ok(plan) => match self.store.acquire(&plan.draws(), max_wait_ms).await {
                Ok(Decision::Granted {
                    wait_ms, origin, ..
                }) => {
                    let decision = if wait_ms > 0 { "would_wait" } else { "granted" };
                    (decision, plan.tokens, plan, origin)
                }
                Ok(Decision::Denied { .. }) => (
                    "would_deny",
                    plan.tokens,
                    AcquirePlan::NOTHING,
                    Origin::Unlimited,
                ),
                Err(_) => (
                    "store_unavailable",
                    plan.tokens,
                    AcquirePlan::NOTHING,
                    Origin::Unlimited,
                ),
            },
            Err(PlanError::NeverFits { .. } | PlanError::AboveMaxRequestTokens { .. }) => {
                let tokens = input.saturating_add(output);
                (
                    "would_refuse",
                    tokens,
                    AcquirePlan::NOTHING,
                    Origin::Unlimited,
                )
            }
            Err(invalid) => return Err(invalid.into()),
        };
        // A slot is taken without waiting; had every one been held, an
        // enforced acquire would have waited for one.
        let (slot, decision) = match snapshot.planner.slots(limit) {
            Some(spec) if decision != "would_refuse" => {
                match self.slots.take(spec, &self.slots.new_holder()).await {
                    Ok(Some(slot)) => (Some(slot), decision),
                    Ok(None) if decision == "granted" => (None, "would_wait"),
                    Ok(None) => (None, decision),
                    Err(_) => (None, "store_unavailable"),
                }
            }
            _ => (None, decision),
        };
        tracing::debug!(limit = limit.name.as_str(), decision, "shadow decision");
        self.count_shadow(snapshot, limit, decision);
        // The call goes to the provider now, whatever the buckets said.
        let noted = Self::note_reservation(
            snapshot,
            limit,
            (input, output),
            tokens,
            Instant::now(),
            None,
        );
        let lease = self.grant(connection, limit, (plan, origin), slot);
        snapshot.grants[&limit.name].name(noted, lease);
        Ok(Response::Granted {
            lease,
            tokens,
            waited_ms: 0,
        })
    }

    /// What an acquire of `cost` would reserve, counted the same way.
    pub(super) async fn estimate(&self, limit: &str, cost: Cost) -> Result<Response, ServiceError> {
        let snapshot = self.snapshot();
        let limit = snapshot.planner.find_limit(limit)?;
        let never = CancellationToken::new();
        let (input_tokens, output_tokens) = self.reservation(limit, cost, &never).await?;
        Ok(Response::Estimated {
            input_tokens,
            output_tokens,
        })
    }

    /// The input and output figures `cost` reserves on `limit`: the counts
    /// given, or the counted prompt and the output maximum (the request's,
    /// else the learned one, else the limit's default).
    async fn reservation(
        &self,
        limit: &LimitConfig,
        cost: Cost,
        cancel: &CancellationToken,
    ) -> Result<(u64, u64), ServiceError> {
        match cost {
            Cost::Tokens {
                input_tokens,
                output_tokens,
            } => Ok((input_tokens, output_tokens)),
            // A limit of requests only: what the prompt costs does not matter.
            Cost::Messages(_) | Cost::Conversation(_) if !limit.counts_tokens() => Ok((0, 0)),
            Cost::Messages(request) => {
                let output = match request.max_output_tokens {
                    Some(given) => given,
                    None => self.default_max_output(limit),
                };
                let prompt = self.count_prompt(limit.counter(), request, cancel).await?;
                Ok((prompt.total, output))
            }
            Cost::Conversation(conversation) => {
                let split = tokens::content::split(conversation)?;
                let output = match split.text.max_output_tokens {
                    Some(given) => given,
                    None => self.default_max_output(limit),
                };
                let prompt = self
                    .count_prompt(limit.counter(), split.text, cancel)
                    .await?;
                Ok((prompt.total.saturating_add(split.fixed_tokens), output))
            }
        }
    }

    /// Output tokens reserved when a messages cost names no maximum.
    fn default_max_output(&self, limit: &LimitConfig) -> u64 {
        let learned = if limit.learn_max_output {
            self.learner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .estimate(learning_key(limit))
        } else {
            None
        };
        match learned {
            Some(learned) => limit
                .max_request_tokens
                .map_or(learned, |largest| learned.min(largest)),
            None => limit.default_max_output_tokens,
        }
    }

    /// Counts a prompt (see [`super::counting`]); refuses role names above
    /// the protocol's bound first.
    async fn count_prompt(
        &self,
        counter: Counter,
        request: ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<PromptCount, ServiceError> {
        for message in &request.messages {
            check_name("role", &message.role)?;
        }
        self.counting.count(counter, request, cancel).await
    }

    /// Records reported output tokens for limits that learn their max output.
    pub(super) fn learn_output(&self, key: &str, output_tokens: u64) {
        self.learner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .record(key, output_tokens);
    }
}

/// How the wait for a reservation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reservation {
    /// It is due: the call may go.
    Due,
    /// The client went away first.
    Cancelled,
    /// Feedback lowered its buckets so far since the grant that it would be
    /// due only `retry_after_ms` after the acquire's deadline, for the
    /// bucket of `draw`.
    PastDeadline { retry_after_ms: u64, draw: usize },
}

impl Service {
    /// Sleeps until the reservation is due: `due` (`wait_ms` from now), and
    /// then for as long as provider feedback lowered its buckets since the
    /// grant (through any sidecar: a lowering moves the bucket's whole
    /// queue, and a call that went at its first time would meet a provider
    /// without its tokens; see `limiter::lowered`), but not past `deadline`.
    async fn wait_for_reservation(
        &self,
        wait_ms: u64,
        due: Instant,
        deadline: Instant,
        marks: Option<&DrawMarks>,
        cancel: &CancellationToken,
    ) -> Reservation {
        if !self.wait_until_due(wait_ms, due, cancel).await {
            return Reservation::Cancelled;
        }
        let Some(marks) = marks else {
            return Reservation::Due;
        };
        let mut postponed_ms = 0;
        while let Some((ms, draw)) = marks.postponement() {
            if ms <= postponed_ms {
                break;
            }
            let later = due + Duration::from_millis(ms);
            tracing::debug!(
                wait_ms,
                postponed_ms = ms,
                "feedback lowered the buckets since the grant: the reservation is postponed"
            );
            if later > deadline {
                let past = later.duration_since(deadline).as_millis() as u64;
                return Reservation::PastDeadline {
                    retry_after_ms: past.max(1),
                    draw,
                };
            }
            if postponed_ms == 0 && self.metered {
                self.metrics.acquires_postponed.inc();
            }
            postponed_ms = ms;
            if !self.wait_until_due(ms, later, cancel).await {
                return Reservation::Cancelled;
            }
        }
        Reservation::Due
    }

    /// Sleeps until `due` (`wait_ms` from now) unless cancelled first; true
    /// when the wait completed.
    async fn wait_until_due(&self, wait_ms: u64, due: Instant, cancel: &CancellationToken) -> bool {
        if cancel.is_cancelled() {
            return false;
        }
        if wait_ms == 0 {
            return true;
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => false,
            () = due::sleep_until(self.due_timer(), due) => true,
        }
    }

    /// The timer that ends waits to the µs, made on first use (inside the
    /// runtime that serves); none if it cannot be made.
    fn due_timer(&self) -> Option<&DueTimer> {
        self.due_timer
            .get_or_init(|| {
                DueTimer::new()
                    .inspect_err(|error| {
                        tracing::warn!(%error, "no precise wait timer: waits end on tokio's, up to 2 ms late");
                    })
                    .ok()
            })
            .as_ref()
    }
}

/// One acquire held back until its reservation is due, counted in its
/// limit's waiters while it lives.
struct Waiter<'a>(&'a AtomicU64);

impl<'a> Waiter<'a> {
    fn enter(waiters: &'a AtomicU64) -> Self {
        waiters.fetch_add(1, Ordering::Relaxed);
        Waiter(waiters)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The key of a limit's learned max output: its model, else its name.
fn learning_key(limit: &LimitConfig) -> &str {
    limit.model.as_deref().unwrap_or(&limit.name)
}
