//! Tandem's transport layer: communicators and process groups over shared memory, TCP and
//! (behind the `cuda` feature) NCCL, with rendezvous through the controller.
//!
//! - [`store`]: the rendezvous key-value store (server hosted by the controller, client in
//!   every rank), authenticated with the run's token.
//! - [`topology`] and [`plan`]: where ranks live and which backend each pair uses (pure
//!   functions, for `tandem check`).
//! - [`Communicator`]: send/recv/isend/irecv, broadcast, all_gather, barrier on the world
//!   or on sub-groups made from rank lists.
//! - [`local`]: spawning N local rank processes with a store (used by tests and by
//!   `tandem bench transport`, crate `tandem-bench`).

mod comm;
mod error;
mod link;
pub mod local;
pub mod plan;
pub mod store;
pub mod topology;

pub use comm::config::{CommConfig, env};
pub use comm::init::cuda_available;
pub use comm::{Communicator, Pending};
pub use error::{Result, TransportError};
pub use link::shm::{AUTO_RATIO, ShmOptions, ShmStats, SingleCopy, single_copy_calibration};
pub use plan::{BackendKind, TransportOverride};
