//! Decoded tensors from a bridge's engine half into its engine (API level 7): the host's
//! [`TensorSink`] and the in-process pipe behind the group [`DECODED_GROUP`].
//!
//! [`receive`] runs a bridge's `receive` on the calling thread and, once the bridge calls
//! the sink's `begin`, its engine's `apply_weight_update` on another, with a
//! `TensorBuckets` update on [`DECODED_GROUP`]: the engine takes the buckets with the same
//! code that receives them over a transport (data, then the 32-byte trailer of
//! `sdk::buckets`), but its `broadcast` calls on that group are answered from the pipe the
//! sink fills. So a decoding bridge needs nothing of an engine beyond the bucket path, and
//! the engine copies every byte into the weights it serves — it never serves the bridge's
//! memory.
//!
//! The pipe holds at most [`DEPTH`] messages (two buckets with their trailers), so the sink's
//! `put` waits while the engine is behind, and returns once the bytes are copied into the
//! pipe's own buffers (recycled). Either side stopping closes the pipe: a `put` after the
//! engine gave up, or the engine's read after the bridge returned short, is an error, never
//! a hang.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use tandem_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use tandem_plugin_api::abi_stable::std_types::RSlice;
use tandem_plugin_api::sdk::buckets;
use tandem_plugin_api::traits::{TensorSink, TensorSink_TO};
use tandem_plugin_api::{
    BridgeBox, EngineBox, PResult, PluginError, RResult, RVec, Received, Shipment, SinkBox,
    TensorBucket, UpdatePayload, UpdateReport, WeightUpdate,
};

/// The group name an engine's decoded-bucket update names; its broadcasts read the pipe.
pub const DECODED_GROUP: &str = "bridge.decoded";

/// Messages the pipe holds: two buckets, each with its trailer.
const DEPTH: usize = 4;

/// The pipe between a sink and the engine's reads.
#[derive(Default)]
pub(crate) struct Pipe {
    state: Mutex<PipeState>,
    changed: Condvar,
}

#[derive(Default)]
struct PipeState {
    /// The buckets the sink's `begin` announced (taken by the engine thread).
    manifest: Option<Vec<TensorBucket>>,
    /// `begin` was called.
    begun: bool,
    queue: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// The sink is gone: no more messages will come.
    writer_closed: bool,
    /// The engine stopped reading.
    reader_closed: bool,
    /// Messages taken by the engine.
    taken: usize,
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a copy of `data`, waiting while the pipe is full.
    fn push(&self, data: &[u8]) -> Result<(), PluginError> {
        let mut s = self.lock();
        while s.queue.len() >= DEPTH && !s.reader_closed {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.reader_closed {
            return Err(PluginError::invalid_state(
                "the engine stopped taking decoded buckets (its apply ended; see its error)",
            ));
        }
        let mut buf = s.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        s.queue.push_back(buf);
        self.changed.notify_all();
        Ok(())
    }

    /// Fills `out` with the next message, which must be exactly its size.
    pub(crate) fn pop_into(&self, out: &mut [u8]) -> Result<(), PluginError> {
        let mut s = self.lock();
        loop {
            if let Some(msg) = s.queue.pop_front() {
                s.taken += 1;
                self.changed.notify_all();
                if msg.len() != out.len() {
                    let taken = s.taken;
                    s.spare.push(msg);
                    return Err(PluginError::invalid_input(format!(
                        "decoded message {taken} is {} bytes, the engine expected {}",
                        s.spare.last().map_or(0, Vec::len),
                        out.len()
                    )));
                }
                out.copy_from_slice(&msg);
                if s.spare.len() < DEPTH {
                    s.spare.push(msg);
                }
                return Ok(());
            }
            if s.writer_closed {
                return Err(PluginError::invalid_state(format!(
                    "the bridge's engine half stopped after {} of the decoded messages the \
                     engine expects",
                    s.taken
                )));
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Records the announced buckets.
    fn begin(&self, buckets: Vec<TensorBucket>) -> Result<(), PluginError> {
        let mut s = self.lock();
        if s.begun {
            return Err(PluginError::invalid_state(
                "the sink's `begin` was called twice",
            ));
        }
        s.begun = true;
        s.manifest = Some(buckets);
        self.changed.notify_all();
        Ok(())
    }

    /// The announced buckets, once `begin` came; `None` when the sink closed without it.
    fn wait_manifest(&self) -> Option<Vec<TensorBucket>> {
        let mut s = self.lock();
        loop {
            if let Some(m) = s.manifest.take() {
                return Some(m);
            }
            if s.writer_closed {
                return None;
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn begun(&self) -> bool {
        self.lock().begun
    }

    fn close_writer(&self) {
        self.lock().writer_closed = true;
        self.changed.notify_all();
    }

    fn close_reader(&self) {
        self.lock().reader_closed = true;
        self.changed.notify_all();
    }
}

/// The slot of a [`Services`](crate::Services) that routes [`DECODED_GROUP`] to the pipe of
/// the receive in progress.
#[derive(Default)]
pub(crate) struct DecodedSlot {
    current: Mutex<Option<Arc<Pipe>>>,
}

impl DecodedSlot {
    fn open(&self) -> Arc<Pipe> {
        let pipe = Arc::new(Pipe::default());
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&pipe));
        pipe
    }

    fn close(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The pipe of the receive in progress.
    pub(crate) fn pipe(&self) -> Result<Arc<Pipe>, PluginError> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                PluginError::invalid_state(format!(
                    "group `{DECODED_GROUP}` is read only while a bridge hands this engine \
                     decoded tensors"
                ))
            })
    }
}

/// The host's sink: the buckets announced go to the engine thread, their bytes (and each
/// one's trailer) into the pipe.
struct HostSink {
    pipe: Arc<Pipe>,
    version: u64,
    next: u32,
}

impl TensorSink for HostSink {
    fn begin(&mut self, buckets: RVec<TensorBucket>) -> PResult<()> {
        self.pipe.begin(buckets.into_vec()).into()
    }

    fn put(&mut self, data: RSlice<'_, u8>) -> PResult<()> {
        if !self.pipe.begun() {
            return RResult::RErr(PluginError::invalid_state(
                "the sink's `put` before `begin`",
            ));
        }
        let data = data.as_slice();
        let trailer = buckets::trailer(data, self.version, self.next);
        self.next += 1;
        self.pipe
            .push(data)
            .and_then(|()| self.pipe.push(&trailer))
            .into()
    }
}

impl Drop for HostSink {
    fn drop(&mut self) {
        self.pipe.close_writer();
    }
}

/// Runs `bridge`'s engine half on `shipment` and has `engine` take what it hands over: the
/// update it returns (applied here), or the tensors it decodes into the sink (applied on a
/// thread of this call's as they come). `services` must be the services `engine` was built
/// with. The engine's report, or the first error (the engine's before the bridge's: a
/// bridge's failure to put is usually the engine's refusal).
pub fn receive(
    bridge: &BridgeBox,
    engine: &EngineBox,
    services: &crate::Services,
    shipment: Shipment,
) -> Result<UpdateReport, PluginError> {
    let pipe = services.decoded.open();
    let update = |buckets: Vec<TensorBucket>| WeightUpdate {
        version: shipment.version,
        digest: shipment.digest.clone(),
        payload: UpdatePayload::TensorBuckets {
            group: DECODED_GROUP.into(),
            buckets: RVec::from(buckets),
        },
    };
    let sink = HostSink {
        pipe: Arc::clone(&pipe),
        version: shipment.version,
        next: 0,
    };
    let sink = TensorSink_TO::from_value(sink, TD_Opaque);
    let (received, decoded) = std::thread::scope(|s| {
        let applier = s.spawn(|| {
            let applied = pipe
                .wait_manifest()
                .map(|buckets| engine.apply_weight_update(update(buckets)).into_result());
            pipe.close_reader();
            applied
        });
        let received = bridge.receive(shipment.clone(), sink).into_result();
        // (A bridge that kept the sink cannot keep the engine waiting.)
        pipe.close_writer();
        let decoded = applier.join().unwrap_or_else(|_| {
            Some(Err(PluginError::runtime(
                "the thread applying decoded tensors panicked",
            )))
        });
        (received, decoded)
    });
    services.decoded.close();
    match (received, decoded) {
        (Ok(Received::Decoded), Some(applied)) => applied,
        (Ok(Received::Decoded), None) => Err(PluginError::invalid_state(
            "the bridge's engine half returned `Decoded` without calling the sink's `begin`",
        )),
        (Ok(Received::Apply(_)), Some(_)) => Err(PluginError::invalid_state(
            "the bridge's engine half both decoded tensors into the sink and returned an \
             update to apply",
        )),
        (Ok(Received::Apply(update)), None) => engine.apply_weight_update(update).into_result(),
        (Err(bridge_error), Some(Err(engine_error))) => Err(PluginError::new(
            engine_error.code,
            format!(
                "{} (the bridge's engine half: {})",
                engine_error.message, bridge_error.message
            ),
        )
        .with_help(engine_error.help.as_str())),
        (Err(e), _) => Err(e),
    }
}

/// A sink with no engine behind it: `begin` and `put` are refused (for checks that a
/// bridge refuses a shipment before it decodes anything).
pub fn refusing_sink() -> SinkBox {
    TensorSink_TO::from_value(Refusing, TD_Opaque)
}

struct Refusing;

impl TensorSink for Refusing {
    fn begin(&mut self, _buckets: RVec<TensorBucket>) -> PResult<()> {
        RResult::RErr(PluginError::invalid_state(
            "this sink has no engine behind it",
        ))
    }
    fn put(&mut self, _data: RSlice<'_, u8>) -> PResult<()> {
        RResult::RErr(PluginError::invalid_state(
            "this sink has no engine behind it",
        ))
    }
}
