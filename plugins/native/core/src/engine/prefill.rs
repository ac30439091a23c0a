//! Prefill (one right-padded full-sequence forward per group of fresh requests sharing an
//! adapter, K/V copied into each request's cache slot) and aux features: the residual stream
//! entering chosen layers, per position, captured through [`forward_observed`]'s input hook.
//! With a draft model set, prefill also records each prompt's aux features as the drafter's
//! first feed (see [`super::draft`]).

use super::{Engine, GenOutput, GenRequest};
use crate::acts::ActLayout;
use crate::buffer::BufferProvider;
use crate::error::{NativeError, Result};
use crate::forward::forward_observed;
use crate::linalg::linear;
use crate::sampling::{Rng, logprob_of, sample};

/// Padded tokens of one [`Engine::aux_features`] forward (sequences are grouped up to this).
const AUX_CHUNK_TOKENS: usize = 2048;

/// Copies the `len` rows of `x` (`[N, d]`, layer `l`'s input) starting at row `r0` into every
/// aux slot of `dst` (`[len, aux.len() · d]`) that names layer `l`.
pub(super) fn copy_aux(
    l: usize,
    x: &[f32],
    aux: &[usize],
    (r0, len, d): (usize, usize, usize),
    dst: &mut [f32],
) {
    let w = aux.len() * d;
    for (a, _) in aux.iter().enumerate().filter(|(_, al)| **al == l) {
        for ti in 0..len {
            dst[ti * w + a * d..][..d].copy_from_slice(&x[(r0 + ti) * d..][..d]);
        }
    }
}

impl Engine {
    /// Prefills `group` (request, slot) pairs sharing `adapter` in one right-padded forward,
    /// fills their cache slots and samples each one's first token. With a draft model set,
    /// each slot's drafter feed becomes the prompt's aux features and next tokens.
    pub(super) fn prefill_batch(
        &mut self,
        group: &[(usize, usize)],
        adapter: Option<usize>,
        reqs: &[GenRequest],
        rngs: &mut [Rng],
        outs: &mut [GenOutput],
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<u32>> {
        let c = self.model.cfg.clone();
        let b = group.len();
        let lens: Vec<usize> = group.iter().map(|&(ri, _)| reqs[ri].prompt.len()).collect();
        let t = lens.iter().copied().max().unwrap_or(1);
        let mut tokens = vec![0u32; b * t];
        for (bi, &(ri, _)) in group.iter().enumerate() {
            tokens[bi * t..bi * t + lens[bi]].copy_from_slice(&reqs[ri].prompt);
        }
        let al = ActLayout::for_prefill(&c, b, t, adapter.map(|i| &self.adapters[i].1.cfg));
        self.prefill_buf(&al, provider)?;
        let d = c.hidden_size;
        if let Some(sp) = self.spec.as_mut() {
            let w = sp.aux.len() * d;
            for (bi, &(ri, slot)) in group.iter().enumerate() {
                let f = &mut sp.feeds[slot];
                f.pos0 = 0;
                f.feats.clear();
                f.feats.resize(lens[bi] * w, 0.0);
                f.next.clear();
                f.next.extend_from_slice(&reqs[ri].prompt[1..]);
            }
        }
        let lora = adapter.map(|i| &self.adapters[i].1);
        let buf = self
            .prefill
            .as_mut()
            .map(|p| p.as_mut_slice())
            .unwrap_or_default();
        // Copy each layer's post-RoPE K and V ([B, KV, T, hd]) of the real (unpadded)
        // positions into each sequence's cache slot.
        let (kvh, hd, ms, nb) = (
            c.num_key_value_heads,
            c.head_dim,
            self.cfg.max_seq,
            self.cfg.max_batch,
        );
        let half = c.num_hidden_layers * nb * kvh * ms * hd;
        let kv = self.kv.as_mut_slice();
        let spec = &mut self.spec;
        forward_observed(
            &self.model,
            lora,
            &tokens,
            &al,
            buf,
            false,
            &mut |l, k, v| {
                for (bi, &(_, slot)) in group.iter().enumerate() {
                    let n = lens[bi] * hd;
                    for h in 0..kvh {
                        let src = (bi * kvh + h) * t * hd;
                        let dst = (((l * nb + slot) * kvh + h) * ms) * hd;
                        kv[dst..dst + n].copy_from_slice(&k[src..src + n]);
                        kv[half + dst..half + dst + n].copy_from_slice(&v[src..src + n]);
                    }
                }
                Ok(())
            },
            &mut |l, x| {
                if let Some(sp) = spec.as_mut() {
                    for (bi, &(_, slot)) in group.iter().enumerate() {
                        let dst = &mut sp.feeds[slot].feats;
                        copy_aux(l, x, &sp.aux, (bi * t, lens[bi], d), dst);
                    }
                }
                Ok(())
            },
        )?;
        let mut last = vec![0.0; b * d];
        for bi in 0..b {
            let ho = al.hidden_offset() + (bi * t + lens[bi] - 1) * d;
            last[bi * d..(bi + 1) * d].copy_from_slice(&buf[ho..ho + d]);
        }
        let mut logits = vec![0.0; b * c.vocab_size];
        linear(
            &mut logits,
            &last,
            &self.model.w()[self.model.offs.lm_head.clone()],
            b,
            d,
            c.vocab_size,
            false,
        );
        let mut toks = Vec::with_capacity(b);
        for (bi, (&(ri, slot), rng)) in group.iter().zip(rngs.iter_mut()).enumerate() {
            let lg = &logits[bi * c.vocab_size..(bi + 1) * c.vocab_size];
            let tok = sample(lg, &reqs[ri].sampling, rng, &mut self.sample_scratch);
            let out = &mut outs[ri];
            out.tokens.push(tok as u32);
            out.logprobs.push(logprob_of(lg, tok));
            if let Some(h) = out.hidden.as_mut() {
                h.extend_from_slice(&last[bi * d..(bi + 1) * d]);
            }
            if let Some(sp) = self.spec.as_mut() {
                sp.feeds[slot].next.push(tok as u32);
            }
            toks.push(tok as u32);
        }
        Ok(toks)
    }

    /// The aux features of every position of each sequence: the residual stream entering
    /// each layer of `layers` (`num_hidden_layers` means the final residual, before the final
    /// norm), concatenated per position, `[seq.len(), layers.len() · hidden]` per sequence —
    /// the inputs a draft model is trained on. Sequences run in right-padded forwards of up
    /// to 2048 padded tokens (one forward for a small batch); the KV cache is not touched.
    pub fn aux_features(
        &mut self,
        seqs: &[Vec<u32>],
        layers: &[usize],
        adapter: Option<&str>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<Vec<f32>>> {
        let ai = self.adapter_index(&adapter.map(String::from))?;
        let c = self.model.cfg.clone();
        if let Some(l) = layers.iter().find(|&&l| l > c.num_hidden_layers) {
            return Err(NativeError::Input(format!(
                "aux layer {l} does not exist: the model has {} layers (use {} for the final \
                 residual)",
                c.num_hidden_layers, c.num_hidden_layers
            )));
        }
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() || s.len() > self.model.rope.max_pos() {
                return Err(NativeError::Input(format!(
                    "sequence {i}: {} tokens; aux features need 1..={} tokens",
                    s.len(),
                    self.model.rope.max_pos()
                )));
            }
            self.model.check_tokens(s)?;
        }
        let d = c.hidden_size;
        let mut out: Vec<Vec<f32>> = seqs
            .iter()
            .map(|s| vec![0.0; s.len() * layers.len() * d])
            .collect();
        let mut i = 0;
        while i < seqs.len() {
            let (mut j, mut t) = (i + 1, seqs[i].len());
            while j < seqs.len() && (j + 1 - i) * t.max(seqs[j].len()) <= AUX_CHUNK_TOKENS {
                t = t.max(seqs[j].len());
                j += 1;
            }
            let b = j - i;
            let mut tokens = vec![0u32; b * t];
            for (bi, s) in seqs[i..j].iter().enumerate() {
                tokens[bi * t..bi * t + s.len()].copy_from_slice(s);
            }
            let al = ActLayout::for_prefill(&c, b, t, ai.map(|a| &self.adapters[a].1.cfg));
            self.prefill_buf(&al, provider)?;
            let lora = ai.map(|a| &self.adapters[a].1);
            let buf = self
                .prefill
                .as_mut()
                .map(|p| p.as_mut_slice())
                .unwrap_or_default();
            let chunk = &mut out[i..j];
            forward_observed(
                &self.model,
                lora,
                &tokens,
                &al,
                buf,
                false,
                &mut |_, _, _| Ok(()),
                &mut |l, x| {
                    for (bi, o) in chunk.iter_mut().enumerate() {
                        copy_aux(l, x, layers, (bi * t, seqs[i + bi].len(), d), o);
                    }
                    Ok(())
                },
            )?;
            i = j;
        }
        Ok(out)
    }
}
