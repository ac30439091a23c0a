//! The `math` verifier: equivalence of a final answer with the reference, in exact rational
//! arithmetic (never floats).
//!
//! What it does: both sides are normalised (surrounding `$...$`, `\(...\)`, `\[...\]`;
//! `\left`/`\right`, spacing commands (`\,` `\!` `\;` `\:` `~`), `\displaystyle`; `\text{}`,
//! `\textbf{}`, `\textnormal{}`, `\mathrm{}`, `\mbox{}` unwrapped; `\dfrac`, `\tfrac`,
//! `\cfrac` read as `\frac`; degree signs; `{,}` and `1,234`-style thousands separators; a
//! trailing period; a leading `x =`), then read as a value: an integer, a decimal (`0.5`,
//! `.5`), a fraction `a/b` or `\frac{a}{b}` (also `\frac12`) of such numbers, with a sign, and
//! an optional `%`; or a tuple/interval of values (`(1, 2)`, `[0, \frac{1}{2})`, brackets
//! compared). Two answers are equivalent when their values are equal as rationals (`0.5` =
//! `\frac{1}{2}` = `1/2`; `50%` equals `50` and `0.5`), or when their normalised texts are
//! equal. Decimals are exact: `0.3333` is not `\frac{1}{3}` (math-verify rounds floats to 6
//! places by default).
//!
//! What it does not do (the Python route with math-verify does): general algebraic or
//! symbolic simplification (`\sqrt{8}` vs `2\sqrt{2}`, `x+1` vs `1+x`), irrational constants,
//! arithmetic inside an answer (`9+1`), relations and equations beyond a leading `x =`,
//! scientific notation, mixed numbers (`1\frac{1}{2}`), decimal commas (`1,22` is a pair),
//! spaces as thousands separators, units other than a `\text{...}` word, unions and
//! unordered set comparison, matrices, or numbers beyond 128-bit numerators and denominators
//! (those compare by text only).

/// A rational number, reduced, with a positive denominator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

impl Rational {
    /// `num / den` reduced; `None` for a zero denominator or on overflow.
    pub fn new(num: i128, den: i128) -> Option<Rational> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (num, den) = (num / g, den / g);
        let sign = if den < 0 { -1 } else { 1 };
        Some(Rational {
            num: num.checked_mul(sign)?,
            den: den.checked_mul(sign)?,
        })
    }

    fn div(self, other: Rational) -> Option<Rational> {
        Rational::new(
            self.num.checked_mul(other.den)?,
            self.den.checked_mul(other.num)?,
        )
    }

    fn neg(self) -> Option<Rational> {
        Some(Rational {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }
}

/// A parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum MathValue {
    /// A number; `true` when written as a percentage (the number is the one before `%`).
    Number(Rational, bool),
    /// A tuple or interval: opening bracket (`' '` for none), elements, closing bracket.
    Tuple(char, Vec<MathValue>, char),
}

const WRAPPERS: &[&str] = &[
    "\\text",
    "\\textbf",
    "\\textrm",
    "\\textnormal",
    "\\mathrm",
    "\\mathbf",
    "\\mbox",
];

/// `s` with every `\cmd{...}` of `cmds` replaced by what `keep` makes of its content.
fn unwrap_commands(s: &str, keep: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'outer: while let Some(i) = rest.find('\\') {
        for cmd in WRAPPERS {
            let Some(after) = rest[i..].strip_prefix(cmd) else {
                continue;
            };
            let after = after.trim_start();
            let Some(body) = after.strip_prefix('{') else {
                continue;
            };
            let mut depth = 1;
            for (j, c) in body.char_indices() {
                depth += match c {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                if depth == 0 {
                    out.push_str(&rest[..i]);
                    if keep {
                        out.push_str(&body[..j]);
                    }
                    rest = &body[j + 1..];
                    continue 'outer;
                }
            }
        }
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out
}

/// The normalised text of an answer (see the module doc); `keep_text` keeps the content of
/// `\text{...}` (else it is dropped, e.g. a unit).
pub fn normalize(answer: &str, keep_text: bool) -> String {
    let mut s = answer.trim().to_owned();
    for (open, close) in [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
        if let Some(inner) = s.strip_prefix(open).and_then(|t| t.strip_suffix(close)) {
            s = inner.to_owned();
        }
    }
    s = unwrap_commands(&s, keep_text);
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\displaystyle", ""),
        ("\\dfrac", "\\frac"),
        ("\\cfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("°", ""),
        ("\\%", "%"),
        ("{,}", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\ ", ""),
        ("~", ""),
        ("\\{", "{"),
        ("\\}", "}"),
        ("$", ""),
    ] {
        s = s.replace(from, to);
    }
    s.retain(|c| !c.is_whitespace());
    let mut s = s.trim_end_matches('.').to_owned();
    // A leading `x =` (one name, one `=`).
    if let Some((name, value)) = s.split_once('=')
        && !value.contains('=')
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphabetic() || c == '_' || c == '\\')
    {
        s = value.to_owned();
    }
    s
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// An unsigned integer or decimal (`12`, `0.25`, `.5`, `3.`).
fn decimal(s: &str) -> Option<Rational> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if !(digits(whole) || whole.is_empty() && digits(frac)) || !(frac.is_empty() || digits(frac)) {
        return None;
    }
    let mut num: i128 = 0;
    let mut den: i128 = 1;
    for b in whole.bytes().chain(frac.bytes()) {
        num = num.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    for _ in 0..frac.len() {
        den = den.checked_mul(10)?;
    }
    Rational::new(num, den)
}

/// `1,234,567`-style thousands: digits in groups of three after the first.
fn thousands(s: &str) -> Option<String> {
    let (whole, frac) = s.split_once('.').map_or((s, None), |(w, f)| (w, Some(f)));
    let mut groups = whole.split(',');
    let first = groups.next()?;
    if !digits(first) || first.len() > 3 {
        return None;
    }
    let mut out = first.to_owned();
    let mut any = false;
    for g in groups {
        if g.len() != 3 || !digits(g) {
            return None;
        }
        out.push_str(g);
        any = true;
    }
    any.then(|| match frac {
        Some(f) => format!("{out}.{f}"),
        None => out,
    })
}

/// The brace group at the start of `s` (`{...}` or one character) and what follows.
fn group(s: &str) -> Option<(&str, &str)> {
    if let Some(body) = s.strip_prefix('{') {
        let mut depth = 1;
        for (i, c) in body.char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                return Some((&body[..i], &body[i + 1..]));
            }
        }
        return None;
    }
    let c = s.chars().next()?;
    Some(s.split_at(c.len_utf8()))
}

/// A signed number: integer, decimal, `a/b`, `\frac{a}{b}` (no percent).
fn number(s: &str) -> Option<Rational> {
    if let Some(rest) = s.strip_prefix('-') {
        return number(rest)?.neg();
    }
    if let Some(rest) = s.strip_prefix('+') {
        return number(rest);
    }
    if let Some(rest) = s.strip_prefix("\\frac") {
        let (a, rest) = group(rest)?;
        let (b, rest) = group(rest)?;
        if !rest.is_empty() {
            return None;
        }
        return number(a)?.div(number(b)?);
    }
    if let Some((a, b)) = s.split_once('/') {
        return number(a)?.div(number(b)?);
    }
    if let Some(body) = s.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        return number(body);
    }
    decimal(s).or_else(|| decimal(&thousands(s)?))
}

/// Splits `s` at the commas outside brackets.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Whether the bracket opening `s` closes at its last character.
fn wrapped(s: &str) -> bool {
    let mut depth = 0i32;
    let last = s.len().saturating_sub(1);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && i < last {
            return false;
        }
    }
    depth == 0
}

/// Reads a normalised answer as a value.
pub fn parse(s: &str) -> Option<MathValue> {
    if s.is_empty() {
        return None;
    }
    let open = s.chars().next().filter(|c| "([{".contains(*c));
    let close = s.chars().last().filter(|c| ")]}".contains(*c));
    if let (Some(o), Some(c)) = (open, close)
        && wrapped(s)
    {
        let inner = &s[1..s.len() - 1];
        let parts = split_top(inner);
        if parts.len() == 1 && o == '(' || o == '{' && c == '}' && !inner.contains(',') {
            return parse(inner);
        }
        let values = parts.into_iter().map(parse).collect::<Option<Vec<_>>>()?;
        return Some(MathValue::Tuple(o, values, c));
    }
    if let Some(r) = thousands(s.trim_start_matches('-')).and_then(|_| number(s)) {
        return Some(MathValue::Number(r, false));
    }
    let parts = split_top(s);
    if parts.len() > 1 {
        let values = parts.into_iter().map(parse).collect::<Option<Vec<_>>>()?;
        return Some(MathValue::Tuple(' ', values, ' '));
    }
    match s.strip_suffix('%') {
        Some(p) => number(p).map(|r| MathValue::Number(r, true)),
        None => number(s).map(|r| MathValue::Number(r, false)),
    }
}

fn equal(a: &MathValue, b: &MathValue) -> bool {
    let hundred = Rational { num: 100, den: 1 };
    match (a, b) {
        (MathValue::Number(x, px), MathValue::Number(y, py)) => {
            x == y
                || (*px && !py && x.div(hundred) == Some(*y))
                || (*py && !px && y.div(hundred) == Some(*x))
        }
        (MathValue::Tuple(o1, xs, c1), MathValue::Tuple(o2, ys, c2)) => {
            let brackets =
                (o1, c1) == (o2, c2) || (*o1 == ' ' && *o2 == '(') || (*o2 == ' ' && *o1 == '(');
            brackets && xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| equal(x, y))
        }
        _ => false,
    }
}

/// Whether `given` and `reference` are the same answer (see the module doc).
pub fn equivalent(given: &str, reference: &str) -> bool {
    let reference = super::text::last_boxed(reference).unwrap_or(reference);
    let (g, r) = (normalize(given, true), normalize(reference, true));
    if !g.is_empty() && g == r {
        return true;
    }
    let value = |raw: &str, n: &str| parse(n).or_else(|| parse(&normalize(raw, false)));
    match (value(given, &g), value(reference, &r)) {
        (Some(a), Some(b)) => equal(&a, &b),
        _ => false,
    }
}

fn reads_as_value(token: &str) -> bool {
    parse(&normalize(token, false)).is_some()
}

/// A token without a leading currency sign and trailing punctuation or symbols (`1,000.99€`,
/// `12.`, `5,`); letters stay (`2x` is not `2`).
fn trim_token(token: &str) -> &str {
    token
        .trim_start_matches(['$', '€', '£', '¥'])
        .trim_end_matches(|c: char| !c.is_alphanumeric() && !")]}%$".contains(c))
}

/// The final answer of a completion: the last `\boxed{...}`; else what follows the last
/// "answer is"/"answer:" on its line (its first token that reads as a value, when the whole
/// does not); else the last whitespace-separated token that reads as a value.
pub fn final_answer(text: &str) -> Option<&str> {
    if let Some(b) = super::text::last_boxed(text) {
        return Some(b);
    }
    let lower = text.to_ascii_lowercase();
    let cue = ["answer is", "answer:"]
        .iter()
        .filter_map(|c| lower.rfind(c).map(|i| i + c.len()))
        .max();
    if let Some(start) = cue {
        let line = text[start..].lines().next().unwrap_or("").trim();
        let line = line
            .trim_start_matches([':', '*', ' '])
            .trim_end_matches(['*', '.']);
        if reads_as_value(line) {
            return Some(line);
        }
        if let Some(t) = line
            .split_whitespace()
            .map(trim_token)
            .find(|t| reads_as_value(t))
        {
            return Some(t);
        }
        if !line.is_empty() {
            return Some(line);
        }
    }
    text.split_whitespace()
        .rev()
        .map(trim_token)
        .find(|t| reads_as_value(t))
}
