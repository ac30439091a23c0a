//! `DrafterRunner`: the drafter as the engine's [`DraftModel`], with its own KV cache
//! (`kv_cache/drafter`, one slot per engine slot, `max_seq` positions) and decode scratch
//! (`activations/drafter_decode`), both allocated at construction.
//!
//! `propose` for rows whose last verified position is `P`: the new verified entries
//! `pos0 .. P−1` are written from `(fc(A_t), x_{t+1})` ([`ctx_entries`]); the entry at `P`
//! is the first draft step (its output gives `d_1`); step `j = 2..=k` feeds the previous
//! step's output hidden state and `embed(d_{j−1})` at position `P + j − 1`, writing scratch
//! entries there that later rounds overwrite. Every step runs all rows in one batched pass.
//!
//! Greedy rows (temperature ≤ 0) take the argmax of the draft logits; sampled rows draw
//! from `q = softmax(logits / temperature)` over the draft vocabulary (top-k / top-p are not
//! applied to the draft: `q` is returned and is exactly what was sampled from) and return
//! `q` on the target vocabulary (`[k, target_vocab]`, zero outside the draft vocabulary).

use super::Drafter;
use super::runner_step::{CTX_CHUNK, Cache, CtxBufs, StepBufs, ctx_entries, step_rows};
use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::engine::draft::{Draft, DraftInput, DraftModel};
use crate::error::{NativeError, Result};
use crate::sampling::{Rng, argmax};

/// Capacity of a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Engine cache slots (rows drafted together).
    pub max_batch: usize,
    /// Positions per slot (verified prefix plus the draft).
    pub max_seq: usize,
}

/// A drafter with a KV cache, drafting for the engine.
pub struct DrafterRunner {
    drafter: Drafter,
    cfg: RunnerConfig,
    aux: [usize; 3],
    kv: Box<dyn Region>,
    scratch: Box<dyn Region>,
    slots: Vec<usize>,
    pos: Vec<usize>,
    toks: Vec<u32>,
    ctx: (Vec<usize>, Vec<usize>, Vec<u32>),
    record: Option<Vec<f32>>,
}

fn sizes(d: &Drafter, c: RunnerConfig) -> [usize; 24] {
    let cf = &d.cfg;
    let (h, qd, kvd, ff) = (
        cf.hidden_size,
        cf.q_dim(),
        cf.kv_dim(),
        cf.intermediate_size,
    );
    let (b, n) = (c.max_batch, CTX_CHUNK);
    [
        n * h,
        n * h,
        n * 2 * h,
        n * kvd,
        n * kvd,
        n,
        b * h,
        b * h,
        b * 2 * h,
        b * qd,
        b * kvd,
        b * kvd,
        b * qd,
        b * h,
        b * h,
        b * h,
        b * ff,
        b * ff,
        b * ff,
        b * h,
        b * cf.draft_vocab_size,
        b * cf.num_attention_heads * c.max_seq,
        b.max(n),
        b.max(n) * cf.feat_dim(),
    ]
}

impl DrafterRunner {
    /// Allocates the cache and scratch for `cfg`.
    pub fn new(
        drafter: Drafter,
        cfg: RunnerConfig,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        if cfg.max_batch == 0 || cfg.max_seq == 0 || cfg.max_seq > drafter.rope.max_pos() {
            return Err(NativeError::Input(format!(
                "drafter runner needs max_batch > 0 and 0 < max_seq <= {} (got {cfg:?})",
                drafter.rope.max_pos()
            )));
        }
        let kv_len = 2 * cfg.max_batch * drafter.cfg.kv_dim() * cfg.max_seq;
        let kv = provider.alloc(BufferTag::KvCache, "kv_cache/drafter", kv_len)?;
        let n: usize = sizes(&drafter, cfg).iter().sum();
        let scratch = provider.alloc(BufferTag::Activations, "activations/drafter_decode", n)?;
        Ok(DrafterRunner {
            aux: drafter.aux_layers(),
            drafter,
            cfg,
            kv,
            scratch,
            slots: Vec::with_capacity(cfg.max_batch),
            pos: Vec::with_capacity(cfg.max_batch),
            toks: Vec::with_capacity(cfg.max_batch),
            ctx: (
                Vec::with_capacity(CTX_CHUNK),
                Vec::with_capacity(CTX_CHUNK),
                Vec::with_capacity(CTX_CHUNK),
            ),
            record: None,
        })
    }

    /// The drafter.
    pub fn drafter(&self) -> &Drafter {
        &self.drafter
    }

    /// The drafter, for weight updates (the cache stays valid only if the weights do not
    /// change between the rounds of a sequence).
    pub fn drafter_mut(&mut self) -> &mut Drafter {
        &mut self.drafter
    }

    /// The runner's capacity.
    pub fn config(&self) -> RunnerConfig {
        self.cfg
    }

    /// Keeps (`true`) the draft logits of every later `propose` for
    /// [`recorded_logits`](Self::recorded_logits) (tests, debugging; allocates).
    pub fn record_logits(&mut self, on: bool) {
        self.record = on.then(Vec::new);
    }

    /// Draft logits of the last `propose` while recording: `[k][rows][draft_vocab]`.
    pub fn recorded_logits(&self) -> &[f32] {
        self.record.as_deref().unwrap_or_default()
    }

    fn check(&self, rows: &[DraftInput<'_>], k: usize, rngs: usize) -> Result<()> {
        let c = &self.drafter.cfg;
        let bad = |m: String| Err(NativeError::Input(format!("drafter propose: {m}")));
        if rows.len() > self.cfg.max_batch || rngs != rows.len() || k == 0 {
            return bad(format!(
                "{} rows (max {}), {rngs} generators, k = {k} (must be >= 1)",
                rows.len(),
                self.cfg.max_batch
            ));
        }
        for (i, r) in rows.iter().enumerate() {
            let n = r.next_tokens.len();
            if r.slot >= self.cfg.max_batch || rows[..i].iter().any(|o| o.slot == r.slot) {
                return bad(format!(
                    "row {i}: slot {} is out of range or repeated",
                    r.slot
                ));
            }
            if n == 0 || r.feats.len() != n * c.feat_dim() {
                return bad(format!(
                    "row {i}: {n} next tokens (need >= 1) and {} feature floats (need {})",
                    r.feats.len(),
                    n * c.feat_dim()
                ));
            }
            if r.pos0 + n - 1 + k > self.cfg.max_seq {
                return bad(format!(
                    "row {i}: last position {} plus {k} drafts exceeds max_seq {}",
                    r.pos0 + n - 1,
                    self.cfg.max_seq
                ));
            }
            if let Some(t) = r.next_tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return bad(format!(
                    "row {i}: token id {t} >= vocab_size {}",
                    c.vocab_size
                ));
            }
        }
        Ok(())
    }
}

/// Picks row `i`'s draft token from `lg` (greedy or sampled) and, for sampled rows, writes
/// `q` over the target vocabulary into `probs` (one `[target_vocab]` row).
fn choose(d: &Drafter, lg: &mut [f32], temp: f32, rng: &mut Rng, probs: Option<&mut [f32]>) -> u32 {
    let (Some(probs), true) = (probs, temp > 0.0) else {
        return d.draft_to_target(argmax(lg)) as u32;
    };
    let mx = lg.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let inv = 1.0 / temp;
    let mut total = 0f64;
    for x in lg.iter_mut() {
        *x = ((*x - mx) * inv).exp();
        total += f64::from(*x);
    }
    let u = f64::from(rng.next_f32()) * total;
    let mut acc = 0f64;
    let mut pick = None;
    for (i, &p) in lg.iter().enumerate() {
        acc += f64::from(p);
        if pick.is_none() && u < acc {
            pick = Some(i);
        }
        probs[d.draft_to_target(i)] = (f64::from(p) / total) as f32;
    }
    let pick = pick.unwrap_or_else(|| lg.iter().rposition(|&p| p > 0.0).unwrap_or(0));
    d.draft_to_target(pick) as u32
}

impl DraftModel for DrafterRunner {
    fn aux_layers(&self) -> &[usize] {
        &self.aux
    }

    fn target_vocab(&self) -> usize {
        self.drafter.cfg.vocab_size
    }

    fn propose(
        &mut self,
        rows: &[DraftInput<'_>],
        k: usize,
        rngs: &mut [Rng],
    ) -> Result<Vec<Draft>> {
        self.check(rows, k, rngs.len())?;
        let d = &self.drafter;
        let c = &d.cfg;
        let (h, fd, vd, vt) = (
            c.hidden_size,
            c.feat_dim(),
            c.draft_vocab_size,
            c.vocab_size,
        );
        let cache = Cache {
            nb: self.cfg.max_batch,
            ms: self.cfg.max_seq,
        };
        let s = sizes(d, self.cfg);
        let [
            cg,
            ce,
            cx,
            ck,
            cv,
            cr,
            g,
            e,
            x,
            q,
            k_,
            v,
            att,
            o,
            m,
            h2,
            gate,
            up,
            act,
            hf,
            logits,
            scores,
            r,
            fx,
        ] = crate::buffer::carve(self.scratch.as_mut_slice(), s)?;
        let mut ctx = CtxBufs {
            g: cg,
            e: ce,
            x: cx,
            k: ck,
            v: cv,
            r: cr,
        };
        let mut st = StepBufs {
            g,
            e,
            x,
            q,
            k: k_,
            v,
            att,
            o,
            m,
            h2,
            gate,
            up,
            act,
            hf,
            logits,
            scores,
            r,
        };
        let kv = self.kv.as_mut_slice();
        let nr = rows.len();
        self.slots.clear();
        self.pos.clear();
        self.toks.clear();
        // Verified entries before each row's newest position, all rows in shared chunks.
        let (cs, cp, ct) = &mut self.ctx;
        cs.clear();
        cp.clear();
        ct.clear();
        for row in rows {
            let n = row.next_tokens.len();
            for e in 0..n - 1 {
                let at = ct.len() * fd;
                fx[at..at + fd].copy_from_slice(&row.feats[e * fd..(e + 1) * fd]);
                cs.push(row.slot);
                cp.push(row.pos0 + e);
                ct.push(row.next_tokens[e]);
                if ct.len() == CTX_CHUNK {
                    ctx_entries(d, kv, cache, &mut ctx, fx, ct, (cs, cp));
                    cs.clear();
                    cp.clear();
                    ct.clear();
                }
            }
        }
        if !ct.is_empty() {
            ctx_entries(d, kv, cache, &mut ctx, fx, ct, (cs, cp));
        }
        // The newest verified position is the first draft step's row.
        for (i, row) in rows.iter().enumerate() {
            let n = row.next_tokens.len();
            self.slots.push(row.slot);
            self.pos.push(row.pos0 + n - 1);
            self.toks.push(row.next_tokens[n - 1]);
            fx[i * fd..(i + 1) * fd].copy_from_slice(&row.feats[(n - 1) * fd..]);
        }
        let fc = &d.w()[d.offs.fc.clone()];
        crate::linalg::linear(&mut st.g[..nr * h], &fx[..nr * fd], fc, nr, fd, h, false);
        let mut out: Vec<Draft> = rows
            .iter()
            .map(|r| Draft {
                tokens: Vec::with_capacity(k),
                probs: if r.sampling.temperature > 0.0 {
                    vec![0.0; k * vt]
                } else {
                    Vec::new()
                },
            })
            .collect();
        if let Some(rec) = self.record.as_mut() {
            rec.clear();
        }
        for j in 0..k {
            step_rows(d, kv, cache, &mut st, (&self.slots, &self.pos), &self.toks);
            if let Some(rec) = self.record.as_mut() {
                rec.extend_from_slice(&st.logits[..nr * vd]);
            }
            for (i, (row, dr)) in rows.iter().zip(out.iter_mut()).enumerate() {
                let lg = &mut st.logits[i * vd..(i + 1) * vd];
                let probs = (!dr.probs.is_empty()).then(|| &mut dr.probs[j * vt..(j + 1) * vt]);
                let tok = choose(d, lg, row.sampling.temperature, &mut rngs[i], probs);
                dr.tokens.push(tok);
                self.toks[i] = tok;
                self.pos[i] += 1;
            }
        }
        Ok(out)
    }
}
