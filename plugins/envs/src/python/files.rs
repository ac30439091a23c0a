//! The Python files the binary carries (the worker script and the `tandem_envs` package),
//! written into the run directory at start so a run needs no checkout.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tandem_plugin_api::PluginError;

/// The worker script.
const WORKER: &str = include_str!("../../python/tandem_env_worker.py");

/// The `tandem_envs` package: (file name, text).
const PACKAGE: [(&str, &str); 3] = [
    (
        "__init__.py",
        include_str!("../../../../python/tandem_envs/__init__.py"),
    ),
    (
        "reasoning_gym_env.py",
        include_str!("../../../../python/tandem_envs/reasoning_gym_env.py"),
    ),
    (
        "math_verify_reward.py",
        include_str!("../../../../python/tandem_envs/math_verify_reward.py"),
    ),
];

/// The directory under `dir` that holds `tandem_envs` (put on the workers' `sys.path`).
pub(crate) fn lib_dir(dir: &Path) -> PathBuf {
    dir.join("lib")
}

fn io(path: &Path, e: &std::io::Error) -> PluginError {
    PluginError::io(format!("cannot write {}: {e}", path.display()))
        .with_help("check that the run directory is writable and the disk not full")
}

/// Writes `text` to `path` through a temporary file renamed over it, so a worker starting
/// meanwhile (another pool of the same run) never reads half a file.
fn write(path: &Path, text: &str) -> Result<(), PluginError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| io(&tmp, &e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, &e))
}

/// Writes the worker script and the package under `dir`; the script's path.
pub(crate) fn install(dir: &Path) -> Result<PathBuf, PluginError> {
    let pkg = lib_dir(dir).join("tandem_envs");
    std::fs::create_dir_all(&pkg).map_err(|e| io(&pkg, &e))?;
    for (name, text) in PACKAGE {
        let path = pkg.join(name);
        write(&path, text)?;
    }
    let script = dir.join("tandem_env_worker.py");
    write(&script, WORKER)?;
    Ok(script)
}

/// `name` as a file-name part: characters other than ASCII letters, digits, `.`, `-` and `_`
/// become `_`.
pub(crate) fn label(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}
