//! Stable numeric error codes: clients map them to exception types and never
//! parse the human-readable message that travels beside them.

use serde::{Deserialize, Serialize};

/// Why a request failed. The numbers are part of the wire format and never
/// change meaning; new codes are only ever added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u16)]
pub enum ErrorCode {
    /// `Hello` named a protocol version this daemon does not speak. Fatal.
    UnsupportedVersion = 1,
    /// The first frame on a connection was not `Hello`. Fatal.
    HelloRequired = 2,
    /// The declared frame length exceeds [`crate::proto::MAX_FRAME_LEN`]. Fatal.
    FrameTooLarge = 3,
    /// The payload did not decode: unknown tag, truncated field, trailing bytes.
    MalformedMessage = 4,
    /// A well-formed request whose fields are not acceptable (zero request id,
    /// a name above the length bound, a zero cost, a second `Hello`).
    InvalidRequest = 5,
    /// The named limit is not in the daemon's configuration.
    UnknownLimit = 6,
    /// The named priority class is not configured, or does not apply to the limit.
    UnknownPriority = 7,
    /// The cost exceeds what one of the limit's buckets can ever hold.
    CostExceedsCapacity = 8,
    /// The request id is already used by an unanswered request on this connection.
    DuplicateRequestId = 9,
    /// The connection already has the maximum number of unanswered requests.
    TooManyInFlight = 10,
    /// The lease is unknown: never granted, already reported or released, or expired.
    UnknownLease = 11,
    /// The acquire was cancelled by a `Cancel` request before it was granted.
    Cancelled = 12,
    /// The bucket store (Redis) failed or timed out and the failure policy denies.
    StoreUnavailable = 13,
    /// The daemon is draining for shutdown and takes no new work.
    ShuttingDown = 14,
    /// A bug in the daemon; the message says what.
    Internal = 15,
    /// The request asks for something this build does not provide, or is a
    /// request of a later protocol revision.
    Unsupported = 16,
    /// The daemon is at one of its resource bounds (its counting queue, its
    /// connections, its buffer for incomplete frames): retry later.
    Overloaded = 17,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: [ErrorCode; 17] = [
        Self::UnsupportedVersion,
        Self::HelloRequired,
        Self::FrameTooLarge,
        Self::MalformedMessage,
        Self::InvalidRequest,
        Self::UnknownLimit,
        Self::UnknownPriority,
        Self::CostExceedsCapacity,
        Self::DuplicateRequestId,
        Self::TooManyInFlight,
        Self::UnknownLease,
        Self::Cancelled,
        Self::StoreUnavailable,
        Self::ShuttingDown,
        Self::Internal,
        Self::Unsupported,
        Self::Overloaded,
    ];

    /// The number carried on the wire.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// The code for a wire number, if this build knows it.
    pub fn from_u16(code: u16) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|known| known.as_u16() == code)
    }

    /// The code's name in snake case, as metrics label it
    /// (`store_unavailable`).
    pub fn label(self) -> &'static str {
        match self {
            Self::UnsupportedVersion => "unsupported_version",
            Self::HelloRequired => "hello_required",
            Self::FrameTooLarge => "frame_too_large",
            Self::MalformedMessage => "malformed_message",
            Self::InvalidRequest => "invalid_request",
            Self::UnknownLimit => "unknown_limit",
            Self::UnknownPriority => "unknown_priority",
            Self::CostExceedsCapacity => "cost_exceeds_capacity",
            Self::DuplicateRequestId => "duplicate_request_id",
            Self::TooManyInFlight => "too_many_in_flight",
            Self::UnknownLease => "unknown_lease",
            Self::Cancelled => "cancelled",
            Self::StoreUnavailable => "store_unavailable",
            Self::ShuttingDown => "shutting_down",
            Self::Internal => "internal",
            Self::Unsupported => "unsupported",
            Self::Overloaded => "overloaded",
        }
    }

    /// Whether sending the same request again later can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::TooManyInFlight | Self::StoreUnavailable | Self::ShuttingDown | Self::Overloaded
        )
    }

    /// Whether the daemon closes the connection after sending this error
    /// with this request id: `Overloaded` closes it only on request id 0,
    /// where it speaks of the connection rather than one request.
    pub fn closes_connection(self, request_id: u64) -> bool {
        match self {
            Self::UnsupportedVersion | Self::HelloRequired | Self::FrameTooLarge => true,
            Self::Overloaded => request_id == crate::proto::CONNECTION_REQUEST_ID,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_their_numbers() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u16(code.as_u16()), Some(code));
        }
        assert_eq!(ErrorCode::from_u16(0), None);
        assert_eq!(ErrorCode::from_u16(18), None);
    }

    #[test]
    fn numbers_are_dense_from_one() {
        let numbers: Vec<u16> = ErrorCode::ALL.iter().map(|c| c.as_u16()).collect();
        let expected: Vec<u16> = (1..=ErrorCode::ALL.len() as u16).collect();
        assert_eq!(numbers, expected);
    }
}
