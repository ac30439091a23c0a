//! The seeded train / held-out split of a task, for `[eval]` and `tandem eval`.
//!
//! The held-out set is problems `0..K` of the same task built with a seed derived from the
//! run's (`held_out_seed`): a stream of its own, a pure function of `(task, seed, K)`, so
//! `tandem eval` rebuilds exactly the set a run evaluated on. Two streams can still produce the
//! same problem text, so the training stream ([`TrainStream`]) replaces every problem whose
//! prompt is in the held-out set by a substitute drawn from a third stream (index
//! `i * ATTEMPTS + k`, the first `k` whose prompt is not held out): training never sees a
//! held-out prompt.
//!
//! Why substitution and not a membership hash with skipping: problem `i` of the training
//! stream stays problem `i` of the plain task unless it collides, so the data position (and
//! with it `--resume` and the rollout seeds) means the same with and without evaluation, and a
//! run with `[eval]` trains on exactly the problems of the same run without it, save the
//! colliding ones. With a large problem space (word problems) that is none at all in practice;
//! with a small one (`arithmetic` with `max_operand = 3`: 16 problems) validation refuses a
//! held-out set that covers more than half of the first [`PROBE`] training problems, which
//! keeps a substitute within `ATTEMPTS` draws certain in practice (with a held-out share `q` of
//! the problems a miss has chance `q^64`, about 2^-64 at one half; it keeps the last draw and
//! logs a warning).

use super::{Problem, Task, TaskError, TaskSpec};
use std::collections::HashSet;

/// Substitute draws per colliding training problem.
const ATTEMPTS: u64 = 64;

/// Training problems validation checks against the held-out set.
pub const PROBE: u64 = 256;

/// splitmix64: seeds of the derived streams.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seed of the held-out stream of a run seeded `seed`.
pub fn held_out_seed(seed: u64) -> u64 {
    mix(seed ^ 0x4845_4C44_2D4F_5554) // "HELD-OUT"
}

/// Seed of the substitute stream of a run seeded `seed`.
fn substitute_seed(seed: u64) -> u64 {
    mix(seed ^ 0x5355_4253_5449_5455) // "SUBSTITU"
}

/// The fixed held-out problems of a task under a seed.
#[derive(Debug, Clone)]
pub struct HeldOut {
    problems: Vec<Problem>,
    prompts: HashSet<String>,
}

impl HeldOut {
    /// Problems `0..count` of `section`'s task under the held-out seed of `seed`.
    pub fn new(section: &TaskSpec, seed: u64, count: u32) -> Result<HeldOut, TaskError> {
        let task = super::build(section, held_out_seed(seed))?;
        let problems: Vec<Problem> = (0..u64::from(count)).map(|i| task.problem(i)).collect();
        let prompts = problems.iter().map(|p| p.prompt.clone()).collect();
        Ok(HeldOut { problems, prompts })
    }

    /// The problems, in order.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Whether a prompt is held out.
    pub fn contains(&self, prompt: &str) -> bool {
        self.prompts.contains(prompt)
    }
}

/// A task's training stream with the held-out prompts replaced (see the module doc).
pub struct TrainStream {
    task: Box<dyn Task>,
    substitutes: Box<dyn Task>,
    held_out: HeldOut,
}

impl TrainStream {
    /// The training stream of `section`'s task under `seed`, avoiding `held_out`.
    pub fn new(section: &TaskSpec, seed: u64, held_out: HeldOut) -> Result<TrainStream, TaskError> {
        Ok(TrainStream {
            task: super::build(section, seed)?,
            substitutes: super::build(section, substitute_seed(seed))?,
            held_out,
        })
    }

    /// How many of the plain task's first `n` problems are held out (and so replaced).
    pub fn collisions(&self, n: u64) -> u64 {
        (0..n)
            .filter(|&i| self.held_out.contains(&self.task.problem(i).prompt))
            .count() as u64
    }
}

impl Task for TrainStream {
    fn kind(&self) -> &'static str {
        self.task.kind()
    }

    fn problem(&self, index: u64) -> Problem {
        let p = self.task.problem(index);
        if !self.held_out.contains(&p.prompt) {
            return p;
        }
        let mut last = p;
        for k in 0..ATTEMPTS {
            let s = self
                .substitutes
                .problem(index.wrapping_mul(ATTEMPTS).wrapping_add(k));
            last = Problem { index, ..s };
            if !self.held_out.contains(&last.prompt) {
                return last;
            }
        }
        tracing::warn!(
            "training problem {index} collides with the held-out set after {ATTEMPTS} draws"
        );
        last
    }

    fn reward(&self, problem: &Problem, completion: &str) -> f32 {
        self.task.reward(problem, completion)
    }
}
