//! `tandem-conformance`: the Tandem plugin contract as a test suite a plugin author runs.
//!
//! A plugin crate's `tests/conformance.rs` names its component and a model, and one macro
//! expands into one `#[test]` per rule of the contract:
//!
//! ```text
//! fn engine() -> tandem_conformance::EngineSetup {
//!     tandem_conformance::EngineSetup::new(Source::built("tandem_myengine"), "myengine", model_dir())
//! }
//! tandem_conformance::engine_suite!(engine());
//! ```
//!
//! A weight bridge is checked between an engine and a trainer (`bridge: BridgeSetup::new(source,
//! "component", options_json)` beside `engine:` and `trainer:`, group `bridge`): its
//! declarations and plan, its halves' kind refusals, and two syncs through both halves — over
//! an in-process transport world of two ranks when its plan asks for one.
//!
//! An environment (`environment: EnvironmentSetup::new(source, "component")`, group
//! `environment`) is checked through its root module alone: items deterministic per
//! `(seed, split, index)`, ids unique, held-out prompts kept out of training, rewards one per
//! sample, finite and in range, failures with reasons, odd completions scored, no panic.
//!
//! What is checked is driven by the component's **declared capabilities** (its manifest): each
//! declared pause mode, releasable tag and update kind must work, everything undeclared must
//! answer `NotSupported` (or be refused), and random lifecycle sequences must be accepted or
//! refused exactly as the host's engine state machine ([`tandem_plugin_api::lifecycle`]) says.
//! Components run in this process with the host's real services (tagged host memory regions,
//! [`tandem_services::Services`]) and are reached through the ABI: a library is `dlopen`ed and
//! its root module's constructors are called, exactly as a `tandem worker` does.
//!
//! Expensive components (a vLLM server, a torchrun job) are built once per test binary and
//! shared by its checks ([`Shared`]): each check leaves the engine serving again, and a check
//! that fails drops the component so the next check starts from a fresh one. A suite that
//! cannot run in an environment is marked `ignore = "why"` (libtest reports it as ignored with
//! the reason); a check never passes without having checked.

#![forbid(unsafe_code)]

mod bridge;
mod engine;
mod environment;
mod expect;
mod features;
mod harness;
mod oracle;
mod pair;
mod ppo;
mod setup;
mod suite;
mod trainer;

/// The bridge checks catching broken bridges.
#[cfg(test)]
mod broken_bridge_tests;
/// The environment checks catching broken environments.
#[cfg(test)]
mod broken_env_tests;
/// The suite catching broken plugins: each rule failing on a fixture broken in one way.
#[cfg(test)]
mod broken_tests;

pub use engine::EngineHarness;
pub use environment::{
    ALL as ENVIRONMENT_CHECKS, EnvironmentCheck, EnvironmentSetup, NO_PANIC, check_environment,
    failures as environment_failures, run_environment,
};
pub use harness::{
    BridgeCheck, BridgeSetups, Failure, Outcome, Shared, run_bridge, run_engine, run_pair,
    run_trainer, users,
};
pub use setup::{BridgeSetup, EngineSetup, Source, TrainerSetup, target_profile_dir, tiny_model};
pub use trainer::TrainerHarness;

/// The checks, by role: each is a plain function a test (or a harness of your own) can call.
pub mod checks {
    pub use crate::bridge::checks as bridge;
    pub use crate::engine::checks as engine;
    pub use crate::environment::checks as environment;
    pub use crate::features::checks as features;
    pub use crate::pair::checks as pair;
    pub use crate::trainer::checks as trainer;
}
