//! `tandem-control`: the control plane between the controller (`tandem run`) and its workers (`tandem worker`).
//!
//! Length-prefixed MessagePack frames ([`frame`], `rmp-serde`) over one TCP connection per
//! worker, listening on loopback by default. The worker connects and presents the run's random
//! token in a hello ([`server`]); a peer without it is refused with one log line. After that
//! the controller sends calls that map 1:1 to the role methods ([`roles`], [`protocol`]), each with
//! its own timeout, and the worker answers each by id ([`channel`]). ABI values travel as
//! themselves (their serde is derived in `tandem-plugin-api`), token ids, logprobs and hidden
//! states as packed byte blobs (`tandem_plugin_api::wire`, and [`packed::Rows`] for the role
//! table's bare rows).
//!
//! # Why not ZeroMQ
//!
//! The design named ZeroMQ; this is a deliberately smaller choice with the same guarantees:
//! - The traffic is point-to-point request/reply between the controller and each worker. There
//!   is no fan-out that needs PUB/SUB, so there is no high-water mark to get wrong: ZeroMQ's
//!   PUB silently drops messages past its default HWM of 1000 (measured in
//!   `shared/reference/rust-deps.md`), and REQ/REP's strict send/recv alternation would forbid
//!   the concurrent calls an engine needs (pause while a generate is in flight).
//! - Workers stay free of an async runtime: the pure-Rust `zeromq` crate needs tokio, which
//!   would sit beside plugin threads in every worker. Here each connection is a blocking socket
//!   served by std threads.
//! - Liveness is exact: a worker's death closes its socket, the reader sees EOF at once, and
//!   the launcher supplies exit status and log tail. With ZeroMQ's reconnecting sockets a dead
//!   peer is indistinguishable from a slow one without an extra heartbeat protocol.
//! - Framing, handshake and routing are ~600 lines we own and test, with one small dependency
//!   (`rmp-serde`).
//!
//! A broadcast to many workers is a loop of calls; if fan-out ever dominates, it belongs on the
//! data plane (`tandem-transport` collectives), not here.

#![forbid(unsafe_code)]

pub mod channel;
pub mod error;
pub mod frame;
pub mod packed;
pub mod protocol;
pub mod roles;
pub mod server;

pub use channel::{Channel, PeerLife};
pub use error::ControlError;
pub use protocol::Role;
pub use server::{Accepted, ControlServer, connect};
