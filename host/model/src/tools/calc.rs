//! The calculator tool: `+ - * / ^` (also `**`), parentheses, unary minus and plus, and
//! decimal numbers, evaluated **exactly** over rationals of `i128` (no floating point, so
//! `0.1 + 0.2` is `0.3` and `1/3 * 3` is `1`).
//!
//! Hand-written rather than a crate: the grammar is five rules, exactness and the work bounds
//! below are the whole point, and the expression-evaluator crates evaluate in `f64` with
//! unbounded powers (and would be a new workspace dependency for ~200 lines).
//!
//! Grammar (`^` binds tighter than unary minus and is right-associative, so `-2^2` is `-4`
//! and `2^3^2` is `2^9`; `2^-1` is allowed):
//!
//! ```text
//! expr  := term (("+" | "-") term)*
//! term  := unary (("*" | "/") unary)*
//! unary := ("-" | "+") unary | power
//! power := atom (("^" | "**") unary)?
//! atom  := number | "(" expr ")"
//! ```
//!
//! Bounded work: at most [`MAX_LEN`] bytes of input, [`MAX_DEPTH`] levels of nesting,
//! exponents at most [`MAX_EXPONENT`] in absolute value, and every operation checked, so an
//! evaluation is microseconds whatever the input. Results: an integer (`42`), else a
//! terminating decimal written exactly (`0.125`), else the reduced fraction (`1/3`); never
//! rounded. Errors are [`ToolError`] lines.

use super::error::ToolError;

/// The longest expression accepted, in bytes.
pub const MAX_LEN: usize = 256;
/// The deepest nesting of parentheses and signs accepted.
pub const MAX_DEPTH: usize = 64;
/// The largest exponent accepted, in absolute value.
pub const MAX_EXPONENT: u32 = 256;

/// Evaluates `expression` exactly (see the module doc).
pub fn calculate(expression: &str) -> Result<String, ToolError> {
    if expression.len() > MAX_LEN {
        return Err(ToolError::TooLong {
            len: expression.len(),
            max: MAX_LEN,
        });
    }
    if expression.trim().is_empty() {
        return Err(ToolError::Empty);
    }
    let mut p = Parser {
        text: expression,
        pos: 0,
        depth: 0,
    };
    let value = p.expr()?;
    p.skip_space();
    if p.pos < p.text.len() {
        return Err(p.unexpected("an operator or the end"));
    }
    Ok(value.to_string())
}

/// An exact rational: `num / den`, `den > 0`, reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ratio {
    num: i128,
    den: i128,
}

/// The greatest common divisor of `|a|` and `|b|` (0 only when both are 0), capped at
/// `i128::MAX` (reached only by `gcd(i128::MIN, 0 or i128::MIN)`, which no caller passes).
fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i128::try_from(a).unwrap_or(i128::MAX)
}

impl Ratio {
    fn new(num: i128, den: i128) -> Result<Ratio, ToolError> {
        if den == 0 {
            return Err(ToolError::DivisionByZero);
        }
        let g = gcd(num, den).max(1);
        let (mut num, mut den) = (num / g, den / g);
        if den < 0 {
            num = num.checked_neg().ok_or(ToolError::Overflow)?;
            den = den.checked_neg().ok_or(ToolError::Overflow)?;
        }
        Ok(Ratio { num, den })
    }

    fn add(self, o: Ratio) -> Result<Ratio, ToolError> {
        let g = gcd(self.den, o.den);
        let l = (self.den / g)
            .checked_mul(o.den)
            .ok_or(ToolError::Overflow)?;
        let a = self
            .num
            .checked_mul(l / self.den)
            .ok_or(ToolError::Overflow)?;
        let b = o.num.checked_mul(l / o.den).ok_or(ToolError::Overflow)?;
        Ratio::new(a.checked_add(b).ok_or(ToolError::Overflow)?, l)
    }

    fn neg(self) -> Result<Ratio, ToolError> {
        Ok(Ratio {
            num: self.num.checked_neg().ok_or(ToolError::Overflow)?,
            den: self.den,
        })
    }

    fn mul(self, o: Ratio) -> Result<Ratio, ToolError> {
        // Cross-reduce first so that exact results stay in range as long as they can.
        let g1 = gcd(self.num, o.den).max(1);
        let g2 = gcd(o.num, self.den).max(1);
        let num = (self.num / g1).checked_mul(o.num / g2);
        let den = (self.den / g2).checked_mul(o.den / g1);
        Ratio::new(
            num.ok_or(ToolError::Overflow)?,
            den.ok_or(ToolError::Overflow)?,
        )
    }

    fn recip(self) -> Result<Ratio, ToolError> {
        Ratio::new(self.den, self.num)
    }

    fn pow(self, e: Ratio) -> Result<Ratio, ToolError> {
        if e.den != 1 {
            return Err(ToolError::NonIntegerExponent {
                exponent: e.to_string(),
            });
        }
        let k = u32::try_from(e.num.unsigned_abs())
            .ok()
            .filter(|k| *k <= MAX_EXPONENT)
            .ok_or_else(|| ToolError::ExponentTooLarge {
                exponent: e.to_string(),
                max: MAX_EXPONENT,
            })?;
        let num = self.num.checked_pow(k).ok_or(ToolError::Overflow)?;
        let den = self.den.checked_pow(k).ok_or(ToolError::Overflow)?;
        let r = Ratio::new(num, den)?;
        if e.num < 0 { r.recip() } else { Ok(r) }
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            return write!(f, "{}", self.num);
        }
        // A terminating decimal when the denominator is 2^a 5^b and the scaled value fits.
        let (mut d, mut twos, mut fives) = (self.den, 0u32, 0u32);
        while d % 2 == 0 {
            d /= 2;
            twos += 1;
        }
        while d % 5 == 0 {
            d /= 5;
            fives += 1;
        }
        let scale = twos.max(fives);
        let scaled = 10i128
            .checked_pow(scale)
            .and_then(|p| self.num.checked_mul(p / self.den));
        match scaled {
            Some(s) if d == 1 => {
                let digits = s.unsigned_abs().to_string();
                let width = scale as usize + 1;
                let digits = format!("{digits:0>width$}");
                let (int, frac) = digits.split_at(digits.len() - scale as usize);
                let sign = if s < 0 { "-" } else { "" };
                write!(f, "{sign}{int}.{frac}")
            }
            _ => write!(f, "{}/{}", self.num, self.den),
        }
    }
}

/// A recursive-descent parser over the expression's bytes.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while self.text[self.pos..].starts_with(|c: char| c.is_whitespace()) {
            self.pos += self.text[self.pos..]
                .chars()
                .next()
                .map_or(1, char::len_utf8);
        }
    }

    /// Consumes `tok` (after spaces) when it is next.
    fn eat(&mut self, tok: &str) -> bool {
        self.skip_space();
        if self.text[self.pos..].starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    /// The error for what stands at the current position.
    fn unexpected(&self, expected: &'static str) -> ToolError {
        match self.text[self.pos..].chars().next() {
            None => ToolError::Syntax {
                at: self.pos,
                expected,
                found: "end of input".to_owned(),
            },
            Some(c) if c.is_ascii_digit() || "+-*/^().".contains(c) => ToolError::Syntax {
                at: self.pos,
                expected,
                found: format!("{c:?}"),
            },
            Some(c) => ToolError::UnknownToken {
                at: self.pos,
                found: c,
            },
        }
    }

    fn deeper(&mut self) -> Result<(), ToolError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ToolError::TooDeep {
                at: self.pos,
                max: MAX_DEPTH,
            });
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Ratio, ToolError> {
        let mut acc = self.term()?;
        loop {
            if self.eat("+") {
                acc = acc.add(self.term()?)?;
            } else if self.eat("-") {
                acc = acc.add(self.term()?.neg()?)?;
            } else {
                return Ok(acc);
            }
        }
    }

    fn term(&mut self) -> Result<Ratio, ToolError> {
        let mut acc = self.unary()?;
        loop {
            // `**` is a power, handled below `unary`: do not read its first `*` here.
            self.skip_space();
            if self.text[self.pos..].starts_with("**") {
                return Ok(acc);
            }
            if self.eat("*") {
                acc = acc.mul(self.unary()?)?;
            } else if self.eat("/") {
                acc = acc.mul(self.unary()?.recip()?)?;
            } else {
                return Ok(acc);
            }
        }
    }

    fn unary(&mut self) -> Result<Ratio, ToolError> {
        if self.eat("-") {
            self.deeper()?;
            let v = self.unary()?.neg();
            self.depth -= 1;
            v
        } else if self.eat("+") {
            self.deeper()?;
            let v = self.unary();
            self.depth -= 1;
            v
        } else {
            self.power()
        }
    }

    fn power(&mut self) -> Result<Ratio, ToolError> {
        let base = self.atom()?;
        if self.eat("**") || self.eat("^") {
            self.deeper()?;
            let e = self.unary()?;
            self.depth -= 1;
            base.pow(e)
        } else {
            Ok(base)
        }
    }

    fn atom(&mut self) -> Result<Ratio, ToolError> {
        if self.eat("(") {
            self.deeper()?;
            let v = self.expr()?;
            if !self.eat(")") {
                return Err(self.unexpected("`)`"));
            }
            self.depth -= 1;
            return Ok(v);
        }
        self.skip_space();
        self.number()
    }

    /// `digits`, `digits.digits`, `.digits` or `digits.`, exactly.
    fn number(&mut self) -> Result<Ratio, ToolError> {
        let rest = &self.text[self.pos..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let lit = &rest[..end];
        let (int, frac) = lit.split_once('.').unwrap_or((lit, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(self.unexpected("a number or `(`"));
        }
        if frac.contains('.') {
            return Err(ToolError::Syntax {
                at: self.pos,
                expected: "a number with at most one `.`",
                found: format!("{lit:?}"),
            });
        }
        let mut num: i128 = 0;
        for b in int.bytes().chain(frac.bytes()) {
            num = num
                .checked_mul(10)
                .and_then(|n| n.checked_add(i128::from(b - b'0')))
                .ok_or(ToolError::Overflow)?;
        }
        let scale = u32::try_from(frac.len()).map_err(|_| ToolError::Overflow)?;
        let den = 10i128.checked_pow(scale).ok_or(ToolError::Overflow)?;
        self.pos += end;
        Ratio::new(num, den)
    }
}

#[cfg(test)]
#[path = "calc_tests.rs"]
mod tests;
