//! The transport world of a run's workers (the data plane): a rendezvous store the controller
//! hosts (on the address the workers dial the control plane at: loopback, or the advertised
//! address when workers run on other hosts), a fresh name per run incarnation, and the named groups each worker builds. The
//! drafter job's world pairs each engine rank with the trainer (`pair<i>`); an RL run whose
//! bridge moves data over the transport has the group `bridge` (trainer first, then every
//! engine rank).

use crate::error::RlError;
use std::net::SocketAddr;
use tandem_runtime::launch::LocalLauncher;
use tandem_runtime::worker::TransportSpec;
use tandem_transport::store::StoreServer;

/// A transport world: its store (alive as long as this value) and its layout.
pub struct World {
    _store: StoreServer,
    store: String,
    name: String,
    size: u32,
    groups: Vec<(String, Vec<u32>)>,
    backend: String,
    timeout_secs: f64,
}

impl World {
    /// Starts the store (authenticated by the run's token, on the launcher's control address)
    /// for a world of `size` ranks with `groups` (world ranks in group-rank order); `what`
    /// names the world in its key space.
    pub fn start(
        launcher: &LocalLauncher,
        what: &str,
        size: u32,
        groups: Vec<(String, Vec<u32>)>,
        backend: &str,
        timeout_secs: f64,
    ) -> Result<World, RlError> {
        let at = SocketAddr::new(launcher.control_addr().ip(), 0).to_string();
        let store = StoreServer::start(&at, launcher.token()).map_err(|e| {
            RlError::failed(format!("cannot start the transport rendezvous store: {e}"))
        })?;
        Ok(World {
            store: store.addr().to_string(),
            _store: store,
            name: format!("{what}-{}-{}", std::process::id(), nanos()),
            size,
            groups,
            backend: backend.to_owned(),
            timeout_secs,
        })
    }

    /// The world of a run whose bridge moves data over the transport: world rank 0 is
    /// trainer rank 0, world rank `1 + i` engine rank `i`; the group
    /// [`BRIDGE_GROUP`](tandem_plugin_api::BRIDGE_GROUP) holds them in that order (and so does
    /// `world`).
    pub fn for_bridge(
        launcher: &LocalLauncher,
        engines: u32,
        backend: &str,
        timeout_secs: f64,
    ) -> Result<World, RlError> {
        let everyone: Vec<u32> = (0..=engines).collect();
        let groups = vec![
            ("world".to_string(), everyone.clone()),
            (tandem_plugin_api::BRIDGE_GROUP.to_string(), everyone),
        ];
        World::start(
            launcher,
            "bridge",
            engines + 1,
            groups,
            backend,
            timeout_secs,
        )
    }

    /// World rank `rank`'s spec.
    pub fn spec(&self, rank: u32) -> TransportSpec {
        TransportSpec {
            store: self.store.clone(),
            name: self.name.clone(),
            world_rank: rank,
            world_size: self.size,
            groups: self.groups.clone(),
            backend: self.backend.clone(),
            timeout_secs: self.timeout_secs,
        }
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
