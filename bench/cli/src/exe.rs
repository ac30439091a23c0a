//! Which `tandem` the benches start as workers: the benches run in the `tandem-bench` binary,
//! but worker processes (`tandem worker`) are the product binary's. `TANDEM_EXE` (set by
//! `tandem bench`) names it; else the `tandem` beside this executable.

use std::path::{Path, PathBuf};
use tandem_cli::bench::TANDEM_EXE_ENV;
use tandem_cli::error::CliError;

/// The `tandem` binary to start workers from.
pub fn tandem() -> Result<PathBuf, CliError> {
    if let Some(exe) = std::env::var_os(TANDEM_EXE_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(exe));
    }
    let me =
        std::env::current_exe().map_err(CliError::io("finding the tandem-bench executable"))?;
    beside(&me).ok_or_else(|| {
        CliError::usage(format!(
            "this bench starts `tandem worker` processes, and there is no tandem binary beside {}: \
             run it as `tandem bench ...`, set {TANDEM_EXE_ENV}, or build it with \
             cargo build --release -p tandem",
            me.display()
        ))
    })
}

/// The `tandem` file in the directory of `exe`, when there is one.
fn beside(exe: &Path) -> Option<PathBuf> {
    let candidate = exe.parent()?.join("tandem");
    candidate.is_file().then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tandem_is_found_only_beside_the_executable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let me = dir.path().join("tandem-bench");
        assert_eq!(beside(&me), None);
        std::fs::write(dir.path().join("tandem"), b"").expect("write");
        assert_eq!(beside(&me), Some(dir.path().join("tandem")));
    }
}
