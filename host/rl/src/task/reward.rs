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
