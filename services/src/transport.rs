//! The transport half of the host services: send / recv / broadcast on the named groups of
//! this worker (`world`, `trainers`, `engines`, `pair{i}`), each a
//! [`tandem_transport::Communicator`] with group-local ranks.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tandem_plugin_api::{ErrorCode, PluginError};
use tandem_transport::{Communicator, TransportError};

/// The groups, once joined: ready at once ([`TransportSlot::ready`]) or filled by a joining
/// thread ([`TransportSlot::joining`]) that callers wait for.
pub(super) struct TransportSlot {
    state: Mutex<SlotState>,
    changed: Condvar,
    wait: Duration,
}

enum SlotState {
    Joining,
    Ready(Arc<TransportServices>),
    Failed(PluginError),
}

impl TransportSlot {
    pub(super) fn ready(groups: BTreeMap<String, Communicator>) -> Self {
        TransportSlot {
            state: Mutex::new(SlotState::Ready(Arc::new(TransportServices::new(groups)))),
            changed: Condvar::new(),
            wait: Duration::ZERO,
        }
    }

    pub(super) fn joining<F>(wait: Duration, join: F) -> Arc<Self>
    where
        F: FnOnce() -> Result<BTreeMap<String, Communicator>, TransportError> + Send + 'static,
    {
        let slot = Arc::new(TransportSlot {
            state: Mutex::new(SlotState::Joining),
            changed: Condvar::new(),
            wait,
        });
        let filled = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("transport-join".into())
            .spawn(move || {
                let state = match join() {
                    Ok(groups) => SlotState::Ready(Arc::new(TransportServices::new(groups))),
                    Err(e) => SlotState::Failed(transport_error("world", e)),
                };
                filled.set(state);
            });
        if let Err(e) = spawned {
            slot.set(SlotState::Failed(PluginError::new(
                ErrorCode::Runtime,
                format!("cannot start the transport join thread: {e}"),
            )));
        }
        slot
    }

    fn set(&self, state: SlotState) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *s = state;
        self.changed.notify_all();
    }

    /// The joined groups, waiting for a join in progress (at most the slot's wait).
    pub(super) fn get(&self) -> Result<Arc<TransportServices>, PluginError> {
        let deadline = Instant::now() + self.wait;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*s {
                SlotState::Ready(t) => return Ok(Arc::clone(t)),
                SlotState::Failed(e) => return Err(e.clone()),
                SlotState::Joining => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(PluginError::new(
                            ErrorCode::Timeout,
                            format!(
                                "this process has not joined the transport after {:.0} s",
                                self.wait.as_secs_f64()
                            ),
                        )
                        .with_help("a peer rank did not start; see the run's worker logs"));
                    }
                    s = self
                        .changed
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}

/// The groups this process belongs to, by name.
pub(super) struct TransportServices {
    groups: BTreeMap<String, Communicator>,
}

impl TransportServices {
    pub(super) fn new(groups: BTreeMap<String, Communicator>) -> Self {
        TransportServices { groups }
    }

    fn group(&self, name: &str) -> Result<&Communicator, PluginError> {
        self.groups.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.groups.keys().map(String::as_str).collect();
            PluginError::invalid_input(format!(
                "this process is not a member of transport group `{name}`"
            ))
            .with_help(format!("its groups are: {}", known.join(", ")))
        })
    }

    fn rank(comm: &Communicator, group: &str, rank: u32) -> Result<usize, PluginError> {
        let r = rank as usize;
        if r >= comm.world_size() {
            return Err(PluginError::invalid_input(format!(
                "rank {rank} is outside transport group `{group}` of {} ranks",
                comm.world_size()
            )));
        }
        Ok(r)
    }

    pub(super) fn send(
        &self,
        group: &str,
        dst: u32,
        data: &[u8],
        tag: u64,
    ) -> Result<(), PluginError> {
        let comm = self.group(group)?;
        let dst = Self::rank(comm, group, dst)?;
        comm.send(dst, data, wire_tag(tag)?)
            .map_err(|e| transport_error(group, e))
    }

    pub(super) fn recv(
        &self,
        group: &str,
        src: u32,
        buf: &mut [u8],
        tag: u64,
    ) -> Result<(), PluginError> {
        let comm = self.group(group)?;
        let src = Self::rank(comm, group, src)?;
        comm.recv(src, buf, wire_tag(tag)?)
            .map_err(|e| transport_error(group, e))
    }

    pub(super) fn broadcast(
        &self,
        group: &str,
        root: u32,
        buf: &mut [u8],
    ) -> Result<(), PluginError> {
        let comm = self.group(group)?;
        let root = Self::rank(comm, group, root)?;
        comm.broadcast(root, buf)
            .map_err(|e| transport_error(group, e))
    }
}

/// The transport's tags are 32-bit; the ABI's are 64-bit so plugins can pack (step, bucket).
fn wire_tag(tag: u64) -> Result<u32, PluginError> {
    u32::try_from(tag).map_err(|_| {
        PluginError::invalid_input(format!("transport tag {tag} does not fit in 32 bits"))
    })
}

fn transport_error(group: &str, e: TransportError) -> PluginError {
    let code = match &e {
        TransportError::Timeout { .. } | TransportError::StoreTimeout { .. } => ErrorCode::Timeout,
        TransportError::PeerDied { .. } | TransportError::Broken { .. } => ErrorCode::Unavailable,
        TransportError::SizeMismatch { .. } | TransportError::Invalid(_) => ErrorCode::InvalidInput,
        TransportError::Unsupported(_) => ErrorCode::NotSupported,
        _ => ErrorCode::Runtime,
    };
    PluginError::new(code, format!("transport group `{group}`: {e}"))
}
