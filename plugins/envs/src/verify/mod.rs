//! Rewards of the `dataset` environment: the built-in verifiers (each a small pure function of
//! the completion and the row's answer) and reward specs built from them.
//!
//! A reward spec (`[environment.options] reward`, or one entry of `sources`) is either one
//! verifier, `{ verifier = "math" }`, or a weighted sum,
//! `{ components = [{ verifier = "boxed", weight = 1.0 }, { verifier = "length", weight = 0.1,
//! target = 256 }] }`. A component is named after its verifier unless it sets `name`; every
//! `ok` reward reports each component's (unweighted) value by name, and its `value` is the
//! weighted sum. A verifier value that is NaN or outside the verifier's range, or a sum outside
//! the spec's range, is a [`Reward::failed`] with the reason, never clamped.
//!
//! The built-in specs are one implementation of [`Scorer`]; a spec that scores through another
//! route (a Python reward, `python = "module:function"`) is another implementation, chosen in
//! [`build`].

mod choice;
pub mod math;
mod schema;
mod spec;
mod text;

#[cfg(test)]
mod tests;

pub use spec::{Component, Verifier};

use serde_json::Value;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{EnvironmentConfig, PluginError, Reward, ScoreSample};

/// One sample to score: the item and completion, and the dataset row the item came from
/// (every column, as read) when the environment knows it.
#[derive(Debug, Clone, Copy)]
pub struct ScoreInput<'a> {
    /// The item and the completion.
    pub sample: &'a ScoreSample,
    /// The item's row, when the item is one of the environment's.
    pub row: Option<&'a Value>,
}

/// Something that scores batches of samples: one [`Reward`] per input, in order. A scorer
/// reports what it could not score as [`Reward::failed`]; [`checked`] (applied by the
/// environment to every scorer's answers) turns a NaN or an out-of-range value into one.
pub trait Scorer: Send + Sync {
    /// Names of the components an `ok` reward reports.
    fn components(&self) -> Vec<String>;
    /// Smallest and largest `ok` value.
    fn range(&self) -> (f64, f64);
    /// Whether the scorer compares with the row's answer (the dataset then needs an answer
    /// column).
    fn needs_answer(&self) -> bool;
    /// One reward per input, in order.
    fn score(&self, inputs: &[ScoreInput<'_>]) -> Vec<Reward>;
}

/// Builds the scorer of a reward spec; `key` is where the spec sits in the options table
/// (`reward`, `sources.gsm8k`), for error messages; `config` is the environment's (a Python
/// reward resolves its modules against its base directory and starts its pool in its run
/// directory, or only checks when it has none).
///
/// A spec object with a `python` key is a Python reward ([`crate::python::scorer`]); any
/// other is a weighted sum of built-in verifiers.
pub fn build(spec: &Value, key: &str, config: &EnvironmentConfig) -> Result<Box<dyn Scorer>> {
    if let Some(python) = crate::python::scorer::build(spec, key, config)? {
        return Ok(python);
    }
    Ok(Box::new(spec::WeightedSum::parse(spec, key)?))
}

/// `reward` unless it is NaN or outside `[lo, hi]` (a small tolerance for rounding of sums),
/// in which case a failed reward saying so.
pub fn checked(reward: Reward, (lo, hi): (f64, f64)) -> Reward {
    if reward.status != tandem_plugin_api::RewardStatus::Ok {
        return reward;
    }
    let v = f64::from(reward.value);
    let slack = 1e-6 * (1.0 + hi.abs().max(lo.abs()));
    if !v.is_finite() {
        Reward::failed(format!("the reward is {v}, not a finite number"))
    } else if v < lo - slack || v > hi + slack {
        Reward::failed(format!(
            "the reward {v} is outside the declared range [{lo}, {hi}]"
        ))
    } else {
        reward
    }
}

/// A build error at `key` of the options (`options.KEY: message`, the form `tandem check`
/// attributes to the key) with how to fix it.
pub(crate) fn option_error(key: &str, message: impl std::fmt::Display, help: &str) -> PluginError {
    PluginError::invalid_input(format!("options.{key}: {message}")).with_help(help)
}
