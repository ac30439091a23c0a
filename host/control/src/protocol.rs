//! The control-plane messages, one enum per direction.
//!
//! A session: the worker connects and sends [`ToController::Hello`]; the controller answers
//! [`ToWorker::Welcome`] or [`ToWorker::Rejected`] (and closes). The worker then constructs its
//! component and sends [`ToController::Ready`] or [`ToController::StartFailed`]. After that the
//! controller sends [`ToWorker::Call`]s with increasing ids and the worker answers each with a
//! [`ToController::Reply`] carrying the same id; replies may come back out of order (an
//! engine serves calls concurrently). [`Call::Exit`] ends the session.

use super::mirror::*;
use super::packed;
use serde::{Deserialize, Serialize};

/// Version of this protocol; a worker of another build is refused at the hello.
pub const PROTOCOL_VERSION: u32 = 1;

/// Role of a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs an inference engine.
    Engine,
    /// Runs a trainer.
    Trainer,
}

impl Role {
    /// Lower-case name, as on the command line and in log file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Engine => "engine",
            Role::Trainer => "trainer",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Controller → worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    /// The hello was accepted.
    Welcome,
    /// The hello was refused; the connection closes after this.
    Rejected { reason: String },
    /// A call to answer with a [`ToController::Reply`] of the same id.
    Call { id: u64, call: Call },
}

/// Worker → controller.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToController {
    /// First frame of every connection.
    Hello {
        protocol: u32,
        token: String,
        role: Role,
        rank: u32,
        pid: u32,
    },
    /// The component was constructed; calls may come.
    Ready { component: String },
    /// The component could not be constructed; the worker exits after this.
    StartFailed {
        context: String,
        error: WirePluginError,
    },
    /// The answer to the call with this id.
    Reply {
        id: u64,
        result: Result<Reply, WirePluginError>,
    },
}

/// A call: one role-trait method, or the end of the session.
#[derive(Debug, Serialize, Deserialize)]
pub enum Call {
    Engine(EngineCall),
    Trainer(TrainerCall),
    /// Answer, then exit the worker process with status 0.
    Exit,
}

impl Call {
    /// The method name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Engine(c) => c.name(),
            Call::Trainer(c) => c.name(),
            Call::Exit => "exit",
        }
    }
}

/// One [`tandem_plugin_api::traits::InferenceEngine`] method with its arguments.
#[derive(Debug, Serialize, Deserialize)]
pub enum EngineCall {
    Start,
    Health,
    Shutdown,
    Generate(WireGenerateRequest),
    Score(#[serde(with = "packed::nested")] Vec<Vec<u32>>),
    PauseGeneration(WirePauseMode),
    ContinueGeneration,
    FlushCache,
    ReleaseMemory(Vec<String>),
    ResumeMemory(Vec<String>),
    ApplyWeightUpdate(WireWeightUpdate),
    LoadAdapter { name: String, dir: String },
    UnloadAdapter(String),
    Stats,
}

impl EngineCall {
    /// The trait method's name.
    pub fn name(&self) -> &'static str {
        match self {
            EngineCall::Start => "start",
            EngineCall::Health => "health",
            EngineCall::Shutdown => "shutdown",
            EngineCall::Generate(_) => "generate",
            EngineCall::Score(_) => "score",
            EngineCall::PauseGeneration(_) => "pause_generation",
            EngineCall::ContinueGeneration => "continue_generation",
            EngineCall::FlushCache => "flush_cache",
            EngineCall::ReleaseMemory(_) => "release_memory",
            EngineCall::ResumeMemory(_) => "resume_memory",
            EngineCall::ApplyWeightUpdate(_) => "apply_weight_update",
            EngineCall::LoadAdapter { .. } => "load_adapter",
            EngineCall::UnloadAdapter(_) => "unload_adapter",
            EngineCall::Stats => "stats",
        }
    }
}

/// One [`tandem_plugin_api::traits::Trainer`] method with its arguments.
#[derive(Debug, Serialize, Deserialize)]
pub enum TrainerCall {
    Init,
    ComputeLogprobs {
        batch: WireTrainBatch,
        which: WireWhichWeights,
    },
    TrainStep(WireTrainBatch),
    Snapshot(String),
    Restore(String),
    SaveCheckpoint(String),
    LoadCheckpoint(String),
    ExportWeightUpdate(WireUpdateKind),
    Offload(Vec<String>),
    Onload(Vec<String>),
    Stats,
}

impl TrainerCall {
    /// The trait method's name.
    pub fn name(&self) -> &'static str {
        match self {
            TrainerCall::Init => "init",
            TrainerCall::ComputeLogprobs { .. } => "compute_logprobs",
            TrainerCall::TrainStep(_) => "train_step",
            TrainerCall::Snapshot(_) => "snapshot",
            TrainerCall::Restore(_) => "restore",
            TrainerCall::SaveCheckpoint(_) => "save_checkpoint",
            TrainerCall::LoadCheckpoint(_) => "load_checkpoint",
            TrainerCall::ExportWeightUpdate(_) => "export_weight_update",
            TrainerCall::Offload(_) => "offload",
            TrainerCall::Onload(_) => "onload",
            TrainerCall::Stats => "stats",
        }
    }
}

/// A successful answer; which variant depends on the call.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Unit,
    Health(WireEngineHealth),
    Generated(WireGenerateResponse),
    Logprobs(#[serde(with = "packed::nested")] Vec<Vec<f32>>),
    Updated(WireUpdateReport),
    Stats(WireComponentStats),
    TrainerInfo(WireTrainerInfo),
    Metrics(Vec<WireMetric>),
    Checkpoint(WireCheckpointInfo),
    WeightUpdate(WireWeightUpdate),
}

impl Reply {
    /// The variant's name, for protocol-error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Unit => "unit",
            Reply::Health(_) => "health",
            Reply::Generated(_) => "generated",
            Reply::Logprobs(_) => "logprobs",
            Reply::Updated(_) => "updated",
            Reply::Stats(_) => "stats",
            Reply::TrainerInfo(_) => "trainer_info",
            Reply::Metrics(_) => "metrics",
            Reply::Checkpoint(_) => "checkpoint",
            Reply::WeightUpdate(_) => "weight_update",
        }
    }
}
