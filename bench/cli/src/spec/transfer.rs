//! Hidden-state transfer over the data plane, as a drafter job moves it: a `native` engine
//! and a `native-drafter` trainer in two `tandem worker` processes, world ranks 1 and 0 of
//! one transport world (a rendezvous store in this process, the launcher's token) with the
//! group `pair0` = [engine, trainer]. Per message: the engine's `hidden_states` on the
//! `Transport` route and the trainer's `train_step_features` receiving it, at once; the
//! bandwidth is the bytes the engine sent over the time it spent sending (`hidden_states.
//! bytes_sent` / `hidden_states.send_s` of its stats: the receive was already posted, so this
//! is the transfer), beside a memcpy of the same size timed in this process in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use super::train::{drafter_inputs, train_batch_of};
use super::{BENCH, Ctx};
use crate::Figure;
use crate::native::{median, metric};
use tandem_cli::error::CliError;
use tandem_control::Role;
use tandem_plugin_api::{
    FeatureBatch, FeatureRoute, FeatureSource, HiddenStatesRequest, ROption, RString, RVec,
};
use tandem_runtime::launch::{LaunchOptions, LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::worker::{TransportSpec, WorkerSpec};
use tandem_transport::store::StoreServer;

/// Tokens per sequence of a message (the message's last sequence takes the remainder).
const SEQ_LEN: usize = 64;
/// The group of the engine and the trainer.
const GROUP: &str = "pair0";

/// The transfer figures at `sizes` (bytes), each the median of `reps` after one warm-up.
pub(super) fn measure(
    ctx: &Ctx<'_>,
    model: &Path,
    name: &str,
    sizes: &[usize],
    reps: usize,
) -> Result<Vec<Figure>, CliError> {
    let run_dir = ctx.scratch.join(format!("{name}-transfer"));
    let mut opts = LaunchOptions::new(&run_dir);
    opts.exe = Some(crate::exe::tandem()?);
    opts.worker_verbosity = 0;
    let mut launcher = LocalLauncher::new(opts)?;
    let store = StoreServer::start("127.0.0.1:0", launcher.token()).map_err(|e| {
        CliError::failed(format!(
            "tandem bench spec: cannot start the rendezvous store: {e}"
        ))
    })?;
    let world = |rank: u32| TransportSpec {
        store: store.addr().to_string(),
        name: format!("bench-spec-{}", std::process::id()),
        world_rank: rank,
        world_size: 2,
        groups: vec![("world".into(), vec![0, 1]), (GROUP.into(), vec![1, 0])],
        backend: "auto".into(),
        timeout_secs: 120.0,
    };
    let width_guess = 3 * hidden_size(model)?;
    let max_rows = sizes
        .iter()
        .map(|s| s.div_ceil(width_guess * 4))
        .max()
        .unwrap_or(1);
    let mut engine = WorkerSpec::single_cpu(
        Role::Engine,
        "native",
        model,
        &format!(r#"{{"max_batch": 4, "max_seq_len": {SEQ_LEN}}}"#),
        &run_dir,
        vec![],
    );
    engine.transport = Some(world(1));
    let mut trainer = WorkerSpec::single_cpu(
        Role::Trainer,
        "native-drafter",
        model,
        &format!(r#"{{"ttt_steps": 1, "max_tokens": {max_rows}}}"#),
        &run_dir,
        vec![],
    );
    trainer.transport = Some(world(0));
    eprintln!("spec: {name}: hidden-state transfer between two worker processes");
    let engine = launcher
        .spawn_engines(&[engine])?
        .pop()
        .ok_or_else(|| CliError::failed("tandem bench spec: the engine worker did not start"))?;
    let trainer = launcher
        .spawn_trainers(&[trainer])?
        .pop()
        .ok_or_else(|| CliError::failed("tandem bench spec: the trainer worker did not start"))?;
    trainer.init()?;
    let (layers, width) = drafter_inputs(&trainer.stats()?.metrics)?;
    let pair = Pair {
        engine: &engine,
        trainer: &trainer,
        layers,
        width: width as usize,
        vocab: vocab_size(model)?,
    };
    let mut figures = Vec::new();
    let mut tag = 0;
    for &size in sizes {
        let rows = size.div_ceil(pair.width * 4);
        let (mut bw, mut copy) = (Vec::new(), Vec::new());
        for rep in 0..=reps {
            tag += 1;
            let (bytes, secs) = pair.transfer(rows, tag)?;
            if rep > 0 {
                bw.push(bytes / secs);
                copy.push(memcpy_bytes_per_s(bytes as usize));
            }
        }
        let (bw, copy) = (median(bw), median(copy));
        let mib = (rows * pair.width * 4) as f64 / f64::from(1 << 20);
        eprintln!(
            "spec: {name}: hidden states {mib:.1} MiB ({rows} rows of {}): {:.2} GB/s, memcpy \
             {:.2} GB/s",
            pair.width,
            bw / 1e9,
            copy / 1e9
        );
        figures.push(
            Figure::new(
                BENCH,
                &format!("{name} hidden states {} MiB", size >> 20),
                bw / 1e9,
                "GB/s",
                copy / 1e9,
            )
            .limit_name("memcpy, same size")
            .target(">= 0.7"),
        );
    }
    drop(pair);
    launcher.shutdown(Duration::from_secs(30))?;
    drop(store);
    Ok(figures)
}

/// The two workers and what a message needs.
struct Pair<'a> {
    engine: &'a RemoteEngine,
    trainer: &'a RemoteTrainer,
    layers: Vec<u32>,
    width: usize,
    vocab: usize,
}

impl Pair<'_> {
    /// One message of `rows` feature rows with `tag`: `(bytes sent, seconds sending)` from
    /// the engine's counters.
    fn transfer(&self, rows: usize, tag: u64) -> Result<(f64, f64), CliError> {
        let seqs: Vec<Vec<u32>> = (0..rows.div_ceil(SEQ_LEN))
            .map(|i| {
                let len = SEQ_LEN.min(rows - i * SEQ_LEN);
                (0..len)
                    .map(|j| ((i * 131 + j * 7 + 3) % self.vocab) as u32)
                    .collect()
            })
            .collect();
        let request = HiddenStatesRequest {
            sequences: seqs.iter().map(|s| RVec::from(s.clone())).collect(),
            layers: RVec::from(self.layers.clone()),
            adapter: ROption::RNone,
            route: FeatureRoute::Transport {
                group: RString::from(GROUP),
                peer: 1,
                tag,
            },
        };
        let features = FeatureBatch {
            width: self.width as u32,
            layers: RVec::from(self.layers.clone()),
            sources: RVec::from(vec![FeatureSource {
                route: FeatureRoute::Transport {
                    group: RString::from(GROUP),
                    peer: 0,
                    tag,
                },
                rows: rows as u64,
                features: RVec::new(),
            }]),
        };
        let batch = train_batch_of(seqs.into_iter().map(|s| (s, 1)), 1e-4);
        let before = self.engine.stats()?.metrics;
        std::thread::scope(|scope| {
            let trained = scope.spawn(|| self.trainer.train_step_features(batch, features));
            let sent = self.engine.hidden_states(request);
            let trained = trained.join().unwrap_or_else(|_| {
                Err(tandem_runtime::RuntimeError::runtime(
                    "the trainer call thread panicked",
                ))
            });
            sent?;
            trained?;
            Ok::<(), CliError>(())
        })?;
        let after = self.engine.stats()?.metrics;
        let delta = |k: &str| metric(&after, k) - metric(&before, k);
        let (bytes, secs) = (
            delta("hidden_states.bytes_sent"),
            delta("hidden_states.send_s"),
        );
        if !(bytes > 0.0 && secs > 0.0) {
            return Err(CliError::failed(format!(
                "tandem bench spec: the engine reports {bytes} bytes sent in {secs} s"
            )));
        }
        Ok((bytes, secs))
    }
}

/// Bytes per second of copying `bytes` between two buffers in this process, timed as `bench
/// transport` times its memcpy limit: about 256 MiB of copies per trial (3 ..= 2000 copies),
/// the best of 3 trials.
fn memcpy_bytes_per_s(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let n = ((256usize << 20) / bytes.max(1)).clamp(3, 2000);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..n {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    (bytes * n) as f64 / best
}

fn config_value(model: &Path, key: &str) -> Result<usize, CliError> {
    let path = model.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(CliError::io(format!(
        "tandem bench spec: reading {}",
        path.display()
    )))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::failed(format!("tandem bench spec: {}: {e}", path.display())))?;
    v[key]
        .as_u64()
        .map(|x| x as usize)
        .filter(|&x| x > 0)
        .ok_or_else(|| {
            CliError::failed(format!(
                "tandem bench spec: {} has no {key}",
                path.display()
            ))
        })
}

fn hidden_size(model: &Path) -> Result<usize, CliError> {
    config_value(model, "hidden_size")
}

fn vocab_size(model: &Path) -> Result<usize, CliError> {
    config_value(model, "vocab_size")
}
