//! Where each rank goes: world ranks `0..T` are trainers and `T..T+E` engines. Colocated:
//! trainer i and engine i share device `devices[i % len]`. Disaggregated: trainers take the
//! first devices, engines the next ones (CPU "devices" are all the same CPU). From placements
//! the transport plan picks a backend per pair (same device → shm, never NCCL).

use crate::config::{JobFile, LauncherKind, PlacementMode};
use tandem_transport::plan::{self, GroupPlan, TransportOverride};
use tandem_transport::topology::{Device, GroupSpec, Placement};

/// World layout of a job on this host.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Placement of each world rank.
    pub placements: Vec<Placement>,
    /// World ranks of the trainers.
    pub trainers: Vec<usize>,
    /// World ranks of the engines.
    pub engines: Vec<usize>,
}

impl Layout {
    /// The layout of `job`: every rank on this host, or with `[launcher] kind = "slurm"` or
    /// `"ray"` on the node it names for the rank (this host where it names none).
    pub fn of(job: &JobFile) -> Result<Layout, String> {
        let (t, e) = (job.trainer.ranks as usize, job.engine.ranks as usize);
        let devices: Vec<Device> = job
            .placement
            .devices
            .iter()
            .map(|d| d.parse::<Device>().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        if devices.is_empty() {
            return Err("placement.devices is empty".into());
        }
        let here = tandem_transport::topology::host_id();
        let l = &job.launcher;
        let placed = l.kind != LauncherKind::Local;
        let host = |nodes: &[String], rank: usize| match nodes.get(rank).or(nodes.last()) {
            Some(n) if placed => n.clone(),
            _ => here.clone(),
        };
        let at = |host: String, i: usize| Placement::new(host, devices[i % devices.len()]);
        let mut placements: Vec<Placement> =
            (0..t).map(|i| at(host(&l.trainer_nodes, i), i)).collect();
        let engine_offset = match job.placement.mode {
            PlacementMode::Colocate => 0,
            PlacementMode::Disaggregated => t,
        };
        placements.extend((0..e).map(|i| at(host(&l.engine_nodes, i), engine_offset + i)));
        Ok(Layout {
            placements,
            trainers: (0..t).collect(),
            engines: (t..t + e).collect(),
        })
    }

    /// The named groups: `world`, `trainers`, `engines`, and `pair{i}` (engine i ↔ trainer i).
    pub fn groups(&self) -> Vec<GroupSpec> {
        let mut groups = vec![
            GroupSpec {
                name: "world".into(),
                ranks: (0..self.placements.len()).collect(),
            },
            GroupSpec {
                name: "trainers".into(),
                ranks: self.trainers.clone(),
            },
            GroupSpec {
                name: "engines".into(),
                ranks: self.engines.clone(),
            },
        ];
        for (i, (&e, &t)) in self.engines.iter().zip(&self.trainers).enumerate() {
            groups.push(GroupSpec {
                name: format!("pair{i}"),
                ranks: vec![e, t],
            });
        }
        groups
    }

    /// The transport choice for every group, given the job's override.
    pub fn transport_plan(&self, backend: &str) -> Result<Vec<GroupPlan>, String> {
        let ov: TransportOverride = backend.parse().map_err(|e| format!("{e}"))?;
        let plan = plan::plan(&self.placements, ov, tandem_transport::cuda_available())
            .map_err(|e| e.to_string())?;
        Ok(plan.groups(&self.groups()))
    }
}
