//! What connections may buffer for frames that have not fully arrived: one
//! read chunk each, allocated when the first byte arrives, and beyond it
//! only what a shared budget grants (`server.max_buffered_bytes`). A buffer
//! grown for a large frame is given back once the frame is taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;

use crate::proto::FrameReader;

/// Bytes every connection may buffer without drawing on the budget: its
/// read chunk, which holds hundreds of pipelined acquires.
pub(crate) const READ_CHUNK: usize = 4 * 1024;

/// The bytes all connections together may hold beyond their read chunks.
#[derive(Debug)]
pub(crate) struct BufferBudget {
    free: AtomicUsize,
}

impl BufferBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        BufferBudget {
            free: AtomicUsize::new(bytes),
        }
    }

    /// Takes `bytes` if that many are free.
    fn take(&self, bytes: usize) -> bool {
        self.free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                free.checked_sub(bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.free.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Bytes not taken.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.free.load(Ordering::Acquire)
    }
}

/// A frame the budget cannot make room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    /// The frame's size, length prefix included.
    pub frame_len: usize,
}

/// One connection's [`FrameReader`] under the shared budget.
#[derive(Debug)]
pub(crate) struct ConnectionBuffer {
    frames: FrameReader,
    /// Bytes of the allocation beyond [`READ_CHUNK`], taken from `budget`.
    charged: usize,
    budget: Arc<BufferBudget>,
}

impl ConnectionBuffer {
    pub(crate) fn new(budget: Arc<BufferBudget>) -> Self {
        ConnectionBuffer {
            frames: FrameReader::new(),
            charged: 0,
            budget,
        }
    }

    /// The frames received so far.
    pub(crate) fn frames(&mut self) -> &mut FrameReader {
        &mut self.frames
    }

    /// Bytes received but not yet taken as a frame.
    pub(crate) fn buffered(&self) -> usize {
        self.frames.buffered()
    }

    /// The buffer the next read appends to: room for a read chunk, or for
    /// the whole of a larger frame whose prefix is in, drawn from the budget
    /// in one piece so that a frame never holds part of it for nothing.
    pub(crate) fn read_space(&mut self) -> Result<&mut BytesMut, Exhausted> {
        let frame_len = self.frames.incomplete_frame_len();
        if frame_len > READ_CHUNK {
            if self.frames.room() < frame_len {
                self.charge(frame_len - READ_CHUNK)
                    .map_err(|()| Exhausted { frame_len })?;
                self.frames.reallocate(frame_len);
            }
        } else if self.frames.room() < READ_CHUNK && !self.frames.reclaim(READ_CHUNK) {
            self.charge(0).expect("giving back always succeeds");
            self.frames.reallocate(READ_CHUNK);
        }
        Ok(self.frames.buffer_mut())
    }

    /// After frames were taken: gives back a buffer grown for a large frame
    /// once what remains fits in a read chunk.
    pub(crate) fn shrink(&mut self) {
        if self.charged > 0
            && self.frames.buffered() <= READ_CHUNK
            && self.frames.incomplete_frame_len() <= READ_CHUNK
        {
            self.charge(0).expect("giving back always succeeds");
            self.frames.reallocate(READ_CHUNK);
        }
    }

    /// Holds exactly `bytes` of the budget, taking or giving back the
    /// difference; `Err` when the budget cannot cover it.
    fn charge(&mut self, bytes: usize) -> Result<(), ()> {
        if bytes > self.charged {
            if !self.budget.take(bytes - self.charged) {
                return Err(());
            }
        } else {
            self.budget.give_back(self.charged - bytes);
        }
        self.charged = bytes;
        Ok(())
    }
}

impl Drop for ConnectionBuffer {
    fn drop(&mut self) {
        self.budget.give_back(self.charged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::MAX_FRAME_LEN;

    fn prefix(len: u32) -> [u8; 4] {
        len.to_le_bytes()
    }

    #[test]
    fn nothing_is_allocated_before_the_first_read() {
        let budget = Arc::new(BufferBudget::new(0));
        let mut buffer = ConnectionBuffer::new(budget);
        assert_eq!(buffer.frames().room(), 0);
        assert!(buffer.read_space().unwrap().capacity() >= READ_CHUNK);
    }

    #[test]
    fn a_large_frame_draws_on_the_budget_and_gives_it_back() {
        let budget = Arc::new(BufferBudget::new(MAX_FRAME_LEN as usize));
        let mut buffer = ConnectionBuffer::new(budget.clone());
        let frame_len = 1_000_000;
        buffer
            .read_space()
            .unwrap()
            .extend_from_slice(&prefix(frame_len - 4));
        let space = buffer.read_space().unwrap();
        assert_eq!(space.capacity(), frame_len as usize);
        assert_eq!(
            budget.free(),
            MAX_FRAME_LEN as usize - (frame_len as usize - READ_CHUNK)
        );
        space.resize(frame_len as usize, 0);
        let payload = buffer.frames().next_payload().unwrap().unwrap();
        assert_eq!(payload.len(), frame_len as usize - 4);
        buffer.shrink();
        assert_eq!(budget.free(), MAX_FRAME_LEN as usize);
        assert_eq!(buffer.frames().room(), READ_CHUNK);
        drop(payload);
    }

    #[test]
    fn a_frame_the_budget_cannot_hold_is_refused_and_charges_nothing() {
        let budget = Arc::new(BufferBudget::new(100_000));
        let mut buffer = ConnectionBuffer::new(budget.clone());
        buffer
            .read_space()
            .unwrap()
            .extend_from_slice(&prefix(200_000));
        assert_eq!(
            buffer.read_space().unwrap_err(),
            Exhausted { frame_len: 200_004 }
        );
        assert_eq!(budget.free(), 100_000);
        // A frame that fits the budget still arrives on another connection.
        let mut other = ConnectionBuffer::new(budget.clone());
        other
            .read_space()
            .unwrap()
            .extend_from_slice(&prefix(90_000));
        assert!(other.read_space().is_ok());
        drop(other);
        assert_eq!(budget.free(), 100_000);
    }

    #[test]
    fn small_frames_reuse_the_read_chunk() {
        let budget = Arc::new(BufferBudget::new(0));
        let mut buffer = ConnectionBuffer::new(budget);
        for _ in 0..1000 {
            let space = buffer.read_space().unwrap();
            space.extend_from_slice(&prefix(60));
            space.extend_from_slice(&[0; 60]);
            let pointer = space.as_ptr();
            assert!(buffer.frames().next_payload().unwrap().is_some());
            buffer.shrink();
            let space = buffer.read_space().unwrap();
            // The same allocation, its room reclaimed: no allocation per frame.
            assert_eq!(space.as_ptr(), pointer);
        }
    }
}
