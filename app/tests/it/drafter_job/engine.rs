//! The native engine with a drafter, in this process through the plugin registry: greedy
//! output equals the engine's without a drafter — for several prompts at once, with a LoRA
//! adapter, and after a weight update (which only changes how much the drafter is accepted);
//! a drafter that cannot load is refused and the engine keeps serving with what it had; and
//! RL rollouts through `tandem run` that speculate in the tail of each engine's batch
//! (`speculate_below_batch`) with the same greedy tokens, their figures in the metrics.

use crate::common::rl::{JobOpts, OutputText, Scratch};
use std::path::Path;
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::drafter::{Drafter, DrafterInit};
use tandem_native_core::model::Model;
use tandem_plugin_api::{
    ComponentConfig, EngineBox, GenerateRequest, PauseMode, RResult, RString, RVec, SamplingParams,
    UpdatePayload, WeightUpdate,
};
use tandem_runtime::registry::Registry;
use tandem_runtime::services::Services;

fn ok<T>(r: RResult<T, tandem_plugin_api::PluginError>, what: &str) -> T {
    match r {
        RResult::ROk(v) => v,
        RResult::RErr(e) => panic!("{what}: {e:?}"),
    }
}

fn engine(model: &Path, drafter: Option<&Path>) -> EngineBox {
    let registry = Registry::discover(&[]).unwrap();
    let mut options = serde_json::json!({"max_batch": 3, "max_seq_len": 48, "draft_tokens": 3});
    if let Some(d) = drafter {
        options["drafter"] = d.display().to_string().into();
    }
    let config = ComponentConfig {
        component: "native".into(),
        model_path: model.display().to_string().into(),
        options_json: options.to_string().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: RString::new(),
    };
    registry
        .new_engine(config, Services::new().handle())
        .unwrap()
}

fn greedy(e: &EngineBox, adapter: Option<&str>) -> Vec<Vec<u32>> {
    let prompts: Vec<RVec<u32>> = [
        &[1u32, 5, 6, 7][..],
        &[1, 9, 4],
        &[1, 7, 7, 3, 2],
        &[1, 8],
        &[1, 3, 3],
    ]
    .iter()
    .map(|p| RVec::from(p.to_vec()))
    .collect();
    let r = ok(
        e.generate(GenerateRequest {
            prompts: RVec::from(prompts),
            sampling: SamplingParams {
                temperature: 0.0,
                max_tokens: 20,
                ..SamplingParams::default()
            },
            adapter: adapter.map(RString::from).into(),
        }),
        "generate",
    );
    r.completions.iter().map(|c| c.tokens.to_vec()).collect()
}

fn stat(e: &EngineBox, name: &str) -> f64 {
    let s = ok(e.stats(), "stats");
    s.metrics
        .iter()
        .find(|m| m.name.as_str() == name)
        .map_or(f64::NAN, |m| m.value)
}

/// A PEFT adapter for `model` on all projections with random A and B, saved into `out`.
fn lora_for(model: &Path, out: &Path) {
    use tandem_native_core::lora::{ALL_TARGETS, LoraAdapter, LoraConfig};
    let target = Model::load(model, &mut VecProvider::new()).unwrap();
    let cfg = LoraConfig {
        r: 4,
        alpha: 8.0,
        targets: ALL_TARGETS.to_vec(),
        base_model: model.display().to_string(),
    };
    let mut a = LoraAdapter::new(&target.cfg, cfg, &mut VecProvider::new()).unwrap();
    a.init_a(3);
    for (i, x) in a.weights.as_mut_slice().iter_mut().enumerate() {
        if *x == 0.0 {
            *x = ((i as f32 * 0.618_034).fract() - 0.5) * 0.2;
        }
    }
    a.save(out).unwrap();
}

/// An untrained drafter for `model`, saved into `out`.
fn drafter_for(model: &Path, out: &Path, seed: u64) {
    let target = Model::load(model, &mut VecProvider::new()).unwrap();
    let opts = DrafterInit {
        seed,
        ..DrafterInit::default()
    };
    let d = Drafter::init_from_target(&target, opts, &mut VecProvider::new()).unwrap();
    d.save(out).unwrap();
}

#[test]
fn speculative_greedy_output_is_the_models_with_batches_adapters_and_weight_updates() {
    let _serial = crate::common::process_lock();
    let t = Scratch::warm();
    let model = t.dir.join("model");
    let drafter = t.dir.join("drafter");
    drafter_for(&model, &drafter, 1);
    let plain = engine(&model, None);
    let spec = engine(&model, Some(&drafter));
    assert_eq!(stat(&spec, "spec.drafter"), 1.0);
    assert_eq!(greedy(&spec, None), greedy(&plain, None));
    assert!(stat(&spec, "spec.rounds") > 0.0, "it speculated");

    // A LoRA adapter (the verify runs the adapter; the drafter does not know it).
    let adapter = t.dir.join("adapter");
    lora_for(&model, &adapter);
    for e in [&plain, &spec] {
        ok(
            e.load_adapter("a".into(), adapter.display().to_string().into()),
            "load_adapter",
        );
    }
    let with_adapter = greedy(&plain, Some("a"));
    assert_ne!(
        with_adapter,
        greedy(&plain, None),
        "the adapter changes the output"
    );
    assert_eq!(greedy(&spec, Some("a")), with_adapter);

    // A weight update to another model of the same shape: still the model's own output.
    let other = t.dir.join("other");
    let out = t.tandem(&[
        "model",
        "init",
        "--preset",
        "tiny",
        "--seed",
        "9",
        "--out",
        other.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let update = WeightUpdate {
        version: ok(plain.health(), "health").weight_version + 1,
        payload: UpdatePayload::CheckpointDir {
            dir: other.display().to_string().into(),
        },
        digest: RString::new(),
    };
    for e in [&plain, &spec] {
        ok(e.pause_generation(PauseMode::Wait), "pause");
        ok(e.apply_weight_update(update.clone()), "update");
        ok(e.continue_generation(), "continue");
    }
    let (a, b) = (greedy(&spec, None), greedy(&plain, None));
    assert_eq!(a, b);

    // A drafter that cannot load: refused, the engine keeps its drafter and serves.
    let bad = t.dir.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(drafter.join("config.json"), bad.join("config.json")).unwrap();
    std::fs::write(bad.join("model.safetensors"), b"not a safetensors file").unwrap();
    match spec.load_drafter(bad.display().to_string().into()) {
        RResult::ROk(()) => panic!("a corrupt drafter was accepted"),
        RResult::RErr(e) => assert!(e.message.contains("model.safetensors"), "{e:?}"),
    }
    assert_eq!(stat(&spec, "spec.drafter"), 1.0);
    assert_eq!(greedy(&spec, None), b);
    // A drafter of the same shape loads in place.
    let second = t.dir.join("drafter2");
    drafter_for(&model, &second, 2);
    ok(
        spec.load_drafter(second.display().to_string().into()),
        "load_drafter",
    );
    assert_eq!(greedy(&spec, None), b);
}

#[test]
fn an_engine_started_with_an_unusable_drafter_serves_without_it() {
    let _serial = crate::common::process_lock();
    let t = Scratch::new();
    let model = t.dir.join("model");
    let bad = t.dir.join("bad");
    drafter_for(&model, &bad, 1);
    let f = bad.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let e = engine(&model, Some(&bad));
    assert_eq!(stat(&e, "spec.drafter"), 0.0);
    let plain = engine(&model, None);
    assert_eq!(greedy(&e, None), greedy(&plain, None));
}

/// Each line of `<dir>/<file>`.
fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    crate::common::rl::json_lines(path)
}

#[test]
fn rl_rollouts_speculate_in_the_tail_and_generate_the_same_greedy_tokens() {
    let _serial = crate::common::process_lock();
    // An untrained model rarely stops early: long completions, many speculative rounds.
    let t = Scratch::new();
    let drafter = t.dir.join("drafter");
    drafter_for(&t.dir.join("model"), &drafter, 5);
    // Two engines: rank 0 gets 2 groups (8 rows), rank 1 one (4 rows). With drafting only
    // while at most 4 rows decode, rank 1 speculates from its first round and rank 0 only
    // once a group has finished; greedy, so speculation must not change a single token.
    let job = t.job(&JobOpts {
        engines: 2,
        steps: 3,
        prompts: 3,
        max_tokens: 12,
        extra_run: "dump_rollouts = true".into(),
        extra_algorithm: "temperature = 0.0".into(),
        bridge_options: "restart = false".into(),
        ..JobOpts::default()
    });
    let text = std::fs::read_to_string(&job).unwrap();
    let spec_job = t.dir.join("spec.toml");
    let options = format!("max_seq_len = 64\ndrafter = {drafter:?}\nspeculate_below_batch = 4\n");
    std::fs::write(&spec_job, text.replace("max_seq_len = 64\n", &options)).unwrap();
    for (job, out) in [(&job, "plain"), (&spec_job, "spec")] {
        let out = t.run(job, &["--output-dir", out]);
        assert!(out.status.success(), "{}", out.stderr_text());
    }
    let tokens = |run: &str| -> Vec<(u64, Vec<u64>)> {
        json_lines(&t.dir.join(run).join("rollouts.jsonl"))
            .iter()
            .map(|l| {
                let toks = l["tokens"].as_array().unwrap();
                let toks = toks.iter().map(|x| x.as_u64().unwrap()).collect();
                (l["step"].as_u64().unwrap(), toks)
            })
            .collect()
    };
    let plain = tokens("plain");
    assert_eq!(plain.len(), 3 * 3 * 4, "3 steps of 3 groups of 4");
    assert_eq!(
        tokens("spec"),
        plain,
        "speculation changed the greedy rollouts"
    );
    let metrics = |run: &str| json_lines(&t.dir.join(run).join("metrics.jsonl"));
    for m in metrics("plain") {
        assert!(m.get("spec_tokens").is_none() && m.get("acceptance_length").is_none());
    }
    let spec = metrics("spec");
    assert_eq!(spec.len(), 3);
    for (m, p) in spec.iter().zip(metrics("plain")) {
        assert_eq!(m["reward_mean"], p["reward_mean"], "{m}");
        let (n, len) = (
            m["spec_tokens"].as_u64().unwrap(),
            m["acceptance_length"].as_f64(),
        );
        // Rank 1 speculates from its first round (the prefill's token is not a round's).
        assert!(n > 0, "{m}");
        let len = len.unwrap();
        assert!((1.0..=5.0).contains(&len), "{m}");
        println!(
            "step {}: {n} tokens in speculative rounds, acceptance length {len:.2}",
            m["step"]
        );
    }
}
