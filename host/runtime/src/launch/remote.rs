//! Controller-side handles of remote components: [`RemoteEngine`] and [`RemoteTrainer`].
//!
//! Their role methods are generated from the role table (see [`crate::role`]: each is an
//! inherent method and the [`Engine`](crate::role::Engine) /
//! [`Trainer`](crate::role::Trainer) implementation) and return `Result<_, RuntimeError>`: a
//! plugin error comes back as [`RuntimeError::Plugin`] naming the worker and the method; a
//! timeout, a dead worker (exit status + log tail) or a protocol error as
//! [`RuntimeError::Control`]. Every call has a timeout ([`CallTimeouts`]), so none can hang.
//! Both handles are `Send + Sync` and cheap to share; trainer calls are executed one at a
//! time by the worker, in the order they arrive. This file holds what the table does not:
//! the connection, the timeouts, the process and `exit`.

use super::monitor::WorkerProc;
use crate::error::RuntimeError;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tandem_control::protocol::{BridgeCall, BridgeReply, Call, Reply};
use tandem_control::{Channel, ControlError};
use tandem_plugin_api::{ApplyOutcome, BridgePlan, Metric, Shipment, UpdateKind, UpdateReport};

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
    /// Sends `call` with its timeout class and picks the expected reply out of the answer.
    fn call<T>(
        &self,
        call: Call,
        pick: impl FnOnce(Reply) -> Result<T, &'static str>,
    ) -> Result<T, RuntimeError> {
        let op = call.name();
        let t = if call.quick() {
            self.timeouts.quick
        } else {
            self.timeouts.long
        };
        let reply = self.channel.call(call, t)?;
        pick(reply).map_err(|other| {
            RuntimeError::from(ControlError::Protocol {
                peer: self.proc.name.clone(),
                message: format!("`{op}` was answered with a `{other}` reply"),
            })
        })
    }

    fn exit(&self) -> Result<(), RuntimeError> {
        self.proc
            .expected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.channel.expect_close(SHUT_DOWN.into());
        let r = self.call(Call::Exit, |r| match r {
            Reply::Exit => Ok(()),
            other => Err(other.kind()),
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
        /// Installs the bridge component `component` with `options_json` in the worker,
        /// beside its engine or trainer (`engines`: the run's engine ranks); its plan.
        pub fn bridge_install(
            &self,
            component: &str,
            options_json: &str,
            engines: u32,
        ) -> Result<BridgePlan, RuntimeError> {
            let call = BridgeCall::Install {
                component: component.into(),
                options_json: options_json.into(),
                engines,
            };
            self.request(Call::Bridge(call), |r| match r {
                Reply::Bridge(BridgeReply::Installed(plan)) => Ok(plan),
                other => Err(other.kind()),
            })
        }
        /// The figures of the worker's bridge half since the last call.
        pub fn bridge_stats(&self) -> Result<Vec<Metric>, RuntimeError> {
            self.request(Call::Bridge(BridgeCall::Stats), |r| match r {
                Reply::Bridge(BridgeReply::Stats(m)) => Ok(m),
                other => Err(other.kind()),
            })
        }
        /// The worker's name as used in errors: role, rank, pid, log file.
        pub fn name(&self) -> &str {
            &self.r.proc.name
        }
        /// The worker's rank within its role.
        pub fn rank(&self) -> u32 {
            self.r.proc.rank
        }
        /// The process this controller started for the worker (the worker itself, or the
        /// `srun` that runs it on another node).
        pub fn pid(&self) -> u32 {
            self.r.proc.pid
        }
        /// The worker's own process on this machine, whose memory this machine can read;
        /// `None` for a worker `srun` runs (possibly on another node).
        pub fn local_pid(&self) -> Option<u32> {
            (!self.r.proc.remote).then_some(self.r.proc.pid)
        }
        /// Where the worker runs: `host (ip)` as it said at its hello.
        pub fn host(&self) -> String {
            self.r.proc.host().unwrap_or_else(|| "unknown host".into())
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
        /// Sends a role call (the generated methods): `pick` takes the expected reply, or hands
        /// back the kind of another one ([`Reply::kind`]), which is a protocol error.
        pub(crate) fn request<T>(
            &self,
            call: Call,
            pick: impl FnOnce(Reply) -> Result<T, &'static str>,
        ) -> Result<T, RuntimeError> {
            self.r.call(call, pick)
        }
    };
}

/// An inference engine in a worker process.
#[derive(Clone)]
pub struct RemoteEngine {
    r: Remote,
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

    /// The engine half of the worker's bridge on `shipped`, the engine takes what it handed
    /// over, and the half learns the outcome; the engine's report.
    pub fn bridge_apply(&self, shipped: Shipment) -> Result<UpdateReport, RuntimeError> {
        self.request(Call::Bridge(BridgeCall::Apply { shipped }), |r| match r {
            Reply::Bridge(BridgeReply::Applied(report)) => Ok(report),
            other => Err(other.kind()),
        })
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

    /// The trainer exports `kind` and the worker's bridge turns it into what ships.
    pub fn bridge_export(&self, kind: UpdateKind) -> Result<Shipment, RuntimeError> {
        self.request(Call::Bridge(BridgeCall::Export { kind }), |r| match r {
            Reply::Bridge(BridgeReply::Shipped(update)) => Ok(update),
            other => Err(other.kind()),
        })
    }

    /// The worker's bridge moves the data of `shipped` over its transport group.
    pub fn bridge_send(&self, shipped: Shipment) -> Result<(), RuntimeError> {
        self.request(Call::Bridge(BridgeCall::Send { shipped }), |r| match r {
            Reply::Bridge(BridgeReply::Sent) => Ok(()),
            other => Err(other.kind()),
        })
    }

    /// Tells the worker's bridge half how the sync of `outcome.version` ended.
    pub fn bridge_after_apply(&self, outcome: ApplyOutcome) -> Result<(), RuntimeError> {
        self.request(
            Call::Bridge(BridgeCall::AfterApply { outcome }),
            |r| match r {
                Reply::Bridge(BridgeReply::Done) => Ok(()),
                other => Err(other.kind()),
            },
        )
    }
}
