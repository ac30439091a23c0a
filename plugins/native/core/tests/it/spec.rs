//! Speculative decoding in the engine: greedy output equals non-speculative greedy output
//! token for token (batching, adapters, k = 1, 3, 4, good and bad drafters), an oracle
//! drafter reaches acceptance length k + 1, stop tokens and limits land inside accepted runs
//! exactly where they would without a drafter, rows near `max_seq` shrink k, the drafter is
//! fed the aux features `Engine::aux_features` computes (also when it drafts only in the
//! tail of a batch, `set_speculate_below_batch`), and sampled output is reproducible
//! with the target's logprobs. (The distribution test is `tests/it/spec_dist.rs`.)
#![allow(clippy::unwrap_used)]

use crate::common;

use common::drafters::{Fixture, Policy};
use common::{random_model, seq};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::engine::draft::DraftModel;
use tandem_native_core::engine::{Engine, EngineConfig, FinishReason, GenOutput, GenRequest};
use tandem_native_core::lora::{LoraAdapter, LoraConfig, Target};
use tandem_native_core::sampling::SamplingParams;

const VOCAB: usize = 40;
const AUX: [usize; 3] = [0, 2, 1];

fn engine(p: &mut VecProvider, max_batch: usize) -> Engine {
    let mut c = common::tiny_cfg(Arch::Qwen2, true);
    c.vocab_size = VOCAB;
    let model = random_model(c, 7, p);
    let mut e = Engine::new(
        model,
        EngineConfig {
            max_batch,
            max_seq: 32,
        },
        p,
    )
    .unwrap();
    let lc = LoraConfig {
        r: 2,
        alpha: 8.0,
        targets: vec![Target::Q, Target::V, Target::O, Target::Gate, Target::Down],
        base_model: "tiny".into(),
    };
    let mut ad = LoraAdapter::new(&e.model.cfg, lc, p).unwrap();
    let v = seq(ad.layout.total_len(), 0.5, 77);
    ad.weights.as_mut_slice().copy_from_slice(&v);
    e.add_adapter("a", ad, p).unwrap();
    e
}

fn req(prompt: Vec<u32>, max_tokens: usize, temp: f32, seed: u64, ad: bool) -> GenRequest {
    GenRequest {
        prompt,
        max_tokens,
        stop_tokens: vec![],
        sampling: SamplingParams {
            temperature: temp,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        adapter: ad.then(|| "a".to_string()),
    }
}

/// Five greedy requests (distinct prompts, adapter on every other one).
fn greedy_reqs(max_tokens: &[usize]) -> Vec<GenRequest> {
    let prompts: [&[u32]; 5] = [
        &[1, 5, 9, 3],
        &[4, 11, 2, 8, 19],
        &[2, 30],
        &[7, 7, 12],
        &[3, 25, 6, 38, 14, 9],
    ];
    prompts
        .iter()
        .zip(max_tokens.iter().cycle())
        .enumerate()
        .map(|(i, (p, &m))| req(p.to_vec(), m, 0.0, i as u64, i % 2 == 0))
        .collect()
}

fn fixture(policy: Policy) -> Fixture {
    Fixture::new(AUX.to_vec(), VOCAB, 16, policy)
}

/// Runs `reqs` with `drafter` (k) set, then takes it back; resets the stats first.
fn spec_run(
    e: &mut Engine,
    reqs: &[GenRequest],
    drafter: Box<dyn DraftModel>,
    k: usize,
    p: &mut VecProvider,
) -> Vec<GenOutput> {
    e.reset_spec_stats();
    assert!(e.set_drafter(Some((drafter, k))).unwrap().is_none());
    assert_eq!(e.draft_tokens(), Some(k));
    let outs = e.generate(reqs, true, p).unwrap();
    assert!(e.take_drafter().is_some());
    outs
}

/// Full sequences (prompt + output), what the oracle proposes from.
fn full(reqs: &[GenRequest], outs: &[GenOutput]) -> Vec<Vec<u32>> {
    reqs.iter()
        .zip(outs)
        .map(|(r, o)| [r.prompt.clone(), o.tokens.clone()].concat())
        .collect()
}

/// Asserts equal tokens and finish, logprobs and hidden within `tol`; returns max |Δ|.
fn assert_same(a: &[GenOutput], b: &[GenOutput], tol: f32, what: &str) -> f32 {
    let mut worst = 0f32;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{what}: request {i} tokens");
        assert_eq!(x.finish, y.finish, "{what}: request {i} finish");
        let hx = x.hidden.as_deref().unwrap_or_default();
        let hy = y.hidden.as_deref().unwrap_or_default();
        assert_eq!(hx.len(), hy.len());
        for (u, v) in x.logprobs.iter().zip(&y.logprobs).chain(hx.iter().zip(hy)) {
            worst = worst.max((u - v).abs());
        }
    }
    assert!(worst <= tol, "{what}: max |Δ| {worst} > {tol}");
    worst
}

#[test]
fn greedy_speculative_output_equals_greedy_output() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p, 3);
    let reqs = greedy_reqs(&[12, 9, 15, 7, 12]);
    let base = e.generate(&reqs, true, &mut p).unwrap();
    assert!(base.iter().all(|o| o.finish == FinishReason::Length));
    let seqs = full(&reqs, &base);
    let mut worst = 0f32;
    for k in [1, 3, 4] {
        for (name, policy) in [
            ("oracle", Policy::Oracle(seqs.clone(), None)),
            ("noisy", Policy::Oracle(seqs.clone(), Some(k as u64))),
            ("random", Policy::Random(k as u64)),
        ] {
            let (d, log) = fixture(policy).boxed();
            let outs = spec_run(&mut e, &reqs, d, k, &mut p);
            worst = worst.max(assert_same(&outs, &base, 1e-5, &format!("{name} k={k}")));
            let st = e.spec_stats();
            let emitted: usize = base.iter().map(|o| o.tokens.len() - 1).sum();
            assert_eq!(st.emitted as usize, emitted, "{name} k={k}: {st:?}");
            assert!(st.drafted > 0 && !log.lock().unwrap().calls.is_empty());
            match name {
                "oracle" => assert_eq!(st.accepted, st.drafted, "k={k}: {st:?}"),
                "noisy" => assert!(st.accepted > 0 && st.accepted < st.drafted, "{st:?}"),
                _ => assert!(st.accept_rate() < 0.5, "{st:?}"),
            }
        }
    }
    println!("greedy spec vs decode: max |Δ logprob, hidden| = {worst:e}");
    // Without a drafter the engine decodes as before.
    assert!(e.drafter().is_none() && e.draft_tokens().is_none());
    assert_same(
        &e.generate(&reqs, true, &mut p).unwrap(),
        &base,
        0.0,
        "after",
    );
}

#[test]
fn oracle_reaches_acceptance_length_k_plus_one() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p, 3);
    for k in [1, 3, 4] {
        // 1 token from prefill, then exactly 3 full rounds of k + 1.
        let reqs = greedy_reqs(&[1 + 3 * (k + 1)]);
        let base = e.generate(&reqs, false, &mut p).unwrap();
        let (d, _) = fixture(Policy::Oracle(full(&reqs, &base), None)).boxed();
        spec_run(&mut e, &reqs, d, k, &mut p);
        let st = e.spec_stats();
        assert_eq!(st.rounds, 15, "k={k}: {st:?}");
        assert_eq!(st.emitted, 15 * (k as u64 + 1));
        assert_eq!((st.drafted, st.accepted), (15 * k as u64, 15 * k as u64));
        assert_eq!(st.mean_accept_len(), (k + 1) as f64);
        // Five rows on three slots: two batched waves of 3 rounds each; both phases timed.
        assert_eq!(st.verifies, 6, "k={k}: {st:?}");
        assert!(st.draft_ns > 0 && st.verify_ns > 0, "k={k}: {st:?}");
        // 12 tokens: 11 after prefill; the last round is cut to what max_tokens allows.
        let reqs = greedy_reqs(&[12]);
        let base = e.generate(&reqs, false, &mut p).unwrap();
        let (d, _) = fixture(Policy::Oracle(full(&reqs, &base), None)).boxed();
        spec_run(&mut e, &reqs, d, k, &mut p);
        let st = e.spec_stats();
        let rounds = 11usize.div_ceil(k + 1) as u64;
        assert_eq!((st.rounds, st.emitted), (5 * rounds, 55), "k={k}: {st:?}");
        assert_eq!(st.accepted, 55 - 5 * rounds);
        assert_eq!(st.accepted, st.drafted);
    }
}

#[test]
fn stop_tokens_and_max_tokens_inside_accepted_runs() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p, 3);
    let reqs = greedy_reqs(&[20]);
    let base = e.generate(&reqs, false, &mut p).unwrap();
    let seqs = full(&reqs, &base);
    let k = 4;
    // Stop at the token generated 4th (inside the first round's accepted run, or at the
    // first token for the rows that repeat one token: a whole wave then ends at prefill and
    // the next requests must still run).
    let stops: Vec<GenRequest> = reqs
        .iter()
        .zip(&base)
        .map(|(r, o)| {
            let mut r = r.clone();
            r.stop_tokens = vec![o.tokens[3], VOCAB as u32 + 5];
            r
        })
        .collect();
    let want = e.generate(&stops, true, &mut p).unwrap();
    for (w, b) in want.iter().zip(&base) {
        let first = b.tokens.iter().position(|t| *t == b.tokens[3]).unwrap();
        assert_eq!(w.tokens, b.tokens[..=first]);
        assert_eq!(w.finish, FinishReason::Stop);
    }
    let (d, _) = fixture(Policy::Oracle(seqs.clone(), None)).boxed();
    let got = spec_run(&mut e, &stops, d, k, &mut p);
    assert_same(&got, &want, 1e-5, "stop");
    let emitted: u64 = want.iter().map(|o| o.tokens.len() as u64 - 1).sum();
    assert_eq!(e.spec_stats().emitted, emitted);
    // max_tokens below, at and above one round's k + 1.
    for m in [1, 2, 3, 4, 5, 6, 7] {
        let short = greedy_reqs(&[m]);
        let want = e.generate(&short, true, &mut p).unwrap();
        for (name, policy) in [
            ("oracle", Policy::Oracle(seqs.clone(), None)),
            ("random", Policy::Random(m as u64)),
        ] {
            let (d, log) = fixture(policy).boxed();
            let got = spec_run(&mut e, &short, d, k, &mut p);
            assert_same(&got, &want, 1e-5, &format!("{name} max_tokens {m}"));
            assert!(got.iter().all(|o| o.tokens.len() == m));
            // Drafts never reach past max_tokens: k shrinks to the budget.
            let calls = log.lock().unwrap().calls.clone();
            assert!(calls.iter().all(|&c| c <= (m.saturating_sub(2)).min(k)));
        }
    }
}

#[test]
fn rows_near_max_seq_shrink_k() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p, 3);
    // max_seq 32: prompts of 26..=31 leave 6..=1 tokens of room.
    let reqs: Vec<GenRequest> = (26..=31)
        .map(|n| {
            let prompt = common::tokens(n, VOCAB, n as u64);
            req(prompt, 100, 0.0, 0, n % 2 == 1)
        })
        .collect();
    let base = e.generate(&reqs, true, &mut p).unwrap();
    for (r, o) in reqs.iter().zip(&base) {
        assert_eq!(r.prompt.len() + o.tokens.len(), 32);
    }
    let seqs = full(&reqs, &base);
    for k in [3, 4] {
        for policy in [Policy::Oracle(seqs.clone(), None), Policy::Random(9)] {
            let (d, _) = fixture(policy).boxed();
            let got = spec_run(&mut e, &reqs, d, k, &mut p);
            assert_same(&got, &base, 1e-5, "near max_seq");
        }
    }
    // Sampled rows near the end keep the cache bound too.
    let sampled: Vec<GenRequest> = reqs
        .iter()
        .map(|r| GenRequest {
            sampling: SamplingParams {
                temperature: 1.0,
                seed: 5,
                ..Default::default()
            },
            ..r.clone()
        })
        .collect();
    let (d, _) = fixture(Policy::Random(3)).boxed();
    let got = spec_run(&mut e, &sampled, d, 4, &mut p);
    for (r, o) in sampled.iter().zip(&got) {
        assert_eq!(r.prompt.len() + o.tokens.len(), 32);
    }
}

#[test]
fn sampled_speculation_is_reproducible_and_reports_target_logprobs() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p, 3);
    // Mixed greedy / sampled rows, top-k and top-p, adapters; 6 requests through 3 slots.
    let reqs: Vec<GenRequest> = (0..6)
        .map(|i| {
            let mut r = req(
                vec![1 + i as u32, 9, (7 * i % VOCAB) as u32],
                10 + i,
                [0.0, 1.0, 0.7][i % 3],
                40 + i as u64,
                i % 2 == 1,
            );
            r.sampling.top_k = [0, 0, 5][i % 3];
            r.sampling.top_p = if i == 4 { 0.9 } else { 1.0 };
            r
        })
        .collect();
    let q: Vec<f32> = (0..VOCAB).map(|i| 1.0 + (i % 5) as f32).collect();
    let qs: f32 = q.iter().sum();
    let q: Vec<f32> = q.iter().map(|x| x / qs).collect();
    let run = |e: &mut Engine, p: &mut VecProvider| {
        let (d, _) = fixture(Policy::Fixed(q.clone())).boxed();
        spec_run(e, &reqs, d, 3, p)
    };
    let a = run(&mut e, &mut p);
    let st = e.spec_stats();
    assert!(st.accepted < st.drafted, "{st:?}");
    let b = run(&mut e, &mut p);
    assert_same(&a, &b, 0.0, "same seeds");
    for (r, o) in reqs.iter().zip(&a) {
        assert_eq!(o.tokens.len(), r.max_tokens);
        assert_eq!(o.hidden.as_ref().unwrap().len(), r.max_tokens * 16);
        let scored = e
            .score(
                &[r.prompt.clone(), o.tokens.clone()].concat(),
                r.adapter.as_deref(),
                &mut p,
            )
            .unwrap();
        for (j, lp) in o.logprobs.iter().enumerate() {
            let s = scored[r.prompt.len() + j];
            assert!((lp - s).abs() < 1e-4, "token {j}: {lp} vs scored {s}");
        }
    }
    // Greedy rows in the mixed batch are the plain greedy tokens.
    let greedy: Vec<GenRequest> = reqs.iter().step_by(3).cloned().collect();
    let plain = e.generate(&greedy, false, &mut p).unwrap();
    assert_eq!(plain[0].tokens, a[0].tokens);
    assert_eq!(plain[1].tokens, a[3].tokens);
}

#[test]
fn drafting_only_in_the_tail_keeps_output_and_feeds_every_position() {
    let mut p = VecProvider::new();
    // All five requests in one batch; their lengths differ, so it shrinks 5 → 1.
    let mut e = engine(&mut p, 5);
    let reqs = greedy_reqs(&[4, 8, 12, 16, 20]);
    let base = e.generate(&reqs, true, &mut p).unwrap();
    let seqs = full(&reqs, &base);
    let total: u64 = base.iter().map(|o| o.tokens.len() as u64 - 1).sum();
    let w = AUX.len() * 16;
    let mut plain = Vec::new();
    for below in [1, 2, 4, 5] {
        e.set_speculate_below_batch(Some(below));
        let (d, log) = fixture(Policy::Oracle(seqs.clone(), None)).boxed();
        let outs = spec_run(&mut e, &reqs, d, 3, &mut p);
        assert_same(&outs, &base, 1e-5, &format!("below {below}"));
        let st = e.spec_stats();
        assert_eq!(st.emitted + st.plain, total, "below {below}: {st:?}");
        // The oracle's drafts all hold: the rows' features reached it across plain rounds.
        assert!(
            st.drafted > 0 && st.accepted == st.drafted,
            "below {below}: {st:?}"
        );
        // Every position the drafter was fed carries the target's aux features (the fixture
        // itself checks that feeds are contiguous).
        for f in log.lock().unwrap().all_fed() {
            let s = seqs
                .iter()
                .find(|s| s.get(1..=f.next.len()) == Some(&f.next[..]))
                .unwrap();
            let r = &reqs[seqs.iter().position(|x| x == s).unwrap()];
            let want = e
                .aux_features(std::slice::from_ref(s), &AUX, r.adapter.as_deref(), &mut p)
                .unwrap();
            for (t, ft) in f.feats.iter().enumerate() {
                for (a, b) in ft.iter().zip(&want[0][t * w..(t + 1) * w]) {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "below {below}, position {t}: {a} vs {b}"
                    );
                }
            }
        }
        plain.push(st.plain);
    }
    // Fewer plain tokens the more rows may draft; none once the whole batch may.
    assert!(plain.windows(2).all(|p| p[0] > p[1]), "{plain:?}");
    assert_eq!(plain[3], 0);
    e.set_speculate_below_batch(None);
}

#[test]
fn drafter_is_fed_the_aux_features_of_the_verified_sequence() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p, 3);
    let reqs = greedy_reqs(&[9, 6, 11, 4, 8]);
    let base = e.generate(&reqs, false, &mut p).unwrap();
    let seqs = full(&reqs, &base);
    let (d, log) = fixture(Policy::Oracle(seqs.clone(), Some(1))).boxed();
    spec_run(&mut e, &reqs, d, 3, &mut p);
    let fed = log.lock().unwrap().all_fed();
    assert_eq!(fed.len(), reqs.len());
    let w = AUX.len() * 16;
    for (r, s) in reqs.iter().zip(&seqs) {
        let f = fed
            .iter()
            .find(|f| s[1..=f.next.len()] == f.next[..])
            .unwrap();
        // Everything but the last round's output was verified and fed.
        assert!(f.next.len() >= r.prompt.len() && f.next.len() < s.len());
        let want = e
            .aux_features(std::slice::from_ref(s), &AUX, r.adapter.as_deref(), &mut p)
            .unwrap();
        assert_eq!(want[0].len(), s.len() * w);
        for (t, ft) in f.feats.iter().enumerate() {
            for (a, b) in ft.iter().zip(&want[0][t * w..(t + 1) * w]) {
                assert!((a - b).abs() < 1e-4, "position {t}: {a} vs {b}");
            }
        }
    }
    // aux_features: layer 0 is the embedding; a padded batch equals one at a time.
    let two = e.aux_features(&seqs[..2], &[0, 2], None, &mut p).unwrap();
    let emb = e
        .model
        .tensor("model.embed_tokens.weight")
        .unwrap()
        .to_vec();
    for (t, &tok) in seqs[1].iter().enumerate() {
        assert_eq!(two[1][t * 32..t * 32 + 16], emb[tok as usize * 16..][..16]);
    }
    let one = e.aux_features(&seqs[1..2], &[0, 2], None, &mut p).unwrap();
    assert_eq!(one[0].len(), two[1].len());
    for (a, b) in one[0].iter().zip(&two[1]) {
        assert!((a - b).abs() < 1e-5);
    }
    assert!(e.aux_features(&seqs[..1], &[3], None, &mut p).is_err());
    let err = e.set_drafter(Some((fixture(Policy::Random(0)).boxed().0, 0)));
    assert!(err.is_err());
    let mut bad = Fixture::new(vec![0], VOCAB + 1, 16, Policy::Random(0));
    bad.log = Default::default();
    assert!(e.set_drafter(Some((Box::new(bad), 2))).is_err());
}
