//! The `choice` verifier's extraction: the multiple-choice letter (A–J) a completion gives.

/// The letter of a reference answer: `C`, `c`, `(C)`, `C.`, `C)`; `None` otherwise.
pub fn answer_letter(answer: &str) -> Option<char> {
    let t = answer
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(['.', ')']);
    let mut chars = t.chars();
    let c = chars.next()?.to_ascii_uppercase();
    (chars.next().is_none() && ('A'..='J').contains(&c)).then_some(c)
}

fn is_choice(c: char) -> bool {
    ('A'..='J').contains(&c)
}

fn word_boundary(b: Option<char>) -> bool {
    b.is_none_or(|c| !c.is_alphanumeric())
}

/// The letter after the last "answer" cue (`Answer: C`, `the answer is (C)`,
/// `answer is: c`), case-insensitive for the letter.
fn after_cue(text: &str) -> Option<char> {
    let lower = text.to_ascii_lowercase();
    let mut best = None;
    for (i, _) in lower.match_indices("answer") {
        let rest = &text[i + "answer".len()..];
        let rest = rest.trim_start_matches([' ', '*', ':']);
        let rest = rest.strip_prefix("is").unwrap_or(rest);
        let rest = rest.trim_start_matches([' ', '*', ':', '(', '$']);
        let rest = rest.strip_prefix("\\boxed{").unwrap_or(rest);
        let mut chars = rest.chars();
        let Some(first) = chars.next() else { continue };
        let next = chars.next();
        // A lower-case letter followed by a space is a word ("the answer is a number").
        let lower_ok = first.is_ascii_uppercase() || next.is_none_or(|n| ").*$}".contains(n));
        let c = first.to_ascii_uppercase();
        if is_choice(c) && word_boundary(next) && lower_ok {
            best = Some(c);
        }
    }
    best
}

/// The multiple-choice letter of a completion, by the first rule that finds one:
/// 1. after the last "answer" cue (`Answer: C`, `The answer is (C).`);
/// 2. the last `\boxed{C}`;
/// 3. the last parenthesised letter `(C)`;
/// 4. a capital letter standing alone as the completion's last word (`... so C.`, `C`).
///
/// Lower-case letters count only after a cue (`a` is also a word).
pub fn extract(text: &str) -> Option<char> {
    if let Some(c) = after_cue(text) {
        return Some(c);
    }
    if let Some(b) = super::text::last_boxed(text)
        && let Some(c) = answer_letter(b)
    {
        return Some(c);
    }
    let chars: Vec<char> = text.chars().collect();
    let paren = chars
        .windows(3)
        .rposition(|w| w[0] == '(' && is_choice(w[1]) && w[2] == ')');
    if let Some(i) = paren {
        return Some(chars[i + 1]);
    }
    let last = text
        .trim_end()
        .trim_end_matches(['.', '!', ')', '*'])
        .split(|c: char| c.is_whitespace() || c == '(' || c == '*')
        .next_back()?;
    let mut cs = last.chars();
    let c = cs.next()?;
    (is_choice(c) && cs.next().is_none()).then_some(c)
}
