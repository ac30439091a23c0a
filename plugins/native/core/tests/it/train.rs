//! Trainer behaviour: SFT memorises a batch, LoRA mode trains only the adapter, the policy
//! loss raises the logprob of positively-advantaged tokens and lowers negative ones.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, tokens};
use tandem_native_core::buffer::{BufferTag, VecProvider};
use tandem_native_core::config::Arch;
use tandem_native_core::lora::{LoraAdapter, LoraConfig, Target};
use tandem_native_core::loss::{Loss, LossStats, PolicyLossConfig};
use tandem_native_core::trainer::{Batch, Trainer};

const B: usize = 4;
const T: usize = 8;

/// SFT on `B` sequences of `T` tokens (salt `salt`, none masked), `1 + steps` times: the
/// losses of the first and the last step.
fn sft_steps(
    tr: &mut Trainer,
    salt: u64,
    steps: usize,
    p: &mut VecProvider,
) -> (LossStats, LossStats) {
    let toks = tokens(B * T, 13, salt);
    let mask = vec![1.0; B * T];
    let batch = Batch {
        tokens: &toks,
        b: B,
        t: T,
        mask: &mask,
    };
    let first = tr.train_step(&batch, &Loss::Sft, p).unwrap().0;
    let mut last = first;
    for _ in 0..steps {
        last = tr.train_step(&batch, &Loss::Sft, p).unwrap().0;
    }
    (first, last)
}

#[test]
fn sft_full_finetune_memorises_a_batch() {
    let mut p = VecProvider::new();
    let model = random_model(common::tiny_cfg(Arch::Qwen2, false), 1, &mut p);
    let mut tr = common::trainer(model, None, 1e-2, &mut p);
    let (first, last) = sft_steps(&mut tr, 3, 60, &mut p);
    assert!(
        first.loss > 2.0,
        "random init should be near ln(13): {}",
        first.loss
    );
    assert!(
        last.loss < 0.3 * first.loss,
        "loss {} -> {}",
        first.loss,
        last.loss
    );
    assert_eq!(tr.opt.step, 61);
    // Full fine-tuning checkpoints are HF model directories; an engine can take the weights.
    let dir = tempfile::tempdir().unwrap();
    tr.save_checkpoint(&dir.path().join("ck")).unwrap();
    let mut back = tandem_native_core::model::Model::load(&dir.path().join("ck"), &mut p).unwrap();
    assert_eq!(back.w(), tr.model.w());
    back.tensor_mut("model.norm.weight").unwrap().fill(0.5);
    assert!(
        back.tensor("model.norm.weight")
            .unwrap()
            .iter()
            .all(|&x| x == 0.5)
    );
    assert!(back.tensor("nope").is_err());
    back.copy_weights_from(tr.model.w()).unwrap();
    assert_eq!(back.w(), tr.model.w());
    assert!(back.copy_weights_from(&[0.0; 3]).is_err());
}

#[test]
fn lora_mode_trains_only_the_adapter() {
    let mut p = VecProvider::new();
    let model = random_model(common::tiny_cfg(Arch::Llama, true), 2, &mut p);
    let base = model.w().to_vec();
    let lc = LoraConfig {
        r: 4,
        alpha: 8.0,
        targets: vec![Target::Q, Target::K, Target::V, Target::O, Target::Up],
        base_model: "t".into(),
    };
    let mut ad = LoraAdapter::new(&model.cfg, lc, &mut p).unwrap();
    ad.init_a(9);
    let mut tr = common::trainer(model, Some(ad), 2e-2, &mut p);
    let (first, last) = sft_steps(&mut tr, 4, 40, &mut p);
    assert!(
        last.loss < 0.8 * first.loss,
        "loss {} -> {}",
        first.loss,
        last.loss
    );
    assert_eq!(tr.model.w(), &base[..], "base weights must stay frozen");
    // The checkpoint of a LoRA trainer is a PEFT adapter that loads back identically.
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("step-40");
    tr.save_checkpoint(&ck).unwrap();
    tr.save_checkpoint(&ck).unwrap(); // overwriting an existing checkpoint works
    let back = LoraAdapter::load(&ck, &tr.model.cfg, &mut p).unwrap();
    let ad = tr.lora.as_ref().unwrap();
    assert_eq!(back.weights.as_slice(), ad.weights.as_slice());
    assert!(!dir.path().join(".step-40.tmp").exists());
    // Gradients and moments exist for the adapter only: no base-sized buffer is allocated
    // (or walked by clipping and AdamW) in LoRA mode.
    let n = tr.lora.as_ref().unwrap().layout.total_len();
    assert_eq!(tr.grads().len(), n);
    assert_eq!(tr.moments().0.len(), n);
    assert_eq!(tr.moments().1.len(), n);
    let grads: usize = [BufferTag::Grads, BufferTag::Optimizer]
        .into_iter()
        .map(|t| p.bytes(t))
        .sum();
    assert_eq!(grads, 3 * 4 * n, "grads + optimizer bytes in LoRA mode");
}

#[test]
fn policy_loss_moves_logprobs_with_the_advantage_sign() {
    let mut p = VecProvider::new();
    let model = random_model(common::tiny_cfg(Arch::Qwen2, true), 3, &mut p);
    let mut tr = common::trainer(model, None, 3e-3, &mut p);
    tr.max_grad_norm = Some(1.0);
    let toks = tokens(B * T, 13, 5);
    let mask: Vec<f32> = (0..B * T)
        .map(|i| if i % T >= 4 { 1.0 } else { 0.0 })
        .collect();
    // Sequences 0,1 rewarded; 2,3 penalised.
    let adv: Vec<f32> = (0..B * T)
        .map(|i| if i / T < 2 { 1.0 } else { -1.0 })
        .collect();
    let batch = Batch {
        tokens: &toks,
        b: B,
        t: T,
        mask: &mask,
    };
    tr.zero_grad();
    tr.accumulate(&batch, &Loss::Sft, None, &mut p).unwrap();
    let old = tr.last_logprobs().to_vec();
    // Forward-only logprobs agree with the ones of the training forward, and touch no grads.
    let grads_before = tr.grads().to_vec();
    let fwd = tr.logprobs(&batch, &mut p).unwrap();
    assert_eq!(tr.grads(), &grads_before[..]);
    for (a, b) in fwd.iter().zip(&old) {
        assert!((a - b).abs() < 1e-6);
    }
    let cfg = PolicyLossConfig {
        clip_low: 0.2,
        clip_high: 0.2,
        kl_coef: 0.0,
        ..PolicyLossConfig::default()
    };
    let loss = Loss::Policy {
        cfg,
        advantages: &adv,
        old_logprobs: &old,
        ref_logprobs: None,
    };
    let mut stats = None;
    for _ in 0..3 {
        stats = Some(tr.train_step(&batch, &loss, &mut p).unwrap());
    }
    let (ls, ss) = stats.unwrap();
    assert!(ss.applied && ss.grad_norm > 0.0);
    assert!(ls.tokens == (B * 4) as f64);
    tr.zero_grad();
    tr.accumulate(&batch, &Loss::Sft, None, &mut p).unwrap();
    let new = tr.last_logprobs();
    let sum = |s: usize| {
        (0..T)
            .filter(|j| *j >= 4)
            .map(|j| new[s * T + j] - old[s * T + j])
            .sum::<f32>()
    };
    assert!(
        sum(0) + sum(1) > 0.0,
        "rewarded sequences should gain logprob"
    );
    assert!(
        sum(2) + sum(3) < 0.0,
        "penalised sequences should lose logprob"
    );
}
