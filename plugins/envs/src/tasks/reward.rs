//! Answer extraction and the two reward kinds shared by every built-in task.

use serde::Deserialize;

/// How a completion is scored against the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardKind {
    /// 1 for the exact answer, else 0.
    Exact,
    /// Per-character credit: matching characters at the same position over the longer of
    /// answer and guess, scaled to at most 0.9 (1 only for the exact answer). Text after the
    /// answer counts against it, so rambling past the answer instead of stopping does not pay.
    #[default]
    Partial,
}

/// The guess in a completion: the whole completion without surrounding whitespace (the
/// model is expected to answer and stop).
pub fn extract(completion: &str) -> &str {
    completion.trim()
}

/// Reward in `[0, 1]` of `completion` against `answer`.
pub fn score_answer(kind: RewardKind, answer: &str, completion: &str) -> f32 {
    let guess = extract(completion);
    if guess == answer {
        return 1.0;
    }
    match kind {
        RewardKind::Exact => 0.0,
        RewardKind::Partial => {
            let longer = guess.chars().count().max(answer.chars().count());
            if longer == 0 {
                return 0.0;
            }
            let same = guess
                .chars()
                .zip(answer.chars())
                .filter(|(a, b)| a == b)
                .count();
            // Exact answers get 1; the best wrong guess stays below it.
            0.9 * same as f32 / longer as f32
        }
    }
}

/// The last number of `text` when it is an integer (GSM8K-style extraction): numbers are runs
/// of digits, with commas between digits dropped (`1,234` is 1234), a `-` right before the
/// first digit making it negative unless a digit precedes the `-` (`10-3` is 10 and 3), and
/// an optional fraction (`.` then digits). `None` when the text has no number, when the last
/// one has a non-zero fraction (`2.5`) or does not fit an `i64`. A `.` not followed by a
/// digit ends a sentence (`57.` is 57).
pub fn last_integer(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let mut last: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = if i > 0 && b[i - 1] == b'-' && (i < 2 || !b[i - 2].is_ascii_digit()) {
            i - 1
        } else {
            i
        };
        while i < b.len()
            && (b[i].is_ascii_digit()
                || (b[i] == b',' && i + 1 < b.len() && b[i + 1].is_ascii_digit()))
        {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
        last = Some((start, i));
    }
    let (start, end) = last?;
    let number = &text[start..end];
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.bytes().any(|d| d != b'0') {
        return None;
    }
    whole.replace(',', "").parse::<i64>().ok()
}
