//! Why a request failed, and the stable wire code of each reason — in one
//! place, so that handlers return what went wrong and never pick codes.

use crate::limiter::StoreError;
use crate::plan::PlanError;
use crate::proto::{ErrorCode, Response};
use crate::tokens::TokenError;

/// A request the service could not answer as asked.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request named something unknown or asked for the impossible.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The prompt could not be counted.
    #[error(transparent)]
    Counting(#[from] TokenError),
    /// The store failed (or found the cost impossible) for this limit.
    #[error("limit \"{limit}\": {source}")]
    Store { limit: String, source: StoreError },
    #[error("the daemon is shutting down and takes no new acquires")]
    ShuttingDown,
    #[error("the acquire was cancelled before it was granted; nothing was reserved")]
    CancelledBeforeReserving,
    #[error("the acquire was cancelled before it was granted; its reservation was returned")]
    CancelledWhileWaiting,
    #[error("the daemon shut down before the reservation was due; it was returned")]
    ShutDownWhileWaiting,
    #[error(
        "lease {0} is unknown: never granted, already reported or released, or its connection closed"
    )]
    UnknownLease(u64),
    #[error("lease {lease} could not be settled, retry the report: {source}")]
    ReportNotSettled { lease: u64, source: StoreError },
    #[error("lease {lease} could not be released, retry the release: {source}")]
    ReleaseNotSettled { lease: u64, source: StoreError },
    /// A `Feedback` beyond the bounds of its headers.
    #[error(
        "feedback carries {headers} headers or a header above {max_len} bytes; at most {max_headers} of at most {max_len} bytes each",
        max_headers = super::feedback::MAX_HEADERS,
        max_len = super::feedback::MAX_HEADER_LEN
    )]
    FeedbackTooLarge { headers: usize },
    /// Too many prompts of this size are waiting to be counted.
    #[error(
        "{waiting} {size} prompts are already waiting to be counted (at most {max}); retry later"
    )]
    CountingBusy {
        size: &'static str,
        waiting: usize,
        max: usize,
    },
    /// The prompts waiting to be counted hold too much memory for one more.
    #[error(
        "the prompts waiting to be counted hold {held_mib} MiB (at most {max_mib} MiB): \
         no room for one more of {bytes} bytes; retry later"
    )]
    CountingMemoryBusy {
        held_mib: usize,
        bytes: usize,
        max_mib: usize,
    },
    /// A fault of the daemon's own (a counting task that died, …).
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// The stable code clients map to an exception type.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServiceError::Plan(plan) => match plan {
                PlanError::NameTooLong { .. }
                | PlanError::MaxWaitTooLong(_)
                | PlanError::NotAllowed { .. }
                | PlanError::ZeroCost => ErrorCode::InvalidRequest,
                PlanError::UnknownLimit { .. } => ErrorCode::UnknownLimit,
                PlanError::UnknownPriority(_) | PlanError::PriorityNotForLimit { .. } => {
                    ErrorCode::UnknownPriority
                }
                PlanError::CostOverflow
                | PlanError::AboveMaxRequestTokens { .. }
                | PlanError::NeverFits { .. }
                | PlanError::AboveBudget { .. } => ErrorCode::CostExceedsCapacity,
            },
            // Too large for the bounds is the client's mistake, anything
            // else the daemon's.
            ServiceError::Counting(counting) => match counting {
                TokenError::TextTooLarge { .. }
                | TokenError::TooManyMessages { .. }
                | TokenError::TooManyParts { .. }
                | TokenError::UnknownApi { .. } => ErrorCode::InvalidRequest,
                TokenError::Cancelled => ErrorCode::Cancelled,
                TokenError::EncoderUnavailable { .. } | TokenError::InvalidEstimator { .. } => {
                    ErrorCode::Internal
                }
            },
            ServiceError::CountingBusy { .. } | ServiceError::CountingMemoryBusy { .. } => {
                ErrorCode::Overloaded
            }
            ServiceError::FeedbackTooLarge { .. } => ErrorCode::InvalidRequest,
            ServiceError::Store { source, .. } => match source {
                StoreError::CostExceedsCapacity { .. } => ErrorCode::CostExceedsCapacity,
                StoreError::Unavailable(_) => ErrorCode::StoreUnavailable,
            },
            ServiceError::ShuttingDown | ServiceError::ShutDownWhileWaiting => {
                ErrorCode::ShuttingDown
            }
            ServiceError::CancelledBeforeReserving | ServiceError::CancelledWhileWaiting => {
                ErrorCode::Cancelled
            }
            ServiceError::UnknownLease(_) => ErrorCode::UnknownLease,
            ServiceError::ReportNotSettled { .. } | ServiceError::ReleaseNotSettled { .. } => {
                ErrorCode::StoreUnavailable
            }
            ServiceError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The `Error` answer carrying this failure.
    pub fn into_response(self) -> Response {
        Response::error(self.code(), self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_keeps_its_wire_code() {
        let unavailable = || StoreError::Unavailable("down".into());
        let cases = [
            (
                ServiceError::Plan(PlanError::ZeroCost),
                ErrorCode::InvalidRequest,
            ),
            (
                ServiceError::Plan(PlanError::UnknownPriority("x".into())),
                ErrorCode::UnknownPriority,
            ),
            (
                ServiceError::Counting(TokenError::TooManyMessages { count: 2, max: 1 }),
                ErrorCode::InvalidRequest,
            ),
            (
                ServiceError::Store {
                    limit: "gpt".into(),
                    source: unavailable(),
                },
                ErrorCode::StoreUnavailable,
            ),
            (
                ServiceError::ReportNotSettled {
                    lease: 3,
                    source: unavailable(),
                },
                ErrorCode::StoreUnavailable,
            ),
            (ServiceError::ShutDownWhileWaiting, ErrorCode::ShuttingDown),
            (ServiceError::CancelledWhileWaiting, ErrorCode::Cancelled),
            (ServiceError::UnknownLease(9), ErrorCode::UnknownLease),
        ];
        for (failure, code) in cases {
            let message = failure.to_string();
            assert_eq!(
                failure.into_response(),
                Response::Error {
                    code: code.as_u16(),
                    message
                }
            );
        }
    }
}
