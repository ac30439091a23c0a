//! The trainer's step (loss positions only, chunked LM head, micro-batches, trimmed padding)
//! against the full-logits path (forward with logits + `apply_loss` + `backward` over the
//! whole padded batch): same loss, logprobs and gradients within float rounding, for
//! micro-batches of 1, 4 and all sequences, a head chunk of one row and of the whole batch,
//! full fine-tuning (untied and tied embeddings) and LoRA; and activations sized once.

use crate::common;

use common::{random_model, seq, tiny_cfg, tokens};
use tandem_native_core::acts::ActLayout;
use tandem_native_core::backward::{Grads, backward};
use tandem_native_core::buffer::{BufferTag, VecProvider};
use tandem_native_core::config::{Arch, ModelConfig};
use tandem_native_core::forward::forward;
use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
use tandem_native_core::loss::{
    Aggregation, Loss, LossStats, PolicyLossConfig, RatioLevel, apply_loss,
};
use tandem_native_core::model::Model;
use tandem_native_core::trainer::{Batch, MicroBatch};

const B: usize = 8;
const T: usize = 9;

/// Right-padded batch: sequence `s` has `3 + s % 6` tokens, prompt of `1 + s % 3`.
fn batch_arrays() -> (Vec<u32>, Vec<f32>) {
    let mut toks = tokens(B * T, 13, 21);
    let mut mask = vec![0f32; B * T];
    for s in 0..B {
        let (p, n) = (1 + s % 3, 3 + s % 6);
        for j in 0..T {
            if j >= n {
                toks[s * T + j] = 0;
            } else if j >= p {
                mask[s * T + j] = 1.0;
            }
        }
    }
    (toks, mask)
}

fn lora_cfg() -> LoraConfig {
    LoraConfig {
        r: 2,
        alpha: 4.0,
        targets: ALL_TARGETS.to_vec(),
        base_model: String::new(),
    }
}

fn build(cfg: &ModelConfig, lora: bool, p: &mut VecProvider) -> (Model, Option<LoraAdapter>) {
    let model = random_model(cfg.clone(), 5, p);
    let ad = lora.then(|| {
        let mut ad = LoraAdapter::new(&model.cfg, lora_cfg(), p).unwrap();
        ad.init_a(3);
        let n = ad.weights.as_slice().len();
        // B nonzero too, so every LoRA gradient is exercised.
        for (w, x) in ad.weights.as_mut_slice().iter_mut().zip(seq(n, 0.1, 4)) {
            if *w == 0.0 {
                *w = x;
            }
        }
        ad
    });
    (model, ad)
}

/// The full-logits path over the whole padded batch: stats, logprobs, gradients.
fn reference(
    cfg: &ModelConfig,
    lora: bool,
    toks: &[u32],
    mask: &[f32],
    loss: &Loss<'_>,
) -> (LossStats, Vec<f32>, Vec<f32>) {
    let mut p = VecProvider::new();
    let (model, ad) = build(cfg, lora, &mut p);
    let al = ActLayout::new(&model.cfg, B, T, ad.as_ref().map(|l| &l.cfg));
    let mut acts = vec![0.0; al.total_len()];
    forward(&model, ad.as_ref(), toks, &al, &mut acts, true).unwrap();
    let (lo, v) = (al.logits_offset(), model.cfg.vocab_size);
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
    let len = ad
        .as_ref()
        .map_or(model.layout.total_len(), |l| l.layout.total_len());
    let mut g = vec![0.0; len];
    let grads = match lora {
        true => Grads {
            base: None,
            lora: Some(&mut g),
        },
        false => Grads {
            base: Some(&mut g),
            lora: None,
        },
    };
    backward(&model, ad.as_ref(), toks, &al, &mut acts, grads).unwrap();
    (st, lp, g)
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |a, x| a.max(x.abs()))
}

fn check(cfg: &ModelConfig, lora: bool, loss: &Loss<'_>, what: &str) {
    let (toks, mask) = batch_arrays();
    let (st0, lp0, g0) = reference(cfg, lora, &toks, &mask, loss);
    let scale = max_abs(&g0);
    assert!(scale > 0.0, "{what}: the reference gradient is zero");
    let batch = Batch {
        tokens: &toks,
        b: B,
        t: T,
        mask: &mask,
    };
    let (v, d) = (cfg.vocab_size, cfg.hidden_size);
    for seqs in [1, 4, B] {
        for head_rows in [1, B * T] {
            let mut p = VecProvider::new();
            let (model, ad) = build(cfg, lora, &mut p);
            let mut tr = common::trainer(model, ad, 1e-3, &mut p);
            tr.micro_batch = MicroBatch {
                sequences: seqs,
                ..MicroBatch::default()
            };
            tr.head_budget_bytes = head_rows * (v + d) * 4;
            tr.zero_grad();
            let st = tr.accumulate(&batch, loss, None, &mut p).unwrap();
            let case = format!("{what}, micro-batches of {seqs}, head chunk {head_rows} rows");
            assert_eq!(st.tokens, st0.tokens, "{case}");
            for (a, b) in [
                (st.loss, st0.loss),
                (st.kl, st0.kl),
                (st.nll, st0.nll),
                (st.clip_frac, st0.clip_frac),
            ] {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{case}: {a} vs {b}"
                );
            }
            for (i, (a, b)) in tr.last_logprobs().iter().zip(&lp0).enumerate() {
                let want = if i % T != 0 && mask[i] != 0.0 {
                    *b
                } else {
                    0.0
                };
                assert!(
                    (a - want).abs() <= 1e-5,
                    "{case}: logprob {i}: {a} vs {want}"
                );
            }
            let g = tr.grads();
            let err = g
                .iter()
                .zip(&g0)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-5 * scale,
                "{case}: max |Δ grad| {err} (largest gradient {scale})"
            );
            // Forward-only logprobs are those of the training pass.
            let fwd = tr.logprobs(&batch, &mut p).unwrap();
            assert_eq!(&fwd[..], tr.last_logprobs(), "{case}");
        }
    }
}

fn policy<'a>(cfg: PolicyLossConfig, adv: &'a [f32], old: &'a [f32], rf: &'a [f32]) -> Loss<'a> {
    Loss::Policy {
        cfg,
        advantages: adv,
        old_logprobs: old,
        ref_logprobs: Some(rf),
    }
}

#[test]
fn sft_full_fine_tuning_matches_the_full_logits_path() {
    check(
        &tiny_cfg(Arch::Llama, false),
        false,
        &Loss::Sft,
        "SFT llama",
    );
    check(
        &tiny_cfg(Arch::Qwen2, true),
        false,
        &Loss::Sft,
        "SFT qwen2 tied",
    );
}

#[test]
fn policy_losses_match_the_full_logits_path() {
    let adv = seq(B * T, 1.0, 8);
    let old = seq(B * T, 0.3, 9)
        .iter()
        .map(|x| x - 2.6)
        .collect::<Vec<_>>();
    let rf = seq(B * T, 0.3, 10)
        .iter()
        .map(|x| x - 2.6)
        .collect::<Vec<_>>();
    let base = PolicyLossConfig {
        kl_coef: 0.1,
        ..PolicyLossConfig::default()
    };
    let gspo = PolicyLossConfig {
        ratio: RatioLevel::Sequence,
        aggregation: Aggregation::SequenceMean,
        ..base
    };
    let dr = PolicyLossConfig {
        aggregation: Aggregation::ConstantLength(8.0),
        ..base
    };
    let cfg = tiny_cfg(Arch::Qwen2, true);
    check(
        &cfg,
        false,
        &policy(base, &adv, &old, &rf),
        "GRPO token-mean",
    );
    check(&cfg, false, &policy(gspo, &adv, &old, &rf), "GSPO");
    check(&cfg, false, &policy(dr, &adv, &old, &rf), "Dr. GRPO");
    check(&cfg, true, &policy(base, &adv, &old, &rf), "GRPO LoRA");
}

#[test]
fn reserved_activations_do_not_grow_over_varied_batches() {
    let mut p = VecProvider::new();
    let cfg = tiny_cfg(Arch::Llama, false);
    let (model, _) = build(&cfg, false, &mut p);
    let mut tr = common::trainer(model, None, 1e-3, &mut p);
    tr.micro_batch = MicroBatch {
        tokens: 2 * T,
        ..MicroBatch::default()
    };
    tr.reserve_activations(2 * T, &mut p).unwrap();
    let before = p.allocations.len();
    let act = p.bytes(BufferTag::Activations);
    let (toks, mask) = batch_arrays();
    for b in [1, 3, B] {
        let batch = Batch {
            tokens: &toks[..b * T],
            b,
            t: T,
            mask: &mask[..b * T],
        };
        tr.train_step(&batch, &Loss::Sft, &mut p).unwrap();
    }
    assert_eq!(
        p.allocations.len(),
        before,
        "{:?}",
        &p.allocations[before..]
    );
    assert_eq!(p.bytes(BufferTag::Activations), act);
}
