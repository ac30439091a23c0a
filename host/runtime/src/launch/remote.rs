//! Controller-side handles of remote components: [`RemoteEngine`] and [`RemoteTrainer`].
//!
//! Their methods mirror the role traits ([`tandem_plugin_api::traits::InferenceEngine`],
//! [`tandem_plugin_api::traits::Trainer`]) one for one and return `Result<_, RuntimeError>`:
//! a plugin error comes back as [`RuntimeError::Plugin`] naming the worker and the method; a
//! timeout, a dead worker (exit status + log tail) or a protocol error as
//! [`RuntimeError::Runtime`]. Every call has a timeout ([`CallTimeouts`]), so none can hang.
//! Both handles are `Send + Sync` and cheap to share; trainer calls are executed one at a
//! time by the worker, in the order they arrive.

use super::monitor::WorkerProc;
use tandem_control::mirror::Mirror;
use tandem_control::protocol::{Call, EngineCall, Reply, TrainerCall};
use tandem_control::{Channel, ControlError};
use crate::error::RuntimeError;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tandem_plugin_api::{
    CheckpointInfo, ComponentStats, EngineHealth, GenerateRequest, GenerateResponse, Metric,
    PauseMode, RVec, TrainBatch, TrainerInfo, UpdateKind, UpdateReport, WeightUpdate, WhichWeights,
};

const SHUT_DOWN: &str = "the worker was shut down";

/// Timeouts of remote calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallTimeouts {
    /// Calls that only read state (`health`, `stats`) and `exit`.
    pub quick: Duration,
    /// Every other call (generation, training, memory moves, weight updates, start).
    pub long: Duration,
}

impl Default for CallTimeouts {
    fn default() -> Self {
        CallTimeouts {
            quick: Duration::from_secs(30),
            long: Duration::from_secs(1800),
        }
    }
}

/// What both handles share: the connection and the process.
#[derive(Clone)]
struct Remote {
    channel: Arc<Channel>,
    proc: Arc<WorkerProc>,
    timeouts: CallTimeouts,
}

impl Remote {
    fn call<T>(
        &self,
        call: Call,
        quick: bool,
        pick: impl FnOnce(Reply) -> Result<T, Reply>,
    ) -> Result<T, RuntimeError> {
        let op = call.name();
        let t = if quick {
            self.timeouts.quick
        } else {
            self.timeouts.long
        };
        let reply = self.channel.call(call, t)?;
        pick(reply).map_err(|other| {
            RuntimeError::from(ControlError::Protocol {
                peer: self.proc.name.clone(),
                message: format!("`{op}` was answered with a `{}` reply", other.kind()),
            })
        })
    }

    fn unit(&self, call: Call) -> Result<(), RuntimeError> {
        self.call(call, false, |r| match r {
            Reply::Unit => Ok(()),
            other => Err(other),
        })
    }

    fn exit(&self) -> Result<(), RuntimeError> {
        self.proc
            .expected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.channel.expect_close(SHUT_DOWN.into());
        let r = self.call(Call::Exit, true, |r| match r {
            Reply::Unit => Ok(()),
            other => Err(other),
        });
        self.channel.fail(SHUT_DOWN.into());
        r
    }
}

/// Asks a worker to exit over `channel` (any role); used by the launcher's shutdown.
pub(crate) fn exit_worker(
    channel: Arc<Channel>,
    proc: Arc<WorkerProc>,
    timeouts: CallTimeouts,
) -> Result<(), RuntimeError> {
    Remote {
        channel,
        proc,
        timeouts,
    }
    .exit()
}

macro_rules! common_methods {
    () => {
        /// The worker's name as used in errors: role, rank, pid, log file.
        pub fn name(&self) -> &str {
            &self.r.proc.name
        }
        /// The worker's rank within its role.
        pub fn rank(&self) -> u32 {
            self.r.proc.rank
        }
        /// The worker's process id.
        pub fn pid(&self) -> u32 {
            self.r.proc.pid
        }
        /// The worker's log file.
        pub fn log_path(&self) -> &Path {
            &self.r.proc.log_path
        }
        /// Why the worker is unusable (died, shut down), or `None` while it serves.
        pub fn dead_reason(&self) -> Option<String> {
            self.r.channel.dead_reason()
        }
        /// Replaces the call timeouts of this handle.
        pub fn set_timeouts(&mut self, timeouts: CallTimeouts) {
            self.r.timeouts = timeouts;
        }
        /// Asks the worker process to exit (status 0) and closes the connection.
        pub fn exit(&self) -> Result<(), RuntimeError> {
            self.r.exit()
        }
        /// [`exit`](Self::exit), then waits up to `grace` for the process to end (its memory
        /// is back once this returns) and kills it if it has not.
        pub fn exit_and_wait(&self, grace: Duration) -> Result<(), RuntimeError> {
            let r = self.r.exit();
            if self.r.proc.wait_exit(grace).is_none() {
                self.r.proc.kill();
            }
            r
        }
        /// Kills the worker on purpose (SIGKILL, reaped); later calls fail with `reason`.
        pub fn kill(&self, reason: &str) {
            super::stop(&self.r.proc, reason);
        }
    };
}

/// An inference engine in a worker process.
#[derive(Clone)]
pub struct RemoteEngine {
    r: Remote,
}

/// Picks one reply variant, converting its payload back to the ABI type.
macro_rules! pick {
    ($variant:ident) => {
        |r| match r {
            Reply::$variant(v) => Ok(Mirror::from_wire(v)),
            other => Err(other),
        }
    };
}

impl RemoteEngine {
    pub(crate) fn new(channel: Arc<Channel>, proc: Arc<WorkerProc>, t: CallTimeouts) -> Self {
        RemoteEngine {
            r: Remote {
                channel,
                proc,
                timeouts: t,
            },
        }
    }

    common_methods!();

    fn e(&self, call: EngineCall) -> Result<(), RuntimeError> {
        self.r.unit(Call::Engine(call))
    }

    /// [`InferenceEngine::start`](tandem_plugin_api::traits::InferenceEngine::start).
    pub fn start(&self) -> Result<(), RuntimeError> {
        self.e(EngineCall::Start)
    }
    /// `health`.
    pub fn health(&self) -> Result<EngineHealth, RuntimeError> {
        self.r
            .call(Call::Engine(EngineCall::Health), true, pick!(Health))
    }
    /// `shutdown` (the engine's; the process keeps serving until [`RemoteEngine::exit`]).
    pub fn shutdown(&self) -> Result<(), RuntimeError> {
        self.e(EngineCall::Shutdown)
    }
    /// `generate`.
    pub fn generate(&self, request: GenerateRequest) -> Result<GenerateResponse, RuntimeError> {
        let call = Call::Engine(EngineCall::Generate(request.into()));
        self.r.call(call, false, pick!(Generated))
    }
    /// `score`.
    pub fn score(&self, sequences: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let call = Call::Engine(EngineCall::Score(sequences));
        self.r.call(call, false, |r| match r {
            Reply::Logprobs(l) => Ok(l),
            other => Err(other),
        })
    }
    /// `pause_generation`.
    pub fn pause_generation(&self, mode: PauseMode) -> Result<(), RuntimeError> {
        self.e(EngineCall::PauseGeneration(mode.into()))
    }
    /// `continue_generation`.
    pub fn continue_generation(&self) -> Result<(), RuntimeError> {
        self.e(EngineCall::ContinueGeneration)
    }
    /// `flush_cache`.
    pub fn flush_cache(&self) -> Result<(), RuntimeError> {
        self.e(EngineCall::FlushCache)
    }
    /// `release_memory`.
    pub fn release_memory(&self, tags: &[String]) -> Result<(), RuntimeError> {
        self.e(EngineCall::ReleaseMemory(tags.to_vec()))
    }
    /// `resume_memory`.
    pub fn resume_memory(&self, tags: &[String]) -> Result<(), RuntimeError> {
        self.e(EngineCall::ResumeMemory(tags.to_vec()))
    }
    /// `apply_weight_update`.
    pub fn apply_weight_update(&self, update: WeightUpdate) -> Result<UpdateReport, RuntimeError> {
        let call = Call::Engine(EngineCall::ApplyWeightUpdate(update.into()));
        self.r.call(call, false, pick!(Updated))
    }
    /// `load_adapter`.
    pub fn load_adapter(&self, name: &str, dir: &str) -> Result<(), RuntimeError> {
        self.e(EngineCall::LoadAdapter {
            name: name.into(),
            dir: dir.into(),
        })
    }
    /// `unload_adapter`.
    pub fn unload_adapter(&self, name: &str) -> Result<(), RuntimeError> {
        self.e(EngineCall::UnloadAdapter(name.into()))
    }
    /// `stats`.
    pub fn stats(&self) -> Result<ComponentStats, RuntimeError> {
        self.r
            .call(Call::Engine(EngineCall::Stats), true, pick!(Stats))
    }
}

/// A trainer in a worker process.
#[derive(Clone)]
pub struct RemoteTrainer {
    r: Remote,
}

impl RemoteTrainer {
    pub(crate) fn new(channel: Arc<Channel>, proc: Arc<WorkerProc>, t: CallTimeouts) -> Self {
        RemoteTrainer {
            r: Remote {
                channel,
                proc,
                timeouts: t,
            },
        }
    }

    common_methods!();

    fn t(&self, call: TrainerCall) -> Result<(), RuntimeError> {
        self.r.unit(Call::Trainer(call))
    }

    /// [`Trainer::init`](tandem_plugin_api::traits::Trainer::init).
    pub fn init(&self) -> Result<TrainerInfo, RuntimeError> {
        self.r
            .call(Call::Trainer(TrainerCall::Init), false, pick!(TrainerInfo))
    }
    /// `compute_logprobs`.
    pub fn compute_logprobs(
        &self,
        batch: TrainBatch,
        which: WhichWeights,
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let call = Call::Trainer(TrainerCall::ComputeLogprobs {
            batch: batch.into(),
            which: which.into(),
        });
        self.r.call(call, false, |r| match r {
            Reply::Logprobs(l) => Ok(l),
            other => Err(other),
        })
    }
    /// `train_step`.
    pub fn train_step(&self, batch: TrainBatch) -> Result<Vec<Metric>, RuntimeError> {
        let call = Call::Trainer(TrainerCall::TrainStep(batch.into()));
        self.r.call(call, false, |r| match r {
            Reply::Metrics(m) => Ok(RVec::<Metric>::from_wire(m).into_vec()),
            other => Err(other),
        })
    }
    /// `snapshot`.
    pub fn snapshot(&self, name: &str) -> Result<(), RuntimeError> {
        self.t(TrainerCall::Snapshot(name.into()))
    }
    /// `restore`.
    pub fn restore(&self, name: &str) -> Result<(), RuntimeError> {
        self.t(TrainerCall::Restore(name.into()))
    }
    /// `save_checkpoint`.
    pub fn save_checkpoint(&self, dir: &str) -> Result<CheckpointInfo, RuntimeError> {
        let call = Call::Trainer(TrainerCall::SaveCheckpoint(dir.into()));
        self.r.call(call, false, pick!(Checkpoint))
    }
    /// `load_checkpoint`.
    pub fn load_checkpoint(&self, dir: &str) -> Result<CheckpointInfo, RuntimeError> {
        let call = Call::Trainer(TrainerCall::LoadCheckpoint(dir.into()));
        self.r.call(call, false, pick!(Checkpoint))
    }
    /// `export_weight_update`.
    pub fn export_weight_update(&self, kind: UpdateKind) -> Result<WeightUpdate, RuntimeError> {
        let call = Call::Trainer(TrainerCall::ExportWeightUpdate(kind.into()));
        self.r.call(call, false, pick!(WeightUpdate))
    }
    /// `offload`.
    pub fn offload(&self, tags: &[String]) -> Result<(), RuntimeError> {
        self.t(TrainerCall::Offload(tags.to_vec()))
    }
    /// `onload`.
    pub fn onload(&self, tags: &[String]) -> Result<(), RuntimeError> {
        self.t(TrainerCall::Onload(tags.to_vec()))
    }
    /// `stats`.
    pub fn stats(&self) -> Result<ComponentStats, RuntimeError> {
        self.r
            .call(Call::Trainer(TrainerCall::Stats), true, pick!(Stats))
    }
}
