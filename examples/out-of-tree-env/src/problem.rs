//! Countdown problems: given numbers and a target reached by combining some of them, each at
//! most once, with `+ - * /` (every intermediate result a positive integer). A problem is a
//! pure function of `(seed, stream, index, attempt)`; its prompt, reference expression and
//! metadata are what an item carries.

use crate::options::Options;
use tandem_plugin_api::sdk::{self, parse_options};
use tandem_plugin_api::serde::Deserialize;

/// One problem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields)]
pub struct Problem {
    /// The given numbers, in the order the prompt lists them.
    pub numbers: Vec<u32>,
    /// The number to reach.
    pub target: u32,
    /// An expression reaching it (the reference answer; not carried in the metadata).
    #[serde(skip)]
    pub expression: String,
}

/// SplitMix64: the whole state is one word, so a problem's generator is made from its
/// coordinates alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the bias is below 2^-32 for the sizes used here).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The large numbers a problem may draw (the others are 1 to 10).
const LARGE: [u32; 4] = [25, 50, 75, 100];

impl Problem {
    /// Problem `(stream, index)` of `seed`, trying generator `attempt`s until a target lies in
    /// `1..=max_target` (a sum of two numbers after 64 tries, which never happens in practice).
    pub fn generate(options: &Options, seed: u64, stream: u64, index: u64) -> Problem {
        (0..64)
            .find_map(|attempt| Problem::attempt(options, [seed, stream, index, attempt]))
            .unwrap_or_else(|| {
                let numbers = draw(&mut rng([seed, stream, index, 64]), options.numbers);
                Problem {
                    target: numbers[0] + numbers[1],
                    expression: format!("{} + {}", numbers[0], numbers[1]),
                    numbers,
                }
            })
    }

    fn attempt(options: &Options, at: [u64; 4]) -> Option<Problem> {
        let mut r = rng(at);
        let numbers = draw(&mut r, options.numbers);
        // Combine a random selection of 2..=n of them, in a random order, left to right.
        let mut order: Vec<usize> = (0..numbers.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, r.below(i as u64 + 1) as usize);
        }
        let k = 2 + r.below(numbers.len() as u64 - 1) as usize;
        let mut value = u64::from(numbers[order[0]]);
        let mut expression = numbers[order[0]].to_string();
        for (step, &i) in order[1..k].iter().enumerate() {
            let x = u64::from(numbers[i]);
            let op = match r.below(4) {
                0 => '+',
                1 if value > x => '-',
                2 if value * x <= u64::from(options.max_target) * 4 => '*',
                3 if value % x == 0 && x > 1 => '/',
                _ => '+',
            };
            value = match op {
                '-' => value - x,
                '*' => value * x,
                '/' => value / x,
                _ => value + x,
            };
            expression = if step == 0 {
                format!("{expression} {op} {x}")
            } else {
                format!("({expression}) {op} {x}")
            };
        }
        let target = u32::try_from(value).ok()?;
        (1..=options.max_target)
            .contains(&target)
            .then_some(Problem {
                numbers,
                target,
                expression,
            })
    }

    /// The prompt.
    pub fn prompt(&self) -> String {
        let numbers: Vec<String> = self.numbers.iter().map(u32::to_string).collect();
        format!(
            "Using the numbers {}, each at most once, and + - * / with parentheses, write an \
             expression equal to {}. Put the expression alone on the last line.",
            numbers.join(", "),
            self.target
        )
    }

    /// What an item's metadata carries: the numbers and the target, as a JSON object.
    pub fn metadata_json(&self) -> String {
        let numbers: Vec<String> = self.numbers.iter().map(u32::to_string).collect();
        format!(
            "{{\"numbers\":[{}],\"target\":{}}}",
            numbers.join(","),
            self.target
        )
    }

    /// The problem an item's metadata describes (no reference expression).
    pub fn from_metadata(json: &str) -> sdk::Result<Problem> {
        parse_options::<Problem>(json).map_err(|p| {
            tandem_plugin_api::PluginError::invalid_input(format!(
                "not a countdown item's metadata ({}: {})",
                p.key, p.message
            ))
        })
    }

    /// What makes two problems the same question (the order of the numbers does not).
    pub fn key(&self) -> (Vec<u32>, u32) {
        let mut n = self.numbers.clone();
        n.sort_unstable();
        (n, self.target)
    }
}

fn rng(at: [u64; 4]) -> Rng {
    let mut r = Rng(0);
    for x in at {
        r.0 ^= x;
        r.0 = r.next();
    }
    Rng(r.0)
}

/// `n` numbers: each 1 to 10, or one of [`LARGE`] with probability 1/4.
fn draw(r: &mut Rng, n: u32) -> Vec<u32> {
    (0..n)
        .map(|_| match r.below(4) {
            0 => LARGE[r.below(4) as usize],
            _ => 1 + r.below(10) as u32,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::expr;

    #[test]
    fn every_reference_expression_reaches_its_target_with_the_given_numbers() {
        let options = Options::default();
        for i in 0..500 {
            let p = Problem::generate(&options, 11, 0, i);
            let e = expr::parse(&p.expression).unwrap();
            assert_eq!(e.value.integer(), Some(i128::from(p.target)), "{p:?}");
            assert!(expr::uses_given(&e.literals, &p.numbers), "{p:?}");
            assert!((1..=options.max_target).contains(&p.target), "{p:?}");
        }
    }

    #[test]
    fn problems_are_a_function_of_their_coordinates() {
        let o = Options::default();
        assert_eq!(
            Problem::generate(&o, 1, 0, 5),
            Problem::generate(&o, 1, 0, 5)
        );
        assert_ne!(
            Problem::generate(&o, 1, 0, 5),
            Problem::generate(&o, 2, 0, 5)
        );
        assert_ne!(
            Problem::generate(&o, 1, 0, 5),
            Problem::generate(&o, 1, 1, 5)
        );
    }

    #[test]
    fn metadata_round_trips() {
        let p = Problem::generate(&Options::default(), 3, 0, 0);
        let back = Problem::from_metadata(&p.metadata_json()).unwrap();
        assert_eq!(back.key(), p.key());
        assert!(Problem::from_metadata("{}").is_err());
    }
}
