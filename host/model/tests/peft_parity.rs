//! `tandem_model::merge` against PEFT: a small random Llama base (F32 and BF16) and a PEFT
//! adapter with random `B` (plain LoRA on two projections, rsLoRA on all seven), both written
//! by PEFT; the merge's weights equal PEFT's `merge_and_unload()` and the merged model's
//! logprobs equal the unmerged PEFT model's, loaded by `AutoModelForCausalLM` as it is.
//!
//! Needs the Python environment of `python/requirements-cpu.lock` (torch, transformers, peft):
//! ```sh
//! export TANDEM_REF_PYTHON="$(bash scripts/setup-python.sh | tail -n1)"
//! cargo test -p tandem-model --test peft_parity -- --ignored
//! ```
//! `.ci/run` runs it in its HF-parity step; in a plain `cargo test` it is reported ignored.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use tandem_model::merge::{MergeOptions, merge_lora};

fn python(args: &[&str], dir: &Path) -> String {
    let python = std::env::var("TANDEM_REF_PYTHON").expect(
        "set TANDEM_REF_PYTHON: export TANDEM_REF_PYTHON=\"$(bash scripts/setup-python.sh | tail -n1)\"",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peft_parity.py");
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .arg(dir)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "peft_parity.py {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
#[ignore = "needs TANDEM_REF_PYTHON (torch + transformers + peft)"]
fn merges_equal_peft_merge_and_unload() {
    let dir = tempfile::tempdir().unwrap();
    python(&["make"], dir.path());
    for (case, rank, scale) in [("f32-rslora", 4, 4.0), ("bf16-lora", 8, 2.0)] {
        let d = dir.path().join(case);
        let r = merge_lora(
            &d.join("base"),
            &d.join("adapter"),
            &d.join("merged"),
            &MergeOptions::default(),
        )
        .unwrap();
        assert_eq!((r.rank, r.scale), (rank, scale), "{case}");
        for f in ["config.json", "generation_config.json"] {
            assert!(d.join("merged").join(f).is_file(), "{case}: {f}");
        }
    }
    let report = python(&["check"], dir.path());
    let v: serde_json::Value = serde_json::from_str(report.lines().last().unwrap()).unwrap();
    eprintln!("peft parity: {v}");
    let f32 = &v["f32-rslora"];
    assert!(f32["weights"].as_f64().unwrap() <= 1e-6, "{f32}");
    assert!(f32["logprobs"].as_f64().unwrap() <= 1e-5, "{f32}");
    // PEFT adds a BF16-rounded delta to BF16 weights, the merge rounds W + delta once: at
    // most one BF16 step apart (measured: identical).
    let bf16 = &v["bf16-lora"];
    assert!(bf16["weights"].as_f64().unwrap() <= 1e-3, "{bf16}");
    for case in ["f32-rslora", "bf16-lora"] {
        let effect = v[case]["adapter_effect"].as_f64().unwrap();
        assert!(
            effect > 1e-2,
            "{case}: the adapter changed nothing ({effect})"
        );
    }
}
