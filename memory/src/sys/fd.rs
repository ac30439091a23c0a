//! Descriptors: sealed memfds, their size and allocated bytes, hole punching and allocation,
//! `pwrite`, `dup`, and passing descriptors over a Unix socket (`SCM_RIGHTS`).

use std::ffi::CStr;
use std::io::{IoSlice, IoSliceMut};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::error::{MemoryError, Result};

/// Creates a close-on-exec memfd of `len` bytes whose size is sealed (no other process can
/// shrink it under our mapping, which would turn accesses into SIGBUS).
pub(crate) fn create_memfd(name: &CStr, len: usize) -> Result<OwnedFd> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(|e| MemoryError::errno("memfd_create", e))?;
    let len_off = i64::try_from(len)
        .map_err(|_| MemoryError::InvalidArgument(format!("size {len} bytes overflows")))?;
    nix::unistd::ftruncate(&fd, len_off).map_err(|e| MemoryError::errno("ftruncate(memfd)", e))?;
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(|e| MemoryError::errno("F_ADD_SEALS", e))?;
    Ok(fd)
}

/// Size of the file behind `fd` and the bytes it has allocated (`st_blocks * 512`).
pub(crate) fn file_size_and_allocated(fd: BorrowedFd<'_>) -> Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| MemoryError::errno("fstat", e))?;
    Ok((st.st_size.max(0) as u64, st.st_blocks.max(0) as u64 * 512))
}

/// Returns the pages of `range` of the file to the OS; the size and every mapping stay.
pub(crate) fn punch_hole(fd: BorrowedFd<'_>, range: Range<usize>) -> Result<()> {
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(fd, flags, range.start as i64, range.len() as i64)
        .map_err(|e| MemoryError::errno("fallocate(PUNCH_HOLE)", e))
}

/// Allocates (zeroed) pages for `range` of the file now, so a later touch cannot SIGBUS.
pub(crate) fn allocate(fd: BorrowedFd<'_>, range: Range<usize>) -> Result<()> {
    fallocate(
        fd,
        FallocateFlags::empty(),
        range.start as i64,
        range.len() as i64,
    )
    .map_err(|e| MemoryError::errno("fallocate(allocate)", e))
}

/// Writes all of `src` to the file at offset `at`.
pub(crate) fn pwrite_all(fd: BorrowedFd<'_>, src: &[u8], at: usize) -> Result<()> {
    let mut off = 0usize;
    while off < src.len() {
        match nix::sys::uio::pwrite(fd, &src[off..], (at + off) as i64) {
            Ok(0) => return Err(MemoryError::InvalidArgument("pwrite wrote 0 bytes".into())),
            Ok(n) => off += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(MemoryError::errno("pwrite(memfd)", e)),
        }
    }
    Ok(())
}

/// Duplicates an fd as a new close-on-exec owned fd.
pub(crate) fn dup_fd(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().map_err(|e| MemoryError::Sys {
        op: "dup",
        source: e,
    })
}

/// Checks that `fd` is a file of at least `len` bytes (a memfd normally).
pub(crate) fn check_fd_len(fd: &impl AsFd, len: usize) -> Result<()> {
    let (size, _) = file_size_and_allocated(fd.as_fd())?;
    if (size as usize) < len {
        return Err(MemoryError::InvalidArgument(format!(
            "fd {} is {size} bytes but {len} bytes were requested; pass the region's own length",
            fd.as_fd().as_raw_fd()
        )));
    }
    Ok(())
}

/// Sends `fds` and `payload` in one message (`SCM_RIGHTS`).
pub fn send_fds(sock: &UnixStream, fds: &[BorrowedFd<'_>], payload: &[u8]) -> Result<()> {
    if payload.is_empty() {
        return Err(MemoryError::InvalidArgument(
            "fd message needs a non-empty payload".into(),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(payload)];
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(|e| MemoryError::errno("sendmsg(SCM_RIGHTS)", e))?;
    if sent != payload.len() {
        return Err(MemoryError::InvalidArgument(format!(
            "sendmsg sent {sent} of {} payload bytes",
            payload.len()
        )));
    }
    Ok(())
}

/// Receives one message: its payload (up to `max_payload` bytes) and the fds it carried.
pub fn recv_fds(sock: &UnixStream, max_payload: usize) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; max_payload.max(1)];
    let mut cspace = nix::cmsg_space!([RawFd; 16]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cspace),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| MemoryError::errno("recvmsg(SCM_RIGHTS)", e))?;
    let mut fds = Vec::new();
    for c in msg
        .cmsgs()
        .map_err(|e| MemoryError::errno("recvmsg(cmsgs)", e))?
    {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                // SAFETY: SCM_RIGHTS installed `r` as a fresh descriptor owned by nobody else.
                fds.push(unsafe { OwnedFd::from_raw_fd(r) });
            }
        }
    }
    let n = msg.bytes;
    buf.truncate(n);
    Ok((buf, fds))
}
