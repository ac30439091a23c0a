//! Backend choice per pair of ranks, from placements and the job file's override. A pure
//! function, so `tandem check` can print the plan before anything starts.
//!
//! Rules (`auto`): same device -> shm (NCCL refuses two ranks on one GPU: "Duplicate GPU
//! detected"); same host -> NCCL when both ranks are on distinct GPUs and CUDA is available,
//! else shm; other hosts -> NCCL when both are on GPUs and CUDA is available, else tcp.
//!
//! ```
//! use tandem_transport::plan::{plan, BackendKind, TransportOverride};
//! use tandem_transport::topology::Colocated;
//! let topo = Colocated::new(2);
//! let places = topo.placements(&["hostA"], 2, true); // 2 GPUs, engine i + trainer i on GPU i
//! let p = plan(&places, TransportOverride::Auto, true)?;
//! assert_eq!(p.backend(2, 0), BackendKind::Shm); // engine 0 and trainer 0 share cuda:0
//! assert_eq!(p.backend(0, 1), BackendKind::Nccl); // trainers on distinct GPUs
//! let no_cuda = plan(&places, "auto".parse()?, false)?;
//! assert_eq!(no_cuda.backend(0, 1), BackendKind::Shm);
//! # Ok::<(), tandem_transport::TransportError>(())
//! ```

use crate::error::{Result, TransportError};
use crate::topology::{Device, GroupSpec, Placement};
use std::collections::BTreeMap;
use std::fmt;

/// A concrete transport between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// memfd ring buffers between processes on one host.
    Shm,
    /// TCP sockets.
    Tcp,
    /// NCCL (feature `cuda`).
    Nccl,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Shm => "shm",
            BackendKind::Tcp => "tcp",
            BackendKind::Nccl => "nccl",
        })
    }
}

/// The job file's `transport = "auto" | "shm" | "tcp" | "nccl"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportOverride {
    /// Choose from topology.
    #[default]
    Auto,
    /// Force a backend where it is physically possible (see [`plan`]).
    Force(BackendKind),
}

impl std::str::FromStr for TransportOverride {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => TransportOverride::Auto,
            "shm" => TransportOverride::Force(BackendKind::Shm),
            "tcp" => TransportOverride::Force(BackendKind::Tcp),
            "nccl" => TransportOverride::Force(BackendKind::Nccl),
            other => {
                return Err(TransportError::Invalid(format!(
                    "transport {other:?} is not known; use one of \"auto\", \"shm\", \"tcp\", \"nccl\""
                )));
            }
        })
    }
}

impl fmt::Display for TransportOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportOverride::Auto => f.write_str("auto"),
            TransportOverride::Force(k) => k.fmt(f),
        }
    }
}

/// The choice for one pair and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairChoice {
    /// Chosen backend.
    pub backend: BackendKind,
    /// One-line reason, for `tandem check`.
    pub reason: &'static str,
}

/// The backend of one pair of ranks.
pub fn choose(
    a: &Placement,
    b: &Placement,
    ov: TransportOverride,
    cuda: bool,
) -> Result<PairChoice> {
    let same_host = a.host == b.host;
    let both_gpu = matches!((a.device, b.device), (Device::Cuda(_), Device::Cuda(_)));
    let same_device = same_host && a.device == b.device && both_gpu;
    let c = |backend, reason| Ok(PairChoice { backend, reason });
    match ov {
        TransportOverride::Auto => {
            if same_device {
                c(
                    BackendKind::Shm,
                    "same GPU: NCCL refuses two ranks on one device",
                )
            } else if same_host && both_gpu && cuda {
                c(BackendKind::Nccl, "same host, distinct GPUs")
            } else if same_host {
                c(BackendKind::Shm, "same host")
            } else if both_gpu && cuda {
                c(BackendKind::Nccl, "different hosts, GPUs")
            } else {
                c(BackendKind::Tcp, "different hosts")
            }
        }
        TransportOverride::Force(BackendKind::Tcp) => c(BackendKind::Tcp, "forced by job file"),
        TransportOverride::Force(BackendKind::Shm) => {
            if same_host {
                c(BackendKind::Shm, "forced by job file")
            } else {
                Err(TransportError::Invalid(format!(
                    "transport \"shm\" cannot connect ranks on different hosts ({a} and {b}); \
                     use \"auto\" or \"tcp\""
                )))
            }
        }
        TransportOverride::Force(BackendKind::Nccl) => {
            if !cuda {
                Err(TransportError::Unsupported(
                    "transport \"nccl\" needs CUDA and NCCL (build with feature `cuda` and \
                     install libcuda + libnccl); use \"auto\""
                        .into(),
                ))
            } else if !both_gpu {
                Err(TransportError::Invalid(format!(
                    "transport \"nccl\" needs both ranks on GPUs, got {a} and {b}; use \"auto\""
                )))
            } else if same_device {
                c(
                    BackendKind::Shm,
                    "same GPU: NCCL refuses two ranks on one device, shm used",
                )
            } else {
                c(BackendKind::Nccl, "forced by job file")
            }
        }
    }
}

/// The plan for a whole world: one choice per unordered pair of ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    world: usize,
    pairs: BTreeMap<(usize, usize), PairChoice>,
}

/// Plans every pair of `placements` (index = world rank).
pub fn plan(placements: &[Placement], ov: TransportOverride, cuda: bool) -> Result<Plan> {
    let mut pairs = BTreeMap::new();
    for (i, a) in placements.iter().enumerate() {
        for (j, b) in placements.iter().enumerate().skip(i + 1) {
            let ch = choose(a, b, ov, cuda).map_err(|e| match e {
                TransportError::Invalid(m) => {
                    TransportError::Invalid(format!("ranks {i} and {j}: {m}"))
                }
                other => other,
            })?;
            pairs.insert((i, j), ch);
        }
    }
    Ok(Plan {
        world: placements.len(),
        pairs,
    })
}

impl Plan {
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }
    /// The choice for ranks `a` and `b` (order does not matter), `None` if `a == b` or out of
    /// range.
    pub fn pair(&self, a: usize, b: usize) -> Option<&PairChoice> {
        self.pairs.get(&(a.min(b), a.max(b)))
    }
    /// The backend for ranks `a` and `b`; shm for `a == b` or ranks out of range.
    pub fn backend(&self, a: usize, b: usize) -> BackendKind {
        self.pair(a, b).map_or(BackendKind::Shm, |c| c.backend)
    }
    /// Summaries for several groups (what `tandem check` prints, one line each).
    pub fn groups(&self, specs: &[GroupSpec]) -> Vec<GroupPlan> {
        specs.iter().map(|s| self.group(s)).collect()
    }

    /// Summary for one group: how many of its pairs use each backend.
    pub fn group(&self, spec: &GroupSpec) -> GroupPlan {
        let mut counts = BTreeMap::new();
        for (x, &a) in spec.ranks.iter().enumerate() {
            for &b in &spec.ranks[x + 1..] {
                *counts.entry(self.backend(a, b)).or_insert(0) += 1;
            }
        }
        GroupPlan {
            name: spec.name.clone(),
            ranks: spec.ranks.clone(),
            counts,
        }
    }
}

/// Per-group summary printed by `tandem check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    /// Group name.
    pub name: String,
    /// World ranks.
    pub ranks: Vec<usize>,
    /// Pairs per backend.
    pub counts: BTreeMap<BackendKind, usize>,
}

impl fmt::Display for GroupPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}: ", self.name, self.ranks)?;
        if self.counts.is_empty() {
            return f.write_str("single rank, no transport");
        }
        let parts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, n)| format!("{k} ({n} pair{})", if *n == 1 { "" } else { "s" }))
            .collect();
        f.write_str(&parts.join(", "))
    }
}
