//! The `tandem` binary: a thin edge over [`tandem_host::cli`]. Errors print as one line each
//! on stderr; exit code 2 for user errors, 1 for runtime failures.

use std::process::ExitCode;

fn main() -> ExitCode {
    tandem_host::cli::main()
}
