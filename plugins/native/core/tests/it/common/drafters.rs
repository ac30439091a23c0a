//! Draft-model fixtures for the speculative-decoding tests: an oracle that proposes a known
//! continuation (optionally wrong half of the time), a drafter with a fixed distribution `q`,
//! and a uniform random one. Every fixture checks the feeding protocol of
//! `engine::draft` (contiguous positions, feature widths) and records what it was fed.

use std::sync::{Arc, Mutex};

use tandem_native_core::Result;
use tandem_native_core::engine::draft::{Draft, DraftInput, DraftModel};
use tandem_native_core::sampling::Rng;

/// What a fixture was fed for one sequence in one slot: `feats[t]` / `next[t]` for
/// position `t` (latest feed wins).
#[derive(Debug, Clone, Default)]
pub struct Fed {
    /// `[t] -> [aux · hidden]`.
    pub feats: Vec<Vec<f32>>,
    /// `[t] -> x_{t+1}`.
    pub next: Vec<u32>,
}

/// How a fixture chooses its drafts.
#[derive(Debug, Clone)]
pub enum Policy {
    /// The continuation of whichever of these full sequences matches the history; every
    /// `noise`-th hash (if `Some`) is replaced by a wrong token.
    Oracle(Vec<Vec<u32>>, Option<u64>),
    /// Each token drawn from this fixed distribution with the row's generator (argmax for
    /// greedy rows).
    Fixed(Vec<f32>),
    /// Uniform tokens from the fixture's own generator.
    Random(u64),
}

/// What a fixture saw (shared with the test, which keeps a clone of the `Arc`).
#[derive(Debug, Default)]
pub struct Log {
    /// Per slot: the sequence being fed now.
    pub current: Vec<Option<Fed>>,
    /// Sequences whose slot was taken by a new one.
    pub done: Vec<Fed>,
    /// The `k` of each `propose` call.
    pub calls: Vec<usize>,
}

impl Log {
    /// Every sequence fed so far (finished ones first).
    pub fn all_fed(&self) -> Vec<Fed> {
        let mut v = self.done.clone();
        v.extend(self.current.iter().flatten().cloned());
        v
    }
}

/// A test drafter.
pub struct Fixture {
    aux: Vec<usize>,
    vocab: usize,
    hidden: usize,
    policy: Policy,
    rng: Rng,
    /// What it saw.
    pub log: Arc<Mutex<Log>>,
}

impl Fixture {
    /// A fixture for a target of `vocab` tokens and `hidden` width, wanting `aux` layers.
    pub fn new(aux: Vec<usize>, vocab: usize, hidden: usize, policy: Policy) -> Self {
        let seed = if let Policy::Random(s) = &policy {
            *s
        } else {
            0
        };
        Fixture {
            aux,
            vocab,
            hidden,
            policy,
            rng: Rng::new(seed),
            log: Arc::default(),
        }
    }

    /// The fixture boxed for the engine, and its log.
    pub fn boxed(self) -> (Box<dyn DraftModel>, Arc<Mutex<Log>>) {
        let log = self.log.clone();
        (Box::new(self), log)
    }

    fn feed(&mut self, r: &DraftInput<'_>) -> Vec<u32> {
        let w = self.aux.len() * self.hidden;
        assert_eq!(r.feats.len(), r.next_tokens.len() * w, "feature width");
        assert!(
            !r.next_tokens.is_empty(),
            "a round feeds at least one position"
        );
        let mut log = self.log.lock().expect("log");
        if log.current.len() <= r.slot {
            log.current.resize(r.slot + 1, None);
        }
        if r.pos0 == 0 {
            if let Some(old) = log.current[r.slot].take() {
                log.done.push(old);
            }
            log.current[r.slot] = Some(Fed::default());
        }
        let fed = log.current[r.slot]
            .as_mut()
            .expect("fresh sequences start at 0");
        assert_eq!(
            r.pos0,
            fed.next.len(),
            "feeds continue where the last verified one ended"
        );
        fed.next.extend_from_slice(r.next_tokens);
        fed.feats
            .extend(r.feats.chunks(w.max(1)).map(<[f32]>::to_vec));
        if w == 0 {
            fed.feats.resize(fed.next.len(), Vec::new());
        }
        fed.next.clone()
    }

    /// Draft tokens after history `hist` (`x_1 ..= x_{P+1}`) and the distribution each came
    /// from.
    fn draft(
        &mut self,
        slot: usize,
        hist: &[u32],
        k: usize,
        sampled: bool,
        rng: &mut Rng,
    ) -> Draft {
        let v = self.vocab;
        let mut tokens = Vec::with_capacity(k);
        let mut probs = Vec::new();
        match &self.policy {
            Policy::Oracle(seqs, noise) => {
                // hist = x_1 ..= x_{P+1}; the drafts are x_{P+2} ..= x_{P+k+1}.
                let s = seqs
                    .iter()
                    .find(|s| s.len() > hist.len() && s[1..=hist.len()] == hist[..]);
                for j in 0..k {
                    let at = hist.len() + 1 + j;
                    let mut t = s.and_then(|s| s.get(at).copied()).unwrap_or(0);
                    if let Some(n) = noise {
                        let h = (at as u64 * 0x9E37_79B9 + slot as u64 * 31 + n) % 7;
                        if h < 3 {
                            t = (t + 1) % v as u32;
                        }
                    }
                    tokens.push(t);
                    if sampled {
                        let mut q = vec![0.0; v];
                        q[t as usize] = 1.0;
                        probs.extend(q);
                    }
                }
            }
            Policy::Fixed(q) => {
                for _ in 0..k {
                    let t = if sampled {
                        let mut u = rng.next_f32();
                        let mut pick = v - 1;
                        for (i, &p) in q.iter().enumerate() {
                            if u < p {
                                pick = i;
                                break;
                            }
                            u -= p;
                        }
                        probs.extend_from_slice(q);
                        pick
                    } else {
                        let mut best = 0;
                        for (i, &p) in q.iter().enumerate() {
                            if p > q[best] {
                                best = i;
                            }
                        }
                        best
                    };
                    tokens.push(t as u32);
                }
            }
            Policy::Random(_) => {
                for _ in 0..k {
                    let t = ((self.rng.next_f32() * v as f32) as usize).min(v - 1);
                    tokens.push(t as u32);
                    if sampled {
                        probs.extend(std::iter::repeat_n(1.0 / v as f32, v));
                    }
                }
            }
        }
        Draft { tokens, probs }
    }
}

impl DraftModel for Fixture {
    fn aux_layers(&self) -> &[usize] {
        &self.aux
    }
    fn target_vocab(&self) -> usize {
        self.vocab
    }
    fn propose(
        &mut self,
        rows: &[DraftInput<'_>],
        k: usize,
        rngs: &mut [Rng],
    ) -> Result<Vec<Draft>> {
        assert!(k >= 1 && rows.len() == rngs.len());
        self.log.lock().expect("log").calls.push(k);
        let mut out = Vec::with_capacity(rows.len());
        for (r, rng) in rows.iter().zip(rngs.iter_mut()) {
            let hist = self.feed(r);
            out.push(self.draft(r.slot, &hist, k, r.sampling.temperature > 0.0, rng));
        }
        Ok(out)
    }
}
