//! `word_problems`: short arithmetic stories with names and objects, for instruct models.
//!
//! Problem `i` under a seed picks an operation from `ops`, operands of `digits` digits (for
//! `*`, one operand of `digits` digits times a factor in 2..=9), a sentence template of that
//! operation, two distinct names and an object, and ends with the instruction "Answer with a
//! number." Differences are never negative. The reward is exact: 1 when the last integer of
//! the completion ([`last_integer`](super::reward::last_integer): GSM8K-style, commas
//! dropped, a leading minus kept) equals the answer, else 0.

use super::reward::last_integer;
use super::{Problem, Task, TaskError, rng_for};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::RngCore;
use serde::Deserialize;

/// Options of `[task] kind = "word_problems"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WordProblemsOptions {
    /// Digits of each operand (1..=6; one-digit operands are 1..=9).
    pub digits: u32,
    /// Operations to draw from: `+`, `-`, `*` (times a one-digit factor).
    pub ops: Vec<String>,
}

impl Default for WordProblemsOptions {
    fn default() -> Self {
        WordProblemsOptions {
            digits: 2,
            ops: vec!["+".into(), "-".into()],
        }
    }
}

const NAMES: &[&str] = &[
    "Alice", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kira",
    "Liam", "Maya", "Noah", "Olivia", "Pablo", "Rosa", "Sam", "Tara", "Victor",
];

const OBJECTS: &[&str] = &[
    "apples", "marbles", "stickers", "books", "pencils", "coins", "cookies", "cards", "shells",
    "balloons", "stamps", "beads", "flowers", "eggs", "candies", "toy cars",
];

/// Templates of `a + b`: `{n}`/`{m}` names, `{o}` the object, `{a}`/`{b}` the operands.
const ADD: &[&str] = &[
    "{n} has {a} {o}. {m} gives {n} {b} more {o}. How many {o} does {n} have now?",
    "A shop sold {a} {o} in the morning and {b} {o} in the afternoon. How many {o} did the shop sell in total?",
    "{n} collected {a} {o} on Monday and {b} {o} on Tuesday. How many {o} did {n} collect altogether?",
    "There are {a} {o} in a red box and {b} {o} in a blue box. How many {o} are there in both boxes?",
];

/// Templates of `a - b` (`a >= b`).
const SUB: &[&str] = &[
    "{n} had {a} {o} and gave {b} of them to {m}. How many {o} does {n} have left?",
    "A box held {a} {o}. {n} took {b} {o} out of the box. How many {o} are left in the box?",
    "{n} has {a} {o} and {m} has {b} {o}. How many more {o} does {n} have than {m}?",
    "{n} needs {a} {o} and already has {b}. How many more {o} does {n} need?",
];

/// Templates of `a * b` (`b` the one-digit factor).
const MUL: &[&str] = &[
    "{n} buys {b} bags with {a} {o} in each bag. How many {o} does {n} buy?",
    "There are {b} shelves with {a} {o} on each shelf. How many {o} are there in all?",
    "{n} packs {a} {o} into each of {b} boxes. How many {o} does {n} pack?",
];

/// The instruction every prompt ends with.
pub const INSTRUCTION: &str = "Answer with a number.";

/// The word-problem task.
#[derive(Debug, Clone)]
pub struct WordProblems {
    opts: WordProblemsOptions,
    seed: u64,
}

impl WordProblems {
    /// Checks the options.
    pub fn new(opts: WordProblemsOptions, seed: u64) -> Result<Self, TaskError> {
        if !(1..=6).contains(&opts.digits) {
            return Err(TaskError::new(
                "options.digits",
                format!("{} is out of range", opts.digits),
                "use 1..=6 digits per operand",
            ));
        }
        if opts.ops.is_empty() {
            return Err(TaskError::new(
                "options.ops",
                "empty",
                "use any of \"+\", \"-\", \"*\", e.g. [\"+\", \"-\"]",
            ));
        }
        if let Some(bad) = opts
            .ops
            .iter()
            .find(|o| !matches!(o.as_str(), "+" | "-" | "*"))
        {
            return Err(TaskError::new(
                "options.ops",
                format!("unknown operator `{bad}`"),
                "use \"+\", \"-\" or \"*\"",
            ));
        }
        Ok(WordProblems { opts, seed })
    }

    /// An operand of `digits` digits.
    fn operand(&self, rng: &mut ChaCha8Rng) -> u64 {
        let lo = if self.opts.digits == 1 {
            1
        } else {
            10u64.pow(self.opts.digits - 1)
        };
        let hi = 10u64.pow(self.opts.digits) - 1;
        lo + rng.next_u64() % (hi - lo + 1)
    }
}

fn pick<'a>(rng: &mut ChaCha8Rng, list: &[&'a str]) -> &'a str {
    list[(rng.next_u64() % list.len() as u64) as usize]
}

impl Task for WordProblems {
    fn kind(&self) -> &'static str {
        "word_problems"
    }

    fn problem(&self, index: u64) -> Problem {
        let mut rng = rng_for(self.seed, index);
        let op = self.opts.ops[(rng.next_u64() % self.opts.ops.len() as u64) as usize].as_str();
        let mut a = self.operand(&mut rng);
        let (b, answer, templates) = match op {
            "-" => {
                let mut b = self.operand(&mut rng);
                if a < b {
                    std::mem::swap(&mut a, &mut b);
                }
                (b, a - b, SUB)
            }
            "*" => {
                let b = 2 + rng.next_u64() % 8;
                (b, a * b, MUL)
            }
            _ => {
                let b = self.operand(&mut rng);
                (b, a + b, ADD)
            }
        };
        let template = pick(&mut rng, templates);
        let n = pick(&mut rng, NAMES);
        let mut m = pick(&mut rng, NAMES);
        if m == n {
            // The next name: two distinct people, still a pure function of (seed, index).
            let i = NAMES.iter().position(|x| *x == n).unwrap_or(0);
            m = NAMES[(i + 1) % NAMES.len()];
        }
        let o = pick(&mut rng, OBJECTS);
        let story = template
            .replace("{n}", n)
            .replace("{m}", m)
            .replace("{o}", o)
            .replace("{a}", &a.to_string())
            .replace("{b}", &b.to_string());
        Problem {
            index,
            prompt: format!("{story} {INSTRUCTION}"),
            answer: answer.to_string(),
            expression: Some(format!("{a} {op} {b}")),
        }
    }

    fn reward(&self, problem: &Problem, completion: &str) -> f32 {
        let want = problem.answer.parse::<i64>().ok();
        match (last_integer(completion), want) {
            (Some(got), Some(want)) if got == want => 1.0,
            _ => 0.0,
        }
    }
}
