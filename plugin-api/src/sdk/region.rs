//! [`Region`]: a memory region of the host's memory layer seen as bytes — the one place a
//! plugin's region access needs `unsafe`, so no bridge writes it.
//!
//! A region is mapped into this process through the host services (attached under another
//! component's key, e.g. the trainer's weights, or allocated here) and stays mapped until
//! the `Region` is dropped, which frees it. Every view borrows the `Region`: a slice cannot
//! outlive the mapping, `&mut` views are exclusive, and every range is bounds-checked (an
//! out-of-range request is an `InvalidInput` error naming the region, never a panic).
//!
//! What the borrow checker cannot see is another mapping of the same memory: the trainer's
//! own view of its weights region. The host never runs a trainer step and a bridge call on
//! the same trainer at once (both run on the trainer worker's one thread), so a view taken
//! inside a bridge call sees bytes no one writes meanwhile.

#![allow(unsafe_code)]

use super::Result;
use crate::error::PluginError;
use crate::traits::HostBox;
use crate::types::RegionRequest;
use abi_stable::std_types::RString;

/// A mapped region: attached under a key or allocated by this process; freed on drop.
pub struct Region {
    host: HostBox,
    key: String,
    id: u64,
    addr: usize,
    len: usize,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("len", &self.len)
            .finish()
    }
}

impl Region {
    /// Maps the region another component shared under `key`.
    pub fn attach(host: &HostBox, key: &str) -> Result<Region> {
        let info = host
            .attach_region(RString::from(key))
            .into_result()
            .map_err(|e| {
                PluginError::new(e.code, format!("mapping region {key}: {}", e.message))
                    .with_help(e.help.as_str())
            })?;
        Region::checked(host, key.to_owned(), info.id, info.addr, info.len)
    }

    /// Allocates a region from this process's memory manager (tagged, pausable).
    pub fn alloc(host: &HostBox, request: RegionRequest) -> Result<Region> {
        let name = request.name.to_string();
        let info = host.alloc_region(request).into_result().map_err(|e| {
            PluginError::new(e.code, format!("allocating region {name}: {}", e.message))
                .with_help(e.help.as_str())
        })?;
        Region::checked(host, info.key.to_string(), info.id, info.addr, info.len)
    }

    fn checked(host: &HostBox, key: String, id: u64, addr: usize, len: u64) -> Result<Region> {
        let region = Region {
            host: host.clone(),
            key,
            id,
            addr,
            len: len as usize,
        };
        if addr == 0 && len > 0 {
            return Err(PluginError::runtime(format!(
                "the host mapped region {} at address 0",
                region.key
            )));
        }
        Ok(region)
    }

    /// The region's key (what another process attaches it under).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `start..start + len` as `usize`s, if inside the region.
    fn bounds(&self, start: u64, len: u64) -> Result<(usize, usize)> {
        match start.checked_add(len) {
            Some(end) if end <= self.len as u64 => Ok((start as usize, len as usize)),
            _ => Err(PluginError::invalid_input(format!(
                "bytes {start}..{} are outside region {} ({} bytes)",
                start.saturating_add(len),
                self.key,
                self.len
            ))),
        }
    }

    /// The whole region.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the host mapped `len` bytes at `addr` (non-null, checked at construction)
        // for this process and keeps them mapped until `free_region` in `drop`, which the
        // borrow of `self` rules out while the slice lives; no `&mut` view of this `Region`
        // can exist meanwhile (they borrow it mutably). Writers through other mappings: see
        // the module docs.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Bytes `start..start + len`.
    pub fn range(&self, start: u64, len: u64) -> Result<&[u8]> {
        let (s, n) = self.bounds(start, len)?;
        Ok(&self.bytes()[s..s + n])
    }

    /// The whole region, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`; `&mut self` makes this the only view of the mapping while
        // it lives.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }

    /// Bytes `start..start + len`, writable (e.g. the buffer of a broadcast whose root is
    /// this process: the transport only reads a root's buffer).
    pub fn range_mut(&mut self, start: u64, len: u64) -> Result<&mut [u8]> {
        let (s, n) = self.bounds(start, len)?;
        Ok(&mut self.bytes_mut()[s..s + n])
    }

    /// Two ranges at once, `(start, len)` each: the first writable, the second read-only
    /// (e.g. one bucket on the wire while the next one is checksummed). They may not overlap.
    pub fn split_mut(
        &mut self,
        first: (u64, u64),
        second: (u64, u64),
    ) -> Result<(&mut [u8], &[u8])> {
        let (a, n) = self.bounds(first.0, first.1)?;
        let (b, m) = self.bounds(second.0, second.1)?;
        let key = self.key.clone();
        let all = self.bytes_mut();
        if a + n <= b {
            let (lo, hi) = all.split_at_mut(b);
            Ok((&mut lo[a..a + n], &hi[..m]))
        } else if b + m <= a {
            let (lo, hi) = all.split_at_mut(a);
            Ok((&mut hi[..n], &lo[b..b + m]))
        } else {
            Err(PluginError::invalid_input(format!(
                "bytes {b}..{} overlap bytes {a}..{} of region {key}",
                b + m,
                a + n
            )))
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let _ = self.host.free_region(self.id);
    }
}
