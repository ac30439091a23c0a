//! Environments through `tandem run` and `tandem check`: a dataset with a Python reward that
//! fails in every way a reward can (it sleeps forever, raises, returns NaN, a value out of
//! range or a list of the wrong length, or kills its worker) gives failed samples counted in
//! the metrics and named in `events.jsonl`, a replaced worker and a run that goes on — or
//! one line and a stop past `max_failed_frac`; `--resume` continues at the same data
//! position as an uninterrupted run; bad data is one line from `tandem check`.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod data;
mod rewards;
mod verl;

use crate::common::rl::*;
use std::path::{Path, PathBuf};

/// The rows of the test dataset: `a+b` with the sum as the answer, two data sources.
pub(super) fn rows(n: u32) -> String {
    (0..n)
        .map(|i| {
            let (a, b) = (i % 7, i / 7 % 5);
            let source = if i % 2 == 0 { "even" } else { "odd" };
            format!(
                "{{\"id\": \"row-{i}\", \"prompt\": \"Q: {a}+{b}=? A:\", \"answer\": \"{}\", \"data_source\": \"{source}\"}}\n",
                a + b
            )
        })
        .collect()
}

/// A job on `data.jsonl` of the scratch directory with `reward` as the reward spec (an
/// inline TOML table) and `extra` lines in `[environment]`.
pub(super) fn dataset_job(t: &Scratch, o: &JobOpts, reward: &str, extra: &str) -> PathBuf {
    std::fs::write(t.dir.join("data.jsonl"), rows(40)).unwrap();
    let opts = JobOpts {
        task_options: format!("path = \"data.jsonl\"\nid = \"id\"\nreward = {reward}\n"),
        ..o.clone()
    };
    let path = t.job(&opts);
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "[task]\nkind = \"arithmetic\"\n\n[task.options]",
        &format!("[environment]\nplugin = \"dataset\"\n{extra}\n[environment.options]"),
    );
    assert!(text.contains("[environment]"), "{text}");
    std::fs::write(&path, text).unwrap();
    path
}

/// The lines of `<run>/file` as JSON.
pub(super) fn json_lines(run: &Path, file: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `environment` events of a run with op `op`: `(step, detail)`.
pub(super) fn env_events(run: &Path, op: &str) -> Vec<(u64, String)> {
    json_lines(run, "events.jsonl")
        .into_iter()
        .filter(|e| e["target"] == "environment" && e["op"] == op)
        .map(|e| {
            (
                e["step"].as_u64().unwrap(),
                e["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}
