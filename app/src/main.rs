//! The `tandem` binary: the host crates (through [`tandem_cli::main`]) plus the built-in
//! plugins, linked here — at the edge — so that no host crate depends on a plugin. Errors
//! print as one line each on stderr; exit code 2 for user errors, 1 for runtime failures.

#![forbid(unsafe_code)]

use std::process::ExitCode;

// The built-in plugins (each registered with `register_builtin!` when linked): `native`
// (engine and trainers), `bridges` (the weight bridges) and `envs` (the environments).
use tandem_plugin_bridges as _;
use tandem_plugin_envs as _;
use tandem_plugin_native as _;

fn main() -> ExitCode {
    tandem_cli::main()
}
