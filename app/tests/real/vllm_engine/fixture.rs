//! Fixtures and helpers of the `vllm_engine` tests.

#![allow(dead_code)]

use crate::common::*;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;
use tandem_plugin_api::{
    ComponentConfig, EngineBox, GenerateRequest, GenerateResponse, LossKind, PauseMode, RString,
    RVec, SamplingParams, TrainBatch, UpdateKind, WeightUpdate,
};
use tandem_runtime::registry::Registry;
use tandem_services::Services;

pub(crate) const PROMPT: [u32; 4] = [1, 40, 41, 42];
pub(crate) const EOS: u32 = 2;

pub(crate) fn python() -> String {
    python_env("vllm_engine")
}

/// Tiny model (`tandem model init`) + a plugin dir holding only `libtandem_vllm.so`; the
/// components' run directory is `<dir>/run`.
pub(crate) fn fixture() -> &'static ModelFixture {
    static F: OnceLock<ModelFixture> = OnceLock::new();
    F.get_or_init(|| model_fixture(3, &[(&cdylib("tandem_vllm"), "libtandem_vllm.so")]))
}

pub(crate) fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| discover(&fixture().plugins))
}

pub(crate) fn config(component: &str, model: &Path, options: &str) -> ComponentConfig {
    cpu_config(component, model, options, &fixture().dir.join("run"))
}

/// Options of the shared server configuration (the plugin picks a free port).
pub(crate) fn shared_options() -> String {
    format!(
        r#"{{"python": "{}", "max_model_len": 1024, "enable_lora": true, "max_lora_rank": 8,
            "request_timeout_s": 120, "control_timeout_s": 60}}"#,
        python(),
    )
}

/// `http://127.0.0.1:PORT` of the vLLM server this process runs now (at most one runs at a
/// time): the `--port` on the command line of the newest vLLM process descended from this
/// one, read from `/proc` — the port the plugin chose, with no port reserved in advance.
pub(crate) fn shared_url() -> String {
    let me = std::process::id();
    let stat = |pid: u32| -> Option<(u32, u64)> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the `(comm)`: state ppid ... starttime is field 22 of the whole line.
        let rest: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
        Some((rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
    };
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let descends = |mut pid: u32| {
        for _ in 0..64 {
            match stat(pid) {
                Some((ppid, _)) if ppid == me => return true,
                Some((ppid, _)) if ppid > 1 => pid = ppid,
                _ => return false,
            }
        }
        false
    };
    let mut servers: Vec<(u64, u16)> = pids
        .into_iter()
        .filter(|&pid| descends(pid))
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmd
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !args.iter().any(|a| a.contains("vllm")) {
                return None;
            }
            let at = args.iter().position(|a| a == "--port")?;
            Some((stat(pid)?.1, args.get(at + 1)?.parse().ok()?))
        })
        .collect();
    servers.sort();
    let (_, port) = servers
        .last()
        .unwrap_or_else(|| panic!("no vLLM server with --port runs under this process"));
    format!("http://127.0.0.1:{port}")
}

/// The shared engine slot; the guard also serialises the tests.
pub(crate) static SHARED: Mutex<Option<Arc<EngineBox>>> = Mutex::new(None);

pub(crate) fn lock_shared() -> MutexGuard<'static, Option<Arc<EngineBox>>> {
    SHARED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The shared engine, started on first use and serving (a failed test may leave it paused).
pub(crate) fn shared(slot: &mut Option<Arc<EngineBox>>) -> &Arc<EngineBox> {
    if let Some(e) = slot.as_ref()
        && ok(e.stats()).state.as_str() == "paused"
    {
        ok(e.continue_generation());
    }
    slot.get_or_insert_with(|| {
        let t = Instant::now();
        let e = registry()
            .new_engine(
                config("vllm", &fixture().model, &shared_options()),
                Services::new().handle(),
            )
            .unwrap();
        ok(e.start());
        eprintln!(
            "vllm: shared server started in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Arc::new(e)
    })
}

/// Stops the shared server so another configuration can run (one server at a time).
pub(crate) fn stop_shared(slot: &mut Option<Arc<EngineBox>>) {
    if let Some(e) = slot.take() {
        ok(e.shutdown());
    }
}

pub(crate) fn greedy(
    prompts: Vec<Vec<u32>>,
    max_tokens: u32,
    adapter: Option<&str>,
) -> GenerateRequest {
    GenerateRequest {
        prompts: prompts.into_iter().map(RVec::from).collect(),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens,
            stop_token_ids: vec![EOS].into(),
            ..SamplingParams::default()
        },
        adapter: adapter.map(RString::from).into(),
    }
}

/// Greedy tokens, logprobs and scores of the native engine through `tandem generate`.
pub(crate) fn native_generate(extra: &[&str]) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let ids = PROMPT.map(|t| t.to_string()).join(",");
    let out = run(tandem()
        .args([
            "generate",
            "--json",
            "--greedy",
            "--score",
            "--max-tokens",
            "8",
        ])
        .args(["--prompt-ids", &ids])
        .arg("--model")
        .arg(&fixture().model)
        .args(extra));
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let nums = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    (
        nums("tokens").into_iter().map(|t| t as u32).collect(),
        nums("logprobs").into_iter().map(|x| x as f32).collect(),
        nums("score").into_iter().map(|x| x as f32).collect(),
    )
}

pub(crate) fn first(r: &GenerateResponse) -> (Vec<u32>, Vec<f32>) {
    let c = &r.completions[0];
    (c.tokens.to_vec(), c.logprobs.to_vec())
}

pub(crate) fn sft(tokens: &[u32], lr: f32) -> TrainBatch {
    batch_of(vec![seq(tokens, 2)], LossKind::Sft, lr)
}

/// A native trainer (`options`) trained a few SFT steps, and its export of `kind`.
pub(crate) fn native_export(options: &str, kind: UpdateKind, run_dir: &Path) -> WeightUpdate {
    let mut cfg = config("native", &fixture().model, options);
    cfg.run_dir = run_dir.display().to_string().into();
    let mut trainer = registry()
        .new_trainer(cfg, Services::new().handle())
        .unwrap();
    ok(trainer.init());
    let batch = sft(&[1, 40, 41, 42, 43, 44, 45, 46, 2], 1e-2);
    for _ in 0..3 {
        ok(trainer.train_step(batch.clone()));
    }
    ok(trainer.export_weight_update(kind))
}

/// The native engine with `update` applied: greedy tokens and logprobs for `adapter`.
pub(crate) fn native_engine_with(
    update: &WeightUpdate,
    adapter: Option<&str>,
) -> (Vec<u32>, Vec<f32>) {
    let e = registry()
        .new_engine(
            config("native", &fixture().model, ""),
            Services::new().handle(),
        )
        .unwrap();
    apply_paused(&e, update.clone());
    first(&ok(e.generate(greedy(vec![PROMPT.to_vec()], 8, adapter))))
}

pub(crate) fn metric(e: &EngineBox, name: &str) -> f64 {
    metric_value(&ok(e.stats()).metrics, name)
}

pub(crate) fn start_error(model: &Path, options: &str) -> String {
    let e = registry().new_engine(config("vllm", model, options), Services::new().handle());
    let msg = match e {
        Err(e) => e.to_string(),
        Ok(engine) => err(engine.start()).to_string(),
    };
    assert_eq!(msg.lines().count(), 1, "{msg}");
    msg
}

/// Applies an update the way the contract allows: paused, then serving again.
pub(crate) fn apply_paused(e: &EngineBox, update: WeightUpdate) -> tandem_plugin_api::UpdateReport {
    ok(e.pause_generation(PauseMode::Wait));
    let report = ok(e.apply_weight_update(update));
    ok(e.continue_generation());
    report
}

/// Scores `ids` (logprob of every token after the first) with transformers'
/// `AutoModelForCausalLM` on `dir` as it is, and encodes `text` with its `AutoTokenizer`.
const HF_SCORE: &str = r#"
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, ids, text = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tk = AutoTokenizer.from_pretrained(d)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
with torch.no_grad():
    lp = torch.log_softmax(m(torch.tensor([ids])).logits[0].float(), -1)
print(json.dumps({"score": [lp[i - 1, ids[i]].item() for i in range(1, len(ids))],
                  "text_ids": tk(text)["input_ids"], "bos": tk.bos_token_id,
                  "eos": tk.eos_token_id}))
"#;

/// What transformers makes of a model directory ([`HF_SCORE`]).
pub(crate) struct HfView {
    pub score: Vec<f32>,
    pub text_ids: Vec<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
}

pub(crate) fn hf_view(dir: &Path, ids: &[u32], text: &str) -> HfView {
    let out = run(std::process::Command::new(python())
        .args(["-c", HF_SCORE])
        .arg(dir)
        .arg(serde_json::to_string(ids).unwrap())
        .arg(text)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1"));
    assert!(out.status.success(), "transformers: {}", stderr(&out));
    let line = stdout(&out);
    let v: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    let nums = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    HfView {
        score: nums("score").into_iter().map(|x| x as f32).collect(),
        text_ids: nums("text_ids").into_iter().map(|x| x as u32).collect(),
        bos: v["bos"].as_u64().map(|x| x as u32),
        eos: v["eos"].as_u64().map(|x| x as u32),
    }
}

/// `tandem generate --json <args>` on `model`.
pub(crate) fn generate_on(model: &Path, args: &[&str]) -> serde_json::Value {
    let out = run(tandem()
        .args(["generate", "--json", "--greedy", "--max-tokens", "8"])
        .arg("--model")
        .arg(model)
        .args(args));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

/// A `u32` array of a `tandem generate` JSON object.
pub(crate) fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The checkpoint of a one-step `tandem run` (native engine and trainer, tiny model) in a
/// scratch directory kept for the process: a model directory exactly as Tandem writes it.
pub(crate) fn tandem_run_checkpoint() -> std::path::PathBuf {
    let t = crate::common::rl::Scratch::new();
    let job = t.job(&crate::common::rl::JobOpts {
        steps: 1,
        ..Default::default()
    });
    let out = t.run(&job, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ck = t.dir.join("run/checkpoints/step-000001");
    let keep = process_scratch("vllm-tandem-checkpoint").join("step-000001");
    let _ = std::fs::remove_dir_all(&keep);
    std::fs::rename(&ck, &keep).unwrap();
    keep
}
