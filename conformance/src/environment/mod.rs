//! The `environment` group: an environment component ([`tandem_plugin_api::Environment`])
//! against its contract (`tandem_plugin_api::types::env`). Each check builds the instances it
//! needs from an [`EnvironmentSetup`] through the plugin's root module, exactly as the host
//! does, and drives them only through the ABI.
//!
//! What is checked: `describe` (a `train` split, a finite, non-empty reward range, named
//! components); items as a pure function of `(seed, split, index)` across two instances; ids
//! unique within a split; no held-out prompt among the first training items; reading past the
//! end of a split (train wraps into another epoch, held-out is an error); `score` (one reward
//! per sample in order, the same reward alone, in a batch or reversed; `ok` values finite and
//! in range with the declared components; failures with a reason; an empty batch; empty,
//! garbage and very long completions scored, never an error for the batch); and, in every
//! call, a panic is a failure of rule [`NO_PANIC`]. No check depends on timing.

pub mod checks;
mod samples;

use crate::harness::{Failure, Outcome};
use crate::setup::Source;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use tandem_plugin_api::{
    EnvironmentBox, EnvironmentConfig, ErrorCode, PResult, PluginModuleRef, RResult, RString,
};

/// The rule every call is held to: a panic inside the plugin comes back as an error (the SDK
/// guard's `panicked`), and it is a failure of the component all the same.
pub const NO_PANIC: &str = "no panic";

/// An environment component under test: where it comes from and the configuration the checks
/// build it with (the seed, the held-out size, the options).
#[derive(Debug, Clone)]
pub struct EnvironmentSetup {
    /// Where the plugin comes from.
    pub source: Source,
    /// The configuration every instance is built from (`component` names it).
    pub config: EnvironmentConfig,
    /// Training items the checks read (indices `0..probe`): determinism, unique ids, the
    /// held-out overlap.
    pub probe: u64,
    /// Held-out items the checks read at most (all of them when the split is smaller).
    pub held_out_limit: u64,
    /// Keeps the run directory of the instances alive as long as the setup.
    _run_dir: Option<std::sync::Arc<tempfile::TempDir>>,
}

impl EnvironmentSetup {
    /// The environment `component` of `source` with options `{}`, seed 0, no held-out split
    /// asked for, base dir the current directory, a fresh run dir, 64 training items probed.
    pub fn new(source: Source, component: &str) -> EnvironmentSetup {
        let run_dir = tempfile::tempdir().ok().map(std::sync::Arc::new);
        let run = run_dir
            .as_ref()
            .map(|d| d.path().display().to_string())
            .unwrap_or_default();
        let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        EnvironmentSetup {
            source,
            config: EnvironmentConfig {
                component: component.into(),
                options_json: "{}".into(),
                seed: 0,
                held_out: 0,
                base_dir: base.display().to_string().into(),
                run_dir: run.into(),
            },
            probe: 64,
            held_out_limit: 4096,
            _run_dir: run_dir,
        }
    }

    /// A setup from a whole configuration (`config.component` names the environment).
    pub fn with_config(source: Source, config: EnvironmentConfig) -> EnvironmentSetup {
        EnvironmentSetup {
            config,
            ..EnvironmentSetup::new(source, "")
        }
    }

    /// Sets the options (`[environment.options]` as JSON object text).
    #[must_use]
    pub fn options(mut self, json: &str) -> Self {
        self.config.options_json = json.into();
        self
    }

    /// Sets the seed.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Asks for `n` held-out items (`[eval] problems`).
    #[must_use]
    pub fn held_out(mut self, n: u32) -> Self {
        self.config.held_out = n;
        self
    }

    /// Sets the directory relative paths in the options resolve against.
    #[must_use]
    pub fn base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.base_dir = dir.into().display().to_string().into();
        self
    }

    /// Sets how many training items the checks read.
    #[must_use]
    pub fn probe(mut self, n: u64) -> Self {
        self.probe = n.max(1);
        self
    }

    /// The component's name.
    pub fn component(&self) -> &str {
        self.config.component.as_str()
    }

    /// Builds one instance with this setup's configuration.
    pub fn build(&self) -> Result<EnvironmentBox, Failure> {
        self.build_with(self.config.clone())
    }

    /// Builds one instance with `config` (another seed, say): the component must be listed by
    /// the root module's `environments`, and its constructor must answer.
    pub fn build_with(&self, config: EnvironmentConfig) -> Result<EnvironmentBox, Failure> {
        let module = self.source.load().map_err(|e| Failure::new("setup", e))?;
        declared(module, config.component.as_str())?;
        let Some(new) = module.new_environment() else {
            return Err(Failure::new(
                "the component is declared",
                "the plugin was built before API level 6: it has no environments",
            ));
        };
        let host = tandem_services::Services::new().handle();
        call(
            new(config, host),
            "the environment builds",
            "building the environment",
        )
    }
}

/// Checks that `module` lists the environment `component`.
fn declared(module: PluginModuleRef, component: &str) -> Outcome {
    const RULE: &str = "the component is declared";
    let Some(list) = module.environments() else {
        return Err(Failure::new(
            RULE,
            "the plugin was built before API level 6: it lists no environments",
        ));
    };
    let names: Vec<RString> = list().into_iter().map(|d| d.name).collect();
    if names.iter().any(|n| n.as_str() == component) {
        Ok(())
    } else {
        Err(Failure::new(
            RULE,
            format!("the plugin lists no environment `{component}` (it lists {names:?})"),
        ))
    }
}

/// The `Ok` value of a plugin call, or a failure: of [`NO_PANIC`] when the plugin panicked,
/// of `rule` otherwise.
pub(crate) fn call<T>(r: PResult<T>, rule: &'static str, what: &str) -> Result<T, Failure> {
    match r {
        RResult::ROk(v) => Ok(v),
        RResult::RErr(e) if e.code == ErrorCode::Panicked => Err(Failure::new(
            NO_PANIC,
            format!("{what} panicked: {}", e.message),
        )),
        RResult::RErr(e) => Err(Failure::new(rule, format!("{what} failed: {}", e.message))),
    }
}

/// An environment check (see [`checks`]).
pub type EnvironmentCheck = fn(&EnvironmentSetup) -> Outcome;

/// Runs one environment check (a panic in the check itself is a failure of [`NO_PANIC`]);
/// panics with the failure, for a `#[test]`.
pub fn run_environment(name: &str, setup: fn() -> EnvironmentSetup, check: EnvironmentCheck) {
    if let Err(f) = check_environment(&setup(), check) {
        panic!("conformance check `{name}` failed: {f}");
    }
}

/// Runs one environment check and returns its outcome (a panic in the check itself is a
/// failure of [`NO_PANIC`]).
pub fn check_environment(setup: &EnvironmentSetup, check: EnvironmentCheck) -> Outcome {
    catch_unwind(AssertUnwindSafe(|| check(setup))).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic".into());
        Err(Failure::new(NO_PANIC, what))
    })
}

/// Every check of the group, by name: what [`crate::suite!`]'s `environment` group expands
/// (a harness of your own can loop over it).
pub const ALL: [(&str, EnvironmentCheck); 9] = [
    ("declared_and_described", checks::declared_and_described),
    ("items_are_deterministic", checks::items_are_deterministic),
    ("ids_are_unique", checks::ids_are_unique),
    ("held_out_is_not_in_train", checks::held_out_is_not_in_train),
    ("past_the_end", checks::past_the_end),
    (
        "one_reward_per_sample_in_order",
        checks::one_reward_per_sample_in_order,
    ),
    ("rewards_are_valid", checks::rewards_are_valid),
    ("empty_batch", checks::empty_batch),
    (
        "odd_completions_are_scored",
        checks::odd_completions_are_scored,
    ),
];

/// Runs every check of the group on `setup`; the failures as `(check, failure)`.
pub fn failures(setup: &EnvironmentSetup) -> Vec<(&'static str, Failure)> {
    ALL.iter()
        .filter_map(|(name, check)| check_environment(setup, *check).err().map(|f| (*name, f)))
        .collect()
}
