//! `tandem-plugin-support`: what plugins that drive an external program (a vLLM server, a
//! torchrun job) share, so each plugin does not grow its own copy.
//!
//! - [`process`]: a child started in its own process group with `PR_SET_PDEATHSIG`, owned
//!   by a supervisor thread that records its exit and stops the whole group on request.
//! - [`log`]: the last meaningful lines of a child's log, on one line, for error messages.
//! - [`model`]: what a server reads of a model directory before serving it (its positions).
//! - [`python`]: which Python interpreter to drive (the `python` option, `$TANDEM_PYTHON`,
//!   or the venv `scripts/setup-python.sh` recorded), or one error saying how to get one.
//! - [`server_engine`]: an engine that is an HTTP-driven inference server, launched and
//!   supervised or attached (the `vllm` and `sglang` plugins).
//! - [`torchrun`]: a trainer that is a torchrun job of Python ranks driven over a control
//!   channel (the `fsdp` and `megatron` plugins).
//!
//! This crate is linked into each plugin library; nothing of it crosses the plugin ABI.

pub mod log;
pub mod model;
pub mod process;
pub mod python;
pub mod quote;
pub mod server_engine;
pub mod torchrun;

pub use log::log_tail;
pub use process::Supervised;
pub use python::{Python, PythonError, PythonSource, resolve_python};
