//! The `tandem-bench` binary: every `tandem bench NAME` (`tandem bench` runs it), linked with
//! the built-in plugins exactly as the `tandem` binary is, so the benches see the same
//! registry. Errors print as one line each on stderr; exit code 2 for user errors, 1 for
//! runtime failures.

#![forbid(unsafe_code)]

use std::process::ExitCode;

// The built-in plugins (each registered with `register_builtin!` when linked): `native`
// (engine and trainers) and `bridges` (the weight bridges).
use tandem_plugin_bridges as _;
use tandem_plugin_envs as _;
use tandem_plugin_native as _;

fn main() -> ExitCode {
    // `tandem bench transport` (and the broadcast rows of `bridges`) re-run this executable as
    // their rank processes.
    tandem_bench::transport::child_main_if_requested();
    tandem_bench::command::main()
}
