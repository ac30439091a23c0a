//! `tandem bench soak`: `examples/drafter.toml` as shipped (its model and run directory moved
//! into a scratch directory), 1000 colocated steps (`--quick`: 40), reporting per worker the
//! memory ledger's drift after step 10 beside its value at step 10 (the ledger is exact
//! accounting: target ≤ 2 %), the memory the workers allocated (`rss_data`: anonymous +
//! shared) — the growth of its median from the early to the late steps beside the early
//! median (target ≤ 8 %), and the growth in the calmer half of the run (a leak grows in both
//! halves; target ≤ 1 %) — and the drafter's acceptance length at the last step beside
//! `draft_tokens + 1` (target ≥ 2.5 tokens, the figure the example's header states).
//!
//! Medians of windows, not single samples: the heap moves by a few MB with fragmentation
//! (an engine's anonymous memory sampled through 760 steps ranged over 11.2–14.1 MB with no
//! trend), so neither one sample nor a window's peak is a baseline.

use super::Figure;
use serde_json::Value;
use std::collections::BTreeMap;
use tandem_cli::error::CliError;
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;

/// The example, as shipped.
const EXAMPLE: &str = include_str!("../../../examples/drafter.toml");
/// Its draft tokens per round: an acceptance length is at most this + 1.
const DRAFT_TOKENS: f64 = 4.0;
/// The acceptance length the example's header states for the trained drafter.
const STATED_ACCEPTANCE: &str = ">= 0.5 (2.5 tokens)";
/// The step whose ledger is the baseline (first allocations are done by then).
const BASELINE_STEP: u64 = 10;
const MIB: f64 = 1024.0 * 1024.0;

/// Runs the benchmark (`quick`: 40 steps).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let steps: u64 = if quick { 40 } else { 1000 };
    super::rl_loop::in_scratch("soak", |tmp| run_in(tmp, steps))
}

fn run_in(tmp: &std::path::Path, steps: u64) -> Result<Vec<Figure>, CliError> {
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    let text = EXAMPLE
        .replace("\"../models/tiny-arith\"", "\"model\"")
        .replace("steps = 1000", &format!("steps = {steps}"))
        .replace("eval_every = 100", &format!("eval_every = {}", steps / 2));
    let run_dir = super::rl_loop::run_text(&registry, tmp, "soak", &text, None, true)?;
    let path = run_dir.join("metrics.jsonl");
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .map_err(CliError::io(format!("reading {}", path.display())))?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Ok(figures(&lines, steps))
}

/// The figures of a run's metrics lines (`steps` steps).
fn figures(lines: &[Value], steps: u64) -> Vec<Figure> {
    let step = |l: &Value| l["step"].as_u64().unwrap_or(0);
    let mut out = Vec::new();
    let base = lines
        .iter()
        .find(|l| step(l) == BASELINE_STEP)
        .map(|l| bytes(l, "ledger"))
        .unwrap_or_default();
    for (worker, was) in &base {
        let drift = lines
            .iter()
            .filter(|l| step(l) > BASELINE_STEP)
            .filter_map(|l| bytes(l, "ledger").get(worker).copied())
            .map(|now| (now - was).abs())
            .fold(0.0, f64::max);
        out.push(
            Figure::new(
                "soak",
                &format!("{worker}: ledger drift after step {BASELINE_STEP}"),
                drift / MIB,
                "MiB",
                was / MIB,
            )
            .limit_name(&format!("ledger at step {BASELINE_STEP}"))
            .target("<= 0.02"),
        );
    }
    let window = (steps / 10).max(1);
    let median_at = |from: u64| median(lines, from, from + window);
    let (early, mid, late) = (
        median_at(BASELINE_STEP),
        median_at(steps / 2 - window / 2),
        median_at(steps - window),
    );
    for (worker, base) in &early {
        let (m, l) = (mid.get(worker).copied(), late.get(worker).copied());
        let (Some(m), Some(l)) = (m, l) else { continue };
        out.push(
            Figure::new(
                "soak",
                &format!("{worker}: allocated memory growth over the run (medians)"),
                (l - base) / MIB,
                "MiB",
                base / MIB,
            )
            .limit_name("early median")
            .target("<= 0.08"),
        );
        out.push(
            Figure::new(
                "soak",
                &format!("{worker}: allocated memory growth in the calmer half"),
                (m - base).min(l - m) / MIB,
                "MiB",
                base / MIB,
            )
            .limit_name("early median")
            .target("<= 0.01 (or 1 MiB)"),
        );
    }
    let acceptance = |s: u64| {
        lines
            .iter()
            .find(|l| step(l) == s)
            .and_then(|l| l["acceptance_length"].as_f64())
    };
    for (s, target) in [(0, None), (steps, Some(STATED_ACCEPTANCE))] {
        if let Some(a) = acceptance(s) {
            let f = Figure::new(
                "soak",
                &format!("drafter: acceptance length at step {s}"),
                a,
                "tokens",
                DRAFT_TOKENS + 1.0,
            )
            .limit_name("draft tokens + 1");
            out.push(match target {
                Some(t) => f.target(t),
                None => f,
            });
        }
    }
    out
}

/// A line's figures under `key` (`ledger`, `rss_data`), by worker, as f64 bytes.
fn bytes(line: &Value, key: &str) -> BTreeMap<String, f64> {
    line[key]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Per worker, the median `rss_data` of the steps `from..=to`.
fn median(lines: &[Value], from: u64, to: u64) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in lines {
        let s = line["step"].as_u64().unwrap_or(0);
        if (from..=to).contains(&s) {
            for (worker, v) in bytes(line, "rss_data") {
                by.entry(worker).or_default().push(v);
            }
        }
    }
    by.into_iter()
        .map(|(w, mut v)| {
            v.sort_by(f64::total_cmp);
            (w, v[v.len() / 2])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(step: u64, ledger: f64, rss: f64) -> Value {
        json!({"step": step, "ledger": {"engine-0": ledger}, "rss_data": {"engine-0": rss}})
    }

    #[test]
    fn a_leak_shows_as_growth_in_both_halves_and_a_flat_run_as_none() {
        let flat: Vec<Value> = (0..=100)
            .map(|s| line(s, 100.0 * MIB, 50.0 * MIB))
            .collect();
        let leak: Vec<Value> = (0..=100)
            .map(|s| line(s, 100.0 * MIB, (50.0 + s as f64) * MIB))
            .collect();
        let value = |fs: &[Figure], case: &str| {
            fs.iter()
                .find(|f| f.case.contains(case))
                .map(|f| f.value)
                .expect("the figure is there")
        };
        let f = figures(&flat, 100);
        assert_eq!(value(&f, "ledger drift"), 0.0);
        assert_eq!(value(&f, "over the run"), 0.0);
        let f = figures(&leak, 100);
        assert!(value(&f, "over the run") > 70.0, "{f:?}");
        assert!(value(&f, "calmer half") > 30.0, "{f:?}");
    }

    #[test]
    fn the_example_keeps_the_keys_the_bench_rewrites() {
        for key in [
            "\"../models/tiny-arith\"",
            "steps = 1000",
            "eval_every = 100",
            "draft_tokens = 4",
            "acceptance length >= 2.5",
        ] {
            assert!(EXAMPLE.contains(key), "examples/drafter.toml lacks {key}");
        }
    }
}
