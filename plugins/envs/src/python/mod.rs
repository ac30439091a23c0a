//! Python rewards and environments, run in a pool of worker processes owned by the
//! environment (never in the controller process; killed when it is dropped).
//!
//! - [`pool`]: `workers` processes of the interpreter (the `python` option, else
//!   `$TANDEM_PYTHON`, else the venv `scripts/setup-python.sh` recorded), speaking one JSON
//!   object a line over stdin/stdout, each logging to `<run dir>/python-workers/<name>-<k>.log`;
//!   a per-call `timeout_s`, `memory_mb` (RLIMIT_AS) and `cpu_s` (per-call RLIMIT_CPU) set by the
//!   worker before it imports user code; a worker that times out or dies is replaced and the
//!   samples it held fail with the reason.
//! - [`reward`]: `python = "module:function"` with verl's or TRL's signature (sync or async),
//!   for the rewards of other environments; [`scorer`]: one as a `dataset` reward spec.
//! - [`env`]: the `python` environment component, `class = "module:Class"`.
//! - [`verdict`]: the user's answer as a [`tandem_plugin_api::Reward`] (never a silent 0).
//!
//! Modules are looked up in the job file's directory, then `python_path = [...]` (relative to
//! it), then the `tandem_envs` package the binary carries (reasoning-gym, math-verify), then
//! the interpreter's site-packages. When the environment is only checked (`tandem check`, an
//! empty run directory) no worker starts: the options are parsed and the interpreter's path
//! checked, nothing is imported.

pub mod env;
mod files;
pub mod pool;
pub mod reward;
pub mod scorer;
pub mod verdict;
mod worker;

pub use pool::{Kind, Pool, PoolSpec, Target};
pub use reward::PythonReward;

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tandem_plugin_api::{PluginError, ScoreSample};

/// Default worker count.
pub const DEFAULT_WORKERS: usize = 2;
/// Default per-call timeout, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Default timeout of a worker's start (import and constructor), in seconds.
pub const DEFAULT_START_TIMEOUT_S: f64 = 120.0;

/// The pool's options, shared by the `python` environment and Python rewards.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolOptions {
    /// The interpreter (default `$TANDEM_PYTHON`, else the recorded venv's).
    #[serde(default)]
    pub python: Option<PathBuf>,
    /// Worker processes (1 to 64; default 2).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Seconds one call of the user's code may take (default 30).
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Seconds a worker may take to import the code and build the class (default 120).
    #[serde(default = "default_start_timeout")]
    pub start_timeout_s: f64,
    /// Address-space limit of each worker, MiB (default none).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// CPU seconds one call may use (default none).
    #[serde(default)]
    pub cpu_s: Option<u64>,
    /// Directories put on `sys.path` after the job file's (relative to it).
    #[serde(default)]
    pub python_path: Vec<PathBuf>,
    /// Declared `[min, max]` of `ok` values (default `[0, 1]`, or the class's own).
    #[serde(default)]
    pub reward_range: Option<[f64; 2]>,
}

fn default_workers() -> usize {
    DEFAULT_WORKERS
}
fn default_timeout() -> f64 {
    DEFAULT_TIMEOUT_S
}
fn default_start_timeout() -> f64 {
    DEFAULT_START_TIMEOUT_S
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            python: None,
            workers: DEFAULT_WORKERS,
            timeout_s: DEFAULT_TIMEOUT_S,
            start_timeout_s: DEFAULT_START_TIMEOUT_S,
            memory_mb: None,
            cpu_s: None,
            python_path: Vec::new(),
            reward_range: None,
        }
    }
}

/// The option keys of [`PoolOptions`] (for components that take them beside their own).
pub const POOL_KEYS: [&str; 8] = [
    "python",
    "workers",
    "timeout_s",
    "start_timeout_s",
    "memory_mb",
    "cpu_s",
    "python_path",
    "reward_range",
];

fn bad(what: &str, help: &str) -> PluginError {
    PluginError::invalid_input(what.to_string()).with_help(help.to_string())
}

impl PoolOptions {
    /// Checks the values; `what` names the owner in messages.
    pub fn validate(&self, what: &str) -> Result<(), PluginError> {
        if !(1..=64).contains(&self.workers) {
            return Err(bad(
                &format!("{what}: workers = {} is not between 1 and 64", self.workers),
                "set `workers` to the number of Python processes to score with (default 2)",
            ));
        }
        for (key, v) in [
            ("timeout_s", self.timeout_s),
            ("start_timeout_s", self.start_timeout_s),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                return Err(bad(
                    &format!("{what}: {key} = {v} is not a number of seconds in (0, 86400]"),
                    "give a positive number of seconds",
                ));
            }
        }
        if self.memory_mb.is_some_and(|m| m < 64) || self.cpu_s == Some(0) {
            return Err(bad(
                &format!("{what}: memory_mb must be at least 64 and cpu_s at least 1"),
                "raise the limit or leave it out (no limit)",
            ));
        }
        if let Some([lo, hi]) = self.reward_range
            && !(lo.is_finite() && hi.is_finite() && lo < hi)
        {
            return Err(bad(
                &format!("{what}: reward_range = [{lo}, {hi}] is not [min, max] with min < max"),
                "give two finite numbers, the smaller first",
            ));
        }
        Ok(())
    }

    /// The interpreter: the option, else `$TANDEM_PYTHON`, else the recorded venv's; it must
    /// exist (a bare name is looked up on `PATH`).
    pub fn interpreter(&self, what: &str) -> Result<PathBuf, PluginError> {
        let py = tandem_plugin_support::resolve_python(self.python.as_deref())
            .map_err(|e| PluginError::invalid_input(format!("{what}: {e}")).with_help(e.help()))?;
        if exists(&py.path) {
            Ok(py.path)
        } else {
            Err(bad(
                &format!(
                    "{what}: Python `{}` (from {}) does not exist",
                    py.path.display(),
                    py.source
                ),
                "point the `python` option or $TANDEM_PYTHON at an interpreter, or run \
                 `bash scripts/setup.sh`",
            ))
        }
    }

    /// The pool spec for `target`, its files under `<run_dir>/python-workers`.
    pub fn spec(
        &self,
        target: Target,
        base_dir: &Path,
        run_dir: &Path,
        what: &str,
    ) -> Result<PoolSpec, PluginError> {
        self.validate(what)?;
        let python = self.interpreter(what)?;
        let dir = run_dir.join("python-workers");
        let mut path = vec![base_dir.to_path_buf()];
        path.extend(self.python_path.iter().map(|p| base_dir.join(p)));
        path.push(files::lib_dir(&dir));
        Ok(PoolSpec {
            python,
            workers: self.workers,
            timeout: Duration::from_secs_f64(self.timeout_s),
            start_timeout: Duration::from_secs_f64(self.start_timeout_s),
            memory_mb: self.memory_mb,
            cpu_s: self.cpu_s,
            path,
            target,
            dir,
        })
    }
}

/// Whether `path` names an existing file (a bare name: on `PATH`).
fn exists(path: &Path) -> bool {
    if path.components().count() > 1 {
        return path.is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(path).is_file()))
}

/// Checks that `target` reads `module:name`.
pub fn check_target(target: &str, key: &str, what: &str) -> Result<(), PluginError> {
    let ok = target
        .split_once(':')
        .is_some_and(|(m, n)| !m.is_empty() && !n.is_empty() && !n.contains(':'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            &format!("{what}: {key} = \"{target}\" is not \"module:name\""),
            "name the module (importable from the job file's directory or `python_path`) and \
             the function or class in it, e.g. \"my_rewards:accuracy\"",
        ))
    }
}

/// A sample as the workers read it: `{"item": {id, prompt, messages, answer, source,
/// metadata}, "completion": {text, token_ids, finished}}`.
pub fn sample_json(s: &ScoreSample) -> serde_json::Value {
    let metadata: serde_json::Value =
        serde_json::from_str(s.item.metadata_json.as_str()).unwrap_or_default();
    serde_json::json!({
        "item": {
            "id": s.item.id.as_str(),
            "prompt": s.item.prompt.as_str(),
            "messages": s.item.messages.iter()
                .map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content.as_str()}))
                .collect::<Vec<_>>(),
            "answer": s.item.answer.as_str(),
            "source": s.item.source.as_str(),
            "metadata": if metadata.is_object() { metadata } else { serde_json::json!({}) },
        },
        "completion": {
            "text": s.completion.text.as_str(),
            "token_ids": s.completion.token_ids.as_slice(),
            "finished": s.completion.finished,
        },
    })
}
