//! Passing a file descriptor between the two ends of a shm link: a 16-byte message `{magic,
//! tag, value}` with the fd attached (SCM_RIGHTS) on the link's Unix socket, the one that is
//! otherwise only watched for liveness. Used to hand a group's broadcast segment to its
//! members. Messages for other tags (another group set up concurrently) are kept in an inbox
//! until asked for.
//!
//! While a message sits unread, the liveness peek sees bytes and reports the peer alive; the
//! protocol reads every message at once (the members are in the same collective call).

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x544e_4446; // "TNDF"
const MSG_LEN: usize = 16;

/// A received message: the value and the fd, if one was attached.
pub(crate) type Received = (u64, Option<OwnedFd>);

/// Messages received for tags nobody asked for yet.
#[derive(Default)]
pub(crate) struct Inbox {
    stash: Mutex<Vec<(u32, Received)>>,
}

/// How receiving failed.
#[derive(Debug)]
pub(crate) enum RecvEnd {
    /// Nothing arrived within the idle timeout.
    Timeout,
    /// The peer closed its socket (its process is gone).
    Dead,
    /// The bytes are not a message of this protocol.
    Protocol(String),
}

/// Sends `{tag, value}` and `fd` (if any).
pub(crate) fn send(
    sock: &UnixStream,
    tag: u32,
    value: u64,
    fd: Option<BorrowedFd<'_>>,
    idle: Duration,
) -> Result<(), Errno> {
    let mut msg = [0u8; MSG_LEN];
    msg[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    msg[4..8].copy_from_slice(&tag.to_le_bytes());
    msg[8..16].copy_from_slice(&value.to_le_bytes());
    let fds: Vec<i32> = fd.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg: Vec<ControlMessage<'_>> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    let deadline = Instant::now() + idle;
    loop {
        // A 16-byte message on an idle stream socket is taken whole or not at all.
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&msg)],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(n) if n == MSG_LEN => return Ok(()),
            Ok(_) => return Err(Errno::EMSGSIZE),
            Err(Errno::EAGAIN | Errno::EINTR) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Receives the message for `tag`, waiting at most `idle` (in 1 ms sleeps).
pub(crate) fn recv(
    sock: &UnixStream,
    inbox: &Inbox,
    tag: u32,
    idle: Duration,
) -> Result<Received, RecvEnd> {
    let deadline = Instant::now() + idle;
    loop {
        {
            let mut stash = inbox.stash.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(i) = stash.iter().position(|(t, _)| *t == tag) {
                return Ok(stash.remove(i).1);
            }
            while let Some((t, m)) = recv_one(sock, deadline)? {
                if t == tag {
                    return Ok(m);
                }
                stash.push((t, m));
            }
        }
        if Instant::now() >= deadline {
            return Err(RecvEnd::Timeout);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One message if one is waiting (`None` when the socket is empty).
fn recv_one(sock: &UnixStream, deadline: Instant) -> Result<Option<(u32, Received)>, RecvEnd> {
    let mut buf = [0u8; MSG_LEN];
    let mut got = 0;
    let mut fd = None;
    while got < MSG_LEN {
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let r = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        );
        let msg = match r {
            Ok(m) => m,
            Err(Errno::EAGAIN | Errno::EINTR) if got == 0 => return Ok(None),
            Err(Errno::EAGAIN | Errno::EINTR) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(Errno::EAGAIN) => return Err(RecvEnd::Timeout),
            Err(_) => return Err(RecvEnd::Dead),
        };
        if msg.bytes == 0 {
            return Err(RecvEnd::Dead);
        }
        let n = msg.bytes;
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    for raw in fds {
                        // SAFETY: the kernel just installed `raw` in our fd table; we take
                        // sole ownership of it exactly once (extra fds are closed on drop).
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        fd.get_or_insert(owned);
                    }
                }
            }
        }
        got += n;
    }
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if word(0) != MAGIC {
        return Err(RecvEnd::Protocol(format!(
            "fd message with bad magic {:#x}",
            word(0)
        )));
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&buf[8..16]);
    Ok(Some((word(4), (u64::from_le_bytes(v), fd))))
}
