//! Speculative sampling keeps the target's distribution: on a tiny random model with an
//! 8-token vocabulary, many thousands of seeded 4-token generations with a drafter whose `q`
//! clearly differs from the target's `p` (so drafts are rejected often) are compared, by a
//! chi-square test, with the exact target probabilities of the generated token pairs
//! (computed from `Engine::score`). The non-speculative sampler passes the same test, and the
//! same samples FAIL it against a deliberately wrong distribution (the test has power).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::drafters::{Fixture, Policy};
use common::random_model;
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::engine::{Engine, EngineConfig, GenRequest};
use tandem_native_core::sampling::SamplingParams;

const V: usize = 8;
const N: usize = 20_000;
const PROMPT: [u32; 3] = [1, 5, 3];
/// The drafter's distribution, far from the target's (total variation > 0.2, asserted).
const Q: [f32; V] = [0.30, 0.02, 0.05, 0.20, 0.03, 0.25, 0.05, 0.10];

fn engine(p: &mut VecProvider) -> Engine {
    let mut c = common::tiny_cfg(Arch::Llama, false);
    c.vocab_size = V;
    let mut model = random_model(c, 3, p);
    // Sharpen the output layer so p is far from uniform (and from q).
    for w in model.tensor_mut("lm_head.weight").unwrap() {
        *w *= 2.0;
    }
    Engine::new(
        model,
        EngineConfig {
            max_batch: 64,
            max_seq: 16,
        },
        p,
    )
    .unwrap()
}

/// What `sampling::sample` draws from, given the raw log-probabilities of one context.
fn target(lp: &[f64], temp: f64, top_k: usize) -> Vec<f64> {
    let w: Vec<f64> = lp.iter().map(|x| (x / temp).exp()).collect();
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(a.cmp(&b)));
    let keep = if top_k == 0 { w.len() } else { top_k };
    let mut p = vec![0.0; w.len()];
    for &i in &order[..keep] {
        p[i] = w[i];
    }
    let s: f64 = p.iter().sum();
    p.iter().map(|x| x / s).collect()
}

/// Exact `P(t1, t2)` and `P(t2, t3)` (row-major `[V·V]`) of the generated tokens.
fn exact(e: &mut Engine, p: &mut VecProvider, temp: f64, top_k: usize) -> [Vec<f64>; 2] {
    let l = PROMPT.len();
    // lp[a][b][c] = the score of prompt + [a, b, c].
    let mut lp1 = vec![0.0; V];
    let mut lp2 = vec![vec![0.0; V]; V];
    let mut lp3 = vec![vec![0.0; V]; V * V];
    for a in 0..V {
        for b in 0..V {
            for (c, lp) in lp3[a * V + b].iter_mut().enumerate() {
                let mut toks = PROMPT.to_vec();
                toks.extend([a as u32, b as u32, c as u32]);
                let s = e.score(&toks, None, p).unwrap();
                lp1[a] = f64::from(s[l]);
                lp2[a][b] = f64::from(s[l + 1]);
                *lp = f64::from(s[l + 2]);
            }
        }
    }
    let p1 = target(&lp1, temp, top_k);
    let mut j12 = vec![0.0; V * V];
    let mut j23 = vec![0.0; V * V];
    for a in 0..V {
        let p2 = target(&lp2[a], temp, top_k);
        for b in 0..V {
            j12[a * V + b] = p1[a] * p2[b];
            let p3 = target(&lp3[a * V + b], temp, top_k);
            for (j, p3c) in j23[b * V..(b + 1) * V].iter_mut().zip(p3) {
                *j += p1[a] * p2[b] * p3c;
            }
        }
    }
    [j12, j23]
}

/// Counts of `(t1, t2)` and `(t2, t3)` over `N` generations with distinct seeds.
fn observe(e: &mut Engine, p: &mut VecProvider, temp: f32, top_k: usize) -> [Vec<f64>; 2] {
    let reqs: Vec<GenRequest> = (0..N)
        .map(|i| GenRequest {
            prompt: PROMPT.to_vec(),
            max_tokens: 4,
            stop_tokens: vec![],
            sampling: SamplingParams {
                temperature: temp,
                top_p: 1.0,
                top_k,
                seed: 1_000 + i as u64,
            },
            adapter: None,
        })
        .collect();
    let outs = e.generate(&reqs, false, p).unwrap();
    let mut c = [vec![0.0; V * V], vec![0.0; V * V]];
    for o in &outs {
        let t: Vec<usize> = o.tokens.iter().map(|&x| x as usize).collect();
        assert_eq!(t.len(), 4);
        c[0][t[0] * V + t[1]] += 1.0;
        c[1][t[1] * V + t[2]] += 1.0;
    }
    c
}

/// Upper 0.999 quantile of chi-square with `df` degrees of freedom, by the Wilson–Hilferty
/// cube-root normal approximation (`z_0.999 = 3.090232`). Slightly above the exact value
/// (computed from the regularised incomplete gamma function): df 8 → 26.32 vs 26.12, df 30 →
/// 59.81 vs 59.70, df 63 → 103.51 vs 103.44.
fn chi2_q999(df: usize) -> f64 {
    let (k, z) = (df as f64, 3.090_232);
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Pearson chi-square of `obs` against probabilities `p` (`N` draws): cells expected below
/// 5 are pooled; a cell of probability 0 must be empty. Returns (statistic, df).
fn chi2(obs: &[f64], p: &[f64]) -> (f64, usize) {
    let n = obs.iter().sum::<f64>();
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let (mut po, mut pe) = (0.0, 0.0);
    for (&o, &pr) in obs.iter().zip(p) {
        if pr == 0.0 {
            assert_eq!(o, 0.0, "a token outside the target's support was generated");
            continue;
        }
        let ex = pr * n;
        if ex < 5.0 {
            po += o;
            pe += ex;
        } else {
            cells.push((o, ex));
        }
    }
    if pe > 0.0 {
        if pe < 5.0 {
            // Too small alone: merge into the smallest cell.
            let i = (0..cells.len())
                .min_by(|&a, &b| cells[a].1.total_cmp(&cells[b].1))
                .unwrap();
            cells[i].0 += po;
            cells[i].1 += pe;
        } else {
            cells.push((po, pe));
        }
    }
    let stat = cells.iter().map(|(o, e)| (o - e) * (o - e) / e).sum();
    (stat, cells.len() - 1)
}

fn assert_passes(obs: &[Vec<f64>; 2], want: &[Vec<f64>; 2], what: &str) {
    for (i, (o, w)) in obs.iter().zip(want).enumerate() {
        let (stat, df) = chi2(o, w);
        let q = chi2_q999(df);
        println!("{what} pair {i}: chi2 {stat:.1}, df {df}, q0.999 {q:.1}");
        assert!(df >= 5, "{what}: too few cells ({df} df)");
        assert!(
            stat < q,
            "{what} pair {i}: chi2 {stat:.1} >= {q:.1} (df {df})"
        );
    }
}

fn spec_observe(e: &mut Engine, p: &mut VecProvider, temp: f32, top_k: usize) -> [Vec<f64>; 2] {
    let d = Fixture::new(vec![1], V, 16, Policy::Fixed(Q.to_vec()));
    e.set_drafter(Some((Box::new(d), 2))).unwrap();
    e.reset_spec_stats();
    let obs = observe(e, p, temp, top_k);
    let st = e.spec_stats();
    e.take_drafter();
    // Rejections happen often, acceptances too.
    println!(
        "temp {temp} top_k {top_k}: {st:?}, accept rate {:.3}",
        st.accept_rate()
    );
    assert!(st.accept_rate() > 0.05 && st.accept_rate() < 0.8, "{st:?}");
    obs
}

#[test]
fn speculative_sampling_matches_the_target_distribution() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    let want = exact(&mut e, &mut p, 1.0, 0);
    // The target is far from q (and from uniform), so the power check below means something.
    let p1: Vec<f64> = (0..V)
        .map(|a| want[0][a * V..(a + 1) * V].iter().sum())
        .collect();
    let tv: f64 = p1
        .iter()
        .zip(Q)
        .map(|(a, b)| (a - f64::from(b)).abs())
        .sum::<f64>()
        / 2.0;
    println!("P(t1) = {p1:.3?}, total variation to q {tv:.3}");
    assert!(tv > 0.2, "q must differ clearly from p");
    let spec = spec_observe(&mut e, &mut p, 1.0, 0);
    assert_passes(&spec, &want, "speculative");
    let plain = observe(&mut e, &mut p, 1.0, 0);
    assert_passes(&plain, &want, "non-speculative");
    // Power: the same samples against a wrong distribution — t2 (and t3) drawn from q, as a
    // drafter whose tokens were always accepted would give — fail the test.
    let q: Vec<f64> = Q.iter().map(|&x| f64::from(x)).collect();
    let wrong = [
        (0..V * V)
            .map(|i| p1[i / V] * q[i % V])
            .collect::<Vec<f64>>(),
        (0..V * V)
            .map(|i| q[i / V] * q[i % V])
            .collect::<Vec<f64>>(),
    ];
    for (i, (o, w)) in spec.iter().zip(&wrong).enumerate() {
        let (stat, df) = chi2(o, w);
        println!("wrong pair {i}: chi2 {stat:.1}, df {df}");
        assert!(
            stat > chi2_q999(df),
            "pair {i}: the test cannot tell q from p"
        );
    }
    // A subtler wrong answer, the target at another temperature, fails too.
    let warm = exact(&mut e, &mut p, 1.25, 0);
    let (stat, df) = chi2(&spec[1], &warm[1]);
    println!("temperature 1.25 pair 1: chi2 {stat:.1}, df {df}");
    assert!(stat > chi2_q999(df));
}

#[test]
fn speculative_sampling_with_top_k_matches_the_target_distribution() {
    let mut p = VecProvider::new();
    let mut e = engine(&mut p);
    let want = exact(&mut e, &mut p, 0.8, 3);
    let spec = spec_observe(&mut e, &mut p, 0.8, 3);
    assert_passes(&spec, &want, "speculative top-k 3");
    let plain = observe(&mut e, &mut p, 0.8, 3);
    assert_passes(&plain, &want, "non-speculative top-k 3");
}
