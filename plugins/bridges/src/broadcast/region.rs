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

    /// Bytes `[start, start + len)` of the region, to broadcast from.
    pub(super) fn bytes_mut(&mut self, start: u64, len: u64) -> Result<&mut [u8]> {
        let (start, len) = (start as usize, len as usize);
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(PluginError::invalid_input(format!(
                "broadcast bridge: bytes {start}..{} are outside region {} ({} bytes)",
                start + len,
                self.key,
                self.len
            )));
        }
        // SAFETY: the host mapped `len` bytes of the region at `addr` for this process
        // (`attach_region`) and keeps them mapped until `free_region` in `drop`; the range was
        // checked to lie inside, and `&mut self` makes this the only slice of this mapping.
        // The trainer writes its weights through a mapping of its own, never during a sync.
        Ok(unsafe { std::slice::from_raw_parts_mut((self.addr + start) as *mut u8, len) })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let _ = self.host.free_region(self.id);
    }
}
