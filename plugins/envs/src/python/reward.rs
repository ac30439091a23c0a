//! A Python reward function, `python = "module:function"`, scored by a [`Pool`]: verl's
//! signature `(data_source, solution_str, ground_truth, extra_info=None) -> float | {"score":
//! float, ...}` (one call per sample; the dict's other numbers are components) or TRL's
//! `(prompts, completions, **kwargs) -> list[float | None]` (one call per chunk; `kwargs` are
//! `completion_ids`, `answer`/`ground_truth`, `data_source`, `id` and every metadata key but
//! `prompt` and `completion`, each a list; conversational items get message lists as in TRL),
//! told apart by parameter names; `async def` runs on the worker's event loop (an async verl
//! function over a chunk's samples concurrently). `extra_info`
//! is the item's metadata (its `extra_info` object when it has one).

use super::pool::{Pool, Target};
use super::{PoolOptions, check_target, sample_json, verdict};
use serde_json::Value;
use std::path::Path;
use tandem_plugin_api::{PluginError, Reward, ScoreSample};

/// A started (or only checked) Python reward.
pub struct PythonReward {
    pool: Option<Pool>,
    range: (f64, f64),
    what: String,
}

impl PythonReward {
    /// Starts the pool for `function` (`module:function`) with `options`; relative paths
    /// resolve against `base_dir`. An empty `run_dir` only checks (nothing starts; scoring
    /// then fails every sample).
    pub fn new(
        function: &str,
        options: &PoolOptions,
        base_dir: &Path,
        run_dir: &str,
    ) -> Result<PythonReward, PluginError> {
        let what = format!("Python reward `{function}`");
        check_target(function, "python", &what)?;
        options.validate(&what)?;
        let [lo, hi] = options.reward_range.unwrap_or([0.0, 1.0]);
        let pool = if run_dir.is_empty() {
            options.interpreter(&what)?;
            None
        } else {
            let target = Target::Reward(function.to_string());
            let spec = options.spec(target, base_dir, Path::new(run_dir), &what)?;
            Some(Pool::start(spec)?)
        };
        Ok(PythonReward {
            pool,
            range: (lo, hi),
            what,
        })
    }

    /// The pool (`None` when only checked).
    pub fn pool(&self) -> Option<&Pool> {
        self.pool.as_ref()
    }

    /// The declared `[min, max]`.
    pub fn range(&self) -> (f64, f64) {
        self.range
    }

    /// One reward per sample, in order.
    pub fn score(&self, samples: &[ScoreSample]) -> Vec<Reward> {
        let json: Vec<Value> = samples.iter().map(sample_json).collect();
        self.score_json(&json)
    }

    /// [`PythonReward::score`] over samples already in the workers' JSON form.
    pub fn score_json(&self, samples: &[Value]) -> Vec<Reward> {
        let Some(pool) = &self.pool else {
            let reason = format!("{} was only checked, not started", self.what);
            return samples
                .iter()
                .map(|_| Reward::failed(reason.clone()))
                .collect();
        };
        pool.score(samples)
            .into_iter()
            .map(|o| verdict::reward(o, self.range, &self.what))
            .collect()
    }
}
