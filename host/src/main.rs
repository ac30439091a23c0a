//! The `tandem` binary: a thin edge over [`tandem_host::cli`]. Errors print as one line each
//! on stderr; exit code 2 for user errors, 1 for runtime failures.

use std::process::ExitCode;

fn main() -> ExitCode {
    // `tandem bench transport` re-runs this executable as its peer processes.
    tandem_transport::bench::child_main_if_requested();
    tandem_host::cli::main()
}
