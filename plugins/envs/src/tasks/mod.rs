//! The generated tasks: prompts generated deterministically from `(seed, index)` and a
//! reward computed from the completion text, so a run is reproducible and a resumed run
//! continues at the same data position. Each is an environment component of its own
//! (`environment.rs`), named after its kind.

mod arithmetic;
mod reverse;
mod reward;
pub mod split;
mod word_problems;

pub use arithmetic::Arithmetic;
pub use reverse::Reverse;
pub use reward::{RewardKind, last_integer, score_answer};
pub use split::{HeldOut, TrainStream};
pub use word_problems::{WordProblems, WordProblemsOptions};

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
    /// The arithmetic that computes the answer (`13 + 98`), when the task knows one: what a
    /// calculator call would evaluate (tool-use warm starts write it).
    pub expression: Option<String>,
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

/// Which task, with its options (the environment's name and `[environment.options]`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// One of [`KINDS`].
    pub kind: String,
    /// The options table.
    pub options: serde_json::Map<String, serde_json::Value>,
}

/// A task error: the key (relative to `[environment]`), what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct TaskError {
    /// `kind`, `options` or `options.KEY`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when the task knows.
    pub help: Option<String>,
}

impl TaskError {
    /// A problem at `key` with how to fix it.
    pub fn new(key: impl Into<String>, message: impl Into<String>, help: &str) -> TaskError {
        TaskError {
            key: key.into(),
            message: message.into(),
            help: Some(help.to_owned()),
        }
    }
}

/// The built-in task kinds.
pub const KINDS: &[&str] = &["arithmetic", "reverse", "word_problems"];

/// Builds the task of a `[task]` section; `seed` is the run's seed.
pub fn build(section: &TaskSpec, seed: u64) -> Result<Box<dyn Task>, TaskError> {
    let options = serde_json::Value::Object(section.options.clone());
    match section.kind.as_str() {
        "arithmetic" => Ok(Box::new(Arithmetic::new(parse(options)?, seed)?)),
        "reverse" => Ok(Box::new(Reverse::new(parse(options)?, seed)?)),
        "word_problems" => Ok(Box::new(WordProblems::new(parse(options)?, seed)?)),
        other => Err(TaskError::new(
            "kind",
            format!("unknown task `{other}`"),
            &format!("built-in tasks are {}", KINDS.join(", ")),
        )),
    }
}

/// The task a run trains on: `[task]`'s, with the `held_out` problems of its evaluation
/// (`None`: the run does not evaluate) replaced (see [`split`]).
pub fn build_for_run(
    section: &TaskSpec,
    seed: u64,
    held_out: Option<u32>,
) -> Result<Box<dyn Task>, TaskError> {
    let Some(problems) = held_out else {
        return build(section, seed);
    };
    let held_out = HeldOut::new(section, seed, problems)?;
    Ok(Box::new(TrainStream::new(section, seed, held_out)?))
}

fn parse<T: for<'de> Deserialize<'de>>(options: serde_json::Value) -> Result<T, TaskError> {
    serde_path_to_error::deserialize(options).map_err(|e| TaskError {
        key: format!("options.{}", e.path()),
        message: e.inner().to_string(),
        help: None,
    })
}

/// The random stream of problem `index` under `seed`.
pub(crate) fn rng_for(seed: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    rng
}

#[cfg(test)]
mod tests;
