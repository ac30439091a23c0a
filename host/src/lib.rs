//! `tandem-host`: the Tandem host runtime — job files, plugin registry and loader, host
//! services, benchmarks, and the CLI the thin `tandem` binary runs.

pub mod bench;
pub mod bridge;
pub mod cli;
pub mod config;
pub mod control;
pub mod error;
pub mod launch;
pub mod logging;
pub mod orchestrator;
pub mod placement;
pub mod registry;
pub mod rl;
pub mod task;
pub mod worker;

pub use error::HostError;
/// The host side of the `HostServices` handle (its own crate, shared with `tandem-conformance`).
pub use tandem_services as services;

// Links the built-in `native` plugin (registered with `register_builtin!`).
use tandem_plugin_native as _;
