//! Inference engine: batched generation with a KV cache (tag `kv_cache`), prefill through
//! the full-sequence forward, batched decode with one GEMM per projection per step,
//! per-sequence LoRA adapters, scoring, and speculative decoding with a draft model
//! ([`draft`]; `spec`: draft k tokens, verify them in one multi-token forward, accept a
//! prefix, emit it plus one target token).
//!
//! KV cache layout (f32): `k[L][slot][KV][max_seq][hd]` followed by `v` with the same shape.
//! Reported logprobs are of the sampled token under the unmodified distribution (see
//! [`crate::sampling`]). Hidden states, when requested, are the final-norm outputs (the
//! lm_head inputs) at the positions that produced each generated token.

use crate::acts::ActLayout;
use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::error::{NativeError, Result};
use crate::forward::forward;
use crate::lora::LoraAdapter;
use crate::model::Model;
use crate::sampling::{Rng, SamplingParams, logprob_of};

/// Capacity of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences decoded together (KV cache slots).
    pub max_batch: usize,
    /// Longest prompt + completion.
    pub max_seq: usize,
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Maximum new tokens.
    pub max_tokens: usize,
    /// Generation stops after any of these tokens (it is included in the output).
    pub stop_tokens: Vec<u32>,
    /// Sampling settings and seed.
    pub sampling: SamplingParams,
    /// Name of a loaded adapter, or `None` for the base model.
    pub adapter: Option<String>,
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was produced.
    Stop,
    /// `max_tokens` (or the cache capacity) was reached.
    Length,
}

/// Result of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenOutput {
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Logprob of each generated token under the unmodified model distribution.
    pub logprobs: Vec<f32>,
    /// Why generation ended.
    pub finish: FinishReason,
    /// `[tokens.len(), hidden_size]` final hidden states, when requested.
    pub hidden: Option<Vec<f32>>,
}

/// The engine: model, adapters, KV cache and decode scratch.
pub struct Engine {
    /// The model.
    pub model: Model,
    adapters: Vec<(String, LoraAdapter)>,
    cfg: EngineConfig,
    kv: Box<dyn Region>,
    scratch: Box<dyn Region>,
    prefill: Option<Box<dyn Region>>,
    sample_scratch: Vec<(f32, u32)>,
    /// The draft model and its per-slot feeds, when speculative decoding is on.
    spec: Option<spec::SpecState>,
    /// Multi-token verify scratch (`activations/verify`), grown on demand.
    verify: Option<Box<dyn Region>>,
    /// Rounds draft only while at most this many rows decode ([`Engine::set_speculate_below_batch`]).
    speculate_below: usize,
    stats: SpecStats,
}

/// Per-row decode state.
struct Row {
    req: usize,
    slot: usize,
    pos: usize,
    token: u32,
    adapter: Option<usize>,
    rng: Rng,
}

impl Engine {
    /// Allocates the KV cache and decode scratch for `cfg`.
    pub fn new(model: Model, cfg: EngineConfig, provider: &mut dyn BufferProvider) -> Result<Self> {
        if cfg.max_batch == 0 || cfg.max_seq == 0 || cfg.max_seq > model.rope.max_pos() {
            return Err(NativeError::Input(format!(
                "engine needs max_batch > 0 and 0 < max_seq <= {} (got {:?})",
                model.rope.max_pos(),
                cfg
            )));
        }
        let c = &model.cfg;
        let kv_len = 2 * c.num_hidden_layers * cfg.max_batch * c.kv_dim() * cfg.max_seq;
        let kv = provider.alloc(BufferTag::KvCache, "kv_cache", kv_len)?;
        let scratch = provider.alloc(
            BufferTag::Activations,
            "activations/decode",
            Self::scratch_len(c, &cfg, 0),
        )?;
        Ok(Engine {
            model,
            adapters: Vec::new(),
            cfg,
            kv,
            scratch,
            prefill: None,
            sample_scratch: Vec::new(),
            spec: None,
            verify: None,
            speculate_below: usize::MAX,
            stats: SpecStats::default(),
        })
    }

    fn scratch_len(c: &crate::config::ModelConfig, e: &EngineConfig, r: usize) -> usize {
        let nb = e.max_batch;
        let (d, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        nb * (4 * d
            + 2 * qd
            + 2 * kvd
            + 3 * ff
            + c.vocab_size
            + c.num_attention_heads * e.max_seq
            + r.max(1)
            + 1)
    }

    /// The engine capacity.
    pub fn config(&self) -> EngineConfig {
        self.cfg
    }

    /// The KV cache buffer (for release/resume by the glue).
    pub fn kv_cache(&mut self) -> &mut dyn Region {
        self.kv.as_mut()
    }

    /// Zeroes the KV cache (`flush_cache`).
    pub fn flush_cache(&mut self) {
        self.kv.as_mut_slice().fill(0.0);
    }

    /// Registers an adapter under `name` (replacing one of the same name).
    pub fn add_adapter(
        &mut self,
        name: &str,
        adapter: LoraAdapter,
        provider: &mut dyn BufferProvider,
    ) -> Result<()> {
        adapter
            .check_for(&self.model.cfg)
            .map_err(|e| NativeError::Input(format!("adapter `{name}`: {e}")))?;
        let r_max = self
            .adapters
            .iter()
            .map(|a| a.1.cfg.r)
            .chain([adapter.cfg.r])
            .max()
            .unwrap_or(0);
        let need = Self::scratch_len(&self.model.cfg, &self.cfg, r_max);
        if self.scratch.len() < need {
            self.scratch = provider.alloc(BufferTag::Activations, "activations/decode", need)?;
        }
        self.adapters.retain(|a| a.0 != name);
        self.adapters.push((name.to_string(), adapter));
        Ok(())
    }

    /// Drops the adapter `name`; returns whether it existed.
    pub fn remove_adapter(&mut self, name: &str) -> bool {
        self.take_adapter(name).is_some()
    }

    /// Unloads the adapter `name` and hands it back (e.g. to reuse its buffer).
    pub fn take_adapter(&mut self, name: &str) -> Option<LoraAdapter> {
        let i = self.adapters.iter().position(|a| a.0 == name)?;
        Some(self.adapters.remove(i).1)
    }

    /// Names of the loaded adapters.
    pub fn adapter_names(&self) -> Vec<&str> {
        self.adapters.iter().map(|a| a.0.as_str()).collect()
    }

    fn adapter_index(&self, name: &Option<String>) -> Result<Option<usize>> {
        match name {
            None => Ok(None),
            Some(n) => self
                .adapters
                .iter()
                .position(|a| &a.0 == n)
                .map(Some)
                .ok_or_else(|| {
                    NativeError::Input(format!(
                        "adapter `{n}` is not loaded; loaded: {:?}",
                        self.adapter_names()
                    ))
                }),
        }
    }

    fn prefill_buf(&mut self, al: &ActLayout, provider: &mut dyn BufferProvider) -> Result<()> {
        if self
            .prefill
            .as_ref()
            .is_none_or(|p| p.len() < al.total_len())
        {
            self.prefill = None;
            self.prefill = Some(provider.alloc(
                BufferTag::Activations,
                "activations/prefill",
                al.total_len(),
            )?);
        }
        Ok(())
    }

    /// Logprob of every token of `tokens` given its prefix (entry 0 is 0: no prefix).
    pub fn score(
        &mut self,
        tokens: &[u32],
        adapter: Option<&str>,
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<f32>> {
        let ai = self.adapter_index(&adapter.map(String::from))?;
        let t = tokens.len();
        let lora_cfg = ai.map(|i| self.adapters[i].1.cfg.clone());
        let al = ActLayout::for_inference(&self.model.cfg, 1, t, lora_cfg.as_ref());
        self.prefill_buf(&al, provider)?;
        let buf = self
            .prefill
            .as_mut()
            .map(|p| p.as_mut_slice())
            .unwrap_or_default();
        forward(
            &self.model,
            ai.map(|i| &self.adapters[i].1),
            tokens,
            &al,
            buf,
            true,
        )?;
        let v = self.model.cfg.vocab_size;
        let lo = al.logits_offset();
        let mut out = vec![0.0; t];
        for j in 1..t {
            out[j] = logprob_of(&buf[lo + (j - 1) * v..lo + j * v], tokens[j] as usize);
        }
        Ok(out)
    }

    /// Generates for every request with continuous batching (at most `max_batch` sequences in
    /// flight; a finished sequence's slot takes the next request), returning outputs in order.
    /// With a draft model set ([`Engine::set_drafter`]) every decode step is a speculative
    /// round (same outputs for greedy requests, same distribution when sampling).
    pub fn generate(
        &mut self,
        reqs: &[GenRequest],
        want_hidden: bool,
        provider: &mut dyn BufferProvider,
    ) -> Result<Vec<GenOutput>> {
        for (i, r) in reqs.iter().enumerate() {
            if r.prompt.is_empty() {
                return Err(NativeError::Input(format!("request {i}: empty prompt")));
            }
            if r.prompt.len() >= self.cfg.max_seq {
                return Err(NativeError::Input(format!(
                    "request {i}: prompt of {} tokens does not fit max_seq {}",
                    r.prompt.len(),
                    self.cfg.max_seq
                )));
            }
            self.model.check_tokens(&r.prompt)?;
            self.adapter_index(&r.adapter)?;
        }
        let mut outs: Vec<GenOutput> = reqs
            .iter()
            .map(|_| GenOutput {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: FinishReason::Length,
                hidden: want_hidden.then(Vec::new),
            })
            .collect();
        if self.spec.is_some() {
            self.grow_verify_scratch(provider)?;
        }
        let max_seq = self.cfg.max_seq;
        // Continuous batching: a slot freed by a finished sequence is refilled with the next
        // pending request before the next decode step.
        let mut next = 0;
        let mut free: Vec<usize> = (0..self.cfg.max_batch).rev().collect();
        let mut rows: Vec<Row> = Vec::with_capacity(self.cfg.max_batch);
        loop {
            // Fill free slots with pending requests; prefill them in runs that share an
            // adapter, one right-padded forward per run.
            let mut fresh: Vec<(usize, usize)> = Vec::new(); // (request, slot)
            while next < reqs.len()
                && let Some(slot) = free.pop()
            {
                fresh.push((next, slot));
                next += 1;
            }
            let mut i = 0;
            while i < fresh.len() {
                let adapter = self.adapter_index(&reqs[fresh[i].0].adapter)?;
                let mut j = i + 1;
                while j < fresh.len() && self.adapter_index(&reqs[fresh[j].0].adapter)? == adapter {
                    j += 1;
                }
                let group = &fresh[i..j];
                let mut rngs: Vec<Rng> = group
                    .iter()
                    .map(|&(ri, _)| Rng::new(reqs[ri].sampling.seed))
                    .collect();
                let toks =
                    self.prefill_batch(group, adapter, reqs, &mut rngs, &mut outs, provider)?;
                for ((&(ri, slot), token), rng) in group.iter().zip(toks).zip(rngs) {
                    let r = &reqs[ri];
                    let row = Row {
                        req: ri,
                        slot,
                        pos: r.prompt.len(),
                        token,
                        adapter,
                        rng,
                    };
                    if Self::finished(max_seq, r, &mut outs[ri], row.pos) {
                        free.push(slot);
                    } else {
                        rows.push(row);
                    }
                }
                i = j;
            }
            if rows.is_empty() {
                // Every fresh row may have finished at its first token (a stop token,
                // max_tokens 1): the freed slots take the next pending requests.
                if next < reqs.len() {
                    continue;
                }
                break;
            }
            if self.spec.is_some() {
                self.spec_round(&mut rows, reqs, &mut outs)?;
            } else {
                self.decode_step(&mut rows, reqs, &mut outs)?;
            }
            rows.retain(|row| {
                let done = Self::finished(max_seq, &reqs[row.req], &mut outs[row.req], row.pos);
                if done {
                    free.push(row.slot);
                }
                !done
            });
        }
        Ok(outs)
    }

    /// Whether a row is done (stop token, max_tokens or cache full); sets its finish reason.
    fn finished(max_seq: usize, req: &GenRequest, out: &mut GenOutput, pos: usize) -> bool {
        if out
            .tokens
            .last()
            .is_some_and(|t| req.stop_tokens.contains(t))
        {
            out.finish = FinishReason::Stop;
            return true;
        }
        out.tokens.len() >= req.max_tokens || pos + 1 >= max_seq
    }
}

mod decode;
pub mod draft;
mod prefill;
mod spec;
mod spec_sample;
mod verify;

pub use spec::SpecStats;
