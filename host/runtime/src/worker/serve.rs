//! The worker's call loop: each call maps 1:1 to a role-trait method.
//!
//! Engine calls run concurrently, one thread each (the engine trait is `&self` and
//! `Send + Sync`: the controller pauses an engine while a `generate` is in flight). Trainer
//! calls run one at a time, in arrival order, on one thread (the trainer trait is `&mut self`).
//! Replies share the socket behind a mutex; a frame is written whole, so they never interleave.

use super::Component;
use tandem_control::frame::{self, FrameError, MAX_FRAME_BYTES};
use tandem_control::mirror::{Mirror, WirePluginError, rstrings};
use tandem_control::protocol::{Call, EngineCall, Reply, ToController, ToWorker, TrainerCall};
use crate::error::RuntimeError;
use crate::services::Services;
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tandem_plugin_api::{
    EngineBox, PResult, PluginError, RString, RVec, TrainerBox, UpdateKind, WhichWeights,
};

type Outcome = Result<Reply, WirePluginError>;

#[derive(Clone)]
struct Replier(Arc<Mutex<TcpStream>>);

impl Replier {
    fn send(&self, id: u64, result: Outcome) {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = frame::write(&mut *w, &ToController::Reply { id, result }) {
            // The controller is gone; the read loop sees it and ends the process.
            tracing::warn!("cannot send the reply to call {id}: {e}");
        }
    }
}

/// Serves calls until `Exit` (Ok) or until the controller goes away (Err).
pub(super) fn serve(
    stream: TcpStream,
    component: Component,
    services: &Services,
) -> Result<(), RuntimeError> {
    let io = |source| RuntimeError::Io {
        context: "worker: control connection".into(),
        source,
    };
    let replier = Replier(Arc::new(Mutex::new(stream.try_clone().map_err(io)?)));
    let mut reader = BufReader::new(stream);
    let role = match &component {
        Component::Engine(_) => "engine",
        Component::Trainer(_) => "trainer",
    };
    let (engine, trainer_queue) = match component {
        Component::Engine(e) => (Some(Arc::new(e)), None),
        Component::Trainer(t) => (None, Some(trainer_thread(t, replier.clone())?)),
    };
    loop {
        let (id, call) = match frame::read::<ToWorker>(&mut reader, MAX_FRAME_BYTES) {
            Ok(ToWorker::Call { id, call }) => (id, call),
            Ok(other) => {
                return Err(RuntimeError::runtime(format!(
                    "worker: unexpected message from the controller: {other:?}"
                )));
            }
            Err(FrameError::Closed) => {
                return Err(RuntimeError::runtime(
                    "worker: the controller closed the control connection; exiting",
                ));
            }
            Err(e) => {
                return Err(RuntimeError::runtime(format!(
                    "worker: reading from the controller: {e}; exiting"
                )));
            }
        };
        match (call, &engine, &trainer_queue) {
            (Call::Exit, _, _) => {
                tracing::info!("the controller asked this worker to exit");
                services.cancel();
                replier.send(id, Ok(Reply::Unit));
                return Ok(());
            }
            (Call::Engine(c), Some(engine), _) => {
                let (engine, r) = (engine.clone(), replier.clone());
                let op = c.name();
                let spawned = std::thread::Builder::new()
                    .name(format!("call-{op}"))
                    .spawn(move || r.send(id, engine_call(&engine, c)));
                if let Err(e) = spawned {
                    let err = PluginError::runtime(format!("worker: cannot start a thread: {e}"));
                    replier.send(id, Err(err.into()));
                }
            }
            (Call::Trainer(c), _, Some(queue)) => {
                if queue.send((id, c)).is_err() {
                    return Err(RuntimeError::runtime(
                        "worker: the trainer thread ended",
                    ));
                }
            }
            (call, _, _) => {
                let err = PluginError::invalid_input(format!(
                    "{role} worker got the call `{}` of another role",
                    call.name()
                ));
                replier.send(id, Err(err.into()));
            }
        }
    }
}

fn trainer_thread(
    mut trainer: TrainerBox,
    replier: Replier,
) -> Result<mpsc::Sender<(u64, TrainerCall)>, RuntimeError> {
    let (tx, rx) = mpsc::channel::<(u64, TrainerCall)>();
    std::thread::Builder::new()
        .name("trainer".into())
        .spawn(move || {
            for (id, call) in rx {
                replier.send(id, trainer_call(&mut trainer, call));
            }
        })
        .map_err(|source| RuntimeError::Io {
            context: "worker: starting the trainer thread".into(),
            source,
        })?;
    Ok(tx)
}

fn reply<T>(r: PResult<T>, f: impl FnOnce(T) -> Reply) -> Outcome {
    r.into_result().map(f).map_err(Into::into)
}

fn unit(r: PResult<()>) -> Outcome {
    reply(r, |()| Reply::Unit)
}

fn engine_call(e: &EngineBox, call: EngineCall) -> Outcome {
    match call {
        EngineCall::Start => unit(e.start()),
        EngineCall::Health => reply(e.health(), |h| Reply::Health(h.into())),
        EngineCall::Shutdown => unit(e.shutdown()),
        EngineCall::Generate(req) => reply(e.generate(req.into()), |r| Reply::Generated(r.into())),
        EngineCall::Score(seqs) => reply(e.score(Mirror::from_wire(seqs)), |l| {
            Reply::Logprobs(l.to_wire())
        }),
        EngineCall::PauseGeneration(mode) => unit(e.pause_generation(mode.into())),
        EngineCall::ContinueGeneration => unit(e.continue_generation()),
        EngineCall::FlushCache => unit(e.flush_cache()),
        EngineCall::ReleaseMemory(tags) => unit(e.release_memory(rstrings(tags))),
        EngineCall::ResumeMemory(tags) => unit(e.resume_memory(rstrings(tags))),
        EngineCall::ApplyWeightUpdate(u) => reply(e.apply_weight_update(u.into()), |r| {
            Reply::Updated(r.into())
        }),
        EngineCall::LoadAdapter { name, dir } => unit(e.load_adapter(name.into(), dir.into())),
        EngineCall::UnloadAdapter(name) => unit(e.unload_adapter(name.into())),
        EngineCall::Stats => reply(e.stats(), |s| Reply::Stats(s.into())),
    }
}

fn trainer_call(t: &mut TrainerBox, call: TrainerCall) -> Outcome {
    let s = RString::from;
    match call {
        TrainerCall::Init => reply(t.init(), |i| Reply::TrainerInfo(i.into())),
        TrainerCall::ComputeLogprobs { batch, which } => reply(
            t.compute_logprobs(batch.into(), WhichWeights::from(which)),
            |l: RVec<RVec<f32>>| Reply::Logprobs(l.to_wire()),
        ),
        TrainerCall::TrainStep(batch) => {
            reply(t.train_step(batch.into()), |m| Reply::Metrics(m.to_wire()))
        }
        TrainerCall::Snapshot(name) => unit(t.snapshot(s(name))),
        TrainerCall::Restore(name) => unit(t.restore(s(name))),
        TrainerCall::SaveCheckpoint(dir) => {
            reply(t.save_checkpoint(s(dir)), |c| Reply::Checkpoint(c.into()))
        }
        TrainerCall::LoadCheckpoint(dir) => {
            reply(t.load_checkpoint(s(dir)), |c| Reply::Checkpoint(c.into()))
        }
        TrainerCall::ExportWeightUpdate(kind) => {
            reply(t.export_weight_update(UpdateKind::from(kind)), |u| {
                Reply::WeightUpdate(u.into())
            })
        }
        TrainerCall::Offload(tags) => unit(t.offload(rstrings(tags))),
        TrainerCall::Onload(tags) => unit(t.onload(rstrings(tags))),
        TrainerCall::Stats => reply(t.stats(), |s| Reply::Stats(s.into())),
    }
}
