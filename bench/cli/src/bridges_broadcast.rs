//! `tandem bench bridges`, the `broadcast` rows: a native trainer and [`ENGINES`] native
//! engines in real worker processes joined in a transport world over shm, the trainer's
//! weights streamed to both engines at once in buckets of the bridge's default size. Beside
//! each figure, measured in the same run:
//!
//! - `sync` (verify off, GB/s of weights per sync): the transport's own broadcast of one
//!   bucket's bytes to the same number of ranks (`crate::transport`, children of this
//!   executable), target ≥ 0.7× of it; and memcpy for scale.
//! - `broadcast+digest` (verify on): the same, with the trainer's digest before the send and
//!   each engine's after the last bucket (two passes over the weights at memcpy speed).
//! - memory: peak memory of trainer + engines during the sync, less their non-weight buffers
//!   and a worker's baseline per process, in weights; the limit is one copy per process plus
//!   two buckets per engine.

use std::time::Duration;

use super::Figure;
use super::bridges::{Ctx, non_weight_bytes, pause, resume, spec, train_step};
use crate::transport::{BenchOptions, bench};
use tandem_cli::error::CliError;
use tandem_control::Role;
use tandem_rl::bridge::BridgeDriver;
use tandem_rl::driver::world::World;
use tandem_runtime::launch::{LaunchOptions, LocalLauncher};

const BENCH: &str = "bridges";

/// Engine ranks the broadcast reaches.
pub(super) const ENGINES: u32 = 2;

/// The bridge's default bucket (`bucket_mb = 64`).
const BUCKET: u64 = 64 << 20;

fn failed(what: &str) -> impl Fn(String) -> CliError + '_ {
    move |e| CliError::failed(format!("tandem bench bridges: broadcast: {what}: {e}"))
}

impl Ctx<'_> {
    /// The broadcast rows of this model: verify off and on, and the transport's own
    /// broadcast of one bucket to the same ranks.
    pub(super) fn broadcast_rows(&self) -> Result<Vec<Figure>, CliError> {
        let bucket = BUCKET.min(self.weights) as usize;
        let transport_gbps = transport_broadcast_gbps(bucket)?;
        let mut figures = Vec::new();
        for verify in [false, true] {
            figures.extend(self.broadcast(verify, bucket, transport_gbps)?);
        }
        Ok(figures)
    }

    fn broadcast(
        &self,
        verify: bool,
        bucket: usize,
        transport_gbps: f64,
    ) -> Result<Vec<Figure>, CliError> {
        let label = if verify {
            "broadcast+digest"
        } else {
            "broadcast"
        };
        let run_dir = self.scratch.join(format!("{}-{label}", self.size));
        let mut opts = LaunchOptions::new(&run_dir);
        opts.exe = Some(crate::exe::tandem()?);
        opts.worker_verbosity = 0;
        let mut launcher = LocalLauncher::new(opts)?;
        let world = World::for_bridge(&launcher, ENGINES, "shm", 120.0)
            .map_err(|e| failed("transport world")(e.to_string()))?;
        let engine_opts = r#"{"max_batch": 2, "max_seq_len": 64}"#;
        let specs: Vec<_> = (0..ENGINES)
            .map(|i| {
                let mut s = spec(Role::Engine, self.model, engine_opts, &run_dir);
                s.rank = i;
                s.world_size = ENGINES;
                s.transport = Some(world.spec(1 + i));
                s
            })
            .collect();
        let mut engines = launcher.spawn_engines(&specs)?;
        let t_opts = serde_json::json!({ "digest": verify }).to_string();
        let mut t_spec = spec(Role::Trainer, self.model, &t_opts, &run_dir);
        t_spec.transport = Some(world.spec(0));
        let trainer = launcher
            .spawn_trainers(&[t_spec])?
            .pop()
            .ok_or_else(|| failed("trainer")("did not start".into()))?;
        let baseline = tandem_rl::bridge::rss::pss_bytes(trainer.pid()).unwrap_or(0);
        trainer.init()?;
        let mut driver = BridgeDriver::builtin("broadcast", verify, &toml::Table::new())?;
        pause(&engines)?;
        driver.setup(&trainer, &mut engines, &mut launcher)?;
        resume(&engines)?;
        // The first sync is cold (the engines' bucket buffer, the trainer's mapping of its
        // region): reported apart; the median is of the rest.
        let (mut lat, mut peak) = (Vec::new(), 0u64);
        let mut last = None;
        for k in 0..1 + self.syncs.max(3) {
            train_step(&trainer, &engines)?;
            let rec = driver.sync(&trainer, &mut engines, &mut launcher)?;
            resume(&engines)?;
            lat.push(rec.latency_s);
            last = Some(rec.clone());
            if k > 0 {
                peak = peak.max(rec.peak_rss_bytes);
            }
        }
        let other = non_weight_bytes(&trainer, &engines, false)?;
        launcher.shutdown(Duration::from_secs(30))?;
        drop(world);
        let _ = std::fs::remove_dir_all(&run_dir);
        let w = self.weights as f64;
        let cold = lat.remove(0);
        lat.sort_by(f64::total_cmp);
        let median = lat[lat.len() / 2];
        let gbps = |s: f64| w / s / 1e9;
        let case = |what: &str| format!("{}/{label}/{what}", self.size);
        let procs = 1.0 + ENGINES as f64;
        let copies = (peak as f64 - other as f64 - procs * baseline as f64) / w;
        let copies_limit = procs + 2.0 * ENGINES as f64 * bucket as f64 / w;
        let mut figures = vec![
            Figure::new(BENCH, &case("sync"), gbps(median), "GB/s", transport_gbps)
                .limit_name(&format!(
                    "transport broadcast x{} of {} MiB",
                    1 + ENGINES,
                    bucket >> 20
                ))
                .target(if verify { "" } else { ">= 0.7" }),
            Figure::new(BENCH, &case("sync_ms"), median * 1e3, "ms", cold * 1e3)
                .limit_name("first (cold) sync"),
            Figure::new(
                BENCH,
                &case("sync_vs_memcpy"),
                gbps(median),
                "GB/s",
                self.memcpy,
            )
            .limit_name("memcpy"),
            Figure::new(BENCH, &case("weight_copies"), copies, "×", copies_limit).limit_name(
                &format!("1 × weights per process + 2 buckets per engine ({ENGINES} engines)"),
            ),
        ];
        if let Some(rec) = &last {
            figures.extend(super::bridges::bridge_stat_figures(&case, rec, w));
        }
        Ok(figures)
    }
}

/// The transport's own broadcast of `bytes` over shm to `1 + ENGINES` ranks (GB/s).
fn transport_broadcast_gbps(bytes: usize) -> Result<f64, CliError> {
    let opts = BenchOptions {
        min_bytes: bytes,
        max_bytes: bytes,
        backends: vec![tandem_transport::BackendKind::Shm],
        broadcast_ranks: 1 + ENGINES as usize,
        latency_iters: 100,
        ..BenchOptions::default()
    };
    let measured = bench(&opts).map_err(|e| failed("transport bench")(e.to_string()))?;
    measured
        .iter()
        .find(|m| m.case.starts_with("broadcast shm"))
        .map(|m| m.value)
        .ok_or_else(|| failed("transport bench")("no broadcast figure".into()))
}
