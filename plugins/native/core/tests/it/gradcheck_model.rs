//! Whole-model gradient checks: analytic gradients of a 2-layer model (full fine-tuning and
//! LoRA mode; SFT and the policy loss with KL) against central finite differences.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, seq, tiny_cfg, tokens};
use tandem_native_core::acts::ActLayout;
use tandem_native_core::backward::{Grads, backward};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::forward::forward;
use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
use tandem_native_core::loss::{Loss, PolicyLossConfig, apply_loss};
use tandem_native_core::model::Model;

const B: usize = 2;
const T: usize = 5;

fn loss_and_grads(
    model: &Model,
    lora: Option<&LoraAdapter>,
    toks: &[u32],
    mask: &[f32],
    loss: &Loss<'_>,
    want_grads: bool,
) -> (f64, Vec<f32>) {
    let al = ActLayout::new(&model.cfg, B, T, lora.map(|l| &l.cfg));
    let mut acts = vec![0.0; al.total_len()];
    forward(model, lora, toks, &al, &mut acts, true).unwrap();
    let lo = al.logits_offset();
    let v = model.cfg.vocab_size;
    let mut lp = vec![0.0; B * T];
    let st = apply_loss(
        &mut acts[lo..lo + B * T * v],
        v,
        toks,
        T,
        mask,
        loss,
        None,
        &mut lp,
    )
    .unwrap();
    if !want_grads {
        return (st.loss, vec![]);
    }
    let mut g = vec![0.0; lora.map_or(model.layout.total_len(), |l| l.layout.total_len())];
    let grads = if lora.is_some() {
        Grads {
            base: None,
            lora: Some(&mut g),
        }
    } else {
        Grads {
            base: Some(&mut g),
            lora: None,
        }
    };
    backward(model, lora, toks, &al, &mut acts, grads).unwrap();
    (st.loss, g)
}

fn assert_close(name: &str, analytic: f32, fd: f32, scale: f32) {
    let err = (analytic - fd).abs();
    assert!(
        err <= 2e-4 * scale + 1e-2 * fd.abs(),
        "{name}: analytic {analytic} vs finite difference {fd} (scale {scale})"
    );
}

fn check_full(arch: Arch, tie: bool, policy: bool) {
    let mut p = VecProvider::new();
    let mut model = random_model(tiny_cfg(arch, tie), 3, &mut p);
    let toks = tokens(B * T, 13, 5);
    let mask: Vec<f32> = (0..B * T)
        .map(|i| if i % T >= 2 { 1.0 } else { 0.0 })
        .collect();
    let adv = seq(B * T, 1.0, 8);
    // Behaviour/ref logprobs near the model's own so the ratio is ~1 (away from clip kinks).
    let (_, _) = (0, 0);
    let base_lp = {
        let al = ActLayout::new(&model.cfg, B, T, None);
        let mut acts = vec![0.0; al.total_len()];
        forward(&model, None, &toks, &al, &mut acts, true).unwrap();
        let lo = al.logits_offset();
        let mut lp = vec![0.0; B * T];
        apply_loss(
            &mut acts[lo..lo + B * T * 13],
            13,
            &toks,
            T,
            &mask,
            &Loss::Sft,
            None,
            &mut lp,
        )
        .unwrap();
        lp
    };
    let old: Vec<f32> = base_lp
        .iter()
        .zip(seq(B * T, 0.05, 9))
        .map(|(a, b)| a + b)
        .collect();
    let rf: Vec<f32> = base_lp
        .iter()
        .zip(seq(B * T, 0.5, 10))
        .map(|(a, b)| a + b)
        .collect();
    let loss = if policy {
        Loss::Policy {
            cfg: PolicyLossConfig {
                clip_low: 0.2,
                clip_high: 0.28,
                kl_coef: 0.3,
                ..PolicyLossConfig::default()
            },
            advantages: &adv,
            old_logprobs: &old,
            ref_logprobs: Some(&rf),
        }
    } else {
        Loss::Sft
    };
    let (_, g) = loss_and_grads(&model, None, &toks, &mask, &loss, true);
    let scale = g.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 1e-3, "gradients are all ~0");
    let entries = model.layout.entries().to_vec();
    let eps = 1e-2f32;
    let mut checked = 0;
    for e in &entries {
        // A few elements of every tensor, so every parameter kind is covered.
        let r = e.range();
        for j in 0..3 {
            let i = r.start + (j * 7919 + 13) % r.len();
            let orig = model.weights.as_slice()[i];
            model.weights.as_mut_slice()[i] = orig + eps;
            let (lp_, _) = loss_and_grads(&model, None, &toks, &mask, &loss, false);
            model.weights.as_mut_slice()[i] = orig - eps;
            let (lm_, _) = loss_and_grads(&model, None, &toks, &mask, &loss, false);
            model.weights.as_mut_slice()[i] = orig;
            let fd = ((lp_ - lm_) / (2.0 * eps as f64)) as f32;
            assert_close(&format!("{}[{}]", e.name, i - r.start), g[i], fd, scale);
            checked += 1;
        }
    }
    assert!(checked >= 3 * entries.len());
}

#[test]
fn full_model_sft_gradients_llama_untied() {
    check_full(Arch::Llama, false, false);
}

#[test]
fn full_model_policy_kl_gradients_qwen2_tied() {
    check_full(Arch::Qwen2, true, true);
}

#[test]
fn lora_gradients_match_and_base_is_untouched() {
    let mut p = VecProvider::new();
    let model = random_model(tiny_cfg(Arch::Qwen2, false), 4, &mut p);
    let cfg = LoraConfig {
        r: 2,
        alpha: 4.0,
        targets: ALL_TARGETS.to_vec(),
        base_model: "tiny".into(),
    };
    let mut ad = LoraAdapter::new(&model.cfg, cfg, &mut p).unwrap();
    let vals = seq(ad.layout.total_len(), 0.3, 21);
    ad.weights.as_mut_slice().copy_from_slice(&vals);
    let toks = tokens(B * T, 13, 6);
    let mask = vec![1.0; B * T];
    let (_, g) = loss_and_grads(&model, Some(&ad), &toks, &mask, &Loss::Sft, true);
    let scale = g.iter().fold(0f32, |m, x| m.max(x.abs()));
    let eps = 1e-2f32;
    for e in ad.layout.entries().to_vec() {
        let r = e.range();
        for j in 0..2 {
            let i = r.start + (j * 31 + 1) % r.len();
            let orig = ad.weights.as_slice()[i];
            ad.weights.as_mut_slice()[i] = orig + eps;
            let (lp_, _) = loss_and_grads(&model, Some(&ad), &toks, &mask, &Loss::Sft, false);
            ad.weights.as_mut_slice()[i] = orig - eps;
            let (lm_, _) = loss_and_grads(&model, Some(&ad), &toks, &mask, &Loss::Sft, false);
            ad.weights.as_mut_slice()[i] = orig;
            let fd = ((lp_ - lm_) / (2.0 * eps as f64)) as f32;
            assert_close(&e.name, g[i], fd, scale);
        }
    }
}
