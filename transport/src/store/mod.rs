//! Rendezvous store (like torchrun's TCPStore): a small authenticated TCP key-value server
//! that the controller hosts, and a blocking client. Ranks use it to exchange placements,
//! tcp addresses, shm socket names and NCCL unique ids.
//!
//! ```
//! use tandem_transport::store::{StoreClient, StoreServer};
//! use std::time::Duration;
//! let server = StoreServer::start("127.0.0.1:0", "run-token")?;
//! let c = StoreClient::connect(&server.addr().to_string(), "run-token", Duration::from_secs(5))?;
//! c.set("rank0/addr", b"127.0.0.1:4000")?;
//! c.wait(&["rank0/addr"], Duration::from_secs(1))?;
//! assert_eq!(c.get("rank0/addr")?, b"127.0.0.1:4000");
//! assert_eq!(c.add("counter", 2)?, 2);
//! # Ok::<(), tandem_transport::TransportError>(())
//! ```

mod client;
mod proto;
mod server;

pub use client::StoreClient;
pub use server::StoreServer;
