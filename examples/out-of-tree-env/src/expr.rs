//! Countdown expressions: finding the expression in a completion, parsing it (numbers,
//! `+ - * /` (also `×`, `÷`), parentheses; no unary minus) and evaluating it exactly over the
//! rationals, with every literal it used.

/// Longest expression read (characters): a longer candidate is no answer.
const MAX_LEN: usize = 200;
/// Deepest parenthesis nesting read.
const MAX_DEPTH: usize = 32;
/// Largest literal (six digits).
const MAX_LITERAL: i128 = 999_999;

/// An exact rational `num / den`, `den > 0`, in lowest terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio {
    num: i128,
    den: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Ratio {
    /// The integer `n`.
    pub fn int(n: i128) -> Ratio {
        Ratio { num: n, den: 1 }
    }

    /// The value when it is an integer.
    pub fn integer(self) -> Option<i128> {
        (self.den == 1).then_some(self.num)
    }

    fn new(num: i128, den: i128) -> Option<Ratio> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den).max(1);
        let sign = if den < 0 { -1 } else { 1 };
        Some(Ratio {
            num: sign * num / g,
            den: sign * den / g,
        })
    }

    fn apply(self, op: char, o: Ratio) -> Option<Ratio> {
        let (a, b, c, d) = (self.num, self.den, o.num, o.den);
        match op {
            '+' => Ratio::new(
                a.checked_mul(d)?.checked_add(c.checked_mul(b)?)?,
                b.checked_mul(d)?,
            ),
            '-' => Ratio::new(
                a.checked_mul(d)?.checked_sub(c.checked_mul(b)?)?,
                b.checked_mul(d)?,
            ),
            '*' => Ratio::new(a.checked_mul(c)?, b.checked_mul(d)?),
            '/' => Ratio::new(a.checked_mul(d)?, b.checked_mul(c)?),
            _ => None,
        }
    }
}

/// A parsed expression: its exact value and its literals, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluated {
    /// The value.
    pub value: Ratio,
    /// Every number the expression used.
    pub literals: Vec<i128>,
}

/// The candidate expression of a completion: on its last line holding a digit (backticks
/// and `$` dropped), the first `=`-separated part that parses, read from where the
/// expression's characters start (so `Answer: (3 + 7) * 9 = 90` gives `(3 + 7) * 9`).
pub fn find(completion: &str) -> Option<Evaluated> {
    let line = completion
        .lines()
        .rev()
        .find(|l| l.chars().any(|c| c.is_ascii_digit()))?;
    let line: String = line.chars().filter(|c| !matches!(c, '`' | '$')).collect();
    line.split('=').find_map(|part| {
        let start = part
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_expression_char(*c))
            .last()
            .map_or(part.len(), |(i, _)| i);
        parse(part[start..].trim())
    })
}

fn is_expression_char(c: char) -> bool {
    c.is_ascii_digit() || c.is_whitespace() || "+-*/()×÷".contains(c)
}

/// Parses and evaluates `text` (the whole of it); `None` when it is not an expression, too
/// long or too deep, divides by zero or overflows.
pub fn parse(text: &str) -> Option<Evaluated> {
    if text.is_empty() || text.chars().count() > MAX_LEN {
        return None;
    }
    let tokens: Vec<char> = text
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| match c {
            '×' => '*',
            '÷' => '/',
            c => c,
        })
        .collect();
    // Digits separated by spaces (`1 2`) are two numbers, not twelve.
    if text
        .split(|c: char| !c.is_ascii_digit() && !c.is_whitespace())
        .any(|run| run.split_whitespace().count() > 1)
    {
        return None;
    }
    let mut p = Parser {
        tokens,
        at: 0,
        literals: Vec::new(),
    };
    let value = p.expr(0)?;
    (p.at == p.tokens.len()).then_some(Evaluated {
        value,
        literals: p.literals,
    })
}

struct Parser {
    tokens: Vec<char>,
    at: usize,
    literals: Vec<i128>,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.tokens.get(self.at).copied()
    }

    /// `term (('+' | '-') term)*`
    fn expr(&mut self, depth: usize) -> Option<Ratio> {
        let mut acc = self.term(depth)?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.at += 1;
            acc = acc.apply(op, self.term(depth)?)?;
        }
        Some(acc)
    }

    /// `factor (('*' | '/') factor)*`
    fn term(&mut self, depth: usize) -> Option<Ratio> {
        let mut acc = self.factor(depth)?;
        while let Some(op @ ('*' | '/')) = self.peek() {
            self.at += 1;
            acc = acc.apply(op, self.factor(depth)?)?;
        }
        Some(acc)
    }

    /// `number | '(' expr ')'`
    fn factor(&mut self, depth: usize) -> Option<Ratio> {
        match self.peek()? {
            '(' if depth < MAX_DEPTH => {
                self.at += 1;
                let v = self.expr(depth + 1)?;
                (self.peek()? == ')').then(|| self.at += 1)?;
                Some(v)
            }
            c if c.is_ascii_digit() => {
                let mut n: i128 = 0;
                while let Some(d) = self.peek().and_then(|c| c.to_digit(10)) {
                    n = n * 10 + i128::from(d);
                    if n > MAX_LITERAL {
                        return None;
                    }
                    self.at += 1;
                }
                self.literals.push(n);
                Some(Ratio::int(n))
            }
            _ => None,
        }
    }
}

/// Whether `used` takes each number at most as often as `given` holds it.
pub fn uses_given(used: &[i128], given: &[u32]) -> bool {
    let mut left: Vec<i128> = given.iter().map(|&n| i128::from(n)).collect();
    used.iter().all(|n| match left.iter().position(|m| m == n) {
        Some(i) => {
            left.swap_remove(i);
            true
        }
        None => false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn value(text: &str) -> Option<Ratio> {
        parse(text).map(|e| e.value)
    }

    #[test]
    fn evaluates_exactly_with_precedence_and_parentheses() {
        assert_eq!(value("2 + 3 * 4"), Some(Ratio::int(14)));
        assert_eq!(value("(2 + 3) * 4"), Some(Ratio::int(20)));
        assert_eq!(value("7 / 2 * 2"), Some(Ratio::int(7)));
        assert_eq!(value("1 / 3 + 1 / 3 + 1 / 3"), Some(Ratio::int(1)));
        assert_eq!(value("25 × 4 ÷ 5"), Some(Ratio::int(20)));
        assert_eq!(value("3 - 10"), Some(Ratio::int(-7)));
    }

    #[test]
    fn refuses_what_is_not_an_expression() {
        for bad in [
            "",
            "1 +",
            "(1 + 2",
            "1 2",
            "-3 + 4",
            "5 / (2 - 2)",
            "x + 1",
            "1234567 + 1",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(parse(&deep), None);
    }

    #[test]
    fn finds_the_expression_on_the_last_line() {
        let e = find("Let me think.\n3 * 3 = 9\nAnswer: `(3 + 7) * 9 = 90`\n").unwrap();
        assert_eq!((e.value, e.literals), (Ratio::int(90), vec![3, 7, 9]));
        assert_eq!(find("no numbers at all"), None);
    }

    #[test]
    fn each_given_number_is_used_at_most_once() {
        assert!(uses_given(&[3, 7], &[7, 3, 9]));
        assert!(!uses_given(&[3, 3], &[3, 7]));
        assert!(!uses_given(&[4], &[3, 7]));
    }
}
