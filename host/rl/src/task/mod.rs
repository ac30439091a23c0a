//! Built-in verifiable tasks: prompts generated deterministically from `(seed, index)` and a
//! reward computed from the completion text, so a run is reproducible and a resumed run
//! continues at the same data position.
//!
//! Tasks live on the controller side: the engine sees token ids only, the controller encodes
//! prompts and decodes completions with the model's `tokenizer.json`.

mod arithmetic;
mod reverse;
mod reward;

pub use arithmetic::Arithmetic;
pub use reverse::Reverse;
pub use reward::{RewardKind, score_answer};

use crate::config::TaskSection;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use serde::Deserialize;

/// One problem: the prompt text and the answer the reward checks against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Position of the problem in the task's stream.
    pub index: u64,
    /// Prompt text (ends where the answer starts).
    pub prompt: String,
    /// Expected answer (without surrounding spaces).
    pub answer: String,
}

impl Problem {
    /// The supervised target text for warm starts: a space, then the answer.
    pub fn target(&self) -> String {
        format!(" {}", self.answer)
    }
}

/// A task: an endless deterministic stream of problems and their reward.
pub trait Task: Send + Sync {
    /// The task's kind, as in `[task] kind`.
    fn kind(&self) -> &'static str;
    /// Problem number `index` of the stream (the same for the same seed and index).
    fn problem(&self, index: u64) -> Problem;
    /// Reward in `[0, 1]` of `completion` (decoded text after the prompt).
    fn reward(&self, problem: &Problem, completion: &str) -> f32;
}

/// A task-section error: one line naming the key and how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("[task] {0}")]
pub struct TaskError(pub String);

/// The built-in task kinds.
pub const KINDS: &[&str] = &["arithmetic", "reverse"];

/// Builds the task of a `[task]` section; `seed` is the run's seed.
pub fn build(section: &TaskSection, seed: u64) -> Result<Box<dyn Task>, TaskError> {
    let options = toml::Value::Table(section.options.clone());
    match section.kind.as_str() {
        "arithmetic" => Ok(Box::new(Arithmetic::new(parse(options)?, seed)?)),
        "reverse" => Ok(Box::new(Reverse::new(parse(options)?, seed)?)),
        other => Err(TaskError(format!(
            "kind: unknown task `{other}` (help: built-in tasks are {})",
            KINDS.join(", ")
        ))),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(options: toml::Value) -> Result<T, TaskError> {
    serde_path_to_error::deserialize(options)
        .map_err(|e| TaskError(format!("options.{}: {}", e.path(), e.inner())))
}

/// The random stream of problem `index` under `seed`.
pub(crate) fn rng_for(seed: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    rng
}

#[cfg(test)]
mod tests;
