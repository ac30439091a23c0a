//! [`Sink`]: where a bridge's engine half puts the tensors it decoded (API level
//! [`BRIDGE_IO`](crate::api_level::BRIDGE_IO)), the SDK face of the host's
//! [`TensorSink`](crate::traits::TensorSink).
//!
//! The contract: [`begin`](Sink::begin) once with the buckets (whole tensors, offsets
//! relative to each bucket), then one [`put`](Sink::put) per bucket in that order with
//! exactly its bytes, then return [`Received::Decoded`](crate::Received::Decoded) from
//! `receive`. The engine copies each bucket into the weights it serves as it arrives, so the
//! bridge may reuse its buffer as soon as `put` returns. The sink checks the order and sizes
//! here, before anything reaches the engine.

use super::Result;
use crate::error::PluginError;
use crate::traits::SinkBox;
use crate::types::TensorBucket;
use abi_stable::std_types::{RSlice, RVec};

/// The host's sink for decoded tensors, with the contract checked on the plugin's side.
pub struct Sink {
    inner: SinkBox,
    /// Each bucket's byte count, once `begin` was called.
    sizes: Option<Vec<u64>>,
    /// Buckets put so far.
    put: usize,
}

impl Sink {
    /// Wraps the host's sink.
    pub fn new(inner: SinkBox) -> Sink {
        Sink {
            inner,
            sizes: None,
            put: 0,
        }
    }

    /// Announces the buckets that follow. Once per `receive`.
    pub fn begin(&mut self, buckets: Vec<TensorBucket>) -> Result<()> {
        if self.sizes.is_some() {
            return Err(PluginError::invalid_state(
                "sink: `begin` called twice in one receive",
            ));
        }
        self.sizes = Some(buckets.iter().map(|b| b.bytes).collect());
        self.inner.begin(RVec::from(buckets)).into_result()
    }

    /// Hands over the next bucket's bytes (exactly its size); returns once they were copied
    /// out, so `data` may be reused.
    pub fn put(&mut self, data: &[u8]) -> Result<()> {
        let Some(sizes) = &self.sizes else {
            return Err(PluginError::invalid_state("sink: `put` before `begin`"));
        };
        let Some(&want) = sizes.get(self.put) else {
            return Err(PluginError::invalid_input(format!(
                "sink: bucket {} put, but `begin` announced {}",
                self.put + 1,
                sizes.len()
            )));
        };
        if data.len() as u64 != want {
            return Err(PluginError::invalid_input(format!(
                "sink: bucket {} is {} bytes, `begin` announced {want}",
                self.put,
                data.len()
            )));
        }
        self.put += 1;
        self.inner.put(RSlice::from_slice(data)).into_result()
    }

    /// Whether every announced bucket was put (`false` before `begin`).
    pub fn complete(&self) -> bool {
        self.sizes.as_ref().is_some_and(|s| s.len() == self.put)
    }
}
