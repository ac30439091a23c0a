//! `tandem bench ARGS`: the benchmarks live in the separate `tandem-bench` binary (crate
//! `bench/cli`), outside the product; this subcommand finds it beside the `tandem` executable,
//! else on `PATH`, and runs it in place of this process with `ARGS` as given, the global
//! options given before `bench`, and [`TANDEM_EXE_ENV`] naming this `tandem` (the benches
//! start `tandem worker` processes from it).

use crate::error::CliError;
use crate::logging::LogFormat;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Set for `tandem-bench` to the `tandem` binary that ran it.
pub const TANDEM_EXE_ENV: &str = "TANDEM_EXE";

/// The benchmarks' executable.
pub const BENCH_EXE: &str = "tandem-bench";

/// Arguments of `tandem bench`: passed to `tandem-bench` untouched.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// NAME [--json] [--quick] [--across-netns NETNS] (`tandem bench --help` lists the names).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// Runs `tandem-bench` with the arguments; returns only when it cannot be started.
pub(crate) fn run(
    plugin_dirs: &[PathBuf],
    log_format: LogFormat,
    verbose: u8,
    quiet: bool,
    args: BenchArgs,
) -> Result<(), CliError> {
    use std::os::unix::process::CommandExt;

    let tandem = std::env::current_exe().map_err(CliError::io("finding the tandem executable"))?;
    let path = std::env::var_os("PATH");
    let bench = find(&tandem, path.as_deref()).ok_or_else(|| missing(&tandem))?;
    let mut cmd = std::process::Command::new(&bench);
    // The global options given before `bench` (later ones, in ARGS, override them).
    if log_format == LogFormat::Json {
        cmd.args(["--log-format", "json"]);
    }
    cmd.args(std::iter::repeat_n("-v", verbose.into()));
    if quiet {
        cmd.arg("-q");
    }
    for dir in plugin_dirs {
        cmd.arg("--plugin-dir").arg(dir);
    }
    cmd.args(&args.args).env(TANDEM_EXE_ENV, &tandem);
    let err = cmd.exec();
    Err(CliError::failed(format!(
        "cannot run {}: {err}",
        bench.display()
    )))
}

/// `tandem-bench` beside `tandem`, else the first on `path` (a `PATH` value).
fn find(tandem: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    let beside = tandem.parent().map(|dir| dir.join(BENCH_EXE));
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(BENCH_EXE));
    beside.into_iter().chain(on_path).find(|p| p.is_file())
}

/// The one-line error when there is no `tandem-bench` to run (exit code 2).
fn missing(tandem: &Path) -> CliError {
    CliError::usage(format!(
        "tandem bench needs the {BENCH_EXE} binary beside {} or on PATH: build it with \
         cargo build --release -p {BENCH_EXE}",
        tandem.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tandem_bench_is_found_beside_tandem_then_on_path() {
        let home = tempfile::tempdir().expect("temp dir");
        let (bin, other) = (home.path().join("bin"), home.path().join("other"));
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::create_dir_all(&other).expect("mkdir");
        let tandem = bin.join("tandem");
        let path = std::env::join_paths([&other]).expect("PATH");
        assert_eq!(find(&tandem, Some(&path)), None);
        assert_eq!(find(&tandem, None), None);

        std::fs::write(other.join(BENCH_EXE), b"").expect("write");
        assert_eq!(find(&tandem, Some(&path)), Some(other.join(BENCH_EXE)));
        std::fs::write(bin.join(BENCH_EXE), b"").expect("write");
        assert_eq!(find(&tandem, Some(&path)), Some(bin.join(BENCH_EXE)));
    }

    #[test]
    fn a_missing_tandem_bench_is_one_line_with_the_build_command_and_exit_code_2() {
        let err = missing(Path::new("/opt/t/tandem"));
        assert_eq!(
            err.lines(),
            [
                "tandem bench needs the tandem-bench binary beside /opt/t/tandem or on PATH: \
              build it with cargo build --release -p tandem-bench"
            ]
        );
        assert_eq!(err.exit_code(), 2);
    }
}
