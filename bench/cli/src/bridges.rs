//! `tandem bench bridges`: sync latency, bytes moved and peak memory of the weight bridges
//! (`ipc`, `lora`, `checkpoint` with restart and reloading in place) for the tiny and small
//! presets and a model ≥ 10× the small one (`big`, ~255 M parameters, written by the bench;
//! skipped with `--quick`), with a native trainer and a native engine in real worker
//! processes. Each figure stands beside a limit measured in the same run:
//!
//! - `ipc`: 1 ms (verify off: fence + version bump); with the digest check, the time to read
//!   the weights twice at memcpy bandwidth (both sides hash them).
//! - `lora`: 2 × adapter bytes ÷ memcpy bandwidth + 10 ms.
//! - `checkpoint`: 1.5 × (write + read of the checkpoint at the disk bandwidth measured
//!   beside each sync: a probe of the checkpoint's size before it and after it) + the
//!   engine's start time on that model (restart), or without it (reload in place).
//! - `broadcast` (two engines, `bridges_broadcast.rs`): GB/s of weights per sync beside the
//!   transport's own broadcast of one bucket to the same ranks (target ≥ 0.7×).
//! - memory: peak memory of engine + trainer during the sync (Pss at the start plus each
//!   process's growth to its RSS high-water mark: `bridge::rss`), less their non-weight buffers
//!   (grads, optimizer, KV cache, activations as the workers report them) and a worker
//!   process's baseline Pss (the trainer's before `init`) per process, in multiples of the
//!   weights' size (limit 1×).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Figure;
use tandem_cli::error::CliError;
use tandem_control::Role;
use tandem_plugin_api::files::dir_bytes;
use tandem_plugin_api::{ComponentStats, LossConfig, LossKind, TrainBatch, TrainSequence};
use tandem_rl::bridge::BridgeDriver;
use tandem_rl::warmstart::create_preset;
use tandem_runtime::RuntimeError;
use tandem_runtime::launch::{LaunchOptions, LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::registry::Registry;
use tandem_runtime::worker::WorkerSpec;

const BENCH: &str = "bridges";
const LORA: &str = r#"{"rank": 16, "alpha": 32.0, "seed": 1}"#;

fn rt(what: &str) -> impl Fn(String) -> CliError + '_ {
    move |e| CliError::failed(format!("tandem bench bridges: {what}: {e}"))
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> CliError {
    CliError::io(format!("tandem bench bridges: {what}"))
}

/// Runs the benchmark (tiny and small with `quick`, plus the big model otherwise).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let scratch = std::env::temp_dir().join(format!("tandem-bench-bridges-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(io(format!("creating {}", scratch.display())))?;
    let out = run_in(&scratch, quick);
    let _ = std::fs::remove_dir_all(&scratch);
    out
}

fn run_in(scratch: &Path, quick: bool) -> Result<Vec<Figure>, CliError> {
    let mut figures = Vec::new();
    let memcpy = memcpy_gbps();
    let mut sizes = vec!["tiny", "small"];
    if !quick {
        sizes.push("big");
    }
    for size in sizes {
        let model = write_model(scratch, size)?;
        let weights = dir_bytes(&model);
        let syncs = if size == "big" { 2 } else { 3 };
        let ctx = Ctx {
            scratch,
            model: &model,
            size,
            weights,
            memcpy,
            syncs,
        };
        figures.push(
            Figure::new(
                BENCH,
                &format!("{size}/weights"),
                weights as f64 / 1e6,
                "MB",
                0.0,
            )
            .limit_name("-"),
        );
        figures.extend(ctx.mode("ipc", false, "", None)?);
        figures.extend(ctx.mode("ipc", true, "", None)?);
        figures.extend(ctx.mode("lora", true, &format!(r#"{{"lora": {LORA}}}"#), None)?);
        figures.extend(ctx.mode("checkpoint", true, "", Some(true))?);
        figures.extend(ctx.mode("checkpoint", true, "", Some(false))?);
        figures.extend(ctx.broadcast_rows()?);
    }
    Ok(figures)
}

pub(super) struct Ctx<'a> {
    pub(super) scratch: &'a Path,
    pub(super) model: &'a Path,
    pub(super) size: &'a str,
    pub(super) weights: u64,
    pub(super) memcpy: f64,
    pub(super) syncs: usize,
}

pub(super) fn spec(role: Role, model: &Path, options: &str, run_dir: &Path) -> WorkerSpec {
    WorkerSpec::single_cpu(role, "native", model, options, run_dir, vec![])
}

fn metric(s: &ComponentStats, name: &str) -> f64 {
    s.metrics
        .iter()
        .find(|m| m.name.as_str() == name)
        .map_or(0.0, |m| m.value)
}

impl Ctx<'_> {
    /// One mode: fresh workers, setup, `syncs` syncs (each after a training step), figures.
    /// `checkpoint` is `Some(restart)` for the checkpoint mode.
    fn mode(
        &self,
        mode: &str,
        verify: bool,
        trainer_opts: &str,
        checkpoint: Option<bool>,
    ) -> Result<Vec<Figure>, CliError> {
        let restart = checkpoint == Some(true);
        let label = match (mode, verify, checkpoint) {
            ("ipc", false, _) => "ipc".to_string(),
            ("ipc", true, _) => "ipc+digest".to_string(),
            (_, _, Some(true)) => "checkpoint/restart".to_string(),
            (_, _, Some(false)) => "checkpoint/reload".to_string(),
            _ => mode.to_string(),
        };
        let run_dir = self
            .scratch
            .join(format!("{}-{}", self.size, label.replace('/', "-")));
        let mut opts = LaunchOptions::new(&run_dir);
        opts.exe = Some(crate::exe::tandem()?);
        opts.worker_verbosity = 0;
        let mut launcher = LocalLauncher::new(opts)?;
        let started = Instant::now();
        let engine_opts = r#"{"max_batch": 2, "max_seq_len": 64}"#;
        let mut engines =
            launcher.spawn_engines(&[spec(Role::Engine, self.model, engine_opts, &run_dir)])?;
        let engine_start = started.elapsed().as_secs_f64();
        let mut t_opts = if trainer_opts.is_empty() {
            serde_json::json!({})
        } else {
            serde_json::from_str(trainer_opts).map_err(|e| rt("trainer options")(e.to_string()))?
        };
        t_opts["digest"] = serde_json::Value::Bool(verify);
        let trainer = launcher
            .spawn_trainers(&[spec(
                Role::Trainer,
                self.model,
                &t_opts.to_string(),
                &run_dir,
            )])?
            .pop()
            .ok_or_else(|| rt("trainer")("did not start".into()))?;
        // Before init the trainer holds no buffer: its Pss is a worker process's baseline
        // (binary, libraries, runtime), subtracted per process from the weight copies.
        let baseline = tandem_rl::bridge::rss::pss_bytes(trainer.pid()).unwrap_or(0);
        trainer.init()?;
        let mut bridge_opts = toml::Table::new();
        if mode == "checkpoint" {
            bridge_opts.insert("restart".into(), toml::Value::Boolean(restart));
        }
        let mut driver = BridgeDriver::builtin(mode, verify, &bridge_opts)?;
        // The ipc setup applies the trainer's region: updates go to paused engines.
        pause(&engines)?;
        driver.setup(&trainer, &mut engines, &mut launcher)?;
        resume(&engines)?;
        let (mut lat, mut bytes, mut peak) = (Vec::new(), 0, 0);
        let mut last = None;
        // ipc syncs cost no I/O: ten more (without a training step in between, same path:
        // export, fence, version check) make the median robust on a loaded machine.
        let extra = if mode == "ipc" { 10 } else { 0 };
        // lora and checkpoint: the first two syncs are cold (no recycled adapter or
        // checkpoint dir, no spare engine buffer yet: the export writes fresh files, and fresh
        // pages cost more than the copies, several times more in a VM): reported apart, the
        // median is of the rest.
        let cold = if mode == "ipc" { 0 } else { 2 };
        // checkpoint: the disk of this class of machine (a shared virtual disk) changes speed
        // from second to second, so one probe per run made the limit a lottery (the same
        // 1 GB checkpoint cost 3.5–5.6 s while a single probe's limit ranged 1.6–4.4 s). A
        // probe of the checkpoint's size is taken before every sync and after the last, and
        // each sync is held to the mean of the two beside it.
        let mut probes = Vec::new();
        // An adapter sync costs milliseconds: five of them (at least) make its median robust
        // to one sync that waited for a core; checkpoint syncs of the big model cost seconds.
        let syncs = if mode == "lora" {
            self.syncs.max(5)
        } else {
            self.syncs
        };
        for k in 0..cold + syncs + extra {
            if k < cold + syncs {
                train_step(&trainer, &engines)?;
            } else {
                pause(&engines)?;
            }
            if checkpoint.is_some() {
                probes.push(disk_seconds(self.scratch, self.weights)?);
            }
            let rec = driver.sync(&trainer, &mut engines, &mut launcher)?;
            // A checkpoint restart replaces the engines with new ones that already serve.
            if !rec.restarted {
                resume(&engines)?;
            }
            lat.push(rec.latency_s);
            bytes = rec.bytes_moved;
            last = Some(rec.clone());
            if k >= cold {
                peak = peak.max(rec.peak_rss_bytes);
            }
        }
        if checkpoint.is_some() {
            probes.push(disk_seconds(self.scratch, self.weights)?);
        }
        let other = non_weight_bytes(&trainer, &engines, mode == "lora")?;
        launcher.shutdown(Duration::from_secs(30))?;
        let _ = std::fs::remove_dir_all(&run_dir);
        let w = self.weights as f64;
        let case = |what: &str| format!("{}/{label}/{what}", self.size);
        let cold_lat = lat.drain(..cold).collect::<Vec<f64>>();
        let median = |mut lat: Vec<f64>| {
            lat.sort_by(f64::total_cmp);
            lat[lat.len() / 2] * 1e3
        };
        let worst = |lat: &[f64]| lat.iter().fold(0.0f64, |m, l| m.max(l * 1e3));
        // (sync ms, limit ms, limit name, target) for the steady syncs, and (ms, limit) of
        // the cold one reported.
        let (sync_ms, limit_ms, limit_name, target, cold_fig) = match (mode, verify, checkpoint) {
            ("ipc", false, _) => (median(lat), 1.0, "1 ms".to_string(), "<= 1", None),
            ("ipc", true, _) => (
                median(lat),
                2.0 * w / (self.memcpy * 1e9) * 1e3,
                "2 × weights ÷ memcpy (both sides hash)".into(),
                "",
                None,
            ),
            ("lora", ..) => {
                let limit = 2.0 * (bytes as f64) / (self.memcpy * 1e9) * 1e3 + 10.0;
                (
                    median(lat),
                    limit,
                    "2 × adapter ÷ memcpy + 10 ms".into(),
                    "<= 1",
                    Some((worst(&cold_lat), limit)),
                )
            }
            (_, _, Some(restart)) => {
                let start_ms = if restart { engine_start * 1e3 } else { 0.0 };
                // Each sync against the mean of the probes before and after it: (ms, limit,
                // write s, read s).
                let runs: Vec<(f64, f64, f64, f64)> = cold_lat
                    .iter()
                    .chain(&lat)
                    .zip(probes.windows(2))
                    .map(|(l, p)| {
                        let wr = (p[0].0 + p[1].0) / 2.0;
                        let rd = (p[0].1 + p[1].1) / 2.0;
                        (l * 1e3, 1.5 * (wr + rd) * 1e3 + start_ms, wr, rd)
                    })
                    .collect();
                let by_ratio = |a: &(f64, f64, f64, f64), b: &(f64, f64, f64, f64)| {
                    (a.0 / a.1).total_cmp(&(b.0 / b.1))
                };
                let (cold_runs, steady) = runs.split_at(cold);
                let cold_fig = cold_runs
                    .iter()
                    .copied()
                    .max_by(by_ratio)
                    .map(|r| (r.0, r.1));
                // The steady sync whose ratio is the median (the worse of two) is reported.
                let mut steady = steady.to_vec();
                steady.sort_by(by_ratio);
                let (ms, limit, wr, rd) = steady[steady.len() / 2];
                let disk = format!(
                    "1.5 × disk (write+fsync {wr:.2} s + read {rd:.2} s, probed beside the sync)"
                );
                let name = if restart {
                    format!("{disk} + engine start {engine_start:.2} s")
                } else {
                    disk
                };
                (ms, limit, name, "<= 1", cold_fig)
            }
            _ => (median(lat), 1.0, "-".into(), "", None),
        };
        // Restart: old and new engine live side by side for a moment (3 processes).
        let procs = if restart { 3.0 } else { 2.0 };
        let copies = (peak as f64 - other as f64 - procs * baseline as f64) / w;
        let mut figures = vec![];
        if let Some((ms, limit)) = cold_fig {
            let name = if checkpoint.is_some() {
                format!("its own probes (first {cold} syncs, worst ratio)")
            } else {
                format!("{limit_name} (first {cold} syncs, slowest)")
            };
            figures.push(Figure::new(BENCH, &case("cold_sync"), ms, "ms", limit).limit_name(&name));
        }
        figures.extend([
            Figure::new(BENCH, &case("sync"), sync_ms, "ms", limit_ms)
                .limit_name(&limit_name)
                .target(target),
            Figure::new(
                BENCH,
                &case("bytes_moved"),
                bytes as f64 / 1e6,
                "MB",
                w / 1e6,
            )
            .limit_name("weights"),
            Figure::new(BENCH, &case("peak_pss"), peak as f64 / 1e6, "MB", w / 1e6)
                .limit_name("weights"),
            Figure::new(BENCH, &case("weight_copies"), copies, "×", 1.0).limit_name("1 × weights"),
        ]);
        if let Some(rec) = &last {
            figures.extend(bridge_stat_figures(&case, rec, w));
        }
        Ok(figures)
    }
}

/// The bridge's own figures of one sync (`stats()`, in the sync's record): seconds beside the
/// sync's latency, bytes beside the weights, counts alone (their own limit).
pub(super) fn bridge_stat_figures(
    case: &dyn Fn(&str) -> String,
    rec: &tandem_rl::bridge::SyncRecord,
    weights: f64,
) -> Vec<Figure> {
    rec.bridge_stats
        .iter()
        .map(|(name, value)| {
            let case = case(&format!("bridge.{name}"));
            if name.ends_with("_s") {
                Figure::new(BENCH, &case, value * 1e3, "ms", rec.latency_s * 1e3)
                    .limit_name("the sync's latency")
            } else if name.ends_with("bytes") {
                Figure::new(BENCH, &case, value / 1e6, "MB", weights / 1e6).limit_name("weights")
            } else {
                Figure::new(BENCH, &case, *value, "", *value).limit_name("(the bridge's count)")
            }
        })
        .collect()
}

/// Bytes of the workers' buffers other than weights (grads, optimizer, KV, activations); in
/// LoRA mode the trainer's adapter buffers are counted as weights of their own.
pub(super) fn non_weight_bytes(
    trainer: &RemoteTrainer,
    engines: &[RemoteEngine],
    _lora: bool,
) -> Result<u64, CliError> {
    let t = trainer.stats()?;
    let mut sum = ["grads", "optimizer", "activations"]
        .iter()
        .map(|k| metric(&t, &format!("allocated_bytes.{k}")))
        .sum::<f64>();
    for e in engines {
        let s = e.stats()?;
        sum += ["kv_cache", "activations"]
            .iter()
            .map(|k| metric(&s, &format!("allocated_bytes.{k}")))
            .sum::<f64>();
    }
    Ok(sum as u64)
}

pub(super) fn pause(engines: &[RemoteEngine]) -> Result<(), CliError> {
    for e in engines {
        e.pause_generation(tandem_plugin_api::PauseMode::Wait)?;
    }
    Ok(())
}

pub(super) fn resume(engines: &[RemoteEngine]) -> Result<(), CliError> {
    for e in engines {
        e.continue_generation()?;
    }
    Ok(())
}

pub(super) fn train_step(
    trainer: &RemoteTrainer,
    engines: &[RemoteEngine],
) -> Result<(), CliError> {
    pause(engines)?;
    let batch = sft_batch();
    trainer.train_step(batch).map(drop).map_err(CliError::from)
}

/// Writes the model of `size` under `scratch`: the native trainer's preset of that name
/// (`tiny`, `small`, or `big`: the small preset's tokenizer, d 1024, 22 layers, ~255 M
/// parameters).
fn write_model(scratch: &Path, size: &str) -> Result<PathBuf, CliError> {
    let out = scratch.join(format!("model-{size}"));
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    create_preset(&registry, &out, size, 7)?;
    Ok(out)
}

/// memcpy bandwidth (GB/s) over 64 MiB, best of 5.
fn memcpy_gbps() -> f64 {
    let n = 64 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    n as f64 / best / 1e9
}

/// Seconds to write (with fsync) and then read back a file of `bytes` under `scratch`: the
/// disk bandwidth a checkpoint of that size gets, as `dd` would measure it.
fn disk_seconds(scratch: &Path, bytes: u64) -> Result<(f64, f64), CliError> {
    let path = scratch.join("disk-probe.bin");
    let chunk = vec![0x5au8; 8 << 20];
    let t = Instant::now();
    {
        let mut f =
            std::fs::File::create(&path).map_err(io(format!("creating {}", path.display())))?;
        let mut left = bytes.max(1) as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n])
                .map_err(io("writing the disk probe".into()))?;
            left -= n;
        }
        f.sync_all().map_err(io("fsync of the disk probe".into()))?;
    }
    let write = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut f = std::fs::File::open(&path).map_err(io(format!("opening {}", path.display())))?;
    let mut buf = vec![0u8; 8 << 20];
    while f
        .read(&mut buf)
        .map_err(io("reading the disk probe".into()))?
        > 0
    {}
    let read = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    Ok((write, read))
}

/// The one-sequence SFT batch every bench train step uses.
pub(super) fn sft_batch() -> TrainBatch {
    TrainBatch {
        sequences: vec![TrainSequence {
            tokens: vec![1u32, 40, 41, 42, 43, 44, 45, 2].into(),
            prompt_len: 1,
            advantage: 0.0,
            old_logprobs: Default::default(),
            ref_logprobs: Default::default(),
        }]
        .into(),
        loss: LossConfig {
            kind: LossKind::Sft,
            clip_eps_low: 0.2,
            clip_eps_high: 0.2,
            kl_coef: 0.0,
            learning_rate: 1e-4,
            grad_clip: 1.0,
        },
    }
}
