//! Point-to-point links between two ranks. A link moves frames (a 32-byte header + payload)
//! in order, in both directions; matching by tag and collectives live above, in `comm`.
//! Every blocking call takes an idle timeout (the longest time without progress) and fails
//! with `Timeout`/`PeerDied` naming the peer.

pub(crate) mod handshake;
#[cfg(feature = "cuda")]
pub(crate) mod nccl;
pub(crate) mod shm;
pub(crate) mod tcp;

use crate::error::{Result, TransportError};
use crate::plan::BackendKind;
use std::time::Duration;

const MAGIC: u32 = 0x544e_4431; // "TND1"
/// Encoded header size.
pub(crate) const HEADER_LEN: usize = 32;

/// Identifies the stream a message belongs to: (communicator id, message kind, tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MsgKey {
    /// Group id (hash of the group's world ranks).
    pub group: u32,
    /// 0 = user p2p, others = collectives.
    pub kind: u32,
    /// User tag or collective step.
    pub tag: u32,
}

/// Frame header on the wire. Bytes 24..32 are zero on the wire except where a backend uses
/// them (shm: byte 24 flags a single-copy descriptor frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub key: MsgKey,
    pub len: u64,
}

impl FrameHeader {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.key.kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.key.group.to_le_bytes());
        b[12..16].copy_from_slice(&self.key.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; HEADER_LEN], peer: &PeerInfo) -> Result<Self> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if word(0) != MAGIC {
            return Err(TransportError::Protocol {
                peer: peer.to_string(),
                msg: format!("bad frame magic {:#x}", word(0)),
            });
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&b[16..24]);
        Ok(FrameHeader {
            key: MsgKey {
                kind: word(4),
                group: word(8),
                tag: word(12),
            },
            len: u64::from_le_bytes(len),
        })
    }
}

/// Who is on the other end, for error messages.
#[derive(Debug, Clone)]
pub(crate) struct PeerInfo {
    pub rank: usize,
    pub addr: String,
    pub timeout: Duration,
}

impl std::fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} ({})", self.rank, self.addr)
    }
}

impl PeerInfo {
    pub(crate) fn timeout(&self, what: &str) -> TransportError {
        TransportError::Timeout {
            rank: self.rank,
            addr: self.addr.clone(),
            what: what.into(),
            timeout: self.timeout,
        }
    }
    pub(crate) fn died(&self, what: &str) -> TransportError {
        TransportError::PeerDied {
            rank: self.rank,
            addr: self.addr.clone(),
            what: what.into(),
        }
    }
}

/// One direction-agnostic link. Callers serialise senders and receivers separately (one
/// sender and one receiver may run concurrently).
pub(crate) trait Link: Send + Sync {
    /// Sends one frame.
    fn send_frame(&self, hdr: &FrameHeader, payload: &[u8], idle: Duration) -> Result<()>;
    /// Receives the next header. On `Err(Timeout)` with `clean == true` nothing was consumed
    /// and the link stays usable.
    fn recv_header(&self, idle: Duration) -> Result<FrameHeader, (TransportError, bool)>;
    /// Receives exactly `buf.len()` payload bytes of the current frame.
    fn recv_payload(&self, buf: &mut [u8], idle: Duration) -> Result<()>;
    /// Consumes and drops `len` payload bytes of the current frame.
    fn discard_payload(&self, mut len: u64, idle: Duration) -> Result<()> {
        let mut scratch = vec![0u8; (len.min(1 << 20)) as usize];
        while len > 0 {
            let n = len.min(scratch.len() as u64) as usize;
            self.recv_payload(&mut scratch[..n], idle)?;
            len -= n as u64;
        }
        Ok(())
    }
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Path counters of a shm link (`None` for other backends).
    fn shm_stats(&self) -> Option<shm::ShmStats> {
        None
    }
    /// The shm link itself (liveness, fd passing for broadcast segments); `None` for other
    /// backends.
    fn as_shm(&self) -> Option<&shm::ShmLink> {
        None
    }
    /// Peer identity.
    fn peer(&self) -> &PeerInfo;
}
