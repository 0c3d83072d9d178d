//! Where bucket levels live: the [`Store`] trait, its implementations and the
//! pure arithmetic they share.
//!
//! A store knows buckets, not limits: the dispatcher turns an acquire into one
//! [`Draw`] per bucket, and a store reserves in all of them or in none.
//!
//! Every store answers one call, [`Store::call`], for each [`Op`]; callers
//! use [`StoreOps`], which gives each operation its own method and answer
//! type. A decorator changes the operations it is about and forwards the
//! rest in one arm (`tests/it/store_contract.rs` holds every store and
//! decorator to the same answers).

pub mod backlog;
pub mod bucket;
pub mod drain;
pub mod embedded;
pub mod fail_fast;
pub mod fallback;
pub mod health;
pub mod instrumented;
pub mod keys;
pub mod lowered;
pub mod overrun;
pub mod redis;
pub mod replay;
pub mod shapes;
pub mod slots;
mod stack;

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::budget::spans::Span;

pub use bucket::{BucketSpec, BucketState, Draw, Plan, Refill, Window};
pub use embedded::EmbeddedStore;
pub use fail_fast::FailFastStore;
pub use fallback::{FailurePolicy, FallbackStore, Origin};
pub use instrumented::InstrumentedStore;
pub use lowered::{DrawMark, LoweredTotals};
pub use redis::RedisStore;
pub use slots::{SlotGuard, SlotKeeper, SlotSpec};
pub use stack::Stores;

/// The role of a bucket within a limit; its name is what `Denied` and
/// `status` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketRole {
    /// The limit's combined token bucket (input and output together).
    Tokens,
    /// The limit's separate bucket of input (prompt) tokens.
    InputTokens,
    /// The limit's separate bucket of output (completion) tokens.
    OutputTokens,
    /// The limit's requests.
    Requests,
    /// One tenant's share of the limit's tokens.
    Tenant,
    /// The tokens of the limit's group, shared by every limit in it.
    GroupTokens,
    /// The requests of the limit's group.
    GroupRequests,
    /// The limit's tokens over a window other than a minute (per second,
    /// hour or day), beside or instead of its per-minute buckets.
    TokensPer(Window),
    /// The limit's requests over a window other than a minute.
    RequestsPer(Window),
    /// A spend budget, counted in micro-units of money: whose it is, over
    /// which span.
    Budget(BudgetOwner, Span),
}

/// Whose spend a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetOwner {
    /// Every call of the limit.
    Limit,
    /// One tenant's calls of the limit.
    Tenant,
    /// Every call of every limit of the group.
    Group,
    /// One tenant's calls of every limit of the group.
    GroupTenant,
}

impl BudgetOwner {
    pub const ALL: [BudgetOwner; 4] = [
        BudgetOwner::Limit,
        BudgetOwner::Tenant,
        BudgetOwner::Group,
        BudgetOwner::GroupTenant,
    ];
}

/// The names of budget buckets (`Denied.bucket`, `status`), by owner and
/// span (in [`Span::ALL`]'s order). Every one contains `budget`, which is
/// how clients tell a spent budget from a rate limit (PROTOCOL.md §4).
const BUDGET_NAMES: [[&str; 5]; 4] = [
    [
        "budget_day",
        "budget_week",
        "budget_month",
        "budget_rolling_hour",
        "budget_rolling_day",
    ],
    [
        "tenant_budget_day",
        "tenant_budget_week",
        "tenant_budget_month",
        "tenant_budget_rolling_hour",
        "tenant_budget_rolling_day",
    ],
    [
        "group_budget_day",
        "group_budget_week",
        "group_budget_month",
        "group_budget_rolling_hour",
        "group_budget_rolling_day",
    ],
    [
        "group_tenant_budget_day",
        "group_tenant_budget_week",
        "group_tenant_budget_month",
        "group_tenant_budget_rolling_hour",
        "group_tenant_budget_rolling_day",
    ],
];

impl BucketRole {
    /// Every role, each name once: the rate roles of [`Self::RATES`], then
    /// every budget's.
    pub fn all() -> impl Iterator<Item = BucketRole> {
        let budgets = BudgetOwner::ALL.into_iter().flat_map(|owner| {
            Span::ALL
                .into_iter()
                .map(move |span| BucketRole::Budget(owner, span))
        });
        BucketRole::RATES.into_iter().chain(budgets)
    }

    /// Every role of a rate limit, each name once (a minute's window is
    /// `Tokens` and `Requests`).
    pub const RATES: [BucketRole; 13] = [
        BucketRole::Tokens,
        BucketRole::InputTokens,
        BucketRole::OutputTokens,
        BucketRole::Requests,
        BucketRole::Tenant,
        BucketRole::GroupTokens,
        BucketRole::GroupRequests,
        BucketRole::TokensPer(Window::Second),
        BucketRole::TokensPer(Window::Hour),
        BucketRole::TokensPer(Window::Day),
        BucketRole::RequestsPer(Window::Second),
        BucketRole::RequestsPer(Window::Hour),
        BucketRole::RequestsPer(Window::Day),
    ];

    /// The name clients see (`Denied.bucket`, `BucketStatus.name`).
    pub fn name(self) -> &'static str {
        match self {
            BucketRole::Tokens => "tokens",
            BucketRole::InputTokens => "input_tokens",
            BucketRole::OutputTokens => "output_tokens",
            BucketRole::Requests => "requests",
            BucketRole::Tenant => "tenant",
            BucketRole::GroupTokens => "group_tokens",
            BucketRole::GroupRequests => "group_requests",
            BucketRole::TokensPer(window) => match window {
                Window::Second => "tokens_per_second",
                Window::Minute => "tokens",
                Window::Hour => "tokens_per_hour",
                Window::Day => "tokens_per_day",
            },
            BucketRole::RequestsPer(window) => match window {
                Window::Second => "requests_per_second",
                Window::Minute => "requests",
                Window::Hour => "requests_per_hour",
                Window::Day => "requests_per_day",
            },
            BucketRole::Budget(owner, span) => {
                let span = Span::ALL
                    .iter()
                    .position(|known| *known == span)
                    .unwrap_or_default();
                BUDGET_NAMES[owner as usize][span]
            }
        }
    }

    /// Whether the bucket is a spend budget, counted in micro-units.
    pub fn is_budget(self) -> bool {
        matches!(self, BucketRole::Budget(..))
    }

    /// The last segment of the bucket's key: a group's buckets are the
    /// group's `tokens` and `requests`.
    pub fn key_segment(self) -> &'static str {
        match self {
            BucketRole::GroupTokens => "tokens",
            BucketRole::GroupRequests => "requests",
            role => role.name(),
        }
    }

    /// Whether the bucket is one of the limit's own per-minute token
    /// buckets, whose settlement `Settled.tokens_returned` reports.
    pub fn is_limit_tokens(self) -> bool {
        matches!(
            self,
            BucketRole::Tokens | BucketRole::InputTokens | BucketRole::OutputTokens
        )
    }

    /// Whether the bucket is one of the limit's own buckets (not a tenant's
    /// or its group's): those that mirror the provider's.
    pub fn is_limit_own(self) -> bool {
        !matches!(
            self,
            BucketRole::Tenant
                | BucketRole::GroupTokens
                | BucketRole::GroupRequests
                | BucketRole::Budget(..)
        )
    }
}

/// A store's verdict on one acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Reserved in every bucket; the reservation is due after `wait_ms`.
    /// `marks`: where a shared store drew it, for placing feedback exactly.
    Granted {
        wait_ms: u64,
        origin: Origin,
        marks: Option<DrawMarks>,
    },
    /// Nothing reserved; `bucket` indexes the draw that needs the longest wait.
    Denied { retry_after_ms: u64, bucket: usize },
}

/// A change to one bucket's level: positive refunds, negative debits (an
/// overrun, which a store takes only within the bucket's overrun debt of
/// one capacity: [`BucketState::overrun`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    pub bucket: BucketSpec,
    pub tokens: i64,
}

/// A provider's view of one bucket: lower it to `level` tokens if it holds
/// more (never raise it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lowering {
    pub bucket: BucketSpec,
    /// Tokens (or requests); negative to pause until it refills.
    pub level: i64,
    /// What the provider counted, for a shared store that can also subtract
    /// what every sidecar reserved since (`lua/batch.lua`); `level` holds
    /// only this sidecar's view.
    pub fleet: Option<FleetView>,
}

/// Where a shared store drew a grant, one [`DrawMark`] per bucket, and
/// where that store keeps how far feedback has lowered its buckets since.
#[derive(Debug, Clone)]
pub struct DrawMarks {
    pub draws: Arc<[DrawMark]>,
    pub lowered: Arc<LoweredTotals>,
}

impl DrawMarks {
    /// The mark of the bucket with `key` (its count of units drawn right
    /// after the grant), if the grant drew it.
    pub fn of(&self, key: &str) -> Option<i64> {
        self.draws
            .iter()
            .find(|mark| mark.key.as_ref() == key)
            .and_then(|mark| mark.drawn)
    }

    /// How much longer than its wait the grant must wait, in ms, and for
    /// which draw: feedback lowered its buckets since it drew (see
    /// [`lowered`]). `None` when none was.
    pub fn postponement(&self) -> Option<(u64, usize)> {
        self.lowered.postponement(&self.draws)
    }
}

impl PartialEq for DrawMarks {
    fn eq(&self, other: &Self) -> bool {
        self.draws == other.draws && Arc::ptr_eq(&self.lowered, &other.lowered)
    }
}

impl Eq for DrawMarks {}

/// The provider's count for a bucket, when the call it answered was
/// reserved, and how old the count is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetView {
    /// Tokens (or requests) the provider has left now by its count: what
    /// it had after that call, and its refill since.
    pub remaining: i64,
    /// How long ago the answered call's reservation was made, if this
    /// sidecar still knows it (a count without it only starts the store's
    /// history of draws, for the next one).
    pub reserved_ms_ago: Option<u64>,
    /// How long ago, at most, the provider counted: `remaining` credits
    /// the refill since at the configured rate, and what drains the
    /// provider unseen took its share of that.
    pub counted_ms_ago: u64,
    /// The answered call's mark in the store (see [`DrawMarks`]), less what
    /// this sidecar granted before it that may still have reached the
    /// provider after it, in the bucket's units, when the feedback named its
    /// lease: the store then subtracts what the fleet drew after that.
    pub drawn: Option<i64>,
    /// What the answered call holds in the bucket when the provider refused
    /// it (a 429), in tokens: the bucket keeps it, and if the provider did
    /// not charge it the gap to the provider grows by that much at once,
    /// which the drain estimate must not read as negative drain.
    pub refused: u64,
}

/// Why a store could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A cost that no wait can satisfy; callers check capacity first, so
    /// reaching this is a caller bug or a config changed underneath.
    #[error("a cost of {cost} tokens can never fit in bucket {key} (capacity {capacity})")]
    CostExceedsCapacity {
        key: String,
        cost: u64,
        capacity: u64,
    },
    /// The backing service failed or timed out.
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// One operation on a store's buckets or slots: what [`Store::call`] takes.
///
/// A decorator matches the operations it changes and forwards the rest in
/// one arm, so adding an operation touches this enum, [`Answer`] if it
/// answers something new, and the stores that keep state (the embedded
/// store, and the Redis store with its Lua) — nothing that merely forwards.
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// Reserves every draw's cost if all fit within `max_wait_ms`, else
    /// none; answers [`Answer::Decision`].
    Acquire { draws: &'a [Draw], max_wait_ms: u64 },
    /// Applies refunds and debits (settling or releasing a lease) to the
    /// buckets its grant came from; answers [`Answer::Done`].
    Adjust {
        adjustments: &'a [Adjustment],
        origin: Origin,
    },
    /// Lowers buckets to what the provider says they hold (feedback); a
    /// bucket already lower is left alone. Answers [`Answer::Done`].
    Lower(&'a [Lowering]),
    /// Whole tokens available now in each bucket, in order; answers
    /// [`Answer::Levels`].
    Levels(&'a [BucketSpec]),
    /// Takes one of `slots` for `holder` unless every one is held; a holder
    /// that has one already keeps it, so a take can be retried. Answers
    /// [`Answer::Slot`]: where to give it back, or `None`.
    TakeSlot {
        slots: &'a SlotSpec,
        holder: &'a str,
    },
    /// Gives `holder`'s slot back to where it was taken; answers
    /// [`Answer::Done`].
    GiveSlot {
        slots: &'a SlotSpec,
        holder: &'a str,
        origin: Origin,
    },
    /// How many of `slots` are held now; answers [`Answer::Held`].
    SlotsHeld(&'a SlotSpec),
}

impl Op<'_> {
    /// The operation's name in metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Acquire { .. } => "acquire",
            Op::Adjust { .. } => "adjust",
            Op::Lower(_) => "lower",
            Op::Levels(_) => "levels",
            Op::TakeSlot { .. } => "take_slot",
            Op::GiveSlot { .. } => "give_slot",
            Op::SlotsHeld(_) => "slots_held",
        }
    }
}

/// A store's answer to an [`Op`]; each operation says which it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Decision(Decision),
    Done,
    Levels(Vec<i64>),
    /// A slot taken, and where to give it back; `None` when all are held.
    Slot(Option<Origin>),
    Held(u64),
}

/// What every store does besides operations: name itself, prepare, answer
/// health checks, and settle what it lost.
///
/// No defaults: a store that wraps another must pass each of these on.
#[async_trait]
pub trait Lifecycle: Send + Sync + 'static {
    /// `"embedded"` or `"redis"`, as shown by `status`.
    fn kind(&self) -> &'static str;

    /// Connects and prepares whatever the first request would otherwise
    /// wait for (connections, authentication, scripts).
    async fn warm_up(&self) -> Result<(), StoreError>;

    /// Checks that the store answers, cheaply (health checks).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Returns once every call whose outcome the store did not learn has
    /// been undone or kept from running, so that what comes next is not
    /// changed by an undo that lands after it (a refund replayed before the
    /// undo of a lost refund would meet a full bucket and be lost).
    async fn reconciled(&self);
}

/// Bucket levels and slots shared by whoever uses the same store.
#[async_trait]
pub trait Store: Lifecycle {
    /// Runs one operation; the answer is the variant the operation names.
    async fn call(&self, op: Op<'_>) -> Result<Answer, StoreError>;
}

/// Each [`Op`] as a method with its own answer type: what callers use.
pub trait StoreOps: Store {
    /// See [`Op::Acquire`].
    fn acquire<'a>(
        &'a self,
        draws: &'a [Draw],
        max_wait_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send + 'a {
        ask(
            self,
            Op::Acquire { draws, max_wait_ms },
            |answer| match answer {
                Answer::Decision(decision) => Ok(decision),
                other => Err(other),
            },
        )
    }

    /// See [`Op::Adjust`].
    fn adjust<'a>(
        &'a self,
        adjustments: &'a [Adjustment],
        origin: Origin,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        let op = Op::Adjust {
            adjustments,
            origin,
        };
        ask(self, op, done)
    }

    /// See [`Op::Lower`].
    fn lower<'a>(
        &'a self,
        lowerings: &'a [Lowering],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        ask(self, Op::Lower(lowerings), done)
    }

    /// See [`Op::Levels`].
    fn levels<'a>(
        &'a self,
        buckets: &'a [BucketSpec],
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send + 'a {
        ask(self, Op::Levels(buckets), |answer| match answer {
            Answer::Levels(levels) => Ok(levels),
            other => Err(other),
        })
    }

    /// See [`Op::TakeSlot`].
    fn take_slot<'a>(
        &'a self,
        slots: &'a SlotSpec,
        holder: &'a str,
    ) -> impl Future<Output = Result<Option<Origin>, StoreError>> + Send + 'a {
        ask(
            self,
            Op::TakeSlot { slots, holder },
            |answer| match answer {
                Answer::Slot(taken) => Ok(taken),
                other => Err(other),
            },
        )
    }

    /// See [`Op::GiveSlot`].
    fn give_slot<'a>(
        &'a self,
        slots: &'a SlotSpec,
        holder: &'a str,
        origin: Origin,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        let op = Op::GiveSlot {
            slots,
            holder,
            origin,
        };
        ask(self, op, done)
    }

    /// See [`Op::SlotsHeld`].
    fn slots_held<'a>(
        &'a self,
        slots: &'a SlotSpec,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a {
        ask(self, Op::SlotsHeld(slots), |answer| match answer {
            Answer::Held(held) => Ok(held),
            other => Err(other),
        })
    }
}

impl<S: Store + ?Sized> StoreOps for S {}

/// Runs `op` and takes its answer apart with `unpack`, which hands back an
/// answer of the wrong kind.
async fn ask<S: Store + ?Sized, T>(
    store: &S,
    op: Op<'_>,
    unpack: fn(Answer) -> Result<T, Answer>,
) -> Result<T, StoreError> {
    let answer = store.call(op).await?;
    unpack(answer).map_err(|other| wrong_answer(op, other))
}

/// Unpacks [`Answer::Done`].
fn done(answer: Answer) -> Result<(), Answer> {
    match answer {
        Answer::Done => Ok(()),
        other => Err(other),
    }
}

/// A store that answered an operation with another's answer: a bug in that
/// store, reported as a failed call rather than a panic (the contract test
/// in `tests/it/store_contract.rs` holds every store to the right ones).
fn wrong_answer(op: Op<'_>, answer: Answer) -> StoreError {
    tracing::error!(
        op = op.name(),
        ?answer,
        "a store answered the wrong kind of answer"
    );
    StoreError::Unavailable(format!("the store answered {answer:?} to {}", op.name()))
}

/// Turns a [`Plan`] into the store's answer.
pub(crate) fn decision_from_plan(draws: &[Draw], plan: Plan) -> Result<Decision, StoreError> {
    match plan {
        Plan::Grant { wait_ms } => Ok(Decision::Granted {
            wait_ms,
            origin: Origin::Store,
            marks: None,
        }),
        Plan::Deny {
            retry_after_ms,
            bucket,
        } => Ok(Decision::Denied {
            retry_after_ms,
            bucket,
        }),
        Plan::Impossible { bucket } => {
            let draw = &draws[bucket];
            Err(StoreError::CostExceedsCapacity {
                key: draw.bucket.key.to_string(),
                cost: draw.cost.saturating_add(draw.floor),
                capacity: draw.bucket.largest,
            })
        }
    }
}
