//! GRPO: group-relative advantages and the train batch built from a rollout.
//!
//! Each prompt is sampled `group_size` times; a completion's advantage is its reward minus
//! the group's mean, divided by the group's standard deviation (plus a small epsilon). A
//! group whose rewards are all equal carries no signal: its advantages are zero, and it is
//! left out of the batch unless a KL penalty needs every sequence. The loss itself (PPO-clip
//! with optional k3 KL to the reference) is the trainer's; its definition is shared by every
//! trainer (see the native plugin's `loss.rs`).

use tandem_plugin_api::{LossConfig, LossKind, RVec, TrainBatch, TrainSequence};

/// One sampled completion with its reward.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Which group (prompt) it belongs to.
    pub group: usize,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Completion token ids.
    pub completion: Vec<u32>,
    /// The engine's logprob of every completion token (the behaviour policy).
    pub logprobs: Vec<f32>,
    /// Reward in `[0, 1]`.
    pub reward: f32,
}

/// Advantage of every sample: `(r - mean(group)) / (std(group) + eps)`.
pub fn advantages(samples: &[Sample]) -> Vec<f32> {
    const EPS: f32 = 1e-4;
    let groups = samples.iter().map(|s| s.group + 1).max().unwrap_or(0);
    let mut sum = vec![0f32; groups];
    let mut sq = vec![0f32; groups];
    let mut n = vec![0f32; groups];
    for s in samples {
        sum[s.group] += s.reward;
        sq[s.group] += s.reward * s.reward;
        n[s.group] += 1.0;
    }
    samples
        .iter()
        .map(|s| {
            let g = s.group;
            let mean = sum[g] / n[g];
            let var = (sq[g] / n[g] - mean * mean).max(0.0);
            let std = var.sqrt();
            if std < 1e-6 {
                0.0
            } else {
                (s.reward - mean) / (std + EPS)
            }
        })
        .collect()
}

/// The train batch of a rollout; sequences without signal are dropped unless `keep_all`.
pub fn batch(
    samples: &[Sample],
    advantages: &[f32],
    loss: LossConfig,
    keep_all: bool,
) -> TrainBatch {
    let sequences = samples
        .iter()
        .zip(advantages)
        .filter(|(s, a)| (keep_all || **a != 0.0) && !s.completion.is_empty())
        .map(|(s, &a)| {
            let mut tokens = s.prompt.clone();
            tokens.extend(&s.completion);
            TrainSequence {
                tokens: RVec::from(tokens),
                prompt_len: s.prompt.len() as u32,
                advantage: a,
                old_logprobs: RVec::from(s.logprobs.clone()),
                ref_logprobs: RVec::new(),
            }
        })
        .collect::<Vec<_>>();
    TrainBatch {
        sequences: RVec::from(sequences),
        loss,
    }
}

/// The loss settings of a GRPO step.
pub fn loss(learning_rate: f32, clip_eps: f32, kl_coef: f32, grad_clip: f32) -> LossConfig {
    LossConfig {
        kind: LossKind::Grpo,
        clip_eps_low: clip_eps,
        clip_eps_high: clip_eps,
        kl_coef,
        learning_rate,
        grad_clip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(group: usize, reward: f32) -> Sample {
        Sample {
            group,
            prompt: vec![1, 5],
            completion: vec![7, 2],
            logprobs: vec![-0.5, -0.1],
            reward,
        }
    }

    #[test]
    fn advantages_are_group_relative() {
        let samples = [s(0, 1.0), s(0, 0.0), s(1, 0.5), s(1, 0.5)];
        let a = advantages(&samples);
        assert!(
            (a[0] - 1.0).abs() < 1e-3 && (a[1] + 1.0).abs() < 1e-3,
            "{a:?}"
        );
        assert_eq!(&a[2..], &[0.0, 0.0]);
        let b = batch(&samples, &a, loss(1e-3, 0.2, 0.0, 1.0), false);
        assert_eq!(b.sequences.len(), 2);
        assert_eq!(b.sequences[0].tokens.as_slice(), &[1, 5, 7, 2]);
        assert_eq!(b.sequences[0].prompt_len, 2);
        let all = batch(&samples, &a, loss(1e-3, 0.2, 0.1, 1.0), true);
        assert_eq!(all.sequences.len(), 4);
    }
}
