//! Byte budgets: a process's cap is its fraction of the device's capacity. For CPU the capacity
//! is configured or read from `/proc/meminfo` `MemTotal`. [`check_fractions`] is the config-time
//! rule `train_frac + infer_frac + 0.10 <= 1.0` (10% kept for runtime workspaces).

use serde::{Deserialize, Serialize};

use crate::error::{MemoryError, Result};

/// Share of the device kept free for workspaces (cuBLAS/NCCL on GPU, the runtime on CPU).
pub const SAFETY_MARGIN: f64 = 0.10;

/// A cap on a process's resident bytes on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Budget {
    /// The cap; `None` means unlimited.
    pub cap_bytes: Option<u64>,
}

impl Budget {
    /// No cap.
    pub fn unlimited() -> Self {
        Budget { cap_bytes: None }
    }

    /// A cap of `cap` bytes.
    pub fn bytes(cap: u64) -> Self {
        Budget {
            cap_bytes: Some(cap),
        }
    }

    /// A cap of `frac` of `capacity` bytes; `frac` must be in (0, 1].
    pub fn fraction(capacity: u64, frac: f64) -> Result<Self> {
        if !(frac > 0.0 && frac <= 1.0) {
            return Err(MemoryError::InvalidArgument(format!(
                "memory fraction {frac} is outside (0, 1]; use e.g. 0.45"
            )));
        }
        Ok(Budget::bytes((capacity as f64 * frac) as u64))
    }
}

/// CPU capacity: `MemTotal` from `/proc/meminfo`.
pub fn cpu_capacity_bytes() -> Result<u64> {
    crate::stats::meminfo_bytes("MemTotal")
}

/// Config-time check: `train_frac + infer_frac + SAFETY_MARGIN <= 1.0`, each fraction in (0, 1].
pub fn check_fractions(train_frac: f64, infer_frac: f64) -> Result<()> {
    for (name, f) in [("train_frac", train_frac), ("infer_frac", infer_frac)] {
        if !(f > 0.0 && f <= 1.0) {
            return Err(MemoryError::InvalidArgument(format!(
                "{name} = {f} is outside (0, 1]"
            )));
        }
    }
    let sum = train_frac + infer_frac + SAFETY_MARGIN;
    if sum > 1.0 + 1e-9 {
        return Err(MemoryError::InvalidArgument(format!(
            "train_frac ({train_frac}) + infer_frac ({infer_frac}) + {SAFETY_MARGIN} safety margin \
             = {sum:.2} > 1.0; lower one of the fractions (e.g. 0.45 / 0.45)"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fractions_rule() {
        assert!(check_fractions(0.45, 0.45).is_ok());
        let e = check_fractions(0.5, 0.45).unwrap_err().to_string();
        assert!(e.contains("= 1.05 > 1.0"), "{e}");
        assert!(check_fractions(0.0, 0.5).is_err());
        assert_eq!(Budget::fraction(1000, 0.25).unwrap(), Budget::bytes(250));
        assert!(Budget::fraction(1000, 1.5).is_err());
    }

    #[test]
    fn cpu_capacity_is_mem_total() {
        let cap = cpu_capacity_bytes().unwrap();
        assert!(cap > 64 << 20, "MemTotal {cap} looks wrong");
    }
}
