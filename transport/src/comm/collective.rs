//! Collectives built on the group's point-to-point links.
//!
//! - `broadcast`: through the group's shared segment when every pair of members is shm (see
//!   `bcast.rs`); otherwise a pipelined chain root -> root+1 -> ... in chunks, so every link
//!   streams at once and a 1 GiB broadcast costs about one 1 GiB transfer, not n-1 of them.
//! - `all_gather`: ring algorithm, n-1 steps; each step sends one block to the next rank on a
//!   scoped thread while receiving another block from the previous rank.
//! - `barrier`: dissemination barrier, ceil(log2 n) rounds of 1-byte messages.

use super::{Communicator, kind};
use crate::error::{Result, TransportError};

/// Broadcast chunk: big enough to amortise per-frame costs, small enough to pipeline.
const CHUNK: usize = 4 << 20;

impl Communicator {
    /// Copies `buf` of group rank `root` into `buf` on every other member. All members must
    /// pass buffers of the same length (a receiver whose length differs fails with
    /// `SizeMismatch` naming both). The root may return before the receivers have copied.
    pub fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let n = self.world_size();
        self.world_rank(root)?;
        if n == 1 || self.broadcast_shared(root, buf)? {
            return Ok(());
        }
        let pos = (self.rank() + n - root) % n;
        let prev = (self.rank() + n - 1) % n;
        let next = (self.rank() + 1) % n;
        // The first frame carries the total length so a mismatch names both sizes.
        let len = (buf.len() as u64).to_le_bytes();
        if pos == 0 {
            self.send_kind(next, &len, kind::BROADCAST, 0)?;
        } else {
            let mut theirs = [0u8; 8];
            self.recv_kind(prev, &mut theirs, kind::BROADCAST, 0)?;
            let sent = u64::from_le_bytes(theirs);
            if pos != n - 1 {
                self.send_kind(next, &theirs, kind::BROADCAST, 0)?;
            }
            if sent != buf.len() as u64 {
                // Still pass the root's chunks on, so the members after this one (and the
                // next broadcast) are not left waiting.
                self.chain_drain(sent, prev, (pos != n - 1).then_some(next))?;
                return Err(TransportError::SizeMismatch {
                    src: self.ranks()[root],
                    dst: self.global_rank(),
                    tag: 0,
                    sent,
                    expected: buf.len() as u64,
                });
            }
        }
        for chunk in buf.chunks_mut(CHUNK) {
            if pos != 0 {
                self.recv_kind(prev, chunk, kind::BROADCAST, 1)?;
            }
            if pos != n - 1 {
                self.send_kind(next, chunk, kind::BROADCAST, 1)?;
            }
        }
        Ok(())
    }

    /// Receives the `len` chunked bytes of a chain broadcast into scratch space and forwards
    /// them to `next`.
    fn chain_drain(&self, len: u64, prev: usize, next: Option<usize>) -> Result<()> {
        let mut scratch = vec![0u8; len.min(CHUNK as u64) as usize];
        let mut left = len;
        while left > 0 {
            let m = left.min(CHUNK as u64) as usize;
            self.recv_kind(prev, &mut scratch[..m], kind::BROADCAST, 1)?;
            if let Some(next) = next {
                self.send_kind(next, &scratch[..m], kind::BROADCAST, 1)?;
            }
            left -= m as u64;
        }
        Ok(())
    }

    /// Gathers every member's `input` into `output` (`output.len() == n * input.len()`), block
    /// i holding group rank i's input.
    pub fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let n = self.world_size();
        let b = input.len();
        if output.len() != n * b {
            return Err(TransportError::Invalid(format!(
                "all_gather output has {} bytes but {n} ranks x {b} input bytes = {} are needed",
                output.len(),
                n * b
            )));
        }
        let me = self.rank();
        output[me * b..(me + 1) * b].copy_from_slice(input);
        let next = (me + 1) % n;
        let prev = (me + n - 1) % n;
        for step in 0..n.saturating_sub(1) {
            let send_block = (me + n - step) % n;
            let recv_block = (me + n - step - 1) % n;
            let (src, dst) = split_blocks(output, b, send_block, recv_block);
            let step_tag = step as u32;
            std::thread::scope(|s| {
                let sender = s.spawn(|| self.send_kind(next, src, kind::ALL_GATHER, step_tag));
                let r = self.recv_kind(prev, dst, kind::ALL_GATHER, step_tag);
                let sr = sender.join().unwrap_or_else(|_| {
                    Err(TransportError::Invalid(
                        "all_gather send thread panicked".into(),
                    ))
                });
                r.and(sr)
            })?;
        }
        Ok(())
    }

    /// Returns once every member has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        let n = self.world_size();
        let me = self.rank();
        let mut dist = 1;
        let mut round = 0u32;
        while dist < n {
            self.send_kind((me + dist) % n, &[1], kind::BARRIER, round)?;
            let mut b = [0u8; 1];
            self.recv_kind((me + n - dist) % n, &mut b, kind::BARRIER, round)?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }
}

/// Borrows block `a` shared and block `b` mutably from `buf` (blocks of `size`, `a != b`).
fn split_blocks(buf: &mut [u8], size: usize, a: usize, b: usize) -> (&[u8], &mut [u8]) {
    if a < b {
        let (lo, hi) = buf.split_at_mut(b * size);
        (&lo[a * size..(a + 1) * size], &mut hi[..size])
    } else {
        let (lo, hi) = buf.split_at_mut(a * size);
        (&hi[..size], &mut lo[b * size..(b + 1) * size])
    }
}
