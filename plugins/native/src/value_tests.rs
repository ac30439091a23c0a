//! The native trainer as a PPO value model and actor through the root module:
//! `compute_values` of a fresh head, `train_step_value` on fixed returns, a restore that
//! predates the head, `train_step_advantages` against `train_step_policy`, and the value head
//! in checkpoints (round trip; a corrupt or missing file is one clear error).

use crate::NativePlugin;
use tandem_conformance::{Source, TrainerHarness, TrainerSetup};
use tandem_plugin_api::sdk::module_of;
use tandem_plugin_api::{
    LossAggregation, Metric, PolicyLoss, RVec, RatioLevel, TokenAdvantages, TrainBatch,
    ValueTargets, WhichWeights,
};

fn harness(tmp: &tempfile::TempDir, options: &str) -> TrainerHarness {
    let mut setup = TrainerSetup::new(
        Source::Module(module_of::<NativePlugin>()),
        "native",
        tmp.path().join("model"),
    )
    .options(options);
    // Completions of 6 and 2 tokens.
    setup.sequences = vec![
        (vec![5, 6, 7, 8, 9, 10, 11, 12], 2),
        (vec![9, 10, 11, 12, 13], 3),
    ];
    TrainerHarness::new(setup).unwrap()
}

fn metric(metrics: &[Metric], name: &str) -> f64 {
    metrics
        .iter()
        .find(|m| m.name.as_str() == name)
        .map(|m| m.value)
        .unwrap_or_else(|| panic!("no metric {name} in {metrics:?}"))
}

/// Fixed returns: a different constant per sequence, rising along the completion.
fn returns(batch: &TrainBatch) -> RVec<RVec<f32>> {
    let rows = batch.sequences.iter().enumerate().map(|(i, s)| {
        let n = s.tokens.len() - s.prompt_len as usize;
        (0..n).map(|j| [0.8f32, -0.5][i] + 0.1 * j as f32).collect()
    });
    rows.collect()
}

fn value_step(h: &mut TrainerHarness, batch: &TrainBatch, targets: &ValueTargets) -> Vec<Metric> {
    let m = h.trainer.train_step_value(batch.clone(), targets.clone());
    m.into_result().unwrap().into_iter().collect()
}

fn values(h: &mut TrainerHarness, batch: &TrainBatch) -> Vec<Vec<f32>> {
    let v = h
        .trainer
        .compute_values(batch.clone())
        .into_result()
        .unwrap();
    v.into_iter().map(|r| r.into_iter().collect()).collect()
}

fn fixed_targets(batch: &TrainBatch) -> ValueTargets {
    ValueTargets {
        returns: returns(batch),
        old_values: RVec::new(),
        clip: 0.0,
    }
}

#[test]
fn a_fresh_value_head_values_zero_and_value_steps_reduce_the_value_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(&tmp, r#"{"init_preset": "tiny"}"#);
    let caps = h.config_caps.clone().unwrap();
    assert!(caps.value_model && caps.token_advantages, "{caps:?}");
    let mut batch = h.batch(None);
    batch.loss.learning_rate = 1e-3;
    h.trainer.snapshot("before".into()).unwrap();
    let before = allocated(&h);
    let v0 = values(&mut h, &batch);
    assert_eq!(v0, vec![vec![0.0; 6], vec![0.0; 2]]);
    // The head is host memory under the weights / grads / optimizer tags: d + 1 parameters.
    let grown: Vec<f64> = allocated(&h)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    assert!(
        grown[0] > 0.0 && grown[1] == grown[0] && grown[2] == 2.0 * grown[0],
        "{grown:?}"
    );
    let targets = fixed_targets(&batch);
    let first = value_step(&mut h, &batch, &targets);
    let v0_loss = metric(&first, "value_loss");
    assert!(metric(&first, "grad_norm") > 0.0);
    assert_eq!(metric(&first, "value_clip_frac"), 0.0);
    let mut last = first;
    for _ in 0..8 {
        last = value_step(&mut h, &batch, &targets);
    }
    let v_loss = metric(&last, "value_loss");
    assert!(v_loss < 0.5 * v0_loss, "value loss {v0_loss} -> {v_loss}");
    assert_eq!(metric(&last, "weight_version"), 9.0);
    // A clipped step: old values far below the returns clip some tokens.
    let now = values(&mut h, &batch);
    let old: RVec<RVec<f32>> = now
        .iter()
        .map(|r| r.iter().map(|v| v - 1.0).collect())
        .collect();
    let clipped = ValueTargets {
        old_values: old,
        clip: 0.05,
        ..targets.clone()
    };
    let m = value_step(&mut h, &batch, &clipped);
    assert!(metric(&m, "value_clip_frac") > 0.0, "{m:?}");
    // A clip without old values is refused in one line.
    let bad = ValueTargets {
        clip: 0.2,
        ..targets.clone()
    };
    let e = h
        .trainer
        .train_step_value(batch.clone(), bad)
        .into_result()
        .unwrap_err();
    assert!(
        e.message.contains("old values") && e.message.lines().count() == 1,
        "{e:?}"
    );
    // Offload and onload keep the head.
    let trained = values(&mut h, &batch);
    let tags = || vec!["weights".into(), "grads".into(), "optimizer".into()].into();
    h.trainer.offload(tags()).unwrap();
    assert!(
        h.trainer
            .compute_values(batch.clone())
            .into_result()
            .is_err()
    );
    h.trainer.onload(tags()).unwrap();
    assert_eq!(values(&mut h, &batch), trained);
    // A snapshot taken before the head existed restores a fresh (zero) head.
    h.trainer.restore("before".into()).unwrap();
    assert_eq!(values(&mut h, &batch), v0);
}

/// `allocated_bytes` of the tags weights, grads, optimizer.
fn allocated(h: &TrainerHarness) -> Vec<f64> {
    let stats = h.trainer.stats().unwrap();
    ["weights", "grads", "optimizer"]
        .iter()
        .map(|t| metric(&stats.metrics, &format!("allocated_bytes.{t}")))
        .collect()
}

#[test]
fn per_token_advantages_equal_to_the_sequence_s_train_exactly_as_train_step_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(&tmp, r#"{"init_preset": "tiny"}"#);
    let lp = h
        .trainer
        .compute_logprobs(h.batch(None), WhichWeights::Current)
        .unwrap();
    let mut batch = h.batch(Some(&lp));
    for s in batch.sequences.iter_mut() {
        s.old_logprobs = s.old_logprobs.iter().map(|x| x - 0.15).collect();
    }
    let rows: RVec<RVec<f32>> = batch
        .sequences
        .iter()
        .map(|s| vec![s.advantage; s.tokens.len() - s.prompt_len as usize].into())
        .collect();
    let adv = TokenAdvantages { rows };
    h.trainer.snapshot("start".into()).unwrap();
    let gspo = PolicyLoss {
        aggregation: LossAggregation::SequenceMean,
        ratio: RatioLevel::Sequence,
        ..PolicyLoss::default()
    };
    for loss in [PolicyLoss::default(), gspo] {
        let mut run = |per_token: bool| {
            h.trainer.restore("start".into()).unwrap();
            let m = if per_token {
                // The per-sequence advantage must be ignored.
                let mut b = batch.clone();
                b.sequences.iter_mut().for_each(|s| s.advantage = 9.0);
                h.trainer.train_step_advantages(b, loss, adv.clone())
            } else {
                h.trainer.train_step_policy(batch.clone(), loss)
            };
            let m: Vec<(String, u64)> = m
                .into_result()
                .unwrap()
                .iter()
                .map(|m| (m.name.to_string(), m.value.to_bits()))
                .collect();
            let after = h
                .trainer
                .compute_logprobs(h.batch(None), WhichWeights::Current)
                .unwrap();
            let bits: Vec<u32> = after.iter().flatten().map(|x| x.to_bits()).collect();
            (m, bits)
        };
        let (policy, per_token) = (run(false), run(true));
        assert_eq!(policy, per_token, "{loss:?}");
    }
    let short = TokenAdvantages {
        rows: vec![RVec::from(vec![1.0f32; 6])].into(),
    };
    let e = h
        .trainer
        .train_step_advantages(batch.clone(), PolicyLoss::default(), short)
        .into_result()
        .unwrap_err();
    assert!(e.message.contains("one row per sequence"), "{e:?}");
}

#[test]
fn checkpoints_carry_the_value_head_and_a_bad_one_is_one_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(&tmp, r#"{"init_preset": "tiny"}"#);
    let mut batch = h.batch(None);
    batch.loss.learning_rate = 1e-2;
    let targets = fixed_targets(&batch);
    for _ in 0..3 {
        value_step(&mut h, &batch, &targets);
    }
    let saved = values(&mut h, &batch);
    assert!(saved.iter().flatten().any(|&v| v != 0.0));
    let ckpt = tmp.path().join("ckpt");
    let dir = ckpt.display().to_string();
    h.trainer.save_checkpoint(dir.clone().into()).unwrap();
    let next = value_step(&mut h, &batch, &targets);
    value_step(&mut h, &batch, &targets);
    assert_ne!(values(&mut h, &batch), saved);
    h.trainer.load_checkpoint(dir.clone().into()).unwrap();
    assert_eq!(values(&mut h, &batch), saved);
    // Resumed training is the same step bit for bit (the head's moments came back too).
    assert_eq!(value_step(&mut h, &batch, &targets), next);
    let file = ckpt.join("value_head.safetensors");
    std::fs::write(&file, b"not a safetensors file").unwrap();
    let e = h
        .trainer
        .load_checkpoint(dir.clone().into())
        .into_result()
        .unwrap_err();
    assert!(
        e.message.contains("value head") && e.message.lines().count() == 1,
        "{e:?}"
    );
    std::fs::remove_file(&file).unwrap();
    let e = h
        .trainer
        .load_checkpoint(dir.into())
        .into_result()
        .unwrap_err();
    assert!(e.message.contains("value_head.safetensors"), "{e:?}");
    assert_eq!(e.message.lines().count(), 1, "{e:?}");
}

#[test]
fn a_lora_critic_trains_its_adapter_and_head() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(
        &tmp,
        r#"{"init_preset": "tiny", "lora": {"rank": 4, "alpha": 8}}"#,
    );
    assert!(h.config_caps.as_ref().is_some_and(|c| c.value_model));
    let mut batch = h.batch(None);
    batch.loss.learning_rate = 1e-2;
    let targets = fixed_targets(&batch);
    let first = metric(&value_step(&mut h, &batch, &targets), "value_loss");
    let mut last = first;
    for _ in 0..8 {
        last = metric(&value_step(&mut h, &batch, &targets), "value_loss");
    }
    assert!(last < 0.5 * first, "value loss {first} -> {last}");
}
