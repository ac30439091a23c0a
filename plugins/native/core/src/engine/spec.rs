//! Speculative generation: with a draft model set ([`Engine::set_drafter`]), every decode step
//! of [`Engine::generate`] becomes a round per row (the protocol of [`super::draft`]); with
//! [`Engine::set_speculate_below_batch`], rounds of a batch larger than its bound draft nothing
//! (one verified token per row, the features still fed) — speculation in the long tail only:
//!
//! 1. the drafter is fed the row's newly verified positions (aux features + the tokens that
//!    follow them) and proposes `k_i` tokens, `k_i = min(k, budget − 1)` where `budget` is
//!    what `max_tokens` and the cache (`max_seq`) still allow (rows with `k_i = 0` skip it);
//! 2. one multi-token forward (`verify`) feeds `x_{P+1}, d_1..d_{k_i}` of every row;
//! 3. drafts are accepted left to right — greedy: while the draft equals the target argmax;
//!    sampling: by the rejection rule of `spec_sample` — and the round emits the accepted
//!    drafts plus one target token (the correction, or the bonus after `k_i` acceptances),
//!    stopping early at a stop token or the limits, exactly where a non-speculative run
//!    stops.
//!
//! Logprobs are the target's (`logprob_of` of the raw target logits), hidden states the
//! target's final-norm rows. The drafter is adapter-unaware; each row's verify uses its
//! adapter. [`SpecStats`] counts rounds, drafted, accepted and emitted tokens, and the time
//! spent drafting and verifying.

use super::draft::{Draft, DraftInput, DraftModel};
use super::spec_sample::{accept_or_resample, target_dist};
use super::verify::{self, VRow, verify};
use super::{Engine, GenOutput, GenRequest, Row};
use crate::buffer::{BufferProvider, BufferTag};
use crate::error::{NativeError, Result};
use crate::sampling::{Rng, argmax, logprob_of, sample};
use std::time::Instant;

/// Nanoseconds since `t`, saturating.
fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counters of speculative rounds (per row and round), since the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify rounds (one per row per round).
    pub rounds: u64,
    /// Draft tokens proposed and verified.
    pub drafted: u64,
    /// Draft tokens the target accepted (and emitted).
    pub accepted: u64,
    /// Tokens emitted by rounds (accepted drafts + one target token each, fewer at a stop).
    pub emitted: u64,
    /// Verify forwards (one per round of the whole batch).
    pub verifies: u64,
    /// Wall time in the drafter's `propose` calls, ns.
    pub draft_ns: u64,
    /// Wall time in the verify forwards, ns.
    pub verify_ns: u64,
    /// Tokens decoded without drafts because more rows than
    /// [`Engine::set_speculate_below_batch`] allows were decoding (counted in no figure
    /// above).
    pub plain: u64,
}

impl SpecStats {
    /// Mean acceptance length: tokens emitted per verify round (accepted + 1); 0 if none.
    pub fn mean_accept_len(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.emitted as f64 / self.rounds as f64
        }
    }
    /// Fraction of drafted tokens accepted; 0 if none.
    pub fn accept_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// What the drafter has not been fed yet for one cache slot.
#[derive(Debug, Default)]
pub(super) struct Feed {
    /// First position not fed yet.
    pub pos0: usize,
    /// `[n, aux · hidden]` aux features of positions `pos0 ..`.
    pub feats: Vec<f32>,
    /// `[n]` the token after each of those positions.
    pub next: Vec<u32>,
}

/// The draft model, its settings and per-slot state.
pub(super) struct SpecState {
    pub drafter: Box<dyn DraftModel>,
    pub k: usize,
    /// The drafter's aux layers (copied once).
    pub aux: Vec<usize>,
    /// One per cache slot.
    pub feeds: Vec<Feed>,
    /// `[vocab]` target distribution scratch.
    dist: Vec<f32>,
    vrows: Vec<VRow>,
    vtoks: Vec<u32>,
}

impl Engine {
    /// Turns speculative decoding on with `(drafter, k)` (`k ≥ 1` draft tokens per round) or
    /// off with `None`; returns the previous drafter. The drafter must map into this model's
    /// vocabulary and name existing aux layers (`≤ num_hidden_layers`); otherwise it is
    /// dropped and an error returned. The verify scratch is allocated by the next `generate`.
    pub fn set_drafter(
        &mut self,
        drafter: Option<(Box<dyn DraftModel>, usize)>,
    ) -> Result<Option<Box<dyn DraftModel>>> {
        let Some((drafter, k)) = drafter else {
            return Ok(self.take_drafter());
        };
        let c = &self.model.cfg;
        if k == 0 || k + 1 >= self.cfg.max_seq {
            return Err(NativeError::Input(format!(
                "draft_tokens must be in 1..{} (max_seq − 1), got {k}",
                self.cfg.max_seq - 1
            )));
        }
        if drafter.target_vocab() != c.vocab_size {
            return Err(NativeError::Input(format!(
                "drafter maps into a vocabulary of {} tokens, the model has {}",
                drafter.target_vocab(),
                c.vocab_size
            )));
        }
        let aux = drafter.aux_layers().to_vec();
        if let Some(l) = aux.iter().find(|&&l| l > c.num_hidden_layers) {
            return Err(NativeError::Input(format!(
                "drafter wants aux layer {l}; the model has {} layers",
                c.num_hidden_layers
            )));
        }
        let vocab = c.vocab_size;
        let feeds = (0..self.cfg.max_batch).map(|_| Feed::default()).collect();
        let old = self.take_drafter();
        self.spec = Some(SpecState {
            drafter,
            k,
            aux,
            feeds,
            dist: vec![0.0; vocab],
            vrows: Vec::with_capacity(self.cfg.max_batch),
            vtoks: Vec::with_capacity(self.cfg.max_batch * (k + 1)),
        });
        Ok(old)
    }

    /// Drafts only while at most `rows` sequences decode together: the long tail of a batch,
    /// where the target's forward is cheap per row and a drafter's tokens pay; a full batch
    /// gains little from them. Above it, a round verifies one token per row without drafts
    /// (counted in [`SpecStats::plain`]) and still feeds the drafter each row's features, so
    /// drafting starts at once when the batch shrinks. `None` (the default): every round
    /// drafts. Output is the same either way: greedy token for token, sampled in distribution.
    pub fn set_speculate_below_batch(&mut self, rows: Option<usize>) {
        self.speculate_below = rows.unwrap_or(usize::MAX);
    }

    /// Turns speculative decoding off and hands the drafter back (frees the verify scratch).
    pub fn take_drafter(&mut self) -> Option<Box<dyn DraftModel>> {
        self.verify = None;
        self.spec.take().map(|s| s.drafter)
    }

    /// The draft model, when speculative decoding is on.
    pub fn drafter(&self) -> Option<&dyn DraftModel> {
        self.spec.as_ref().map(|s| s.drafter.as_ref())
    }

    /// The draft model, mutably (e.g. to update its weights between generate calls).
    pub fn drafter_mut(&mut self) -> Option<&mut (dyn DraftModel + 'static)> {
        self.spec.as_mut().map(|s| s.drafter.as_mut())
    }

    /// Draft tokens per round (`k`), when speculative decoding is on.
    pub fn draft_tokens(&self) -> Option<usize> {
        self.spec.as_ref().map(|s| s.k)
    }

    /// Speculative-decoding counters since the last [`reset_spec_stats`](Self::reset_spec_stats).
    pub fn spec_stats(&self) -> SpecStats {
        self.stats
    }

    /// Zeroes the speculative-decoding counters.
    pub fn reset_spec_stats(&mut self) {
        self.stats = SpecStats::default();
    }

    /// Allocates (or grows) the verify scratch for `max_batch · (k + 1)` rows.
    pub(super) fn grow_verify_scratch(&mut self, provider: &mut dyn BufferProvider) -> Result<()> {
        let Some(sp) = self.spec.as_ref() else {
            return Ok(());
        };
        let r = self.adapters.iter().map(|a| a.1.cfg.r).max().unwrap_or(0);
        let need = verify::scratch_len(&self.model.cfg, &self.cfg, sp.k + 1, r, sp.aux.len());
        if self.verify.as_ref().is_none_or(|v| v.len() < need) {
            self.verify = None;
            self.verify =
                Some(provider.alloc(BufferTag::Activations, "activations/verify", need)?);
        }
        Ok(())
    }

    /// One speculative round for every row: draft, verify, accept, emit (see the module doc).
    pub(super) fn spec_round(
        &mut self,
        rows: &mut [Row],
        reqs: &[GenRequest],
        outs: &mut [GenOutput],
    ) -> Result<()> {
        let Engine {
            model,
            adapters,
            cfg: ecfg,
            kv,
            spec,
            verify: vscratch,
            stats,
            sample_scratch,
            speculate_below,
            ..
        } = self;
        let speculate = rows.len() <= *speculate_below;
        let (Some(sp), Some(vscratch)) = (spec.as_mut(), vscratch.as_mut()) else {
            return Err(NativeError::Input(
                "speculative round without a drafter or verify scratch".into(),
            ));
        };
        let (vocab, d, max_seq) = (model.cfg.vocab_size, model.cfg.hidden_size, ecfg.max_seq);
        // Draft tokens per row: the round emits at most k_i + 1 tokens within the budget.
        let ks: Vec<usize> = rows
            .iter()
            .map(|row| {
                let left = reqs[row.req]
                    .max_tokens
                    .saturating_sub(outs[row.req].tokens.len());
                let budget = left.min(max_seq.saturating_sub(row.pos + 1));
                if speculate {
                    budget.saturating_sub(1).min(sp.k)
                } else {
                    0
                }
            })
            .collect();
        let drafting = Instant::now();
        let mut drafts: Vec<Option<Draft>> = vec![None; rows.len()];
        let mut kvals: Vec<usize> = ks.iter().copied().filter(|&k| k > 0).collect();
        kvals.sort_unstable();
        kvals.dedup();
        for &kk in kvals.iter().rev() {
            let idx: Vec<usize> = (0..rows.len()).filter(|&i| ks[i] == kk).collect();
            let inputs: Vec<DraftInput<'_>> = idx
                .iter()
                .map(|&i| {
                    let f = &sp.feeds[rows[i].slot];
                    DraftInput {
                        slot: rows[i].slot,
                        pos0: f.pos0,
                        feats: &f.feats,
                        next_tokens: &f.next,
                        sampling: &reqs[rows[i].req].sampling,
                    }
                })
                .collect();
            let mut rngs: Vec<Rng> = idx.iter().map(|&i| rows[i].rng.clone()).collect();
            let got = sp.drafter.propose(&inputs, kk, &mut rngs)?;
            if got.len() != idx.len() {
                return Err(NativeError::Input(format!(
                    "drafter returned {} drafts for {} rows",
                    got.len(),
                    idx.len()
                )));
            }
            for ((&i, rng), dr) in idx.iter().zip(rngs).zip(got) {
                let sampled = reqs[rows[i].req].sampling.temperature > 0.0;
                if dr.tokens.len() != kk
                    || dr.tokens.iter().any(|&t| t as usize >= vocab)
                    || (sampled && dr.probs.len() != kk * vocab)
                {
                    return Err(NativeError::Input(format!(
                        "drafter broke the contract: {} tokens (max id {:?}), {} probs for k {kk}, \
                         vocab {vocab}",
                        dr.tokens.len(),
                        dr.tokens.iter().max(),
                        dr.probs.len()
                    )));
                }
                rows[i].rng = rng;
                drafts[i] = Some(dr);
            }
        }
        stats.draft_ns += elapsed_ns(drafting);
        sp.vrows.clear();
        sp.vtoks.clear();
        for (row, dr) in rows.iter().zip(&drafts) {
            let dt = dr.as_ref().map(|d| d.tokens.as_slice()).unwrap_or_default();
            sp.vrows.push(VRow {
                slot: row.slot,
                pos: row.pos,
                n: 1 + dt.len(),
                adapter: row.adapter,
            });
            sp.vtoks.push(row.token);
            sp.vtoks.extend_from_slice(dt);
        }
        let verifying = Instant::now();
        let vo = verify(
            model,
            adapters,
            ecfg,
            kv.as_mut_slice(),
            vscratch.as_mut_slice(),
            &sp.vrows,
            &sp.vtoks,
            &sp.aux,
        )?;
        stats.verify_ns += elapsed_ns(verifying);
        stats.verifies += 1;
        let w = sp.aux.len() * d;
        let mut r0 = 0;
        for ((row, dr), vr) in rows.iter_mut().zip(&drafts).zip(&sp.vrows) {
            let req = &reqs[row.req];
            let out = &mut outs[row.req];
            let greedy = req.sampling.temperature <= 0.0;
            let (pos, n) = (row.pos, vr.n);
            let mut emitted = 0;
            for j in 0..n {
                let lg = &vo.logits[(r0 + j) * vocab..][..vocab];
                let (tok, accepted) = match dr {
                    Some(dr) if j + 1 < n => {
                        let dt = dr.tokens[j] as usize;
                        if greedy {
                            let a = argmax(lg);
                            (a, a == dt)
                        } else {
                            target_dist(lg, &req.sampling, sample_scratch, &mut sp.dist);
                            let q = &dr.probs[j * vocab..(j + 1) * vocab];
                            accept_or_resample(&sp.dist, q, dt, &mut row.rng)
                        }
                    }
                    _ => (
                        sample(lg, &req.sampling, &mut row.rng, sample_scratch),
                        false,
                    ),
                };
                stats.accepted += u64::from(accepted);
                emitted += 1;
                out.tokens.push(tok as u32);
                out.logprobs.push(logprob_of(lg, tok));
                if let Some(hs) = out.hidden.as_mut() {
                    hs.extend_from_slice(&vo.hidden[(r0 + j) * d..(r0 + j + 1) * d]);
                }
                if !accepted || Self::finished(max_seq, req, out, pos + j + 1) {
                    break;
                }
            }
            if speculate {
                stats.rounds += 1;
                stats.drafted += (n - 1) as u64;
                stats.emitted += emitted as u64;
            } else {
                stats.plain += emitted as u64;
            }
            // Positions pos .. pos + emitted are verified now; each is followed by the token
            // emitted from it. They are the drafter's next feed: the whole feed when the
            // drafter took the previous one this round, else (no drafts for the row) appended
            // to what it has not seen yet.
            let f = &mut sp.feeds[row.slot];
            if dr.is_some() {
                f.pos0 = pos;
                f.feats.clear();
                f.next.clear();
            }
            f.feats
                .extend_from_slice(&vo.aux[r0 * w..(r0 + emitted) * w]);
            f.next
                .extend_from_slice(&out.tokens[out.tokens.len() - emitted..]);
            row.pos = pos + emitted;
            row.token = *out.tokens.last().unwrap_or(&row.token);
            r0 += n;
        }
        Ok(())
    }
}
