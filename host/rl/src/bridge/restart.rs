//! Engine restarts on a shipped checkpoint directory, for a bridge whose plan asks for them
//! (`checkpoint`, `restart = true`): only the controller owns processes. Each engine rank is
//! started anew on the checkpoint by the launcher, gets the bridge installed, is
//! health-checked (ready, serving version N, digest through its bridge half) and only then
//! replaces the old process, which is stopped; if the new one fails, it is stopped and the
//! old one keeps serving the previous version.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::common::{Ledger, mixed_note};
use super::{RestartHook, rss};
use crate::error::RlError;
use tandem_plugin_api::{PauseMode, Shipment, ShipmentBody, UpdatePayload, UpdateReport};
use tandem_runtime::launch::{LocalLauncher, RemoteEngine};

/// How long a graceful engine exit may take before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// The engines and the means to restart them.
pub(super) struct Restarts<'a> {
    pub engines: &'a mut [RemoteEngine],
    pub launcher: &'a mut LocalLauncher,
    pub meter: &'a mut rss::PeakMeter,
    pub hook: Option<&'a mut RestartHook>,
    /// Installs the bridge in a new engine.
    pub install: &'a dyn Fn(&RemoteEngine) -> Result<(), RlError>,
}

/// One engine's restart on a checkpoint directory.
struct Restart<'a> {
    /// Its position among the engines (those before it already switched).
    index: usize,
    update: &'a Shipment,
    dir: &'a Path,
}

impl Restart<'_> {
    fn failed(&self, rank: u32, why: impl std::fmt::Display) -> RlError {
        let switched: Vec<usize> = (0..self.index).collect();
        RlError::failed(format!(
            "checkpoint bridge: restarting engine rank {rank} on {} failed, the old engine keeps \
             serving its previous weights: {why}{}",
            self.dir.display(),
            mixed_note(&switched, self.update.version)
        ))
    }
}

/// Restarts every engine on `shipped` (a checkpoint directory), one after the other.
pub(super) fn restart_all(
    ledger: &Ledger,
    shipped: &Shipment,
    mut r: Restarts<'_>,
) -> Result<Vec<UpdateReport>, RlError> {
    let ShipmentBody::Update(UpdatePayload::CheckpointDir { dir }) = &shipped.body else {
        return Err(RlError::failed(format!(
            "{} bridge: engines restart on a checkpoint directory, but the bridge shipped a `{}` \
             update",
            ledger.name,
            shipped.kind_name()
        )));
    };
    let dir = PathBuf::from(dir.as_str());
    let for_engines = ledger.for_engines(shipped);
    (0..r.engines.len())
        .map(|index| {
            let one = Restart {
                index,
                update: &for_engines,
                dir: &dir,
            };
            restart_one(&one, &mut r)
        })
        .collect()
}

/// Restarts engine `one.index`: new process, bridge, hook, health check (ready, version,
/// digest), then the old one is stopped and replaced.
fn restart_one(one: &Restart<'_>, r: &mut Restarts<'_>) -> Result<UpdateReport, RlError> {
    let slot = one.index;
    let rank = r.engines[slot].rank();
    if !one.dir.join("config.json").is_file() {
        let why = format!(
            "{} has no config.json (the checkpoint vanished or is incomplete)",
            one.dir.display()
        );
        return Err(one.failed(rank, why));
    }
    let t = Instant::now();
    let new = r.launcher.respawn_engine(rank, one.dir).map_err(|e| {
        // The launcher's help (e.g. why a new worker was not ready) stays data.
        let help = e.help();
        let failed = one.failed(rank, e);
        match help {
            Some(h) => failed.with_help(h),
            None => failed,
        }
    })?;
    let started = t.elapsed();
    r.meter.add(new.pid());
    if let Some(h) = r.hook.as_mut() {
        h(&new);
    }
    let report = match (r.install)(&new).and_then(|()| health_check(&new, one)) {
        Ok(report) => report,
        Err(e) => {
            new.kill("its restart on a new checkpoint failed");
            return Err(one.failed(rank, e));
        }
    };
    let healthy = t.elapsed();
    let old = std::mem::replace(&mut r.engines[slot], new);
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

/// A restarted engine serves the checkpoint: ready at its version, and acknowledges the
/// update through its bridge half without reloading (updates go to a paused engine: the
/// lifecycle state machine).
fn health_check(new: &RemoteEngine, one: &Restart<'_>) -> Result<UpdateReport, RlError> {
    let health = new.health()?;
    if !health.ready || health.weight_version != one.update.version {
        return Err(RlError::failed(format!(
            "{} is not ready at version {} after start (ready {}, version {}, {})",
            new.name(),
            one.update.version,
            health.ready,
            health.weight_version,
            health.detail
        )));
    }
    new.pause_generation(PauseMode::Wait)?;
    let report = new.bridge_apply(one.update.clone())?;
    new.continue_generation()?;
    Ok(report)
}
