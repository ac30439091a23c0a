//! The device ledger. Each process's [`MemoryManager`](crate::MemoryManager) produces a
//! [`ProcessReport`] (plain serde data, sent to the controller over IPC); the controller merges
//! them into one [`DeviceLedger`] per device: resident, paused and backup bytes by tag and by
//! process, plus the peak resident total it has seen.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{MemoryError, Result};
use crate::tag::{BackupPolicy, DType, Tag};

/// One region as its process sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionReport {
    /// Region id (unique within its process).
    pub id: u64,
    /// Tag.
    pub tag: Tag,
    /// Element type.
    pub dtype: DType,
    /// Backup policy.
    pub backup_policy: BackupPolicy,
    /// Requested size.
    pub size_bytes: u64,
    /// Whether it is paused.
    pub paused: bool,
    /// `size_bytes` when resident, else 0.
    pub resident_bytes: u64,
    /// `size_bytes` when paused, else 0.
    pub paused_bytes: u64,
    /// CPU backup holding the paused contents.
    pub backup_bytes: u64,
    /// Backup buffer kept after resume for reuse (lazily freed: the kernel may reclaim it).
    pub retained_backup_bytes: u64,
    /// Physical bytes the memfd holds now, measured (`st_blocks * 512`).
    pub allocated_bytes: u64,
}

/// Everything one process holds on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Process name (e.g. `engine-0`).
    pub process: String,
    /// OS pid.
    pub pid: u32,
    /// Device label.
    pub device: String,
    /// Its budget cap.
    pub cap_bytes: Option<u64>,
    /// Live regions.
    pub regions: Vec<RegionReport>,
    /// Bytes held by named snapshots.
    pub snapshot_bytes: u64,
    /// Highest resident total the process has had.
    pub peak_resident_bytes: u64,
}

/// Sums over a set of regions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Number of regions.
    pub regions: u64,
    /// Sum of sizes.
    pub size_bytes: u64,
    /// Resident bytes.
    pub resident_bytes: u64,
    /// Paused bytes.
    pub paused_bytes: u64,
    /// Live backup bytes.
    pub backup_bytes: u64,
    /// Retained (reclaimable) backup buffers.
    pub retained_backup_bytes: u64,
    /// Measured physical bytes of the memfds.
    pub allocated_bytes: u64,
}

impl Totals {
    fn add(&mut self, r: &RegionReport) {
        self.regions += 1;
        self.size_bytes += r.size_bytes;
        self.resident_bytes += r.resident_bytes;
        self.paused_bytes += r.paused_bytes;
        self.backup_bytes += r.backup_bytes;
        self.retained_backup_bytes += r.retained_backup_bytes;
        self.allocated_bytes += r.allocated_bytes;
    }
}

impl ProcessReport {
    /// Sums over this process's regions.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        self.regions.iter().for_each(|r| t.add(r));
        t
    }

    /// Sums over this process's regions, by tag.
    pub fn by_tag(&self) -> BTreeMap<Tag, Totals> {
        let mut m: BTreeMap<Tag, Totals> = BTreeMap::new();
        for r in &self.regions {
            m.entry(r.tag.clone()).or_default().add(r);
        }
        m
    }
}

/// The controller's view of one device across processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceLedger {
    /// Device label.
    pub device: String,
    /// Device capacity, if known.
    pub capacity_bytes: Option<u64>,
    /// Latest report of each process (keyed by name and pid).
    pub processes: Vec<ProcessReport>,
    /// Highest resident total across processes seen at an update.
    pub peak_resident_bytes: u64,
}

impl DeviceLedger {
    /// An empty ledger.
    pub fn new(device: impl Into<String>, capacity_bytes: Option<u64>) -> Self {
        DeviceLedger {
            device: device.into(),
            capacity_bytes,
            processes: Vec::new(),
            peak_resident_bytes: 0,
        }
    }

    /// Replaces the report of the same process (name and pid), or adds it.
    pub fn update(&mut self, report: ProcessReport) -> Result<()> {
        if report.device != self.device {
            return Err(MemoryError::InvalidArgument(format!(
                "report from {} (pid {}) is for device `{}`, not `{}`; send it to that device's \
                 ledger",
                report.process, report.pid, report.device, self.device
            )));
        }
        let same = |p: &ProcessReport| p.process == report.process && p.pid == report.pid;
        match self.processes.iter_mut().find(|p| same(p)) {
            Some(slot) => *slot = report,
            None => self.processes.push(report),
        }
        self.peak_resident_bytes = self.peak_resident_bytes.max(self.totals().resident_bytes);
        Ok(())
    }

    /// Drops a process (it exited). Returns whether it was known.
    pub fn remove(&mut self, process: &str, pid: u32) -> bool {
        let before = self.processes.len();
        self.processes
            .retain(|p| !(p.process == process && p.pid == pid));
        before != self.processes.len()
    }

    /// Sums over every region on the device.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        self.regions().for_each(|(_, r)| t.add(r));
        t
    }

    /// Bytes held by snapshots on the device.
    pub fn snapshot_bytes(&self) -> u64 {
        self.processes.iter().map(|p| p.snapshot_bytes).sum()
    }

    /// Sums by tag.
    pub fn by_tag(&self) -> BTreeMap<Tag, Totals> {
        let mut m: BTreeMap<Tag, Totals> = BTreeMap::new();
        self.regions()
            .for_each(|(_, r)| m.entry(r.tag.clone()).or_default().add(r));
        m
    }

    /// Sums by process, keyed `name:pid`.
    pub fn by_process(&self) -> BTreeMap<String, Totals> {
        let m = self.processes.iter();
        m.map(|p| (format!("{}:{}", p.process, p.pid), p.totals()))
            .collect()
    }

    fn regions(&self) -> impl Iterator<Item = (&ProcessReport, &RegionReport)> {
        self.processes
            .iter()
            .flat_map(|p| p.regions.iter().map(move |r| (p, r)))
    }
}
