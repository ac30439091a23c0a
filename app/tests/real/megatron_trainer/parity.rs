//! The converter against HF transformers on every model shape it maps: the tied Llama of
//! `tandem model init`, an untied Llama (8 heads, 2 KV groups) and a Qwen2 with qkv biases
//! (`plugins/megatron/python/checks/make_models.py`), at TP=1 and TP=2 under torchrun:
//! full logits ≤ 1e-5 and HF → Megatron → HF bit-exact (`checks/parity.py`).

use crate::common::*;
use crate::torchrun_fixture::*;
use std::path::Path;
use std::process::Command;

fn checks() -> std::path::PathBuf {
    workspace_root().join("plugins/megatron/python/checks")
}

fn python_cmd(script: &str) -> Command {
    let mut c = Command::new(python());
    c.current_dir(checks())
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONWARNINGS", "ignore")
        .env("HF_HUB_OFFLINE", "1")
        .env(
            "PYTHONPATH",
            workspace_root().join("plugins/support/python"),
        )
        .arg(script);
    c
}

fn parity(tp: u32, models: &[&Path]) -> Vec<serde_json::Value> {
    let mut cmd = python_cmd("-m");
    cmd.args(["torch.distributed.run", "--standalone"])
        .arg(format!("--nproc-per-node={tp}"))
        .args(["parity.py", "--tp", &tp.to_string(), "--hf"])
        .args(models);
    let out = run(&mut cmd);
    assert!(out.status.success(), "parity.py tp={tp}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(super) fn i_logits_match_hf_transformers_and_round_trip_for_llama_and_qwen2_at_tp_1_and_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(python_cmd("make_models.py").arg(dir.path()));
    assert!(out.status.success(), "make_models.py: {}", stderr(&out));
    let untied = dir.path().join("llama-untied");
    let qwen = dir.path().join("qwen2");
    let models = [fixture().model.as_path(), untied.as_path(), qwen.as_path()];
    for tp in [1, 2] {
        let results = parity(tp, &models);
        assert_eq!(results.len(), models.len(), "{results:?}");
        for r in &results {
            eprintln!(
                "tp={tp} {} ({}, tied {}): logits max |Δ| {:.2e} (max |logit| {:.2}), round trip bit-exact {} ({} tensors)",
                r["model"],
                r["arch"],
                r["tied"],
                r["logits_max_abs_diff"].as_f64().unwrap(),
                r["logits_max_abs"].as_f64().unwrap(),
                r["roundtrip_bit_exact"],
                r["roundtrip_tensors"]
            );
            assert!(r["logits_max_abs_diff"].as_f64().unwrap() <= 1e-5, "{r}");
            assert_eq!(r["roundtrip_bit_exact"], true, "{r}");
        }
        let archs: Vec<&str> = results
            .iter()
            .map(|r| r["arch"].as_str().unwrap())
            .collect();
        assert_eq!(
            archs,
            ["LlamaForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM"]
        );
    }
}
