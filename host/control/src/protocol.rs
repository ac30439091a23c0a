//! The control-plane messages, one enum per direction.
//!
//! A session: the worker connects and sends [`ToController::Hello`]; the controller answers
//! [`ToWorker::Welcome`] or [`ToWorker::Rejected`] (and closes). The worker then constructs its
//! component and sends [`ToController::Ready`] or [`ToController::StartFailed`]. After that the
//! controller sends [`ToWorker::Call`]s with increasing ids and the worker answers each with a
//! [`ToController::Reply`] carrying the same id; replies may come back out of order (an
//! engine serves calls concurrently). [`Call::Exit`] ends the session.
//!
//! The role calls and their replies ([`EngineCall`], [`EngineReply`], [`TrainerCall`],
//! [`TrainerReply`]) are generated from the [role table](crate::roles). The bridge calls
//! ([`BridgeCall`]) run a weight bridge's half beside the worker's component.

use crate::roles::vocabulary::*;
use serde::{Deserialize, Serialize};
use tandem_plugin_api::{ApplyOutcome, BridgePlan, Metric, PluginError, Shipment};

/// Version of this protocol; a worker of another build is refused at the hello. 2: role calls
/// and replies generated from the role table (struct variants; replies per role and method).
/// 3: bridge calls. 4: the hello names the worker's host and its launch.
pub const PROTOCOL_VERSION: u32 = 4;

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
    Rejected {
        /// Why, for the worker's error.
        reason: String,
    },
    /// A call to answer with a [`ToController::Reply`] of the same id.
    Call {
        /// Matches the reply to the call.
        id: u64,
        /// What to do.
        call: Call,
    },
}

/// Worker → controller.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToController {
    /// First frame of every connection.
    Hello {
        /// The worker's [`PROTOCOL_VERSION`].
        protocol: u32,
        /// The run's token.
        token: String,
        /// The worker's role.
        role: Role,
        /// The worker's rank within its role.
        rank: u32,
        /// The worker's process id, on its host.
        pid: u32,
        /// Which start of the rank this is (the launcher claims only the launch it started:
        /// a late connection of an earlier process of the rank is not taken for it).
        launch: u64,
        /// The worker's host name (the launcher records where each rank runs).
        host: String,
    },
    /// The component was constructed; calls may come.
    Ready {
        /// The component's name.
        component: String,
    },
    /// The component could not be constructed; the worker exits after this.
    StartFailed {
        /// What the worker was doing (empty when the error says it).
        context: String,
        /// The error.
        error: PluginError,
    },
    /// The answer to the call with this id.
    Reply {
        /// The call's id.
        id: u64,
        /// The method's result, or the plugin's error.
        result: Result<Reply, PluginError>,
    },
}

/// A call: one role method (the [role table](crate::roles)), or the end of the session.
#[derive(Debug, Serialize, Deserialize)]
pub enum Call {
    /// An engine method.
    Engine(EngineCall),
    /// A trainer method.
    Trainer(TrainerCall),
    /// A half of the worker's weight bridge.
    Bridge(BridgeCall),
    /// Answer, then exit the worker process with status 0.
    Exit,
}

/// A half of a weight bridge, run in the worker that holds the bridge instance next to its
/// component (see `tandem_plugin_api::WeightBridge`).
#[derive(Debug, Serialize, Deserialize)]
pub enum BridgeCall {
    /// Any worker: constructs the bridge component `component` (its plugin from the worker's
    /// registry) with `options_json` beside the worker's component, replacing any earlier
    /// one; `engines` is the run's engine ranks (the bridge's `world_size`). Answered with
    /// [`BridgeReply::Installed`] and the bridge's plan.
    Install {
        /// The bridge component (the job's `[bridge] plugin`).
        component: String,
        /// Its options (`[bridge.options]`) as JSON.
        options_json: String,
        /// The run's engine ranks.
        engines: u32,
    },
    /// Trainer worker: the trainer exports `kind`, then the bridge's trainer half (`ship`)
    /// turns it into what ships. Answered with [`BridgeReply::Shipped`].
    Export {
        /// The kind the bridge asks the trainer for.
        kind: UpdateKind,
    },
    /// Trainer worker: the bridge moves the data of `shipped` over its transport group
    /// (`transmit`). Answered with [`BridgeReply::Sent`].
    Send {
        /// What the trainer half returned.
        shipped: Shipment,
    },
    /// Engine worker: the bridge's engine half (`receive`), the engine applies what it
    /// handed over, then the half learns the outcome (`after_apply`). Answered with
    /// [`BridgeReply::Applied`].
    Apply {
        /// What the trainer half returned.
        shipped: Shipment,
    },
    /// Trainer worker: how the sync ended (`after_apply`). Answered with
    /// [`BridgeReply::Done`].
    AfterApply {
        /// The sync's version, and whether every engine applied it and was verified.
        outcome: ApplyOutcome,
    },
    /// Any worker: the bridge half's own figures since the last call (`stats`). Answered with
    /// [`BridgeReply::Stats`].
    Stats,
}

impl BridgeCall {
    /// The call's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            BridgeCall::Install { .. } => "bridge install",
            BridgeCall::Export { .. } => "bridge export",
            BridgeCall::Send { .. } => "bridge send",
            BridgeCall::Apply { .. } => "bridge apply",
            BridgeCall::AfterApply { .. } => "bridge after_apply",
            BridgeCall::Stats => "bridge stats",
        }
    }
}

/// The result of a [`BridgeCall`].
#[derive(Debug, Serialize, Deserialize)]
pub enum BridgeReply {
    /// The bridge is in place; its plan.
    Installed(BridgePlan),
    /// What ships to the engines.
    Shipped(Shipment),
    /// The data moved.
    Sent,
    /// What the engine reports after applying.
    Applied(UpdateReport),
    /// The half took the outcome.
    Done,
    /// The half's figures.
    Stats(Vec<Metric>),
}

impl Call {
    /// The method name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Engine(c) => c.name(),
            Call::Trainer(c) => c.name(),
            Call::Bridge(c) => c.name(),
            Call::Exit => "exit",
        }
    }

    /// Whether the call gets the short timeout: it only reads state (`health`, `stats`), or it
    /// is `exit`.
    pub fn quick(&self) -> bool {
        match self {
            Call::Engine(c) => c.quick(),
            Call::Trainer(c) => c.quick(),
            Call::Bridge(_) => false,
            Call::Exit => true,
        }
    }
}

/// A successful answer, of the call's role and method.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// The result of an engine method.
    Engine(EngineReply),
    /// The result of a trainer method.
    Trainer(TrainerReply),
    /// The result of a bridge call.
    Bridge(BridgeReply),
    /// The answer to [`Call::Exit`].
    Exit,
}

impl Reply {
    /// The method it answers, for protocol-error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Engine(r) => r.name(),
            Reply::Trainer(r) => r.name(),
            Reply::Bridge(BridgeReply::Installed(_)) => "bridge install",
            Reply::Bridge(BridgeReply::Shipped(_)) => "bridge export",
            Reply::Bridge(BridgeReply::Sent) => "bridge send",
            Reply::Bridge(BridgeReply::Applied(_)) => "bridge apply",
            Reply::Bridge(BridgeReply::Done) => "bridge after_apply",
            Reply::Bridge(BridgeReply::Stats(_)) => "bridge stats",
            Reply::Exit => "exit",
        }
    }
}

/// Generates, per role of the table: the call enum (`name`, `quick`, `dispatch`) and the
/// reply enum (`name`).
macro_rules! role_protocol {
    (@quick) => { false };
    (@quick quick) => { true };
    ($(
        $(#[$role_doc:meta])*
        $Role:ident {
            receiver: $receiver:ty,
            abi: $Abi:ty,
            call: $Call:ident,
            reply: $Reply:ident,
            remote: $Remote:ident $(,)?
        } {$(
            $(#[$doc:meta])*
            $V:ident $name:ident ($($arg:ident: $spec:ty $(as $host:ty)?),* $(,)?)
                -> $ret:ty $(as $ret_host:ty)? $([$speed:ident])?;
        )*}
    )*) => {$(
        #[doc = concat!("A call of one `", stringify!($Role), "` method, with its arguments.")]
        #[derive(Debug, Serialize, Deserialize)]
        pub enum $Call {$(
            $(#[$doc])*
            $V {$(
                #[doc = concat!("`", stringify!($arg), "`")]
                $arg: $spec,
            )*},
        )*}

        impl $Call {
            /// The method's name.
            pub fn name(&self) -> &'static str {
                match self {$( $Call::$V { .. } => stringify!($name), )*}
            }

            /// Whether the call gets the short timeout.
            pub fn quick(&self) -> bool {
                match self {$( $Call::$V { .. } => role_protocol!(@quick $($speed)?), )*}
            }

            /// Calls the method on `component` (the worker's side). The arguments and the
            /// result are the ABI values themselves; `into` is the identity except for
            /// [`Rows`] (to and from `RVec<RVec<_>>`).
            pub fn dispatch(self, component: $Abi) -> Result<$Reply, PluginError> {
                match self {$(
                    $Call::$V { $($arg),* } => component
                        .$name($($arg.into()),*)
                        .into_result()
                        .map(|r| $Reply::$V(r.into())),
                )*}
            }
        }

        #[doc = concat!("The result of one `", stringify!($Role), "` method.")]
        #[derive(Debug, Serialize, Deserialize)]
        pub enum $Reply {$(
            #[doc = concat!("The result of `", stringify!($name), "`.")]
            $V($ret),
        )*}

        impl $Reply {
            /// The name of the method it answers.
            pub fn name(&self) -> &'static str {
                match self {$( $Reply::$V(_) => stringify!($name), )*}
            }
        }
    )*};
}

crate::role_table!(role_protocol);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;
    use tandem_plugin_api::sdk::{self, EngineImpl};

    /// Scores every token after the first as minus its id; nothing else.
    struct Scorer;

    impl EngineImpl for Scorer {
        fn component(&self) -> &str {
            "scorer"
        }
        fn health(&self) -> sdk::Result<EngineHealth> {
            Ok(EngineHealth {
                ready: true,
                weight_version: 0,
                detail: RString::new(),
            })
        }
        fn score(&self, sequences: Vec<RVec<u32>>) -> sdk::Result<Vec<RVec<f32>>> {
            let row = |s: &RVec<u32>| s.iter().skip(1).map(|&t| -(t as f32)).collect();
            Ok(sequences.iter().map(row).collect())
        }
    }

    fn through_the_wire<T: Serialize + serde::de::DeserializeOwned>(v: &T) -> T {
        rmp_serde::from_slice(&rmp_serde::to_vec(v).unwrap()).unwrap()
    }

    #[test]
    fn the_table_names_calls_and_marks_only_state_reads_quick() {
        let quick: Vec<Call> = vec![
            Call::Engine(EngineCall::Health {}),
            Call::Engine(EngineCall::Stats {}),
            Call::Trainer(TrainerCall::Stats {}),
            Call::Exit,
        ];
        let long: Vec<Call> = vec![
            Call::Engine(EngineCall::Start {}),
            Call::Engine(EngineCall::LoadAdapter {
                name: "a".into(),
                dir: "/a".into(),
            }),
            Call::Trainer(TrainerCall::Init {}),
            Call::Trainer(TrainerCall::Offload { tags: RVec::new() }),
        ];
        let names = |calls: &[Call]| calls.iter().map(Call::name).collect::<Vec<_>>();
        assert_eq!(names(&quick), ["health", "stats", "stats", "exit"]);
        assert_eq!(names(&long), ["start", "load_adapter", "init", "offload"]);
        assert!(quick.iter().all(Call::quick));
        assert!(!long.iter().any(Call::quick));
    }

    #[test]
    fn a_call_crosses_the_wire_and_dispatches_to_the_abi_method() {
        let engine = sdk::engine_box(Scorer);
        let call = EngineCall::Score {
            sequences: Rows::from(vec![vec![1, 2, 3], vec![4]]),
        };
        let call = through_the_wire(&call);
        let reply = through_the_wire(&call.dispatch(&engine).unwrap());
        let EngineReply::Score(rows) = reply else {
            panic!("{reply:?}");
        };
        assert_eq!(Vec::<Vec<f32>>::from(rows), [vec![-2.0, -3.0], vec![]]);
        // A method the engine does not implement is the plugin's error, not a reply.
        let err = EngineCall::FlushCache {}.dispatch(&engine).unwrap_err();
        assert_eq!(err.code, tandem_plugin_api::ErrorCode::NotSupported);
    }
}
