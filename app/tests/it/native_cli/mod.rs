//! The built-in `native` plugin end to end: `tandem model init` and `tandem generate` through
//! the binary, the cdylib build of the same plugin loading (and clashing by name with the
//! built-in), and an in-process engine with real host memory services releasing and resuming
//! its `kv_cache` and `weights` regions.

mod fixture;

use crate::common::*;
use fixture::*;
use std::path::Path;
use tandem_memory::{ManagerConfig, MemoryManager};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::ModelConfig;
use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
use tandem_plugin_api::{
    ErrorCode, GenerateRequest, PauseMode, PluginError, ROption, RResult, RString, RVec,
    SamplingParams,
};
use tandem_runtime::registry::Registry;
use tandem_services::Services;

#[test]
fn greedy_generation_is_deterministic_and_json_has_tokens_and_logprobs() {
    let a = generate(&["--greedy"]);
    let b = generate(&["--greedy"]);
    assert_eq!(a["tokens"], b["tokens"]);
    let tokens = a["tokens"].as_array().expect("tokens");
    assert!(!tokens.is_empty());
    let lp = floats(&a["logprobs"]);
    assert_eq!(lp.len(), tokens.len());
    assert!(lp.iter().all(|&x| x <= 0.0 && x.is_finite()), "{lp:?}");
    assert!(a["text"].is_string());
    // Sampling with a seed is reproducible and differs from another seed somewhere.
    let s1 = generate(&["--temperature", "1.5", "--seed", "11"]);
    assert_eq!(
        s1["tokens"],
        generate(&["--temperature", "1.5", "--seed", "11"])["tokens"]
    );
}

#[test]
fn score_matches_generation_logprobs() {
    let g = generate(&["--greedy", "--score"]);
    let lp = floats(&g["logprobs"]);
    let score = floats(&g["score"]);
    let prompt_len = g["prompt_ids"].as_array().expect("prompt").len();
    assert_eq!(score.len(), prompt_len + lp.len() - 1);
    for (i, l) in lp.iter().enumerate() {
        let s = score[prompt_len - 1 + i];
        assert!(
            (s - l).abs() <= 1e-4,
            "token {i}: score {s} vs generate {l}"
        );
    }
}

#[test]
fn an_adapter_saved_by_the_core_changes_the_output() {
    let cfg = ModelConfig::from_dir(model_dir()).expect("config");
    let mut ad = LoraAdapter::new(
        &cfg,
        LoraConfig {
            r: 4,
            alpha: 8.0,
            targets: ALL_TARGETS.to_vec(),
            base_model: "tiny".into(),
        },
        &mut VecProvider::new(),
    )
    .expect("adapter");
    for (i, x) in ad.weights.as_mut_slice().iter_mut().enumerate() {
        *x = (((i * 7919) % 1000) as f32 / 1000.0 - 0.5) * 0.4;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    ad.save(dir.path()).expect("save adapter");
    let base = generate(&["--greedy"]);
    let adapted = generate(&["--greedy", "--adapter", &dir.path().display().to_string()]);
    let (lb, la) = (floats(&base["logprobs"]), floats(&adapted["logprobs"]));
    let differs = base["tokens"] != adapted["tokens"] || (lb[0] - la[0]).abs() > 1e-3;
    assert!(differs, "adapter had no effect: {base} vs {adapted}");
    // An adapter dir without its safetensors is one clear line, exit 2.
    std::fs::remove_file(dir.path().join("adapter_model.safetensors")).expect("rm");
    let out = run(tandem()
        .args(["generate", "--prompt-ids", "1,2", "--adapter"])
        .arg(dir.path())
        .arg("--model")
        .arg(model_dir()));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(error_lines(&out).len(), 1, "{}", stderr(&out));
}

#[test]
fn a_corrupt_or_missing_model_is_one_line_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).expect("mkdir");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(model_dir().join(f), bad.join(f)).expect("copy");
    }
    std::fs::write(bad.join("model.safetensors"), b"definitely not safetensors").expect("write");
    for model in [bad.clone(), dir.path().join("missing")] {
        let out = run(tandem()
            .args(["generate", "--prompt-ids", "1,2,3", "--model"])
            .arg(&model));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let lines = error_lines(&out);
        assert_eq!(lines.len(), 1, "{}", stderr(&out));
        assert!(
            lines[0].contains(&model.display().to_string()),
            "{}",
            lines[0]
        );
    }
}

#[test]
fn model_init_refuses_to_overwrite_a_non_empty_dir() {
    let out = run(tandem()
        .args(["model", "init", "--preset", "tiny", "--out"])
        .arg(model_dir()));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stderr(&out));
    assert!(lines[0].contains("not empty"), "{}", lines[0]);
}

#[test]
fn native_is_built_in_and_the_cdylib_declares_it_too() {
    let out = run(tandem().args(["plugins", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let native: serde_json::Value = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .find(|v| v["name"] == "native")
        .expect("native listed");
    assert_eq!(native["source"], "built-in");
    // The cdylib build declares `native` too: a library of a built-in plugin is skipped (the
    // built-in wins), so listing with it in a plugin dir succeeds and shows `native` once.
    let so = cdylib("tandem_native");
    let dir = plugin_dir(&[(&so, "libtandem_native.so")]);
    let out = run(tandem()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(dir.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(error_lines(&out).is_empty(), "{}", stderr(&out));
    let listed: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .collect();
    let natives: Vec<&serde_json::Value> =
        listed.iter().filter(|v| v["name"] == "native").collect();
    assert_eq!(natives.len(), 1, "{}", stdout(&out));
    assert_eq!(natives[0]["source"], "built-in", "{}", stdout(&out));
    let from_dir = dir.path().display().to_string();
    assert!(
        listed
            .iter()
            .all(|v| !v["source"].as_str().unwrap_or("").starts_with(&from_dir)),
        "nothing is loaded from the skipped library: {}",
        stdout(&out)
    );
}

fn ok<T>(r: RResult<T, PluginError>) -> T {
    match r {
        RResult::ROk(v) => v,
        RResult::RErr(e) => panic!("plugin call failed: {e}"),
    }
}

#[test]
fn released_regions_free_memory_and_generation_is_identical_after_resume() {
    // `RssShmem` is process-wide: no other test of this binary allocates meanwhile.
    let _serial = crate::common::process_lock();
    let services = Services::with_memory(MemoryManager::new(ManagerConfig::cpu("test")));
    let host = services.handle();
    let registry = Registry::discover(&[]).expect("registry");
    let options = r#"{"max_batch": 2, "max_seq_len": 64}"#;
    let config = cpu_config("native", model_dir(), options, Path::new(""));
    let engine = registry.new_engine(config, host.clone()).expect("engine");
    let request = GenerateRequest {
        prompts: vec![RVec::from(vec![1u32, 50, 60]), RVec::from(vec![1u32, 7])].into(),
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 50,
            max_tokens: 12,
            seed: ROption::RSome(7),
            ..SamplingParams::default()
        },
        adapter: ROption::RNone,
    };
    let before = ok(engine.generate(request.clone()));
    assert_eq!(before.completions.len(), 2);
    let stats = ok(host.memory_stats());
    let size =
        metric_value(&stats, "size_bytes.weights") + metric_value(&stats, "size_bytes.kv_cache");
    assert!(
        metric_value(&stats, "size_bytes.weights") > 10e6,
        "{stats:?}"
    );
    let resident = metric_value(&stats, "resident_bytes");
    let shmem = rss_shmem();

    ok(engine.pause_generation(PauseMode::Wait));
    let tags: RVec<RString> = vec![RString::from("kv_cache"), RString::from("weights")].into();
    ok(engine.release_memory(tags.clone()));
    let released = ok(host.memory_stats());
    assert_eq!(metric_value(&released, "resident_bytes"), resident - size);
    let freed = shmem.saturating_sub(rss_shmem()) as f64;
    assert!(
        freed >= 0.9 * size,
        "RssShmem dropped by {freed} bytes, released {size}"
    );
    match engine.continue_generation() {
        RResult::RErr(e) => assert_eq!(e.code, ErrorCode::InvalidState),
        RResult::ROk(()) => panic!("continue with released weights must fail"),
    }
    match engine.generate(request.clone()) {
        RResult::RErr(e) => assert_eq!(e.code, ErrorCode::InvalidState, "{e}"),
        RResult::ROk(_) => panic!("generate while paused must fail"),
    }
    ok(engine.resume_memory(tags));
    assert_eq!(
        metric_value(&ok(host.memory_stats()), "resident_bytes"),
        resident
    );
    ok(engine.continue_generation());
    let after = ok(engine.generate(request.clone()));
    ok(engine.pause_generation(PauseMode::Abort));
    match engine.generate(request) {
        RResult::RErr(e) => assert_eq!(e.code, ErrorCode::InvalidState, "{e}"),
        RResult::ROk(_) => panic!("generate after pause(abort) must fail"),
    }
    match engine.pause_generation(PauseMode::Keep) {
        RResult::RErr(e) => assert_eq!(e.code, ErrorCode::NotSupported, "{e}"),
        RResult::ROk(()) => panic!("keep is not declared"),
    }
    ok(engine.continue_generation());
    for (b, a) in before.completions.iter().zip(after.completions.iter()) {
        assert_eq!(b.tokens, a.tokens);
        for (x, y) in b.logprobs.iter().zip(a.logprobs.iter()) {
            assert!((x - y).abs() <= 1e-5, "{x} vs {y}");
        }
    }
    let stats = ok(engine.stats());
    assert_eq!(metric_value(&stats.metrics, "host_regions"), 1.0);
    assert_eq!(stats.state.as_str(), "serving");
}

#[test]
fn trainer_sft_snapshot_export_and_engine_update_agree() {
    // `RssShmem` is process-wide: no other test of this binary allocates meanwhile.
    let _serial = crate::common::process_lock();
    use tandem_plugin_api::{LossKind, TrainBatch, UpdateKind, UpdatePayload, WhichWeights};
    let run_dir = tempfile::tempdir().expect("tempdir");
    let services = Services::with_memory(MemoryManager::new(ManagerConfig::cpu("trainer")));
    let registry = Registry::discover(&[]).expect("registry");
    let config = cpu_config("native", model_dir(), "", run_dir.path());
    let mut trainer = registry
        .new_trainer(config.clone(), services.handle())
        .expect("trainer");
    let info = ok(trainer.init());
    assert_eq!(info.trainable_params, info.total_params);
    let tokens = [1u32, 40, 41, 42, 43, 44, 45, 2];
    let batch = TrainBatch {
        sequences: vec![seq(&tokens, 3)].into(),
        loss: loss(LossKind::Sft, 1e-3),
    };
    let lp0 = ok(trainer.compute_logprobs(batch.clone(), WhichWeights::Current));
    assert_eq!(lp0[0].len(), tokens.len() - 3);
    ok(trainer.snapshot("ref".into()));
    let mut losses = Vec::new();
    for _ in 0..4 {
        let m = ok(trainer.train_step(batch.clone()));
        losses.push(metric_value(&m, "loss"));
    }
    assert!(losses[3] < losses[0], "SFT loss did not fall: {losses:?}");
    let lp_ref = ok(trainer.compute_logprobs(batch.clone(), WhichWeights::Snapshot("ref".into())));
    for (a, b) in lp0[0].iter().zip(lp_ref[0].iter()) {
        assert!(
            (a - b).abs() <= 1e-6,
            "snapshot logprobs {b} vs before training {a}"
        );
    }
    let lp_now = ok(trainer.compute_logprobs(batch.clone(), WhichWeights::Current));
    let gain = summed_change(&lp_now[0], &lp0[0]);
    assert!(
        gain > 0.0,
        "current weights are the trained ones: {lp_now:?}"
    );
    let update = ok(trainer.export_weight_update(UpdateKind::CheckpointDir));
    assert_eq!(update.version, 4);
    match &update.payload {
        UpdatePayload::CheckpointDir { dir } => {
            assert!(Path::new(dir.as_str()).ends_with("weights/v4"), "{dir}");
        }
        other => panic!("unexpected payload {other:?}"),
    }
    // The engine (heap buffers) applies the checkpoint and scores like the trainer.
    let engine = registry
        .new_engine(config, Services::new().handle())
        .expect("engine");
    // Updates are applied to a paused engine (the lifecycle state machine).
    ok(engine.pause_generation(PauseMode::Wait));
    let report = ok(engine.apply_weight_update(update));
    assert_eq!(report.version, 4);
    ok(engine.continue_generation());
    let scored = ok(engine.score(vec![RVec::from(tokens.to_vec())].into()));
    for (i, t) in lp_now[0].iter().enumerate() {
        let e = scored[0][2 + i];
        assert!(
            (e - t).abs() <= 1e-4,
            "token {i}: engine {e} vs trainer {t}"
        );
    }
    assert_eq!(ok(engine.stats()).weight_version, 4);

    // A GRPO step with a positive advantage raises the completion's logprob.
    let mut grpo = batch.clone();
    grpo.loss.kind = LossKind::Grpo;
    grpo.loss.learning_rate = 1e-4;
    grpo.sequences[0].advantage = 1.0;
    grpo.sequences[0].old_logprobs = lp_now[0].clone();
    let m = ok(trainer.train_step(grpo.clone()));
    assert_eq!(metric_value(&m, "applied"), 1.0);
    let lp_grpo = ok(trainer.compute_logprobs(grpo, WhichWeights::Current));
    let up = summed_change(&lp_grpo[0], &lp_now[0]);
    assert!(
        up > 0.0,
        "GRPO with advantage +1 lowered the logprobs: {up}"
    );
}

#[test]
fn lora_trainer_exports_an_adapter_the_engine_applies_and_bad_options_are_one_error() {
    use tandem_plugin_api::{LossKind, TrainBatch, UpdateKind, WhichWeights};
    let run_dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::discover(&[]).expect("registry");
    let config = |options: &str| cpu_config("native", model_dir(), options, run_dir.path());
    let err = registry
        .new_engine(
            config(r#"{"max_batch": 2, "max_sequence": 9}"#),
            Services::new().handle(),
        )
        .err()
        .expect("unknown option refused")
        .to_string();
    assert!(
        err.contains("max_sequence") && err.contains("options"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let lora = r#"{"lora": {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"], "seed": 1}}"#;
    let mut trainer = registry
        .new_trainer(config(lora), Services::new().handle())
        .expect("trainer");
    let info = ok(trainer.init());
    assert!(info.trainable_params < info.total_params / 10, "{info:?}");
    let tokens = [1u32, 40, 41, 42, 43, 44, 2];
    let batch = TrainBatch {
        sequences: vec![seq(&tokens, 2)].into(),
        loss: loss(LossKind::Sft, 1e-2),
    };
    for _ in 0..3 {
        ok(trainer.train_step(batch.clone()));
    }
    match trainer.export_weight_update(UpdateKind::CheckpointDir) {
        RResult::RErr(e) => assert_eq!(e.code, ErrorCode::InvalidInput, "{e}"),
        RResult::ROk(u) => panic!("LoRA trainer exported a checkpoint dir: {u:?}"),
    }
    let update = ok(trainer.export_weight_update(UpdateKind::Adapter));
    let engine = registry
        .new_engine(config(""), Services::new().handle())
        .expect("engine");
    ok(engine.pause_generation(PauseMode::Wait));
    ok(engine.apply_weight_update(update));
    ok(engine.continue_generation());
    let out = ok(engine.generate(GenerateRequest {
        prompts: vec![RVec::from(tokens[..2].to_vec())].into(),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens: 1,
            ..SamplingParams::default()
        },
        adapter: ROption::RSome("native-v3".into()),
    }));
    // The engine with the adapter gives its greedy token the trainer's logprob of that token.
    let first = &out.completions[0];
    let probe = [tokens[0], tokens[1], first.tokens[0]];
    let probe_batch = TrainBatch {
        sequences: vec![seq(&probe, 2)].into(),
        loss: batch.loss.clone(),
    };
    let trained = ok(trainer.compute_logprobs(probe_batch, WhichWeights::Current));
    let (e, t) = (first.logprobs[0], trained[0][0]);
    assert!((e - t).abs() <= 1e-4, "engine+adapter {e} vs trainer {t}");
    // `score` runs under the adapter the update switched to; unloading it reverts to the base.
    let active = ok(engine.score(vec![RVec::from(probe.to_vec())].into()));
    assert!((active[0][1] - t).abs() <= 1e-4, "{active:?} vs {t}");
    ok(engine.unload_adapter("native-v3".into()));
    let base = ok(engine.score(vec![RVec::from(probe.to_vec())].into()));
    assert!(
        (base[0][1] - t).abs() > 1e-3,
        "the adapter changed nothing: {base:?} vs {t}"
    );
    let scored = ok(engine.score(vec![RVec::from(tokens.to_vec())].into()));
    assert_eq!(scored[0].len(), tokens.len() - 1);
}
