//! Fixtures and helpers of the `native_cli` tests.

#![allow(dead_code)]

use crate::common::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One tiny model shared by the tests (written once by `tandem model init`).
pub(crate) fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = process_scratch("native-cli-model").join("m");
        init_model("tiny", 3, &dir);
        dir
    })
}

pub(crate) fn generate(extra: &[&str]) -> serde_json::Value {
    let out = run(tandem()
        .args([
            "generate",
            "--json",
            "--prompt-ids",
            "1,40,41,42",
            "--max-tokens",
            "8",
        ])
        .arg("--model")
        .arg(model_dir())
        .args(extra));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).expect("one JSON object")
}

pub(crate) fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// `RssShmem` of this process in bytes (memfd regions are shared memory).
pub(crate) fn rss_shmem() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("RssShmem")
        * 1024
}

/// Σ (now − before) over the tokens: how much a step raised a sequence's logprobs.
pub(crate) fn summed_change(now: &[f32], before: &[f32]) -> f32 {
    now.iter().zip(before).map(|(n, o)| n - o).sum()
}
