//! The wire protocol: frame bounds, message types and their encoding.
//!
//! `proto-spec/PROTOCOL.md` is normative; this module implements it and the
//! vectors in `proto-spec/vectors/` hold the two together. Nothing here does
//! I/O: [`frame::split_frame`] takes a buffer and returns a payload, "need more
//! bytes" or an error, so the server and every test drive it the same way.

pub mod error_code;
pub mod frame;
pub mod messages;

pub use error_code::ErrorCode;
pub use frame::{
    FrameError, FrameReader, cost_tag_hint, decode_payload, encode_frame, hello_version_hint,
    request_id_hint, request_tag_hint, split_frame,
};
pub use messages::*;

/// The protocol version this build speaks; `Hello` must carry it.
pub const PROTOCOL_VERSION: u16 = 1;

/// Bytes of the little-endian `u32` length prefix in front of every payload.
pub const LENGTH_PREFIX_LEN: usize = 4;

/// Largest payload (excluding the length prefix) either side may send.
///
/// Large enough for a prompt near a million-token context window; anything
/// declared above it is refused before a byte of it is buffered.
pub const MAX_FRAME_LEN: u32 = 4 * 1024 * 1024;

/// Requests one connection may have unanswered at once.
pub const MAX_IN_FLIGHT: u32 = 1024;

/// Longest limit, tenant, priority, client or role name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 128;

/// Request id reserved for errors that belong to the connection rather than to
/// one request (an oversized frame, a payload too short to carry an id).
pub const CONNECTION_REQUEST_ID: u64 = 0;
