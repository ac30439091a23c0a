//! The value model's gradients (body through `backward_from_hidden`, and the value head)
//! against central finite differences on a tiny 2-layer model, full fine-tuning, with a
//! value clip that takes some tokens' gradients away.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, seq, tiny_cfg, tokens, trainer};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::trainer::{Batch, Trainer};
use tandem_native_core::value::{ValueTargets, value_loss};

const B: usize = 2;
const T: usize = 5;

fn loss_of(tr: &mut Trainer, batch: &Batch<'_>, targets: &ValueTargets<'_>) -> f64 {
    let v = tr.values(batch, &mut VecProvider::new()).unwrap();
    let mut d = vec![0f32; v.len()];
    value_loss(&v, T, batch.mask, targets, None, &mut d)
        .unwrap()
        .loss
}

#[test]
fn value_model_gradients_match_finite_differences() {
    let mut p = VecProvider::new();
    let model = random_model(tiny_cfg(Arch::Qwen2, false), 7, &mut p);
    let mut tr = trainer(model, None, 1e-3, &mut p);
    tr.ensure_value_head(&mut p).unwrap();
    let d = tr.model.cfg.hidden_size;
    let head = seq(d + 1, 0.5, 31);
    tr.value_head
        .as_mut()
        .unwrap()
        .params_mut()
        .copy_from_slice(&head);
    let toks = tokens(B * T, 13, 5);
    let mask: Vec<f32> = (0..B * T).map(|i| f32::from(i % T >= 2)).collect();
    let batch = Batch {
        tokens: &toks,
        b: B,
        t: T,
        mask: &mask,
    };
    let v0 = tr.values(&batch, &mut p).unwrap();
    let returns = seq(B * T, 1.0, 11);
    // Old values: near v for most tokens (inside the clip range), far for two (clipped).
    let mut old: Vec<f32> = v0
        .iter()
        .zip(seq(B * T, 0.05, 12))
        .map(|(a, b)| a + b)
        .collect();
    old[3] = returns[3] + 2.0 * (returns[3] - v0[3]).signum();
    old[8] = returns[8] + 2.0 * (returns[8] - v0[8]).signum();
    let targets = ValueTargets {
        returns: &returns,
        old_values: Some(&old),
        clip: 0.1,
    };
    tr.zero_value_grad();
    let st = tr.accumulate_value(&batch, &targets, None, &mut p).unwrap();
    assert!(st.clip_frac > 0.0 && st.clip_frac < 1.0, "{st:?}");
    let g = tr.grads().to_vec();
    let gh = tr.value_head.as_ref().unwrap().grads().to_vec();
    let scale = g.iter().chain(&gh).fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 1e-3, "gradients are all ~0");
    let eps = 1e-2f32;
    let close = |name: &str, analytic: f32, fd: f32| {
        assert!(
            (analytic - fd).abs() <= 2e-4 * scale + 1e-2 * fd.abs(),
            "{name}: analytic {analytic} vs finite difference {fd} (scale {scale})"
        );
    };
    // Every head parameter.
    for i in 0..=d {
        let orig = head[i];
        tr.value_head.as_mut().unwrap().params_mut()[i] = orig + eps;
        let lp = loss_of(&mut tr, &batch, &targets);
        tr.value_head.as_mut().unwrap().params_mut()[i] = orig - eps;
        let lm = loss_of(&mut tr, &batch, &targets);
        tr.value_head.as_mut().unwrap().params_mut()[i] = orig;
        close(
            &format!("value_head[{i}]"),
            gh[i],
            ((lp - lm) / (2.0 * eps as f64)) as f32,
        );
    }
    // A few elements of every body tensor; the lm_head gets no gradient.
    let entries = tr.model.layout.entries().to_vec();
    for e in &entries {
        let r = e.range();
        if e.name == "lm_head.weight" {
            assert!(
                g[r].iter().all(|&x| x == 0.0),
                "the lm_head has a value gradient"
            );
            continue;
        }
        for j in 0..3 {
            let i = r.start + (j * 7919 + 13) % r.len();
            let orig = tr.model.weights.as_slice()[i];
            tr.model.weights.as_mut_slice()[i] = orig + eps;
            let lp = loss_of(&mut tr, &batch, &targets);
            tr.model.weights.as_mut_slice()[i] = orig - eps;
            let lm = loss_of(&mut tr, &batch, &targets);
            tr.model.weights.as_mut_slice()[i] = orig;
            let fd = ((lp - lm) / (2.0 * eps as f64)) as f32;
            close(&format!("{}[{}]", e.name, i - r.start), g[i], fd);
        }
    }
}

#[test]
fn a_fresh_head_values_zero_and_value_steps_reduce_the_loss() {
    let mut p = VecProvider::new();
    let model = random_model(tiny_cfg(Arch::Llama, true), 3, &mut p);
    let mut tr = trainer(model, None, 1e-2, &mut p);
    let toks = tokens(B * T, 13, 9);
    let mask: Vec<f32> = (0..B * T).map(|i| f32::from(i % T >= 1)).collect();
    let batch = Batch {
        tokens: &toks,
        b: B,
        t: T,
        mask: &mask,
    };
    tr.ensure_value_head(&mut p).unwrap();
    assert!(tr.values(&batch, &mut p).unwrap().iter().all(|&v| v == 0.0));
    let returns = seq(B * T, 1.0, 4);
    let targets = ValueTargets {
        returns: &returns,
        old_values: None,
        clip: 0.0,
    };
    let first = tr
        .train_step_value(&batch, &targets, &mut p)
        .unwrap()
        .0
        .loss;
    let mut last = first;
    for _ in 0..20 {
        let (st, step) = tr.train_step_value(&batch, &targets, &mut p).unwrap();
        assert!(step.applied);
        last = st.loss;
    }
    assert!(last < 0.5 * first, "value loss {first} -> {last}");
}
