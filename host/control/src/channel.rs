//! The controller's end of one worker connection: concurrent calls with per-call timeouts.
//!
//! Any thread may [`Channel::call`]; each call gets an id, its reply is routed back by a
//! reader thread, and the caller waits at most its timeout. A timed-out call's late reply is
//! dropped. When the connection breaks (EOF, reset, undecodable frame) or the process monitor
//! reports the worker dead ([`Channel::fail`]), every pending call fails at once with the same
//! reason, and every later call fails immediately: a dead worker never makes a caller hang.
//!
//! On EOF the reader asks the [`PeerLife`] (the launcher's view of the process) to explain the
//! loss, waiting briefly for the exit status and log tail, so the error says how it died.

use super::error::ControlError;
use super::frame::{self, MAX_FRAME_BYTES};
use super::protocol::{Call, Reply, ToController, ToWorker};
use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tandem_plugin_api::PluginError;

/// How long the reader waits for the launcher to explain a lost connection.
const EXPLAIN_WAIT: Duration = Duration::from_secs(2);

/// Writes of a frame longer than this fail the connection (a stopped peer with full buffers).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the controller knows about the process behind a connection.
pub trait PeerLife: Send + Sync {
    /// Why the peer is gone (exit status and log tail), waiting up to `wait` for the process
    /// to be reaped; `None` if it still runs after that.
    fn explain_exit(&self, wait: Duration) -> Option<String>;
}

type Outcome = Result<Reply, ControlError>;
type Waiter = SyncSender<Result<Reply, Lost>>;

/// A call's result before the call-specific error is built.
enum Lost {
    Plugin(PluginError),
    Gone(String),
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Waiter>,
    /// Set once; every pending and later call fails with this reason.
    dead: Option<String>,
    /// Set when the controller asked the worker to go: the reason a broken connection gets.
    closing: Option<String>,
}

struct Inner {
    peer: String,
    state: Mutex<State>,
    life: Option<Arc<dyn PeerLife>>,
    /// A clone of the stream, to shut it down from [`Channel::fail`].
    stream: TcpStream,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the channel dead (first reason wins) and fails every pending call.
    fn fail(&self, reason: String) {
        let pending = {
            let mut st = self.state();
            if st.dead.is_none() {
                st.dead = Some(reason);
            }
            std::mem::take(&mut st.pending)
        };
        let reason = self.state().dead.clone().unwrap_or_default();
        for (_, waiter) in pending {
            let _ = waiter.try_send(Err(Lost::Gone(reason.clone())));
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Fails the channel after the connection broke, explaining why if the process is gone.
    fn broke(&self, what: &str) {
        let closing = {
            let st = self.state();
            if st.dead.is_some() {
                None
            } else {
                Some(st.closing.clone())
            }
        };
        let Some(closing) = closing else {
            return self.fail(String::new());
        };
        if let Some(reason) = closing {
            return self.fail(reason);
        }
        let reason = match self
            .life
            .as_ref()
            .and_then(|l| l.explain_exit(EXPLAIN_WAIT))
        {
            Some(exit) => exit,
            None => format!("the control connection broke ({what}) while the worker still runs"),
        };
        self.fail(reason);
    }
}

/// A connection to one worker, past the handshake and the ready message.
pub struct Channel {
    inner: Arc<Inner>,
    writer: Mutex<TcpStream>,
    next_id: AtomicU64,
}

impl Channel {
    /// Wraps a connected stream; `peer` names the worker in every error.
    pub fn new(
        stream: TcpStream,
        peer: String,
        life: Option<Arc<dyn PeerLife>>,
    ) -> Result<Channel, ControlError> {
        let io = |e| ControlError::io(format!("{peer}: control connection"), e);
        stream.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(io)?;
        let reader = stream.try_clone().map_err(io)?;
        let inner = Arc::new(Inner {
            peer: peer.clone(),
            state: Mutex::new(State::default()),
            life,
            stream: stream.try_clone().map_err(io)?,
        });
        let i = inner.clone();
        std::thread::Builder::new()
            .name("control-reader".into())
            .spawn(move || read_loop(reader, &i))
            .map_err(io)?;
        Ok(Channel {
            inner,
            writer: Mutex::new(stream),
            next_id: AtomicU64::new(1),
        })
    }

    /// The worker's name, as used in errors.
    pub fn peer(&self) -> &str {
        &self.inner.peer
    }

    /// Fails every pending and later call with `reason` (used by the process monitor).
    pub fn fail(&self, reason: String) {
        self.inner.fail(reason);
    }

    /// Announces that the worker will close the connection (it was asked to exit): the
    /// close then fails later calls with `reason` instead of being reported as a loss.
    pub fn expect_close(&self, reason: String) {
        self.inner.state().closing = Some(reason);
    }

    /// `Some(reason)` once the channel is dead.
    pub fn dead_reason(&self) -> Option<String> {
        self.inner.state().dead.clone()
    }

    /// Sends `call` and waits at most `timeout` for its reply.
    pub fn call(&self, call: Call, timeout: Duration) -> Outcome {
        let op = call.name();
        let (tx, rx) = mpsc::sync_channel(1);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.inner.state();
            if let Some(reason) = &st.dead {
                return Err(self.lost(op, reason.clone()));
            }
            st.pending.insert(id, tx);
        }
        let written = frame::encode(&ToWorker::Call { id, call }).and_then(|buf| {
            use std::io::Write;
            let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            w.write_all(&buf).map_err(frame::FrameError::from)
        });
        if let Err(e) = written {
            // A partial frame would desynchronise the stream: the connection is finished.
            self.inner.broke(&format!("sending `{op}`: {e}"));
        }
        match rx.recv_timeout(timeout) {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(Lost::Plugin(error))) => Err(ControlError::Remote {
                peer: self.inner.peer.clone(),
                op,
                error,
            }),
            Ok(Err(Lost::Gone(reason))) => Err(self.lost(op, reason)),
            Err(RecvTimeoutError::Timeout) => {
                self.inner.state().pending.remove(&id);
                Err(ControlError::Timeout {
                    peer: self.inner.peer.clone(),
                    op,
                    after: timeout,
                })
            }
            Err(RecvTimeoutError::Disconnected) => {
                let reason = self.dead_reason().unwrap_or_else(|| "reply lost".into());
                Err(self.lost(op, reason))
            }
        }
    }

    fn lost(&self, op: &'static str, reason: String) -> ControlError {
        ControlError::Lost {
            peer: self.inner.peer.clone(),
            op,
            reason,
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // Ends the reader thread; the worker sees EOF and exits.
        self.inner
            .fail("the controller closed the connection".into());
    }
}

fn read_loop(mut stream: TcpStream, inner: &Inner) {
    loop {
        match frame::read::<ToController>(&mut stream, MAX_FRAME_BYTES) {
            Ok(ToController::Reply { id, result }) => {
                let waiter = inner.state().pending.remove(&id);
                let Some(waiter) = waiter else {
                    tracing::debug!("{}: dropped a late reply to call {id}", inner.peer);
                    continue;
                };
                let _ = waiter.try_send(result.map_err(Lost::Plugin));
            }
            Ok(other) => {
                let what = format!("unexpected message {other:?}");
                tracing::warn!("{}: control-plane protocol error: {what}", inner.peer);
                return inner.broke(&what);
            }
            Err(frame::FrameError::Closed) => return inner.broke("closed by the worker"),
            Err(e) => return inner.broke(&e.to_string()),
        }
    }
}
