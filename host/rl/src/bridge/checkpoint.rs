//! `checkpoint`: the trainer writes an atomic HF checkpoint (`<run_dir>/weights/v<N>`:
//! staging dir, every file and the dir fsynced, rename, parent fsynced). With `restart` (the
//! default; `[bridge.options] restart = false` reloads in place) each engine rank is started
//! anew on the checkpoint by the launcher, health-checked (ready, serving version N, digest)
//! and only then replaces the old process, which is stopped; if the new one fails, it is
//! stopped and the old one keeps serving the previous version.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::common::{Common, mixed_note};
use super::{Mode, RestartHook, Shipment};
use crate::error::RlError;
use tandem_plugin_api::{PauseMode, UpdatePayload, UpdateReport, WeightUpdate};
use tandem_runtime::launch::RemoteEngine;

/// How long a graceful engine exit may take before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// The `checkpoint` mode's settings.
pub(super) struct Checkpoint {
    /// Restart the engines on each checkpoint (else reload in place).
    pub restart: bool,
    /// Called with each restarted engine before its health check.
    pub hook: Option<RestartHook>,
}

impl Mode for Checkpoint {
    fn ship(
        &mut self,
        common: &Common,
        mut shipment: Shipment<'_>,
    ) -> Result<Vec<UpdateReport>, RlError> {
        let shipped = common.for_engines(shipment.update);
        let dir = match &shipment.update.payload {
            UpdatePayload::CheckpointDir { dir } if self.restart => PathBuf::from(dir.as_str()),
            _ => return common.apply_all(shipment.update, &shipped, shipment.engines),
        };
        (0..shipment.engines.len())
            .map(|index| {
                let restart = Restart {
                    index,
                    update: shipment.update,
                    shipped: &shipped,
                    dir: &dir,
                };
                self.restart_one(&restart, &mut shipment)
            })
            .collect()
    }

    fn restarts(&self) -> bool {
        self.restart
    }

    fn set_restart_hook(&mut self, hook: Option<RestartHook>) {
        self.hook = hook;
    }
}

/// One engine's restart on a checkpoint directory.
struct Restart<'a> {
    /// Its position among the engines (those before it already switched).
    index: usize,
    update: &'a WeightUpdate,
    shipped: &'a WeightUpdate,
    dir: &'a Path,
}

impl Restart<'_> {
    fn failed(&self, rank: u32, why: impl std::fmt::Display) -> RlError {
        RlError::failed(format!(
            "checkpoint bridge: restarting engine rank {rank} on {} failed, the old engine keeps \
             serving its previous weights: {why}{}",
            self.dir.display(),
            mixed_note(self.index, self.update.version)
        ))
    }
}

impl Checkpoint {
    /// Restarts engine `r.index`: new process, hook, health check (ready, version, digest),
    /// then the old one is stopped and replaced.
    fn restart_one(
        &mut self,
        r: &Restart<'_>,
        shipment: &mut Shipment<'_>,
    ) -> Result<UpdateReport, RlError> {
        let slot = r.index;
        let rank = shipment.engines[slot].rank();
        if !r.dir.join("config.json").is_file() {
            let why = format!(
                "{} has no config.json (the checkpoint vanished or is incomplete)",
                r.dir.display()
            );
            return Err(r.failed(rank, why));
        }
        let t = Instant::now();
        let new = shipment.launcher.respawn_engine(rank, r.dir).map_err(|e| {
            // The launcher's help (e.g. why a new worker was not ready) stays data.
            let help = e.help();
            let failed = r.failed(rank, e);
            match help {
                Some(h) => failed.with_help(h),
                None => failed,
            }
        })?;
        let started = t.elapsed();
        shipment.meter.add(new.pid());
        if let Some(h) = self.hook.as_mut() {
            h(&new);
        }
        let report = match health_check(&new, r) {
            Ok(report) => report,
            Err(e) => {
                new.kill("its restart on a new checkpoint failed");
                return Err(r.failed(rank, e));
            }
        };
        let healthy = t.elapsed();
        let old = std::mem::replace(&mut shipment.engines[slot], new);
        if let Err(e) = old.exit_and_wait(EXIT_GRACE) {
            tracing::warn!("stopping the replaced {}: {e}", old.name());
        }
        tracing::debug!(
            "checkpoint restart of engine rank {rank}: started in {:.1} ms, healthy at {:.1} ms, \
             the old engine gone at {:.1} ms",
            started.as_secs_f64() * 1e3,
            healthy.as_secs_f64() * 1e3,
            t.elapsed().as_secs_f64() * 1e3
        );
        Ok(report)
    }
}

/// A restarted engine serves the checkpoint: ready at its version, and acknowledges the
/// update without reloading (updates go to a paused engine: the lifecycle state machine).
fn health_check(new: &RemoteEngine, r: &Restart<'_>) -> Result<UpdateReport, RlError> {
    let health = new.health()?;
    if !health.ready || health.weight_version != r.update.version {
        return Err(RlError::failed(format!(
            "{} is not ready at version {} after start (ready {}, version {}, {})",
            new.name(),
            r.update.version,
            health.ready,
            health.weight_version,
            health.detail
        )));
    }
    new.pause_generation(PauseMode::Wait)?;
    let report = new.apply_weight_update(r.shipped.clone())?;
    new.continue_generation()?;
    Ok(report)
}
