//! The worker's call loop: each call maps 1:1 to a role method, and its `dispatch` (generated
//! from the role table, `tandem_control::roles`) calls the ABI method.
//!
//! Engine calls run concurrently, one thread each (the engine trait is `&self` and
//! `Send + Sync`: the controller pauses an engine while a `generate` is in flight). Trainer
//! calls run one at a time, in arrival order, on one thread (the trainer trait is `&mut self`).
//! Replies share the socket behind a mutex; a frame is written whole, so they never interleave.
//! Bridge calls run where their half needs: the trainer half on the trainer's thread, in
//! order with the trainer's calls; the engine half on a thread of its own like an engine call.

use super::bridge;
use super::{Component, RoleComponent};
use crate::error::RuntimeError;
use crate::services::Services;
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tandem_control::frame::{self, FrameError, MAX_FRAME_BYTES};
use tandem_control::protocol::{BridgeCall, Call, Reply, ToController, ToWorker, TrainerCall};
use tandem_plugin_api::{PluginError, TrainerBox};

type Outcome = Result<Reply, PluginError>;

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
    let role = match &component.role {
        RoleComponent::Engine(_) => "engine",
        RoleComponent::Trainer(_) => "trainer",
    };
    let bridges = Arc::new(component.bridges);
    let (engine, trainer_queue) = match component.role {
        RoleComponent::Engine(e) => (Some(Arc::new(e)), None),
        RoleComponent::Trainer(t) => {
            let queue = trainer_thread(t, bridges.clone(), replier.clone())?;
            (None, Some(queue))
        }
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
                replier.send(id, Ok(Reply::Exit));
                return Ok(());
            }
            (Call::Engine(c), Some(engine), _) => {
                let (engine, r) = (engine.clone(), replier.clone());
                let op = c.name();
                let spawned = std::thread::Builder::new()
                    .name(format!("call-{op}"))
                    .spawn(move || {
                        let result = c.dispatch(&engine).map(Reply::Engine);
                        r.send(id, result);
                    });
                if let Err(e) = spawned {
                    let err = PluginError::runtime(format!("worker: cannot start a thread: {e}"));
                    replier.send(id, Err(err));
                }
            }
            (Call::Bridge(c), Some(engine), _) => {
                let (engine, bridges, r) = (engine.clone(), bridges.clone(), replier.clone());
                let spawned = std::thread::Builder::new()
                    .name("call-bridge".into())
                    .spawn(move || {
                        let result = bridge::on_engine(c, &engine, &bridges);
                        r.send(id, result.map(Reply::Bridge));
                    });
                if let Err(e) = spawned {
                    let err = PluginError::runtime(format!("worker: cannot start a thread: {e}"));
                    replier.send(id, Err(err));
                }
            }
            (Call::Trainer(c), _, Some(queue)) => {
                if queue.send((id, Work::Trainer(c))).is_err() {
                    return Err(RuntimeError::runtime("worker: the trainer thread ended"));
                }
            }
            (Call::Bridge(c), _, Some(queue)) => {
                if queue.send((id, Work::Bridge(c))).is_err() {
                    return Err(RuntimeError::runtime("worker: the trainer thread ended"));
                }
            }
            (call, _, _) => {
                let err = PluginError::invalid_input(format!(
                    "{role} worker got the call `{}` of another role",
                    call.name()
                ));
                replier.send(id, Err(err));
            }
        }
    }
}

/// What the trainer thread runs, in arrival order.
enum Work {
    Trainer(TrainerCall),
    Bridge(BridgeCall),
}

fn trainer_thread(
    mut trainer: TrainerBox,
    bridges: Arc<bridge::Bridges>,
    replier: Replier,
) -> Result<mpsc::Sender<(u64, Work)>, RuntimeError> {
    let (tx, rx) = mpsc::channel::<(u64, Work)>();
    std::thread::Builder::new()
        .name("trainer".into())
        .spawn(move || {
            for (id, work) in rx {
                let result = match work {
                    Work::Trainer(call) => call.dispatch(&mut trainer).map(Reply::Trainer),
                    Work::Bridge(call) => {
                        bridge::on_trainer(call, &mut trainer, &bridges).map(Reply::Bridge)
                    }
                };
                replier.send(id, result);
            }
        })
        .map_err(|source| RuntimeError::Io {
            context: "worker: starting the trainer thread".into(),
            source,
        })?;
    Ok(tx)
}
