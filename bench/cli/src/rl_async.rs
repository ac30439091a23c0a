//! `tandem bench async`: asynchronous RL on this machine. One GRPO job — the tiny model
//! warm-started on small-number arithmetic, engine and trainer on disjoint cores
//! (`[placement.cpus]`: two "devices" on a 2-core machine), the `broadcast` bridge — run
//! synchronously, with `max_staleness` = 1 and 2 (`tis` correction), and with 4 and no
//! correction. Each run reports its samples/s beside the synchronous run's, each role's idle
//! share of the step, the staleness of its trained samples, and its held-out accuracy at the
//! same sample count beside the synchronous run's. The synchronous run's generate and train
//! times come first: overlap can only hide the shorter of the two. The engine serves batches
//! of 8 (`max_batch`), which brings its generate time within 25 % of the train time on this
//! job; the sequences each run trains per step (groups without signal are left out) differ
//! as the runs' policies do, and so does their train time.

use super::Figure;
use crate::rl_loop::{in_scratch, metrics, run_text};
use std::collections::BTreeMap;
use tandem_cli::error::CliError;
use tandem_rl::metrics::StepMetrics;
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;

const JOB: &str = r#"
[run]
name = "bench-async"
output_dir = "run"
steps = STEPS
seed = 0

[placement]
mode = "disaggregated"

[placement.cpus]
engine = [0]
trainer = [1]

[model]
path = "MODEL"
init_preset = "tiny"
warm_start_steps = 200

[engine]
plugin = "native"

[engine.options]
max_batch = 8
max_seq_len = 64

[trainer]
plugin = "native"

[bridge]
mode = "broadcast"

[algorithm]
prompts_per_step = 16
group_size = 8
max_tokens = 6
learning_rate = 0.0003
clip_low = 0.2
clip_high = 0.28
max_staleness = STALENESS
correction = "CORRECTION"

[task]
kind = "arithmetic"

[task.options]
max_operand = 6
reward = "partial"

[eval]
every = STEPS
problems = 12
"#;

/// Samples per step (`prompts_per_step × group_size`).
const SAMPLES: f64 = 128.0;

/// The runs: label, `max_staleness`, correction.
const RUNS: [(&str, u32, &str); 5] = [
    ("sync", 0, "none"),
    ("k=1 none", 1, "none"),
    ("k=1 tis", 1, "tis"),
    ("k=2 tis", 2, "tis"),
    ("k=4 none", 4, "none"),
];

/// Runs the benchmark (`quick`: 8 steps a run instead of 40).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores < 2 {
        return Err(CliError::usage(format!(
            "tandem bench async pins the engine and the trainer to cores 0 and 1; this machine \
             lets it use {cores}"
        )));
    }
    let steps = if quick { 8 } else { 40 };
    in_scratch("async", |tmp| run_in(tmp, steps))
}

/// What one run measured over its steady steps (the first left out: one-off costs).
struct Measured {
    samples_per_s: f64,
    generate_s: f64,
    train_s: f64,
    step_s: f64,
    /// Generation beside the previous step's training, per step.
    ahead_s: f64,
    staleness: BTreeMap<String, u64>,
    accuracy: f64,
    /// Sequences trained per step (groups without signal are left out): the train time's
    /// driver, which differs between runs as their policies do.
    trained: f64,
}

fn measure(ms: &[StepMetrics]) -> Measured {
    let accuracy = ms
        .iter()
        .rev()
        .find_map(|m| m.eval_accuracy)
        .unwrap_or(f64::NAN);
    let steady: Vec<&StepMetrics> = ms.iter().filter(|m| m.step > 1).collect();
    let n = steady.len().max(1) as f64;
    let total: f64 = steady.iter().map(|m| m.step_s).sum();
    let phase = |name: &str| {
        steady
            .iter()
            .map(|m| m.phases.get(name).copied().unwrap_or(0.0))
            .sum::<f64>()
            / n
    };
    let mut staleness = BTreeMap::new();
    for m in ms {
        for (k, v) in &m.staleness {
            *staleness.entry(k.clone()).or_default() += v;
        }
    }
    Measured {
        samples_per_s: SAMPLES * n / total.max(f64::MIN_POSITIVE),
        generate_s: phase("generate"),
        train_s: phase("train"),
        step_s: total / n,
        ahead_s: steady.iter().filter_map(|m| m.ahead_s).sum::<f64>() / n,
        staleness,
        accuracy,
        trained: steady.iter().map(|m| m.train_sequences as f64).sum::<f64>() / n,
    }
}

fn run_in(tmp: &std::path::Path, steps: u32) -> Result<Vec<Figure>, CliError> {
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    let model = tmp.join("model");
    let mut figures = Vec::new();
    let mut sync: Option<Measured> = None;
    for (label, k, correction) in RUNS {
        let text = JOB
            .replace("STEPS", &steps.to_string())
            .replace("MODEL", &model.display().to_string())
            .replace("STALENESS", &k.to_string())
            .replace("CORRECTION", correction);
        let name = format!("k{k}-{correction}");
        eprintln!("tandem bench async: {label} ({steps} steps)");
        let run_dir = run_text(&registry, tmp, &name, &text, None, true)?;
        let m = measure(&metrics(&run_dir));
        let base = sync.as_ref().unwrap_or(&m);
        if k == 0 {
            figures.push(
                Figure::new(
                    "async",
                    "sync: generate per step",
                    m.generate_s,
                    "s",
                    m.train_s,
                )
                .limit_name("train per step"),
            );
        }
        let mut samples = Figure::new(
            "async",
            &format!("{label}: samples/s"),
            m.samples_per_s,
            "samples/s",
            base.samples_per_s,
        )
        .limit_name("synchronous run");
        if label == "k=1 none" {
            samples = samples.target(">= 1.6");
        }
        figures.push(samples);
        // The engine is busy generating its own step's rollout and the one ahead; the
        // trainer, training.
        let engine_busy = m.generate_s + m.ahead_s;
        for (role, busy) in [("engine", engine_busy), ("trainer", m.train_s)] {
            let idle = (1.0 - busy / m.step_s).max(0.0) * 100.0;
            figures.push(
                Figure::new("async", &format!("{label}: {role} idle"), idle, "%", 100.0)
                    .limit_name("step"),
            );
        }
        figures.push(
            Figure::new(
                "async",
                &format!("{label}: sequences trained per step"),
                m.trained,
                "sequences",
                SAMPLES,
            )
            .limit_name("samples per step"),
        );
        let trained: u64 = m.staleness.values().sum();
        for (behind, count) in &m.staleness {
            figures.push(
                Figure::new(
                    "async",
                    &format!("{label}: samples at staleness {behind}"),
                    *count as f64,
                    "samples",
                    trained as f64,
                )
                .limit_name("samples trained"),
            );
        }
        figures.push(
            Figure::new(
                "async",
                &format!("{label}: held-out accuracy"),
                m.accuracy * 100.0,
                "%",
                base.accuracy * 100.0,
            )
            .limit_name("synchronous run"),
        );
        if k == 0 {
            sync = Some(m);
        }
    }
    Ok(figures)
}
