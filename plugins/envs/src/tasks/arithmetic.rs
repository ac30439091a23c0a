//! `arithmetic`: `Q: a+b=? A:` with small operands; the answer is the sum (or difference).
//! With `long_tail`, that fraction of the problems asks for the answer written `long_repeat`
//! times in a row (`Q: 2+3=? x16 A:` → `5555555555555555`): long completions among short
//! ones, the long tail of a rollout that speculative decoding serves.

use super::{Problem, RewardKind, Task, TaskError, rng_for, score_answer};
use rand_chacha::rand_core::RngCore;
use serde::Deserialize;

/// Options of `[task] kind = "arithmetic"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithmeticOptions {
    /// Largest operand (operands are drawn from `0..=max_operand`).
    pub max_operand: u32,
    /// Operators to draw from: `+` and/or `-` (differences are never negative).
    pub ops: Vec<String>,
    /// `exact` or `partial`.
    pub reward: RewardKind,
    /// Fraction of problems (0..=1) whose answer is written `long_repeat` times.
    pub long_tail: f64,
    /// How many times a long-tail problem's answer is written (2..=64).
    pub long_repeat: u32,
}

impl Default for ArithmeticOptions {
    fn default() -> Self {
        ArithmeticOptions {
            max_operand: 9,
            ops: vec!["+".into()],
            reward: RewardKind::Partial,
            long_tail: 0.0,
            long_repeat: 16,
        }
    }
}

/// The arithmetic task.
#[derive(Debug, Clone)]
pub struct Arithmetic {
    opts: ArithmeticOptions,
    seed: u64,
}

impl Arithmetic {
    /// Checks the options.
    pub fn new(opts: ArithmeticOptions, seed: u64) -> Result<Self, TaskError> {
        if opts.max_operand == 0 || opts.max_operand > 9999 {
            return Err(TaskError::new(
                "options.max_operand",
                format!("{} is out of range", opts.max_operand),
                "use 1..=9999",
            ));
        }
        if opts.ops.is_empty() {
            return Err(TaskError::new(
                "options.ops",
                "empty",
                "use [\"+\"], [\"-\"] or both",
            ));
        }
        if let Some(bad) = opts.ops.iter().find(|o| !matches!(o.as_str(), "+" | "-")) {
            return Err(TaskError::new(
                "options.ops",
                format!("unknown operator `{bad}`"),
                "use \"+\" or \"-\"",
            ));
        }
        if !(0.0..=1.0).contains(&opts.long_tail) {
            return Err(TaskError::new(
                "options.long_tail",
                format!("{} is not a fraction", opts.long_tail),
                "use 0..=1, e.g. 0.125 (one problem in eight asks for a long answer)",
            ));
        }
        if !(2..=64).contains(&opts.long_repeat) {
            return Err(TaskError::new(
                "options.long_repeat",
                format!("{} is out of range", opts.long_repeat),
                "use 2..=64 (and [algorithm] max_tokens above it)",
            ));
        }
        Ok(Arithmetic { opts, seed })
    }
}

impl Task for Arithmetic {
    fn kind(&self) -> &'static str {
        "arithmetic"
    }

    fn problem(&self, index: u64) -> Problem {
        let mut rng = rng_for(self.seed, index);
        let n = u64::from(self.opts.max_operand) + 1;
        let mut a = rng.next_u64() % n;
        let mut b = rng.next_u64() % n;
        let op = &self.opts.ops[(rng.next_u64() % self.opts.ops.len() as u64) as usize];
        let answer = if op == "-" {
            if a < b {
                std::mem::swap(&mut a, &mut b);
            }
            a - b
        } else {
            a + b
        };
        // Drawn last, and only when asked for: the short problems are those of a task
        // without a long tail.
        let long = self.opts.long_tail > 0.0
            && ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < self.opts.long_tail;
        if long {
            let n = self.opts.long_repeat;
            return Problem {
                index,
                prompt: format!("Q: {a}{op}{b}=? x{n} A:"),
                answer: answer.to_string().repeat(n as usize),
                expression: None,
            };
        }
        Problem {
            index,
            prompt: format!("Q: {a}{op}{b}=? A:"),
            answer: answer.to_string(),
            expression: Some(format!("{a} {op} {b}")),
        }
    }

    fn reward(&self, problem: &Problem, completion: &str) -> f32 {
        score_answer(self.opts.reward, &problem.answer, completion)
    }
}
