//! Tagged f32 buffers: where every tensor of the native backend lives.
//!
//! The plugin glue implements [`BufferProvider`] over memory-layer regions (raw `(ptr, len)`
//! byte ranges handed out by host services); tests and tools use [`VecProvider`]. Compute code
//! only ever sees `&[f32]` / `&mut [f32]` views obtained from a [`Region`].

use crate::error::{NativeError, Result};

/// What a buffer holds; maps 1:1 to memory-layer region tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferTag {
    /// Model parameters (base weights, LoRA adapters).
    Weights,
    /// Gradients, laid out like the trainable parameters.
    Grads,
    /// Optimizer moments (AdamW `m` and `v`).
    Optimizer,
    /// The KV cache of the inference engine.
    KvCache,
    /// Activations kept for backward, and compute scratch.
    Activations,
}

impl BufferTag {
    /// The memory-layer tag name.
    pub fn as_str(self) -> &'static str {
        match self {
            BufferTag::Weights => "weights",
            BufferTag::Grads => "grads",
            BufferTag::Optimizer => "optimizer",
            BufferTag::KvCache => "kv_cache",
            BufferTag::Activations => "activations",
        }
    }
}

/// One contiguous f32 buffer. Implementations must hand out the same memory on every call
/// (addresses may be kept by the memory layer across pause/resume).
pub trait Region: Send + Sync {
    /// Read view of the whole buffer.
    fn as_slice(&self) -> &[f32];
    /// Write view of the whole buffer.
    fn as_mut_slice(&mut self) -> &mut [f32];
    /// Number of f32 elements.
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    /// True when the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Hands out zero-initialised tagged f32 buffers.
pub trait BufferProvider {
    /// Allocates a zeroed buffer of `len` f32 elements; `name` is a human label
    /// (e.g. "weights/base", "optimizer/m") used in stats and errors.
    fn alloc(&mut self, tag: BufferTag, name: &str, len: usize) -> Result<Box<dyn Region>>;
}

/// A `Vec<f32>`-backed region.
#[derive(Debug, Clone, Default)]
pub struct VecRegion(pub Vec<f32>);

impl Region for VecRegion {
    fn as_slice(&self) -> &[f32] {
        &self.0
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

/// Heap-backed provider for tests and tools; records what was allocated per tag.
#[derive(Debug, Default)]
pub struct VecProvider {
    /// (tag, name, f32 elements) of every allocation, in order.
    pub allocations: Vec<(BufferTag, String, usize)>,
}

impl VecProvider {
    /// A fresh provider.
    pub fn new() -> Self {
        Self::default()
    }
    /// Total bytes allocated under `tag`.
    pub fn bytes(&self, tag: BufferTag) -> usize {
        self.allocations
            .iter()
            .filter(|a| a.0 == tag)
            .map(|a| a.2 * 4)
            .sum()
    }
}

impl BufferProvider for VecProvider {
    fn alloc(&mut self, tag: BufferTag, name: &str, len: usize) -> Result<Box<dyn Region>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|e| {
            NativeError::Buffer(format!(
                "cannot allocate {} MiB for {name}: {e}",
                (len * 4) >> 20
            ))
        })?;
        v.resize(len, 0.0);
        self.allocations.push((tag, name.to_string(), len));
        Ok(Box::new(VecRegion(v)))
    }
}

/// Splits `buf` into consecutive mutable pieces of the given sizes (the rest is dropped).
/// Errors if `buf` is too short.
pub fn carve<'a, const N: usize>(
    buf: &'a mut [f32],
    sizes: [usize; N],
) -> Result<[&'a mut [f32]; N]> {
    let total: usize = sizes.iter().sum();
    if total > buf.len() {
        return Err(NativeError::Buffer(format!(
            "scratch too small: need {total} f32, have {}",
            buf.len()
        )));
    }
    let mut rest = buf;
    let mut out: [&'a mut [f32]; N] = std::array::from_fn(|_| Default::default());
    for (slot, &n) in out.iter_mut().zip(sizes.iter()) {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
        *slot = head;
        rest = tail;
    }
    Ok(out)
}
