//! `tandem-runtime`: what runs components — the plugin registry and loader ([`registry`]), the
//! worker process behind `tandem worker` ([`worker`]), the `local` launcher and the remote
//! handles of engines and trainers in workers ([`launch`]), the host's one view of a role
//! whatever runs it ([`role`]: the [`Engine`] and [`Trainer`] traits, implemented by the remote
//! handles and by [`Local`] components), and the engine lifecycle machine every caller checks
//! ([`orchestrator`]).

#![forbid(unsafe_code)]

pub mod error;
pub mod launch;
pub mod orchestrator;
pub mod registry;
pub mod role;
pub mod worker;

pub use error::{Message, RuntimeError};
pub use role::{Engine, Local, Trainer};
/// The host side of the `HostServices` handle (its own crate, shared with `tandem-conformance`).
pub use tandem_services as services;
