//! An in-process transport world of two ranks for a bridge that asks for a transport: rank 0
//! is the trainer, rank 1 the engine, and both belong to the group
//! [`BRIDGE_GROUP`](tandem_plugin_api::BRIDGE_GROUP) in that order, as the host forms it
//! for one engine. Both communicators live in this process; each goes into the services of
//! its side's component, so each bridge half reaches the group at its own rank.

use crate::harness::Failure;
use crate::setup::Groups;
use std::sync::atomic::{AtomicU64, Ordering};
use tandem_transport::store::StoreServer;
use tandem_transport::topology::GroupSpec;
use tandem_transport::{CommConfig, Communicator};

/// The world's two sides, and the rendezvous store they joined through (kept for the
/// world's lifetime, like the controller's).
pub(crate) struct World {
    _store: StoreServer,
    /// Rank 0's groups: the trainer's services.
    pub trainer: Groups,
    /// Rank 1's groups: the engine's services.
    pub engine: Groups,
}

/// Forms the world: a store on an ephemeral local port, both ranks joining at once.
pub(crate) fn bridge_world() -> Result<World, Failure> {
    static WORLDS: AtomicU64 = AtomicU64::new(0);
    let rule = "setup";
    let n = WORLDS.fetch_add(1, Ordering::Relaxed);
    let token = format!("conformance-{}-{n}", std::process::id());
    let store = StoreServer::start("127.0.0.1:0", &token)
        .map_err(|e| Failure::new(rule, format!("starting a rendezvous store: {e}")))?;
    let addr = store.addr().to_string();
    let join = |rank: usize| -> Result<Groups, String> {
        let mut cfg = CommConfig::new(&addr, &token, rank, 2);
        cfg.name = format!("conformance-bridge-{n}");
        let world = Communicator::init(&cfg).map_err(|e| format!("rank {rank} joining: {e}"))?;
        world
            .groups(&[GroupSpec {
                name: tandem_plugin_api::BRIDGE_GROUP.into(),
                ranks: vec![0, 1],
            }])
            .map_err(|e| format!("rank {rank} forming the group: {e}"))
    };
    let (trainer, engine) = std::thread::scope(|s| {
        let engine = s.spawn(|| join(1));
        let trainer = join(0);
        let engine = engine
            .join()
            .unwrap_or_else(|_| Err("rank 1 panicked joining".into()));
        (trainer, engine)
    });
    let fail = |e: String| Failure::new(rule, format!("forming the transport world: {e}"));
    Ok(World {
        _store: store,
        trainer: trainer.map_err(fail)?,
        engine: engine.map_err(fail)?,
    })
}
