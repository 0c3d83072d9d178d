//! Framing: a `u32` little-endian payload length, then a bincode 2 payload in
//! the fixed-width little-endian layout (`bincode::config::legacy()`).

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};
use bincode::{Decode, Encode};
use bytes::{Buf, Bytes, BytesMut};

use super::{LENGTH_PREFIX_LEN, MAX_FRAME_LEN};

/// Bytes made room for before each read from a stream.
const READ_CHUNK: usize = 16 * 1024;

/// Bytes one decode may claim for each byte of its payload. bincode claims
/// a string's declared length, and a list's elements at their in-memory
/// size, before it allocates them; for a valid payload that is at most about
/// 5.3 times its wire size (an empty `ChatMessage`: 18 bytes on the wire, 96
/// in memory). Eight times lets every valid payload decode, and a length a
/// payload merely declares, beyond what its bytes could hold, is refused
/// before anything is allocated for it.
const CLAIM_PER_PAYLOAD_BYTE: usize = 8;

/// The claim bound of a payload is a power of two, bincode's limit being a
/// constant of its configuration: from 2^10 bytes for the smallest payloads
/// to 2^25 for the largest (eight times [`MAX_FRAME_LEN`]).
const MIN_CLAIM_BITS: u32 = 10;
const MAX_CLAIM_BITS: u32 = 25;
const _: () = assert!(1 << MAX_CLAIM_BITS == CLAIM_PER_PAYLOAD_BYTE * MAX_FRAME_LEN as usize);

/// The bincode configuration of a payload, claiming at most `LIMIT` bytes.
type WireConfig<const LIMIT: usize> = Configuration<LittleEndian, Fixint, Limit<LIMIT>>;

/// log2 of the claim bound of a payload of `len` bytes: the smallest power
/// of two of at least [`CLAIM_PER_PAYLOAD_BYTE`] times its length, so
/// under sixteen times it (and at least 2^[`MIN_CLAIM_BITS`]).
fn claim_bits(len: usize) -> u32 {
    (CLAIM_PER_PAYLOAD_BYTE * len)
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_CLAIM_BITS)
}

/// Why bytes could not be turned into a message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix declares more than the maximum. The stream cannot be
    /// resynchronised without reading that many bytes, so it must be closed.
    #[error("frame of {declared} bytes exceeds the maximum of {max} bytes")]
    TooLarge { declared: u32, max: u32 },
    /// The payload is not a valid message. The frame boundary is intact, so
    /// the connection can go on with the next frame.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Finds the first complete frame in `buffer`.
///
/// Returns `Ok(None)` while more bytes are needed, or the payload and the
/// number of bytes the whole frame occupies. The declared length is checked
/// against [`MAX_FRAME_LEN`] before anything is buffered for it.
pub fn split_frame(buffer: &[u8]) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(prefix) = buffer.first_chunk::<LENGTH_PREFIX_LEN>() else {
        return Ok(None);
    };
    let declared = u32::from_le_bytes(*prefix);
    if declared > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            declared,
            max: MAX_FRAME_LEN,
        });
    }
    let frame_len = LENGTH_PREFIX_LEN + declared as usize;
    Ok(buffer
        .get(LENGTH_PREFIX_LEN..frame_len)
        .map(|payload| (payload, frame_len)))
}

/// The bytes read from one stream, cut into frames: the framing codec of
/// both the server and the client. Pure: the caller reads into
/// [`read_space`](Self::read_space) and takes payloads out. Nothing is
/// allocated before the first read.
#[derive(Debug, Default)]
pub struct FrameReader {
    buffer: BytesMut,
}

impl FrameReader {
    pub fn new() -> Self {
        FrameReader::default()
    }

    /// The buffer the next read appends to, with room made for it.
    pub fn read_space(&mut self) -> &mut BytesMut {
        self.buffer.reserve(READ_CHUNK);
        &mut self.buffer
    }

    /// The buffer as it is, for a caller that manages its room itself
    /// ([`room`](Self::room), [`reclaim`](Self::reclaim),
    /// [`reallocate`](Self::reallocate)).
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// The payload of the next complete frame, `Ok(None)` while more bytes
    /// are needed, or the error of an oversized length (checked before
    /// anything is buffered for it).
    pub fn next_payload(&mut self) -> Result<Option<Bytes>, FrameError> {
        let Some((_, frame_len)) = split_frame(&self.buffer)? else {
            return Ok(None);
        };
        let mut frame = self.buffer.split_to(frame_len).freeze();
        frame.advance(LENGTH_PREFIX_LEN);
        Ok(Some(frame))
    }

    /// Bytes received but not yet taken as a frame.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Bytes the buffer can hold from the first byte not yet taken, without
    /// growing.
    pub fn room(&self) -> usize {
        self.buffer.capacity()
    }

    /// Length prefix included, the size of the frame whose bytes are
    /// arriving, once its prefix is in (and within [`MAX_FRAME_LEN`]); 0
    /// before that.
    pub fn incomplete_frame_len(&self) -> usize {
        match self.buffer.first_chunk::<LENGTH_PREFIX_LEN>() {
            Some(prefix) if u32::from_le_bytes(*prefix) <= MAX_FRAME_LEN => {
                LENGTH_PREFIX_LEN + u32::from_le_bytes(*prefix) as usize
            }
            _ => 0,
        }
    }

    /// Makes [`room`](Self::room) for `capacity` bytes inside the present
    /// allocation (moving what is buffered to its front); false when it
    /// cannot, without allocating.
    pub fn reclaim(&mut self, capacity: usize) -> bool {
        let additional = capacity.saturating_sub(self.buffer.len());
        self.buffer.try_reclaim(additional)
    }

    /// Moves what is buffered into a new allocation of exactly `capacity`
    /// bytes (at least what is buffered), letting the old one go: how a
    /// buffer grows for one large frame, and gives the memory back after.
    pub fn reallocate(&mut self, capacity: usize) {
        let mut buffer = BytesMut::with_capacity(capacity.max(self.buffer.len()));
        buffer.extend_from_slice(&self.buffer);
        self.buffer = buffer;
    }
}

/// Decodes one payload that must hold exactly one `T` and nothing after it.
///
/// Allocates at most sixteen times the payload's length (1 KiB for the
/// smallest), however long the strings and lists it declares: a declared
/// length its bytes cannot hold is malformed before it is allocated.
pub fn decode_payload<T: Decode<()>>(payload: &[u8]) -> Result<T, FrameError> {
    if payload.len() > MAX_FRAME_LEN as usize {
        return Err(FrameError::TooLarge {
            declared: u32::try_from(payload.len()).unwrap_or(u32::MAX),
            max: MAX_FRAME_LEN,
        });
    }
    /// One arm per claim bound from 2^[`MIN_CLAIM_BITS`] up; the last,
    /// 2^[`MAX_CLAIM_BITS`], takes the rest.
    macro_rules! claiming_at_most {
        ($($bits:literal)*) => {
            match claim_bits(payload.len()) {
                $($bits => decode_claiming::<T, { 1 << $bits }>(payload),)*
                _ => decode_claiming::<T, { 1 << MAX_CLAIM_BITS }>(payload),
            }
        };
    }
    claiming_at_most!(10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
}

/// [`decode_payload`] with bincode claiming at most `LIMIT` bytes.
fn decode_claiming<T: Decode<()>, const LIMIT: usize>(payload: &[u8]) -> Result<T, FrameError> {
    let config: WireConfig<LIMIT> = bincode::config::legacy().with_limit::<LIMIT>();
    let (message, consumed) = bincode::decode_from_slice(payload, config)
        .map_err(|error| FrameError::Malformed(error.to_string()))?;
    if consumed != payload.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            payload.len() - consumed
        )));
    }
    Ok(message)
}

/// The request id of a payload that failed to decode, so the error can be
/// addressed to the request; every client frame starts with its `u64` id.
pub fn request_id_hint(payload: &[u8]) -> Option<u64> {
    payload.first_chunk::<8>().map(|id| u64::from_le_bytes(*id))
}

/// The request tag of a client payload that failed to decode, so that a
/// request this daemon does not know yet can be told apart from a broken one.
pub fn request_tag_hint(payload: &[u8]) -> Option<u32> {
    payload
        .get(8..12)
        .map(|tag| u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]]))
}

/// The `Cost` tag of an `Acquire` or `Estimate` payload that failed to
/// decode, so that a cost of a later protocol revision can be told apart
/// from a broken one. Reads only the fields in front of the cost.
pub fn cost_tag_hint(payload: &[u8]) -> Option<u32> {
    fn string(payload: &[u8], at: usize) -> Option<usize> {
        let length = u64::from_le_bytes(*payload.get(at..)?.first_chunk::<8>()?);
        (at + 8).checked_add(usize::try_from(length).ok()?)
    }
    fn optional_string(payload: &[u8], at: usize) -> Option<usize> {
        match payload.get(at)? {
            0 => Some(at + 1),
            1 => string(payload, at + 1),
            _ => None,
        }
    }
    let cost_at = match request_tag_hint(payload)? {
        // Acquire: limit, tenant, priority, cost.
        1 => {
            let at = string(payload, 12)?;
            let at = optional_string(payload, at)?;
            optional_string(payload, at)?
        }
        // Estimate: limit, cost.
        5 => string(payload, 12)?,
        _ => return None,
    };
    let tag = payload.get(cost_at..)?.first_chunk::<4>()?;
    Some(u32::from_le_bytes(*tag))
}

/// The `protocol_version` of a payload that starts like a `Hello` (request
/// id, tag 0, version), even if the rest does not decode: a future version may
/// extend `Hello`, and must still be told which version this daemon speaks.
pub fn hello_version_hint(payload: &[u8]) -> Option<u16> {
    let tag = payload.get(8..12)?;
    let version = payload.get(12..14)?;
    (tag == [0, 0, 0, 0]).then(|| u16::from_le_bytes([version[0], version[1]]))
}

/// Appends `message` to `out` as one frame (length prefix and payload).
pub fn encode_frame<T: Encode>(message: &T, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX_LEN]);
    bincode::encode_into_std_write(message, out, bincode::config::legacy())
        .map_err(|error| FrameError::Malformed(error.to_string()))?;
    let payload_len = out.len() - start - LENGTH_PREFIX_LEN;
    match u32::try_from(payload_len) {
        Ok(len) if len <= MAX_FRAME_LEN => {
            out[start..start + LENGTH_PREFIX_LEN].copy_from_slice(&len.to_le_bytes());
            Ok(())
        }
        _ => {
            out.truncate(start);
            Err(FrameError::TooLarge {
                declared: u32::try_from(payload_len).unwrap_or(u32::MAX),
                max: MAX_FRAME_LEN,
            })
        }
    }
}

#[cfg(test)]
mod tests;
