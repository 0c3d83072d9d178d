//! Where bucket levels live: the [`Store`] trait, its implementations and the
//! pure arithmetic they share.
//!
//! A store knows buckets, not limits: the dispatcher turns an acquire into one
//! [`Draw`] per bucket, and a store reserves in all of them or in none.

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

use std::sync::Arc;

use async_trait::async_trait;

pub use bucket::{BucketSpec, BucketState, Draw, Plan, Refill, Window};
pub use embedded::EmbeddedStore;
pub use fail_fast::FailFastStore;
pub use fallback::{FailurePolicy, FallbackStore};
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
}

impl BucketRole {
    /// Every role, each name once (a minute's window is `Tokens` and
    /// `Requests`).
    pub const ALL: [BucketRole; 13] = [
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
        }
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
            BucketRole::Tenant | BucketRole::GroupTokens | BucketRole::GroupRequests
        )
    }
}

/// Which buckets a grant was reserved in, so that settling it adjusts the
/// same buckets (a lease granted locally during a Redis outage must not be
/// refunded into Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The store's own buckets.
    Store,
    /// The in-memory fallback buckets of the `local` failure policy.
    Local,
    /// Nothing was reserved: the `fail_open` policy let it through.
    Unlimited,
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

/// Bucket levels shared by whoever uses the same store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"embedded"` or `"redis"`, as shown by `status`.
    fn kind(&self) -> &'static str;

    /// Reserves every draw's cost if all fit within `max_wait_ms`, else none.
    async fn acquire(&self, draws: &[Draw], max_wait_ms: u64) -> Result<Decision, StoreError>;

    /// Applies refunds and debits (settling or releasing a lease) to the
    /// buckets its grant came from.
    async fn adjust(&self, adjustments: &[Adjustment], origin: Origin) -> Result<(), StoreError>;

    /// Lowers buckets to what the provider says they hold (feedback); a
    /// bucket already lower is left alone.
    async fn lower(&self, lowerings: &[Lowering]) -> Result<(), StoreError>;

    /// Whole tokens available now in each bucket, in order.
    async fn levels(&self, buckets: &[BucketSpec]) -> Result<Vec<i64>, StoreError>;

    /// Takes one of `slots` for `holder` unless every one is held (then
    /// `None`); a holder that has one already keeps it, so a take can be
    /// retried. The origin says where to give it back.
    async fn take_slot(&self, slots: &SlotSpec, holder: &str)
    -> Result<Option<Origin>, StoreError>;

    /// Gives `holder`'s slot back to where it was taken.
    async fn give_slot(
        &self,
        slots: &SlotSpec,
        holder: &str,
        origin: Origin,
    ) -> Result<(), StoreError>;

    /// How many of `slots` are held now.
    async fn slots_held(&self, slots: &SlotSpec) -> Result<u64, StoreError>;

    /// Connects and prepares whatever the first request would otherwise
    /// wait for (connections, authentication, scripts).
    async fn warm_up(&self) -> Result<(), StoreError>;

    /// Checks that the store answers, cheaply (health checks).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Returns once every call whose outcome the store did not learn has
    /// been undone or kept from running, so that what comes next is not
    /// changed by an undo that lands after it (a refund replayed before the
    /// undo of a lost refund would meet a full bucket and be lost).
    ///
    /// No default: a store that wraps another must pass each of these on.
    async fn reconciled(&self);
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
