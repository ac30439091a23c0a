//! Where ranks live (`Placement`: host id + device) and the seed topology helper
//! (`Colocated`: N trainer ranks + N engine ranks in a union world of 2N, a trainer-only
//! group, and engine i <-> trainer i pairs sharing device i).

use std::fmt;

/// The device a rank computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host CPU (no GPU).
    Cpu,
    /// CUDA device by ordinal on its host.
    Cuda(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = crate::TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        s.strip_prefix("cuda:")
            .and_then(|i| i.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| {
                crate::TransportError::Invalid(format!(
                    "device {s:?} is not valid; expected \"cpu\" or \"cuda:N\""
                ))
            })
    }
}

/// Where one rank runs: a host identity and a device on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Opaque host identity; ranks with equal ids can share memory.
    pub host: String,
    /// Device on that host.
    pub device: Device,
}

impl Placement {
    /// A placement on `host` and `device`.
    pub fn new(host: impl Into<String>, device: Device) -> Self {
        Placement {
            host: host.into(),
            device,
        }
    }

    /// This machine's identity (hostname + kernel boot id), on the CPU.
    pub fn this_host_cpu() -> Self {
        Placement::new(host_id(), Device::Cpu)
    }

    /// Serialises as `host|device` (the store format).
    pub(crate) fn encode(&self) -> String {
        format!("{}|{}", self.host, self.device)
    }

    /// Parses the store format.
    pub(crate) fn decode(s: &str) -> Option<Self> {
        let (h, d) = s.rsplit_once('|')?;
        Some(Placement::new(h, d.parse().ok()?))
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.host, self.device)
    }
}

/// This machine's identity: hostname plus kernel boot id (two containers with the same
/// hostname on different machines still differ). Falls back to the hostname alone.
pub fn host_id() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .ok()
    };
    let name = read("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into());
    match read("/proc/sys/kernel/random/boot_id") {
        Some(b) => format!("{name}-{}", &b[..b.len().min(8)]),
        None => name,
    }
}

/// A named group of world ranks (what plugins address as "named groups").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// Group name, e.g. `"trainers"` or `"pair3"`.
    pub name: String,
    /// World ranks in group order (group rank i = `ranks[i]`).
    pub ranks: Vec<usize>,
}

/// Role of a rank in the colocated topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Trainer rank i (world rank i).
    Trainer(usize),
    /// Engine rank i (world rank n + i).
    Engine(usize),
}

/// The seed's colocated topology: world ranks `0..n` are trainers, `n..2n` engines; engine i
/// and trainer i share a device.
///
/// ```
/// use tandem_transport::topology::{Colocated, Role};
/// let topo = Colocated::new(4);
/// assert_eq!(topo.world_size(), 8);
/// assert_eq!(topo.trainer_ranks(), vec![0, 1, 2, 3]);
/// assert_eq!(topo.pair(2), (6, 2)); // (engine 2, trainer 2)
/// assert_eq!(topo.role(5), Some(Role::Engine(1)));
/// let names: Vec<String> = topo.groups().into_iter().map(|g| g.name).collect();
/// assert_eq!(names, ["world", "trainers", "engines", "pair0", "pair1", "pair2", "pair3"]);
/// // A rank builds only the groups it belongs to:
/// assert_eq!(topo.groups_of(6).iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
///            ["world", "engines", "pair2"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Colocated {
    n: usize,
}

impl Colocated {
    /// `n` trainer ranks and `n` engine ranks.
    pub fn new(n: usize) -> Self {
        Colocated { n }
    }
    /// 2n.
    pub fn world_size(&self) -> usize {
        2 * self.n
    }
    /// World rank of trainer i.
    pub fn trainer(&self, i: usize) -> usize {
        i
    }
    /// World rank of engine i.
    pub fn engine(&self, i: usize) -> usize {
        self.n + i
    }
    /// Trainer world ranks (the FSDP/DP group).
    pub fn trainer_ranks(&self) -> Vec<usize> {
        (0..self.n).collect()
    }
    /// Engine world ranks.
    pub fn engine_ranks(&self) -> Vec<usize> {
        (self.n..2 * self.n).collect()
    }
    /// `(engine i, trainer i)` world ranks.
    pub fn pair(&self, i: usize) -> (usize, usize) {
        (self.engine(i), self.trainer(i))
    }
    /// Role of a world rank, `None` if out of range.
    pub fn role(&self, rank: usize) -> Option<Role> {
        match rank {
            r if r < self.n => Some(Role::Trainer(r)),
            r if r < 2 * self.n => Some(Role::Engine(r - self.n)),
            _ => None,
        }
    }
    /// Every group: `world`, `trainers`, `engines`, `pair{i}` (ranks `[engine i, trainer i]`).
    pub fn groups(&self) -> Vec<GroupSpec> {
        let mut g = vec![
            GroupSpec {
                name: "world".into(),
                ranks: (0..self.world_size()).collect(),
            },
            GroupSpec {
                name: "trainers".into(),
                ranks: self.trainer_ranks(),
            },
            GroupSpec {
                name: "engines".into(),
                ranks: self.engine_ranks(),
            },
        ];
        for i in 0..self.n {
            let (e, t) = self.pair(i);
            g.push(GroupSpec {
                name: format!("pair{i}"),
                ranks: vec![e, t],
            });
        }
        g
    }
    /// The groups `rank` belongs to.
    pub fn groups_of(&self, rank: usize) -> Vec<GroupSpec> {
        self.groups()
            .into_iter()
            .filter(|g| g.ranks.contains(&rank))
            .collect()
    }
    /// Placements with engine i and trainer i on device `i % per_host` of host
    /// `hosts[i / per_host]`; `device` maps a local index to a device (`Device::Cuda` or CPU).
    pub fn placements(&self, hosts: &[&str], per_host: usize, gpu: bool) -> Vec<Placement> {
        let per_host = per_host.max(1);
        let at = |i: usize| {
            let host = hosts.get(i / per_host).copied().unwrap_or("unplaced");
            let dev = if gpu {
                Device::Cuda((i % per_host) as u32)
            } else {
                Device::Cpu
            };
            Placement::new(host, dev)
        };
        (0..self.world_size()).map(|r| at(r % self.n)).collect()
    }
}
