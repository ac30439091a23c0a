//! The plugin's end of the control channel to rank 0: 4-byte big-endian length + UTF-8
//! JSON frames over loopback TCP (the Python side is `tandem_torchrun/channel.py`).
//!
//! JSON, not the host's MessagePack: the worker runs in the pinned venv, whose standard
//! library has no MessagePack codec; the payloads are token ids, logprobs and metrics.
//! Reads wait in short slices so a caller can notice the worker dying or a deadline passing
//! instead of blocking forever.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Largest frame accepted (a malformed length must not allocate gigabytes).
const MAX_FRAME: usize = 1 << 30;
/// Read slice: how often a waiting read looks at the worker and the deadline.
const SLICE: Duration = Duration::from_millis(200);

/// Why a channel operation failed.
#[derive(Debug)]
pub enum ChannelError {
    /// The deadline passed.
    Timeout,
    /// `alive` said the worker is gone (its exit status).
    Dead(String),
    /// The socket failed or the peer closed it.
    Io(std::io::Error),
    /// A frame was not valid JSON or too large.
    Protocol(String),
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelError::Timeout => write!(f, "timed out"),
            ChannelError::Dead(s) => write!(f, "the worker exited ({s})"),
            ChannelError::Io(e) => write!(f, "{e}"),
            ChannelError::Protocol(s) => write!(f, "protocol error: {s}"),
        }
    }
}

/// A connected channel.
pub struct Channel {
    stream: TcpStream,
}

impl Channel {
    /// Wraps an accepted connection.
    pub fn new(stream: TcpStream) -> std::io::Result<Channel> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(SLICE))?;
        Ok(Channel { stream })
    }

    /// Sends one frame.
    pub fn send(&mut self, value: &Value) -> Result<(), ChannelError> {
        let body = serde_json::to_vec(value).map_err(|e| ChannelError::Protocol(e.to_string()))?;
        let len = u32::try_from(body.len())
            .map_err(|_| ChannelError::Protocol(format!("frame of {} bytes", body.len())))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).map_err(ChannelError::Io)
    }

    /// Receives one frame before `deadline`; `alive` returns `Some(status)` once the worker
    /// has exited.
    pub fn recv(
        &mut self,
        deadline: Instant,
        alive: &dyn Fn() -> Option<String>,
    ) -> Result<Value, ChannelError> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len, deadline, alive)?;
        let n = u32::from_be_bytes(len) as usize;
        if n > MAX_FRAME {
            return Err(ChannelError::Protocol(format!("frame of {n} bytes")));
        }
        let mut body = vec![0u8; n];
        self.read_exact(&mut body, deadline, alive)?;
        serde_json::from_slice(&body).map_err(|e| ChannelError::Protocol(e.to_string()))
    }

    fn read_exact(
        &mut self,
        buf: &mut [u8],
        deadline: Instant,
        alive: &dyn Fn() -> Option<String>,
    ) -> Result<(), ChannelError> {
        let mut got = 0;
        while got < buf.len() {
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    // Closed: prefer the worker's exit status when it has one.
                    std::thread::sleep(SLICE);
                    return Err(match alive() {
                        Some(s) => ChannelError::Dead(s),
                        None => ChannelError::Io(std::io::Error::new(
                            ErrorKind::UnexpectedEof,
                            "rank 0 closed the control channel",
                        )),
                    });
                }
                Ok(k) => got += k,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if let Some(s) = alive() {
                        return Err(ChannelError::Dead(s));
                    }
                    if Instant::now() >= deadline {
                        return Err(ChannelError::Timeout);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(ChannelError::Io(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn frames_round_trip_and_a_deadline_is_kept() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut len = [0u8; 4];
            s.read_exact(&mut len).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            s.read_exact(&mut body).unwrap();
            // Echo back in two pieces to exercise partial reads.
            let mut frame = len.to_vec();
            frame.extend_from_slice(&body);
            s.write_all(&frame[..3]).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            s.write_all(&frame[3..]).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
        });
        let (s, _) = l.accept().unwrap();
        let mut c = Channel::new(s).unwrap();
        let v = serde_json::json!({"op": "x", "args": {"lp": [-0.1f32 as f64]}});
        c.send(&v).unwrap();
        let far = Instant::now() + Duration::from_secs(10);
        assert_eq!(c.recv(far, &|| None).unwrap(), v);
        let soon = Instant::now() + Duration::from_millis(400);
        assert!(matches!(c.recv(soon, &|| None), Err(ChannelError::Timeout)));
        let dead = c.recv(far, &|| Some("exit status: 1".into()));
        assert!(matches!(dead, Err(ChannelError::Dead(_))));
        peer.join().unwrap();
    }
}
