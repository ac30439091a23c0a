//! Sharing regions with other processes: [`MappedRegion`] maps a region from its memfd (it sees
//! the owner's writes, zeros while the owner has it paused, and the data again after resume), and
//! [`send_region`] / [`recv_region`] ship a region's fd plus a one-line header over a Unix socket
//! with `SCM_RIGHTS`.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::error::{MemoryError, Result};
use crate::region::Region;
use crate::sys::{self, Mapping};
use crate::tag::{DType, Tag};

/// Another process's region mapped into this one.
#[derive(Debug)]
pub struct MappedRegion {
    fd: OwnedFd,
    map: Mapping,
    len: usize,
}

impl MappedRegion {
    /// Maps `len` bytes of the memfd `fd` shared, read-write. Fails if the file is shorter.
    pub fn attach(fd: OwnedFd, len: usize) -> Result<MappedRegion> {
        if len == 0 {
            return Err(MemoryError::InvalidArgument(
                "cannot attach a zero-byte region".into(),
            ));
        }
        sys::check_fd_len(&fd, len)?;
        let map = Mapping::shared(fd.as_fd(), sys::round_to_pages(len)?)?;
        Ok(MappedRegion { fd, map, len })
    }

    /// Start address in this process (differs from the owner's).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false; for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Physical bytes the memfd holds now (`st_blocks * 512`).
    pub fn allocated_bytes(&self) -> Result<u64> {
        Ok(sys::file_size_and_allocated(self.fd.as_fd())?.1)
    }

    /// Copies `buf.len()` bytes at `offset` out of the region. If the owner writes concurrently
    /// the copy may be torn (bytes have no invalid values, so this is never undefined).
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len())?;
        // SAFETY: the range is inside our live mapping (checked above) and `buf` is a distinct
        // Rust allocation; a concurrent writer can only change byte values.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.ptr().add(offset), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: as in `read_at`; no Rust reference into the mapping exists in this process
        // except through the unsafe `as_slice` whose contract forbids overlapping writes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// The region as a byte slice.
    ///
    /// # Safety
    /// Nobody (the owner, other processes, or this process through `write_at`) may write the
    /// region while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller guarantees no concurrent writes; ptr/len describe our mapping.
        unsafe { std::slice::from_raw_parts(self.map.ptr(), self.len) }
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemoryError::InvalidArgument(format!(
                "range {offset}+{n} is outside the {}-byte mapped region",
                self.len
            ))),
        }
    }
}

/// What travels with a region's fd: enough to map and label it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRegionInfo {
    /// The owner's region id.
    pub id: u64,
    /// Tag.
    pub tag: Tag,
    /// Element type.
    pub dtype: DType,
    /// Length in bytes.
    pub len: usize,
}

const HEADER: &str = "tandem-region/1";

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

/// Ships `region` (fd + header) to the process at the other end of `sock`.
pub fn send_region(sock: &UnixStream, region: &Region) -> Result<()> {
    let header = format!(
        "{HEADER} id={} tag={} dtype={} len={}",
        region.id(),
        region.tag(),
        region.dtype(),
        region.len()
    );
    send_fds(sock, &[region.fd()], header.as_bytes())
}

/// Receives a region sent with [`send_region`] and maps it.
pub fn recv_region(sock: &UnixStream) -> Result<(SharedRegionInfo, MappedRegion)> {
    let (payload, mut fds) = recv_fds(sock, 512)?;
    let text = String::from_utf8_lossy(&payload).into_owned();
    let info = parse_header(&text)?;
    if fds.len() != 1 {
        return Err(MemoryError::InvalidArgument(format!(
            "region message carried {} fds, expected 1 (`{text}`)",
            fds.len()
        )));
    }
    let fd = fds.remove(0);
    let mapped = MappedRegion::attach(fd, info.len)?;
    Ok((info, mapped))
}

fn parse_header(text: &str) -> Result<SharedRegionInfo> {
    let bad = |why: &str| {
        MemoryError::InvalidArgument(format!(
            "malformed region header `{text}`: {why}; expected `{HEADER} id=N tag=T dtype=D len=N`"
        ))
    };
    let mut parts = text.split_whitespace();
    if parts.next() != Some(HEADER) {
        return Err(bad("wrong protocol tag"));
    }
    let (mut id, mut tag, mut dtype, mut len) = (None, None, None, None);
    for p in parts {
        let (k, v) = p.split_once('=').ok_or_else(|| bad("field without `=`"))?;
        match k {
            "id" => id = v.parse().ok(),
            "tag" => tag = v.parse().ok(),
            "dtype" => dtype = v.parse().ok(),
            "len" => len = v.parse().ok(),
            _ => return Err(bad("unknown field")),
        }
    }
    match (id, tag, dtype, len) {
        (Some(id), Some(tag), Some(dtype), Some(len)) => Ok(SharedRegionInfo {
            id,
            tag,
            dtype,
            len,
        }),
        _ => Err(bad("missing or invalid field")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_parses_and_rejects() {
        let i = parse_header("tandem-region/1 id=3 tag=kv_cache dtype=bf16 len=4096").unwrap();
        assert_eq!(
            (i.id, i.tag, i.dtype, i.len),
            (3, Tag::KvCache, DType::BF16, 4096)
        );
        let e = parse_header("tandem-region/1 id=3 tag=kv_cache")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing or invalid field"), "{e}");
        assert!(parse_header("other/1 id=1").is_err());
    }
}
