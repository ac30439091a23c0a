//! TCP link: one `TcpStream` per pair with TCP_NODELAY; frames are header + payload.
//! Blocking reads and writes run in 100 ms timeout slices (SO_RCVTIMEO/SO_SNDTIMEO, set once)
//! so the idle deadline is honoured within one slice.

use super::{FrameHeader, HEADER_LEN, Link, PeerInfo};
use crate::error::{Result, TransportError};
use crate::plan::BackendKind;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Blocking slice; bounds how late a deadline is noticed.
const SLICE: Duration = Duration::from_millis(100);

pub(crate) struct TcpLink {
    stream: TcpStream,
    peer: PeerInfo,
}

impl TcpLink {
    pub(crate) fn new(stream: TcpStream, peer: PeerInfo) -> Result<Self> {
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(SLICE)))
            .and_then(|()| stream.set_write_timeout(Some(SLICE)))
            .map_err(|e| TransportError::io(format!("configuring the socket to {peer}"), e))?;
        Ok(TcpLink { stream, peer })
    }

    fn is_dead(e: &std::io::Error) -> bool {
        matches!(
            e.kind(),
            ErrorKind::BrokenPipe
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::UnexpectedEof
                | ErrorKind::NotConnected
        )
    }

    /// Reads exactly `buf.len()` bytes; returns how many were read before an error.
    fn read_exact_by(
        &self,
        buf: &mut [u8],
        idle: Duration,
        what: &str,
    ) -> Result<(), (TransportError, usize)> {
        let mut done = 0;
        let mut deadline = Instant::now() + idle;
        let mut s = &self.stream;
        while done < buf.len() {
            match s.read(&mut buf[done..]) {
                Ok(0) => return Err((self.peer.died(what), done)),
                Ok(n) => {
                    done += n;
                    deadline = Instant::now() + idle;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return Err((self.peer.timeout(what), done));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if Self::is_dead(&e) => return Err((self.peer.died(what), done)),
                Err(e) => {
                    return Err((
                        TransportError::io(format!("{what} from {}", self.peer), e),
                        done,
                    ));
                }
            }
        }
        Ok(())
    }

    fn write_all_by(&self, mut bufs: &mut [IoSlice<'_>], idle: Duration) -> Result<()> {
        let what = "send";
        let mut deadline = Instant::now() + idle;
        let mut s = &self.stream;
        while !bufs.is_empty() {
            match s.write_vectored(bufs) {
                Ok(0) => return Err(self.peer.died(what)),
                Ok(n) => {
                    IoSlice::advance_slices(&mut bufs, n);
                    deadline = Instant::now() + idle;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return Err(self.peer.timeout(what));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if Self::is_dead(&e) => return Err(self.peer.died(what)),
                Err(e) => return Err(TransportError::io(format!("send to {}", self.peer), e)),
            }
        }
        Ok(())
    }
}

impl Link for TcpLink {
    fn send_frame(&self, hdr: &FrameHeader, payload: &[u8], idle: Duration) -> Result<()> {
        let h = hdr.encode();
        let mut bufs = [IoSlice::new(&h), IoSlice::new(payload)];
        self.write_all_by(&mut bufs, idle)
    }

    fn recv_header(&self, idle: Duration) -> Result<FrameHeader, (TransportError, bool)> {
        let mut b = [0u8; HEADER_LEN];
        self.read_exact_by(&mut b, idle, "recv")
            .map_err(|(e, n)| (e, n == 0))?;
        FrameHeader::decode(&b, &self.peer).map_err(|e| (e, false))
    }

    fn recv_payload(&self, buf: &mut [u8], idle: Duration) -> Result<()> {
        self.read_exact_by(buf, idle, "recv").map_err(|(e, _)| e)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Tcp
    }

    fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}
