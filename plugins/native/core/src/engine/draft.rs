//! What speculative decoding needs from a draft model: the contract between the engine
//! (`engine::spec`, the target side) and a drafter (`crate::drafter`, EAGLE-3).
//!
//! Vocabulary of positions (one sequence, tokens `x_0 x_1 …`): the target's forward at
//! position `t` reads `x_t` and yields the *aux features* `A_t` (the residual stream entering
//! each layer of [`DraftModel::aux_layers`], concatenated: `[aux_layers.len() · hidden]`) and
//! the logits of `x_{t+1}`. A drafter's cache entry at position `t` is computed from
//! `(A_t, x_{t+1})`, so it can only be written once `x_{t+1}` is known.
//!
//! One speculative round of a row whose last verified token is `x_P` (at position `P`):
//! 1. the engine calls [`DraftModel::propose`] with the *verified* positions the drafter has
//!    not seen with real features yet, `pos0..=P`, their aux features and the tokens that
//!    follow each (`x_{pos0+1} ..= x_{P+1}`… i.e. `next_tokens[i] = x_{pos0+i+1}`, the last
//!    one being the token the target just produced). The drafter writes those cache entries
//!    (overwriting whatever speculative entries it left there in an earlier round) and
//!    proposes `k` tokens `d_1..d_k` for positions `P+2 ..= P+k+1`.
//! 2. the engine verifies `x_{P+1}, d_1, …, d_k` in one forward over its KV cache, accepts a
//!    prefix, and feeds the newly verified positions in the next round's `propose`.
//!
//! The drafter owns its KV cache (one slot per engine slot, `max_seq` positions); entries past
//! the verified prefix are scratch and are simply overwritten.

use crate::error::Result;
use crate::sampling::{Rng, SamplingParams};

/// New verified positions of one row, and how to draft after them.
#[derive(Debug)]
pub struct DraftInput<'a> {
    /// Engine cache slot of the row (`< max_batch`).
    pub slot: usize,
    /// First position fed (all positions before it were fed in earlier calls; `0` for a
    /// fresh sequence).
    pub pos0: usize,
    /// `[n, aux_layers.len() · hidden]` aux features of positions `pos0 .. pos0 + n`.
    pub feats: &'a [f32],
    /// `[n]`: `next_tokens[i]` is the token at position `pos0 + i + 1`.
    pub next_tokens: &'a [u32],
    /// The request's sampling settings: greedy (temperature 0) drafts by argmax; otherwise
    /// the drafter samples each draft token from its own distribution `q` (same temperature)
    /// and returns `q`.
    pub sampling: &'a SamplingParams,
}

/// `k` proposed tokens of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Draft tokens, target-vocabulary ids.
    pub tokens: Vec<u32>,
    /// `[k, target_vocab]`: the distribution each token was sampled from, over the TARGET
    /// vocabulary (zero outside the draft vocabulary). Empty for greedy requests.
    pub probs: Vec<f32>,
}

/// A draft model the engine can speculate with.
pub trait DraftModel: Send {
    /// Target layers whose input residual streams make the aux features, in feature order
    /// (`num_hidden_layers` means the final residual, before the final norm).
    fn aux_layers(&self) -> &[usize];
    /// Target vocabulary size the drafter maps into.
    fn target_vocab(&self) -> usize;
    /// Feeds each row's new verified positions and proposes `k ≥ 1` tokens per row, all rows
    /// in one batched pass per draft step. `rngs[i]` is row `i`'s generator (drawn from only
    /// when that row samples).
    fn propose(
        &mut self,
        rows: &[DraftInput<'_>],
        k: usize,
        rngs: &mut [Rng],
    ) -> Result<Vec<Draft>>;
}
