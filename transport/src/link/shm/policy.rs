//! Single-copy policy and counters: the [`SingleCopy`] mode of `ShmOptions`, the one-time
//! measurement behind [`SingleCopy::Auto`], and [`ShmStats`] (which path messages took).

use super::vm;
use crate::error::{Result, TransportError};
use std::sync::OnceLock;
use std::time::Instant;

/// Counters of the shm links of a communicator (summed over its peers). Lets callers (and
/// tests) see which path their bytes took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Messages sent by single copy (the peer read them from this process's memory).
    pub single_copy_sent: u64,
    /// Messages received by single copy (`process_vm_readv` from the sender's memory).
    pub single_copy_received: u64,
    /// Payload bytes received by single copy.
    pub single_copy_bytes_received: u64,
    /// Payload bytes sent through the rings (descriptors and headers not counted).
    pub ring_bytes_sent: u64,
    /// Payload bytes received through the rings.
    pub ring_bytes_received: u64,
    /// Single-copy reads this process refused or could not do, answered with a fallback to
    /// the ring.
    pub fallbacks: u64,
    /// Broadcasts this process took part in through a group's shared segment (root or
    /// receiver), not the chain over the links.
    pub shared_broadcasts: u64,
    /// Payload bytes of those broadcasts.
    pub shared_broadcast_bytes: u64,
}

impl std::ops::AddAssign for ShmStats {
    fn add_assign(&mut self, o: Self) {
        self.single_copy_sent += o.single_copy_sent;
        self.single_copy_received += o.single_copy_received;
        self.single_copy_bytes_received += o.single_copy_bytes_received;
        self.ring_bytes_sent += o.ring_bytes_sent;
        self.ring_bytes_received += o.ring_bytes_received;
        self.fallbacks += o.fallbacks;
        self.shared_broadcasts += o.shared_broadcasts;
        self.shared_broadcast_bytes += o.shared_broadcast_bytes;
    }
}

/// When large shm messages go by single copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SingleCopy {
    /// Send by single copy when a one-time measurement in this process shows the kernel copy
    /// (`process_vm_readv`) at least [`AUTO_RATIO`] times as fast as memcpy; otherwise the
    /// pipelined two-copy ring is faster. Incoming descriptors are always honoured.
    #[default]
    Auto,
    /// Always send large messages by single copy (still falls back where the kernel refuses).
    On,
    /// Never: sends use the ring, and incoming descriptors are answered with a fallback.
    Off,
}

/// `Auto` enables single copy when kernel copy bandwidth >= this x memcpy bandwidth. End to
/// end a single-copy transfer runs at about the kernel copy's speed, while the pipelined ring
/// reaches 0.5-0.8x memcpy for large messages, so single copy pays only near memcpy speed.
pub const AUTO_RATIO: f64 = 0.75;

impl std::str::FromStr for SingleCopy {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(SingleCopy::Auto),
            "on" | "1" | "true" => Ok(SingleCopy::On),
            "off" | "0" | "false" => Ok(SingleCopy::Off),
            other => Err(TransportError::Invalid(format!(
                "single-copy mode {other:?} is not one of auto, on, off"
            ))),
        }
    }
}

impl std::fmt::Display for SingleCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SingleCopy::Auto => "auto",
            SingleCopy::On => "on",
            SingleCopy::Off => "off",
        })
    }
}

/// Bandwidths (GB/s) of `process_vm_readv` and memcpy on an 8 MiB buffer of this process,
/// best of 3; the kernel figure is 0 where the syscall is unavailable. Used by
/// [`SingleCopy::Auto`] (once per process) and reported by the bench.
pub fn single_copy_calibration() -> (f64, f64) {
    let n = 8 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let pid = std::process::id() as i32;
    let (mut kernel, mut user) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        user = user.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut off = 0;
        while off < n {
            match vm::read_from(pid, src.as_ptr() as u64 + off as u64, &mut dst[off..]) {
                Ok(0) | Err(_) => return (0.0, n as f64 / user / 1e9),
                Ok(k) => off += k,
            }
        }
        kernel = kernel.min(t.elapsed().as_secs_f64());
    }
    (n as f64 / kernel / 1e9, n as f64 / user / 1e9)
}

/// The `Auto` decision of this process (measured on first use).
pub(crate) fn auto_decision() -> bool {
    static DECISION: OnceLock<bool> = OnceLock::new();
    *DECISION.get_or_init(|| {
        let (kernel, user) = single_copy_calibration();
        let on = kernel >= AUTO_RATIO * user;
        tracing::debug!(
            "tandem-transport: process_vm_readv {kernel:.2} GB/s vs memcpy {user:.2} GB/s: \
             single-copy shm sends {}",
            if on { "on" } else { "off" }
        );
        on
    })
}

#[cfg(test)]
mod tests {
    //! Calibration figures and mode parsing.
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn calibration_measures_both_copies() {
        let (kernel, user) = single_copy_calibration();
        assert!(kernel.is_finite() && kernel > 0.0, "kernel copy {kernel}");
        assert!(user.is_finite() && user > 0.0, "memcpy {user}");
        assert_eq!("off".parse::<SingleCopy>().unwrap(), SingleCopy::Off);
        assert_eq!(
            SingleCopy::Auto.to_string().parse::<SingleCopy>().unwrap(),
            SingleCopy::Auto
        );
        assert!("maybe".parse::<SingleCopy>().is_err());
    }
}
