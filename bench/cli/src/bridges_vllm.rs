//! `tandem bench bridges`, the vLLM rows: the `vllm` engine plugin (a real vLLM server per
//! engine worker) with a native trainer in real worker processes, synced by the host's bridge
//! driver on the tiny preset, beside the native engine's figures of the same run:
//!
//! - `tiny/vllm/start`: launch → `/health` of the server (informational, no limit).
//! - `tiny/vllm/lora/sync`: export + `/v1/load_lora_adapter` + version, median of 3; limit:
//!   the native engine's `tiny/lora/sync` measured in the same run.
//! - `tiny/vllm/checkpoint/restart/sync`: export + the plugin stopping its server and starting
//!   one on the checkpoint (`checkpoint_apply = "restart"`); limit: the native engine's
//!   `tiny/checkpoint/restart/sync` of the same run.
//! - `tiny/vllm/checkpoint/reload/sync`: export + reload in place through the plugin's worker
//!   extension (`checkpoint_apply = "reload"`, the default), median of 3; limit: the restart
//!   above (target ≤ 1).
//!
//! The rows need `$TANDEM_PYTHON` (the venv of `scripts/setup-python.sh`) and a plugin
//! directory providing the engine `vllm` (`--plugin-dir` or `TANDEM_PLUGIN_PATH`); without them
//! they are skipped with the reason, which is not a failure. One vLLM server runs at a time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Figure;
use super::bridges::sft_batch;
use tandem_cli::error::CliError;
use tandem_control::Role;
use tandem_plugin_api::ComponentKind;
use tandem_rl::bridge::BridgeDriver;
use tandem_rl::warmstart::create_preset;
use tandem_runtime::launch::{LaunchOptions, LocalLauncher, RemoteEngine, RemoteTrainer};
use tandem_runtime::registry::Registry;
use tandem_runtime::worker::WorkerSpec;
use tandem_runtime::{Message, RuntimeError};

const BENCH: &str = "bridges";
const LORA_TRAINER: &str = r#"{"lora": {"rank": 16, "alpha": 32.0, "seed": 1}, "digest": false}"#;
const FULL_TRAINER: &str = r#"{"digest": false}"#;

/// What the vLLM part of the bench produced.
#[derive(Debug)]
pub enum VllmRows {
    /// The measured figures.
    Figures(Vec<Figure>),
    /// Why the rows were not measured (vLLM or the plugin is not available), and what to do.
    Skipped(Message),
}

fn rt(what: &str) -> impl Fn(String) -> CliError + '_ {
    move |e| CliError::failed(format!("tandem bench bridges (vllm): {what}: {e}"))
}

/// Whether the rows can run: `$TANDEM_PYTHON` names a file and the plugin directories
/// (`cli_dirs`, then `TANDEM_PLUGIN_PATH`) provide the engine `vllm`.
fn available(cli_dirs: &[PathBuf]) -> Result<Vec<PathBuf>, Message> {
    let why = |text: String, help: &str| Message {
        text,
        help: Some(help.to_owned()),
    };
    let Some(py) = std::env::var_os("TANDEM_PYTHON") else {
        return Err(why(
            "TANDEM_PYTHON is unset".into(),
            "export TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1)",
        ));
    };
    if !Path::new(&py).is_file() {
        return Err(why(
            format!("TANDEM_PYTHON={} is not a file", Path::new(&py).display()),
            "bash scripts/setup-python.sh prints the venv's python",
        ));
    }
    let dirs = tandem_runtime::registry::plugin_dirs(cli_dirs, &[]);
    let registry = tandem_runtime::registry::Registry::discover(&dirs).map_err(|errs| {
        let first = errs.first().map(ToString::to_string).unwrap_or_default();
        Message::from(format!("the plugin directories do not load: {first}"))
    })?;
    if !registry
        .component_names(ComponentKind::Engine)
        .iter()
        .any(|n| n == "vllm")
    {
        return Err(why(
            "no plugin provides the engine `vllm`".into(),
            "cargo build -p tandem-plugin-vllm, copy libtandem_vllm.so into a directory of its \
             own and name it with --plugin-dir or TANDEM_PLUGIN_PATH",
        ));
    }
    Ok(dirs)
}

/// Runs the vLLM rows; `native` holds the native engine's figures of the same run (limits).
pub fn run(cli_dirs: &[PathBuf], native: &[Figure]) -> Result<VllmRows, CliError> {
    let dirs = match available(cli_dirs) {
        Ok(d) => d,
        Err(why) => return Ok(VllmRows::Skipped(why)),
    };
    let scratch =
        std::env::temp_dir().join(format!("tandem-bench-bridges-vllm-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(CliError::io(format!(
        "tandem bench bridges: creating {}",
        scratch.display()
    )))?;
    let out = run_in(&scratch, &dirs, native);
    let _ = std::fs::remove_dir_all(&scratch);
    out.map(VllmRows::Figures)
}

fn native_value(native: &[Figure], case: &str) -> f64 {
    native
        .iter()
        .find(|f| f.case == case)
        .map_or(0.0, |f| f.value)
}

fn run_in(scratch: &Path, dirs: &[PathBuf], native: &[Figure]) -> Result<Vec<Figure>, CliError> {
    let model = scratch.join("model-tiny");
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    create_preset(&registry, &model, "tiny", 7)?;
    let ctx = Ctx {
        scratch,
        model: &model,
        dirs,
    };
    let lora = ctx.session(
        "lora",
        r#"{"enable_lora": true, "max_lora_rank": 16, "max_model_len": 256}"#,
        LORA_TRAINER,
    )?;
    let start_s = lora.start_s;
    let lora_ms = median_ms(lora.syncs("lora", 3)?);
    let restart = ctx.session(
        "restart",
        r#"{"max_model_len": 256, "checkpoint_apply": "restart"}"#,
        FULL_TRAINER,
    )?;
    let restart_ms = median_ms(restart.syncs("checkpoint", 1)?);
    let reload = ctx.session(
        "reload",
        r#"{"max_model_len": 256, "checkpoint_apply": "reload"}"#,
        FULL_TRAINER,
    )?;
    let reload_ms = median_ms(reload.syncs("checkpoint", 3)?);
    let same_run = |what: &str, case: &str| {
        let v = native_value(native, case);
        if v > 0.0 {
            (v, format!("native engine {what}, same run"))
        } else {
            (0.0, format!("native {case} not measured"))
        }
    };
    let (native_lora, lora_name) = same_run("lora sync", "tiny/lora/sync");
    let (native_restart, restart_name) =
        same_run("checkpoint restart", "tiny/checkpoint/restart/sync");
    Ok(vec![
        Figure::new(BENCH, "tiny/vllm/start", start_s * 1e3, "ms", 0.0).limit_name("-"),
        Figure::new(BENCH, "tiny/vllm/lora/sync", lora_ms, "ms", native_lora)
            .limit_name(&lora_name),
        Figure::new(
            BENCH,
            "tiny/vllm/checkpoint/restart/sync",
            restart_ms,
            "ms",
            native_restart,
        )
        .limit_name(&restart_name),
        Figure::new(
            BENCH,
            "tiny/vllm/checkpoint/reload/sync",
            reload_ms,
            "ms",
            restart_ms,
        )
        .limit_name("vLLM restart, same run")
        .target("<= 1"),
    ])
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN) * 1e3
}

struct Ctx<'a> {
    scratch: &'a Path,
    model: &'a Path,
    dirs: &'a [PathBuf],
}

/// A vLLM engine worker (its server started) and a native trainer worker (initialised).
struct Session {
    launcher: LocalLauncher,
    engines: Vec<RemoteEngine>,
    trainer: RemoteTrainer,
    start_s: f64,
}

impl Ctx<'_> {
    fn spec(&self, role: Role, component: &str, options: &str, run_dir: &Path) -> WorkerSpec {
        WorkerSpec::single_cpu(
            role,
            component,
            self.model,
            options,
            run_dir,
            self.dirs.to_vec(),
        )
    }

    fn session(&self, name: &str, engine: &str, trainer: &str) -> Result<Session, CliError> {
        let run_dir = self.scratch.join(name);
        let mut opts = LaunchOptions::new(&run_dir);
        opts.exe = Some(crate::exe::tandem()?);
        opts.worker_verbosity = 0;
        let mut launcher = LocalLauncher::new(opts)?;
        let engines =
            launcher.spawn_engines(&[self.spec(Role::Engine, "vllm", engine, &run_dir)])?;
        let t = Instant::now();
        for e in &engines {
            e.start()?;
        }
        let start_s = t.elapsed().as_secs_f64();
        let trainer = launcher
            .spawn_trainers(&[self.spec(Role::Trainer, "native", trainer, &run_dir)])?
            .pop()
            .ok_or_else(|| rt("trainer")("did not start".into()))?;
        trainer.init()?;
        Ok(Session {
            launcher,
            engines,
            trainer,
            start_s,
        })
    }
}

impl Session {
    /// `n` syncs in `mode` (each after a training step; the engine applies checkpoints
    /// itself), then the workers and the server are stopped. Latencies in seconds.
    fn syncs(mut self, mode: &str, n: usize) -> Result<Vec<f64>, CliError> {
        let mut bridge_opts = toml::Table::new();
        if mode == "checkpoint" {
            bridge_opts.insert("restart".into(), toml::Value::Boolean(false));
        }
        let mut driver = BridgeDriver::builtin(mode, false, &bridge_opts)?;
        driver.setup(&self.trainer, &mut self.engines, &mut self.launcher)?;
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            for e in &self.engines {
                e.pause_generation(tandem_plugin_api::PauseMode::Wait)?;
            }
            self.trainer.train_step(sft_batch())?;
            let rec = driver.sync(&self.trainer, &mut self.engines, &mut self.launcher)?;
            for e in &self.engines {
                e.continue_generation()?;
            }
            lat.push(rec.latency_s);
        }
        for e in &self.engines {
            e.shutdown()?;
        }
        self.launcher.shutdown(Duration::from_secs(30))?;
        Ok(lat)
    }
}
