//! `reverse`: `Q: reverse 4172 A:`; the answer is the digits in reverse order.

use super::{Problem, RewardKind, Task, TaskError, rng_for, score_answer};
use rand_chacha::rand_core::RngCore;
use serde::Deserialize;

/// Options of `[task] kind = "reverse"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReverseOptions {
    /// Fewest digits of a number.
    pub min_digits: u32,
    /// Most digits of a number.
    pub max_digits: u32,
    /// `exact` or `partial`.
    pub reward: RewardKind,
}

impl Default for ReverseOptions {
    fn default() -> Self {
        ReverseOptions {
            min_digits: 2,
            max_digits: 4,
            reward: RewardKind::Partial,
        }
    }
}

/// The digit-reversal task.
#[derive(Debug, Clone)]
pub struct Reverse {
    opts: ReverseOptions,
    seed: u64,
}

impl Reverse {
    /// Checks the options.
    pub fn new(opts: ReverseOptions, seed: u64) -> Result<Self, TaskError> {
        if opts.min_digits == 0 || opts.min_digits > opts.max_digits || opts.max_digits > 12 {
            return Err(TaskError::new(
                "options",
                format!(
                    "min_digits = {}, max_digits = {}",
                    opts.min_digits, opts.max_digits
                ),
                "need 1 <= min_digits <= max_digits <= 12",
            ));
        }
        Ok(Reverse { opts, seed })
    }
}

impl Task for Reverse {
    fn kind(&self) -> &'static str {
        "reverse"
    }

    fn problem(&self, index: u64) -> Problem {
        let mut rng = rng_for(self.seed, index);
        let span = u64::from(self.opts.max_digits - self.opts.min_digits) + 1;
        let len = u64::from(self.opts.min_digits) + rng.next_u64() % span;
        let digits: String = (0..len)
            .map(|_| char::from(b'0' + (rng.next_u64() % 10) as u8))
            .collect();
        Problem {
            index,
            prompt: format!("Q: reverse {digits} A:"),
            answer: digits.chars().rev().collect(),
            expression: None,
        }
    }

    fn reward(&self, problem: &Problem, completion: &str) -> f32 {
        score_answer(self.opts.reward, &problem.answer, completion)
    }
}
