//! Length-prefixed MessagePack frames: a 4-byte big-endian body length, then the body as
//! `rmp-serde` encodes it. A frame is written with one `write_all` of a single buffer, so
//! writers sharing a stream behind a mutex never interleave.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{self, Read, Write};

/// Largest frame body accepted after the handshake (1 GiB). Bulk data belongs on the data
/// plane (`tandem-transport`); the control plane carries requests, token ids and metrics.
pub const MAX_FRAME_BYTES: u32 = 1 << 30;

/// Largest frame accepted before a peer has proved it holds the run token (64 KiB), so an
/// unauthenticated peer cannot make the controller allocate much.
pub const MAX_HELLO_BYTES: u32 = 64 << 10;

/// Why reading or writing a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection at a frame boundary.
    #[error("connection closed by peer")]
    Closed,
    /// Socket error (including a read or write timeout).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A frame announced more bytes than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// The limit in force.
        max: u32,
    },
    /// The body was not a valid message of the expected type.
    #[error("undecodable message: {0}")]
    Decode(String),
    /// The message could not be encoded (a bug: every message type is serialisable).
    #[error("unencodable message: {0}")]
    Encode(String),
}

impl FrameError {
    /// `true` for a read or write that hit the socket's timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Io(e)
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

/// Encodes `message` into one frame (length prefix included).
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    rmp_serde::encode::write(&mut buf, message).map_err(|e| FrameError::Encode(e.to_string()))?;
    let len = u32::try_from(buf.len() - 4)
        .ok()
        .filter(|&l| l <= MAX_FRAME_BYTES)
        .ok_or(FrameError::TooLarge {
            len: u32::MAX,
            max: MAX_FRAME_BYTES,
        })?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// Writes one frame.
pub fn write<T: Serialize>(w: &mut impl Write, message: &T) -> Result<(), FrameError> {
    let buf = encode(message)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame whose body is at most `max` bytes and decodes it.
pub fn read<T: DeserializeOwned>(r: &mut impl Read, max: u32) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    // A clean close before the first byte of a frame is `Closed`, not an I/O error.
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    rmp_serde::from_slice(&body).map_err(|e| FrameError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let msg = (7u64, "hello".to_string(), vec![1.5f32, -2.0]);
        let mut wire = Vec::new();
        write(&mut wire, &msg).unwrap();
        write(&mut wire, &msg).unwrap();
        let mut r = wire.as_slice();
        let a: (u64, String, Vec<f32>) = read(&mut r, MAX_FRAME_BYTES).unwrap();
        let b: (u64, String, Vec<f32>) = read(&mut r, MAX_FRAME_BYTES).unwrap();
        assert_eq!(a, msg);
        assert_eq!(b, msg);
        assert!(matches!(
            read::<u8>(&mut r, MAX_FRAME_BYTES),
            Err(FrameError::Closed)
        ));
        // The limit is checked before the body is allocated.
        let mut r = wire.as_slice();
        assert!(matches!(
            read::<(u64, String, Vec<f32>)>(&mut r, 4),
            Err(FrameError::TooLarge { max: 4, .. })
        ));
        // A truncated frame is an I/O error, not a clean close.
        let mut r = &wire[..wire.len() / 2 - 1];
        assert!(matches!(
            read::<(u64, String, Vec<f32>)>(&mut r, MAX_FRAME_BYTES),
            Err(FrameError::Io(_))
        ));
        // Garbage decodes to an error, not a panic.
        let junk: Vec<u8> = vec![0, 0, 0, 3, 0xc1, 0xc1, 0xc1];
        let mut r = junk.as_slice();
        assert!(matches!(
            read::<(u64, String)>(&mut r, MAX_FRAME_BYTES),
            Err(FrameError::Decode(_))
        ));
    }
}
