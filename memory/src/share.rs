//! Sharing regions with other processes: [`MappedRegion`] maps a region from its memfd (it sees
//! the owner's writes, zeros while the owner has it paused, and the data again after resume), and
//! [`send_region`] / [`recv_region`] ship a region's fd plus a one-line header over a Unix socket
//! with `SCM_RIGHTS` (the fd passing itself is `sys`'s `send_fds` / `recv_fds`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::error::{MemoryError, Result};
use crate::region::Region;
use crate::sys::{self, Mapping, recv_fds, send_fds};
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
        // SAFETY: the range is inside our mapping (checked above); this process holds no `&mut`
        // into it (a MappedRegion hands out shared slices only, through `as_slice`).
        unsafe { self.map.read_at(offset, buf) };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: the range is inside our mapping (checked above); no Rust reference into the
        // mapping exists in this process except through the unsafe `as_slice` whose contract
        // forbids overlapping writes.
        unsafe { self.map.write_at(offset, data) };
        Ok(())
    }

    /// The region as a byte slice.
    ///
    /// # Safety
    /// Nobody (the owner, other processes, or this process through `write_at`) may write the
    /// region while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller guarantees no concurrent writes.
        let all = unsafe { self.map.bytes() };
        &all[..self.len]
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
    fn mapped_region_reads_and_writes_in_range_only() {
        let len = 5000; // not a whole number of pages
        let fd = sys::create_memfd(c"share-test", len).unwrap();
        let m = MappedRegion::attach(fd, len).unwrap();
        m.write_at(4990, b"0123456789").unwrap();
        let mut buf = [0u8; 4];
        m.read_at(4993, &mut buf).unwrap();
        assert_eq!(&buf, b"3456");
        // SAFETY: this test is the only reader and writer of the region.
        let all = unsafe { m.as_slice() };
        assert_eq!((all.len(), &all[4990..]), (len, &b"0123456789"[..]));
        m.read_at(len, &mut []).unwrap();
        assert!(m.read_at(4998, &mut buf).is_err());
        assert!(m.write_at(len + 1, &[]).is_err());
        assert!(m.write_at(usize::MAX, b"x").is_err());
    }

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
