//! The FFI layer of the `broadcast` bridge: the trainer's weights region, mapped into this
//! process through the host's memory services, seen as bytes to send from.

#![allow(unsafe_code)]

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{HostBox, PluginError, RString};

/// A region another component of this process (the trainer) shares under a key, mapped here.
pub(super) struct Mapped {
    host: HostBox,
    pub key: String,
    id: u64,
    addr: usize,
    len: usize,
}

impl Mapped {
    pub(super) fn attach(host: &HostBox, key: &str) -> Result<Mapped> {
        let info = host.attach_region(RString::from(key)).into_result()?;
        Ok(Mapped {
            host: host.clone(),
            key: key.to_owned(),
            id: info.id,
            addr: info.addr,
            len: info.len as usize,
        })
    }

    fn check(&self, start: u64, len: u64) -> Result<(usize, usize)> {
        let (start, len) = (start as usize, len as usize);
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(PluginError::invalid_input(format!(
                "broadcast bridge: bytes {start}..{} are outside region {} ({} bytes)",
                start + len,
                self.key,
                self.len
            )));
        }
        Ok((start, len))
    }

    /// Bytes `send` of the region to broadcast from, and bytes `next` (another range, not
    /// overlapping it) to read meanwhile, e.g. to checksum the next bucket. Ranges are
    /// `(start, len)`.
    pub(super) fn split(
        &mut self,
        send: (u64, u64),
        next: Option<(u64, u64)>,
    ) -> Result<(&mut [u8], Option<&[u8]>)> {
        let (s, n) = self.check(send.0, send.1)?;
        let other = match next {
            Some((start, len)) => {
                let (o, m) = self.check(start, len)?;
                if o < s + n && s < o + m {
                    return Err(PluginError::invalid_input(format!(
                        "broadcast bridge: bytes {o}..{} overlap the bucket being sent ({s}..{})",
                        o + m,
                        s + n
                    )));
                }
                Some((o, m))
            }
            None => None,
        };
        // SAFETY: the host mapped `len` bytes of the region at `addr` for this process
        // (`attach_region`) and keeps them mapped until `free_region` in `drop`; both ranges
        // were checked to lie inside it and not to overlap, and `&mut self` makes these the
        // only slices of this mapping while they live. The trainer writes its weights through
        // a mapping of its own, never during a sync.
        let send = unsafe { std::slice::from_raw_parts_mut((self.addr + s) as *mut u8, n) };
        // SAFETY: as above; this range is disjoint from `send`, so no byte is reachable
        // through both slices.
        let other = other
            .map(|(o, m)| unsafe { std::slice::from_raw_parts((self.addr + o) as *const u8, m) });
        Ok((send, other))
    }

    /// Bytes `[start, start + len)` of the region, read only.
    pub(super) fn bytes(&mut self, start: u64, len: u64) -> Result<&[u8]> {
        let (s, n) = self.check(start, len)?;
        // SAFETY: as in `split`: mapped, in bounds, the only slice while it lives.
        Ok(unsafe { std::slice::from_raw_parts((self.addr + s) as *const u8, n) })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let _ = self.host.free_region(self.id);
    }
}
