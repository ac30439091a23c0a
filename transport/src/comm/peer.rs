//! One peer of a rank: its link, a send lock, and the receive side with tag matching. A frame
//! whose key does not match the posted receive is stashed (copied to the heap) and handed to
//! a later receive with that key, so sends with different tags may arrive in any order.
//!
//! Invariant: frames of one key between one pair are delivered in send order. A link that
//! failed mid-frame is marked broken and refuses further use.

use crate::error::{Result, TransportError};
use crate::link::{Link, MsgKey};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub(crate) struct Peer {
    link: Box<dyn Link>,
    send: Mutex<()>,
    recv: Mutex<VecDeque<(MsgKey, Vec<u8>)>>,
    broken: Mutex<Option<String>>,
    me: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Peer {
    pub(crate) fn new(link: Box<dyn Link>, me: usize) -> Self {
        Peer {
            link,
            send: Mutex::new(()),
            recv: Mutex::new(VecDeque::new()),
            broken: Mutex::new(None),
            me,
        }
    }

    pub(crate) fn link(&self) -> &dyn Link {
        &*self.link
    }

    fn check(&self) -> Result<()> {
        match &*lock(&self.broken) {
            None => Ok(()),
            Some(cause) => Err(TransportError::Broken {
                rank: self.link.peer().rank,
                addr: self.link.peer().addr.clone(),
                cause: cause.clone(),
            }),
        }
    }

    fn poison(&self, e: TransportError) -> TransportError {
        let mut b = lock(&self.broken);
        if b.is_none() {
            *b = Some(e.to_string());
        }
        e
    }

    /// Sends one message.
    pub(crate) fn send(&self, key: MsgKey, data: &[u8], idle: Duration) -> Result<()> {
        let _g = lock(&self.send);
        self.check()?;
        let hdr = crate::link::FrameHeader {
            key,
            len: data.len() as u64,
        };
        self.link
            .send_frame(&hdr, data, idle)
            .map_err(|e| self.poison(e))
    }

    /// Receives the next message with `key` into `buf` (exact size).
    pub(crate) fn recv(&self, key: MsgKey, buf: &mut [u8], idle: Duration) -> Result<()> {
        let mut stash = lock(&self.recv);
        self.check()?;
        if let Some(i) = stash.iter().position(|(k, _)| *k == key) {
            let v = stash.remove(i).map(|(_, v)| v).unwrap_or_default();
            if v.len() != buf.len() {
                return Err(self.mismatch(key, v.len() as u64, buf.len()));
            }
            buf.copy_from_slice(&v);
            return Ok(());
        }
        loop {
            let hdr = match self.link.recv_header(idle) {
                Ok(h) => h,
                Err((e, true)) => return Err(e),
                Err((e, false)) => return Err(self.poison(e)),
            };
            if hdr.key == key {
                if hdr.len != buf.len() as u64 {
                    self.link
                        .discard_payload(hdr.len, idle)
                        .map_err(|e| self.poison(e))?;
                    return Err(self.mismatch(key, hdr.len, buf.len()));
                }
                return self
                    .link
                    .recv_payload(buf, idle)
                    .map_err(|e| self.poison(e));
            }
            let len = usize::try_from(hdr.len).map_err(|_| {
                self.poison(TransportError::Protocol {
                    peer: self.link.peer().to_string(),
                    msg: format!("frame of {} bytes cannot be buffered", hdr.len),
                })
            })?;
            let mut v = vec![0u8; len];
            self.link
                .recv_payload(&mut v, idle)
                .map_err(|e| self.poison(e))?;
            stash.push_back((hdr.key, v));
        }
    }

    fn mismatch(&self, key: MsgKey, sent: u64, expected: usize) -> TransportError {
        TransportError::SizeMismatch {
            src: self.link.peer().rank,
            dst: self.me,
            tag: key.tag,
            sent,
            expected: expected as u64,
        }
    }
}
