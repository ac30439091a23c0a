//! The FFI layer of the `delta` bridge: the trainer's weights region, mapped into this
//! process through the host's memory services, seen as bytes to fingerprint and to broadcast
//! from. The bridge only ever reads it.

#![allow(unsafe_code)]

use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{HostBox, PluginError, RString};

/// A region the trainer of this process shares under a key, mapped here.
pub(crate) struct Mapped {
    host: HostBox,
    /// The region's key.
    pub key: String,
    id: u64,
    addr: usize,
    len: usize,
}

impl Mapped {
    /// Maps the region shared under `key`.
    pub(crate) fn attach(host: &HostBox, key: &str) -> Result<Mapped> {
        let info = host
            .attach_region(RString::from(key))
            .into_result()
            .map_err(|e| {
                PluginError::new(
                    e.code,
                    format!(
                        "delta bridge: mapping the trainer's region {key}: {}",
                        e.message
                    ),
                )
                .with_help(e.help.as_str())
            })?;
        if info.addr == 0 && info.len > 0 {
            return Err(PluginError::runtime(format!(
                "delta bridge: the host mapped region {key} at address 0"
            )));
        }
        Ok(Mapped {
            host: host.clone(),
            key: key.to_owned(),
            id: info.id,
            addr: info.addr,
            len: info.len as usize,
        })
    }

    /// The region's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// The whole region, to fingerprint.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the host mapped `len` bytes of the region at `addr` (non-null, checked in
        // `attach`) for this process and keeps them mapped until `free_region` in `drop`,
        // which the borrow of `self` rules out while the slice lives. The trainer writes its
        // weights through a mapping of its own, never during a sync (both halves of a sync
        // run on the trainer's thread); this bridge never writes them.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Bytes `[start, start + len)` of the region as the buffer of a broadcast whose root is
    /// this process: the transport only reads the root's buffer (the receivers' buffers are
    /// written), so the region is not written.
    pub(crate) fn send_buffer(&mut self, start: u64, len: u64) -> Result<&mut [u8]> {
        let end = start.checked_add(len);
        if end.is_none_or(|end| end > self.len as u64) {
            return Err(PluginError::invalid_input(format!(
                "delta bridge: bytes {start}..{} are outside region {} ({} bytes)",
                start.saturating_add(len),
                self.key,
                self.len
            )));
        }
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: the range was checked to lie inside the `len` bytes the host mapped at
        // `addr` (kept mapped until `drop`); `&mut self` makes this the only slice of this
        // mapping while it lives. The mutable type is what the host's broadcast takes; at
        // the root it only reads (see the function's doc), so the trainer's weights are not
        // written.
        Ok(unsafe {
            std::slice::from_raw_parts_mut((self.addr + start as usize) as *mut u8, len as usize)
        })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let _ = self.host.free_region(self.id);
    }
}
