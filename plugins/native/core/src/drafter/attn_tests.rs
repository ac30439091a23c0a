//! TTT attention against a naive reference (forward) and finite differences (backward).

use super::*;
use crate::ops::gradcheck::{check, seq};

fn plan() -> Plan {
    let mut p = Plan::default();
    // Second sequence: prompt long enough that steps ≥ 1 start past position 0.
    p.build([(9usize, 2usize), (8, 6), (3, 0)].into_iter(), 3);
    p
}

/// softmax-weighted values of query `(s, b, t)`, head `h`, computed key by key.
fn naive(
    p: &Plan,
    s: usize,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (nh, kv, hd): (usize, usize, usize),
) -> Vec<f32> {
    let (ns, r) = (p.step_rows(s), p.r());
    let mut out = vec![0.0; nh * ns * hd];
    for i in 0..ns {
        let (b, t) = p.rows[p.step_off[s] + i];
        let (b, t) = (b as usize, t as usize);
        for h in 0..nh {
            let kvh = h / (nh / kv);
            let qi = &q[(h * ns + i) * hd..][..hd];
            let mut keys: Vec<usize> = (0..=t).map(|u| p.row(0, b, u)).collect();
            keys.extend((1..=s).map(|sp| p.row(sp, b, t)));
            let sc: Vec<f32> = keys
                .iter()
                .map(|&kr| dot(qi, &k[(kvh * r + kr) * hd..][..hd]) / (hd as f32).sqrt())
                .collect();
            let mx = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let z: f32 = sc.iter().map(|x| (x - mx).exp()).sum();
            for (&kr, x) in keys.iter().zip(&sc) {
                let w = (x - mx).exp() / z;
                axpy(
                    &mut out[(h * ns + i) * hd..][..hd],
                    w,
                    &v[(kvh * r + kr) * hd..][..hd],
                );
            }
        }
    }
    out
}

#[test]
fn ttt_attention_matches_reference_and_finite_differences() {
    let p = plan();
    let (nh, kv, hd) = (4, 2, 4);
    let w = p.max_len() + p.steps;
    let r = p.r();
    assert!(p.find(1, 1, 1).is_none() && p.find(1, 1, 2).is_some());
    for s in [0, 2] {
        let ns = p.step_rows(s);
        let g = Geom {
            plan: &p,
            s,
            nh,
            kv,
            hd,
            w,
        };
        let q0 = seq(nh * ns * hd, 1.0, 1 + s as u64);
        let k0 = seq(kv * r * hd, 1.0, 2);
        let v0 = seq(kv * r * hd, 1.0, 3);
        let rr = seq(nh * ns * hd, 1.0, 4);
        let mut sc = vec![0.0; kv * 2 * BLK * w];
        let run = |q: &[f32], k: &[f32], v: &[f32], sc: &mut [f32]| {
            let mut o = vec![0.0; nh * ns * hd];
            let mut l = vec![0.0; nh * ns];
            forward(&mut o, &mut l, q, k, v, sc, g);
            (o, l)
        };
        let (o, lse) = run(&q0, &k0, &v0, &mut sc);
        let want = naive(&p, s, (&q0, &k0, &v0), (nh, kv, hd));
        for (a, b) in o.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "step {s}: {a} vs {b}");
        }
        let f = |q: &[f32], k: &[f32], v: &[f32]| {
            let mut sc = vec![0.0; kv * 2 * BLK * w];
            let (o, _) = run(q, k, v, &mut sc);
            o.iter()
                .zip(&rr)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum::<f64>()
        };
        let mut dq = vec![0.0; nh * ns * hd];
        let (mut dk, mut dv) = (vec![0.0; kv * r * hd], vec![0.0; kv * r * hd]);
        backward(
            &mut dq, &mut dk, &mut dv, &rr, &q0, &k0, &v0, &lse, &mut sc, g,
        );
        check("ttt dq", &q0, &dq, |q| f(q, &k0, &v0));
        check("ttt dk", &k0, &dk, |k| f(&q0, k, &v0));
        check("ttt dv", &v0, &dv, |v| f(&q0, &k0, v));
    }
}
