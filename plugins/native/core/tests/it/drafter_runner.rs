//! EAGLE-3 drafter inference (`DrafterRunner` as the engine's `DraftModel`): its draft
//! logits equal the TTT forward's at the same chain (one call and fed in two rounds), greedy
//! proposals are deterministic and independent of batching, sampled `q` is a distribution
//! over the target vocabulary, and bad inputs are errors.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, seq, tokens};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::drafter::{
    Drafter, DrafterInit, DrafterRunner, DrafterTrainer, RunnerConfig, SeqFeatures, TttConfig,
    aux_features,
};
use tandem_native_core::engine::draft::{DraftInput, DraftModel};
use tandem_native_core::model::Model;
use tandem_native_core::optim::AdamW;
use tandem_native_core::sampling::{Rng, SamplingParams};

const K: usize = 4;

fn target(p: &mut VecProvider) -> Model {
    let mut c = common::tiny_cfg(Arch::Llama, false);
    c.vocab_size = 40;
    c.num_hidden_layers = 3;
    c.max_position_embeddings = 256;
    random_model(c, 21, p)
}

/// A drafter with a smaller draft vocabulary and randomised trainable weights.
fn drafter(t: &Model, p: &mut VecProvider) -> Drafter {
    let init = DrafterInit {
        aux_layers: Some([0, 2, 1]),
        draft_vocab: Some((0..40).filter(|i| i % 4 != 3).collect()),
        seed: 8,
    };
    let mut d = Drafter::init_from_target(t, init, p).unwrap();
    let n = d.trainable_len();
    for (w, z) in d.weights.as_mut_slice()[..n].iter_mut().zip(seq(n, 0.3, 5)) {
        *w += z;
    }
    d
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

struct Setup {
    t: Model,
    toks: Vec<u32>,
    feats: Vec<f32>,
}

fn setup(p: &mut VecProvider) -> Setup {
    setup_len(p, 12)
}

fn setup_len(p: &mut VecProvider, len: usize) -> Setup {
    let t = target(p);
    let toks = tokens(len, 40, 3);
    let feats = aux_features(&t, &toks, &[0, 2, 1]).unwrap();
    Setup { t, toks, feats }
}

fn runner(s: &Setup, p: &mut VecProvider) -> DrafterRunner {
    let d = drafter(&s.t, p);
    let cfg = RunnerConfig {
        max_batch: 3,
        max_seq: s.toks.len().max(32),
    };
    DrafterRunner::new(d, cfg, p).unwrap()
}

/// Row feeding positions `a..b` of the setup's sequence (tokens `a+1..=b`).
fn row<'a>(
    s: &'a Setup,
    slot: usize,
    a: usize,
    b: usize,
    sp: &'a SamplingParams,
) -> DraftInput<'a> {
    let fd = 48;
    DraftInput {
        slot,
        pos0: a,
        feats: &s.feats[a * fd..b * fd],
        next_tokens: &s.toks[a + 1..b + 1],
        sampling: sp,
    }
}

/// TTT logits `[K, draft_vocab]` at position `p` of the chain `toks[..=p+1]`, `drafts`.
fn ttt_logits(s: &Setup, pv: &mut VecProvider, p: usize, drafts: &[u32]) -> Vec<f32> {
    let d = drafter(&s.t, pv);
    let fd = 48;
    let seq_toks: Vec<u32> = s.toks[..p + 2].iter().chain(drafts).copied().collect();
    let mut feats = s.feats[..(p + 1) * fd].to_vec();
    feats.resize(seq_toks.len() * fd, 0.5);
    let ttt = TttConfig {
        steps: K,
        max_tokens: seq_toks.len(),
    };
    let mut tr = DrafterTrainer::new(d, ttt, AdamW::default(), pv).unwrap();
    let sf = SeqFeatures {
        tokens: &seq_toks,
        feats: &feats,
        prompt_len: p + 1,
    };
    tr.step_logits(&sf, p).unwrap()
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 2e-5, "{what}: max |diff| {worst}");
}

#[test]
fn inference_logits_equal_the_ttt_forward() {
    let mut pv = VecProvider::new();
    let s = setup(&mut pv);
    let mut r = runner(&s, &mut pv);
    r.record_logits(true);
    let sp = greedy();
    let p = 7;
    let mut rng = [Rng::new(1)];
    let out = r
        .propose(&[row(&s, 1, 0, p + 1, &sp)], K, &mut rng)
        .unwrap();
    let drafts = out[0].tokens.clone();
    assert_eq!(drafts.len(), K);
    let rec = r.recorded_logits().to_vec();
    let want = ttt_logits(&s, &mut pv, p, &drafts);
    assert_close(&rec, &want, "one call");
    // Greedy picks the argmax of each step, mapped to target ids.
    for (j, &tok) in drafts.iter().enumerate() {
        let lg = &rec[j * 30..(j + 1) * 30];
        let best = tandem_native_core::sampling::argmax(lg);
        assert_eq!(r.drafter().draft_to_target(best), tok as usize);
        assert!(tok % 4 != 3);
    }
    // Two rounds: positions 0..5 first (their draft entries are scratch), then 5..=p.
    let mut r2 = runner(&s, &mut pv);
    r2.record_logits(true);
    r2.propose(&[row(&s, 0, 0, 5, &sp)], K, &mut rng).unwrap();
    let out2 = r2
        .propose(&[row(&s, 0, 5, p + 1, &sp)], K, &mut rng)
        .unwrap();
    assert_eq!(out2[0].tokens, drafts);
    assert_close(r2.recorded_logits(), &want, "two rounds");
}

#[test]
fn context_entries_crossing_chunks_match_the_ttt_forward() {
    let mut pv = VecProvider::new();
    let s = setup_len(&mut pv, 120);
    let sp = greedy();
    let mut rngs = [Rng::new(1), Rng::new(2), Rng::new(3)];
    // 3 rows of 50, 30 and 40 verified entries: 117 context entries over two chunks.
    let spans = [(0, 51), (0, 31), (0, 41)];
    let mut r = runner(&s, &mut pv);
    r.record_logits(true);
    let rows: Vec<DraftInput<'_>> = spans
        .iter()
        .enumerate()
        .map(|(slot, &(a, b))| row(&s, slot, a, b, &sp))
        .collect();
    let out = r.propose(&rows, K, &mut rngs).unwrap();
    let rec = r.recorded_logits().to_vec();
    for (i, &(_, b)) in spans.iter().enumerate() {
        let want = ttt_logits(&s, &mut pv, b - 1, &out[i].tokens);
        let got: Vec<f32> = (0..K)
            .flat_map(|j| rec[(j * 3 + i) * 30..(j * 3 + i + 1) * 30].to_vec())
            .collect();
        assert_close(&got, &want, "row over chunks");
    }
}

#[test]
fn greedy_is_deterministic_and_batching_changes_nothing() {
    let mut pv = VecProvider::new();
    let s = setup(&mut pv);
    let sp = greedy();
    let mut rngs = [Rng::new(1), Rng::new(2), Rng::new(3)];
    let mut alone = Vec::new();
    for (slot, (a, b)) in [(0, 9), (0, 4), (0, 11)].into_iter().enumerate() {
        let mut r = runner(&s, &mut pv);
        r.record_logits(true);
        let o = r
            .propose(&[row(&s, slot, a, b, &sp)], K, &mut rngs[..1])
            .unwrap();
        alone.push((o[0].clone(), r.recorded_logits().to_vec()));
    }
    let mut r = runner(&s, &mut pv);
    r.record_logits(true);
    let rows = [
        row(&s, 0, 0, 9, &sp),
        row(&s, 1, 0, 4, &sp),
        row(&s, 2, 0, 11, &sp),
    ];
    let both = r.propose(&rows, K, &mut rngs).unwrap();
    let rec = r.recorded_logits().to_vec();
    for (i, (o, lg)) in alone.iter().enumerate() {
        assert_eq!(&both[i], o, "row {i}");
        assert!(o.probs.is_empty());
        for j in 0..K {
            let batched = &rec[(j * 3 + i) * 30..(j * 3 + i + 1) * 30];
            assert_close(batched, &lg[j * 30..(j + 1) * 30], "batched row");
        }
    }
    let again = runner(&s, &mut pv).propose(&rows, K, &mut rngs).unwrap();
    assert_eq!(again, both);
}

#[test]
fn sampled_drafts_return_their_distribution_over_the_target_vocabulary() {
    let mut pv = VecProvider::new();
    let s = setup(&mut pv);
    let mut r = runner(&s, &mut pv);
    r.record_logits(true);
    let sp = SamplingParams {
        temperature: 0.7,
        top_k: 3, // not applied to the draft: q is the tempered softmax
        ..Default::default()
    };
    let draw = |r: &mut DrafterRunner, seed| {
        let mut rng = [Rng::new(seed)];
        r.propose(&[row(&s, 0, 0, 10, &sp)], K, &mut rng).unwrap()
    };
    let o = draw(&mut r, 4);
    let rec = r.recorded_logits().to_vec();
    assert_eq!(o[0].probs.len(), K * 40);
    for j in 0..K {
        let q = &o[0].probs[j * 40..(j + 1) * 40];
        let sum: f64 = q.iter().map(|&x| f64::from(x)).sum();
        assert!((sum - 1.0).abs() < 1e-5, "step {j}: sum {sum}");
        for (t, &x) in q.iter().enumerate() {
            assert_eq!(x == 0.0, t % 4 == 3, "target id {t}: {x}");
        }
        assert!(q[o[0].tokens[j] as usize] > 0.0);
        // q = softmax(logits / 0.7) on the draft vocabulary.
        let lg = &rec[j * 30..(j + 1) * 30];
        let mx = lg.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let z: f32 = lg.iter().map(|x| ((x - mx) / 0.7).exp()).sum();
        for (i, x) in lg.iter().enumerate() {
            let want = ((x - mx) / 0.7).exp() / z;
            assert!((q[r.drafter().draft_to_target(i)] - want).abs() < 1e-6);
        }
    }
    assert_eq!(
        draw(&mut runner(&s, &mut pv), 4),
        o,
        "same seed, same draft"
    );
    let others: Vec<_> = (5..12)
        .map(|seed| draw(&mut runner(&s, &mut pv), seed))
        .collect();
    assert!(others.iter().any(|x| x[0].tokens != o[0].tokens));
}

#[test]
fn bad_proposals_are_errors() {
    let mut pv = VecProvider::new();
    let s = setup(&mut pv);
    let mut r = runner(&s, &mut pv);
    assert_eq!(r.aux_layers(), &[0, 2, 1]);
    assert_eq!(r.target_vocab(), 40);
    let sp = greedy();
    let mut rng = [Rng::new(1), Rng::new(2)];
    let e = |r: &mut DrafterRunner, rows: &[DraftInput<'_>], k, rng: &mut [Rng]| {
        r.propose(rows, k, rng).unwrap_err().to_string()
    };
    assert!(e(&mut r, &[row(&s, 0, 0, 3, &sp)], 0, &mut rng[..1]).contains("k = 0"));
    assert!(e(&mut r, &[row(&s, 3, 0, 3, &sp)], 2, &mut rng[..1]).contains("slot 3"));
    let two = [row(&s, 1, 0, 3, &sp), row(&s, 1, 0, 4, &sp)];
    assert!(e(&mut r, &two, 2, &mut rng).contains("repeated"));
    assert!(e(&mut r, &[row(&s, 0, 3, 3, &sp)], 2, &mut rng[..1]).contains("need >= 1"));
    let mut far = row(&s, 0, 0, 3, &sp);
    far.pos0 = 28;
    assert!(e(&mut r, &[far], 3, &mut rng[..1]).contains("exceeds max_seq 32"));
    let bad_tok = [99u32];
    let mut bad = row(&s, 0, 0, 1, &sp);
    bad.next_tokens = &bad_tok;
    assert!(e(&mut r, &[bad], 1, &mut rng[..1]).contains("token id 99"));
}
