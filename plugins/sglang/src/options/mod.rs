//! The `[engine] options` table of the `sglang` engine (serde, `deny_unknown_fields`), its
//! static checks at exact keys (`tandem check` shows them), and the `sglang.launch_server`
//! command line built from it.
//!
//! Two modes: `url` / `urls` attach to running servers (one per engine rank: the
//! disaggregated case), otherwise the plugin launches `python -m sglang.launch_server` per
//! rank on loopback.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use tandem_plugin_api::sdk::{self, Result};
use tandem_plugin_api::{ConfigCaps, ConfigProblem, PluginError, UpdateKind};
use tandem_plugin_support::server_engine::launch::bind_args;
use tandem_plugin_support::server_engine::options::{
    LaunchOptions, PublicBind, launch_problems, timeout_problems,
};
use tandem_plugin_support::server_engine::{Launcher, Trace};

use crate::engine::DIALECT;

/// What `PauseMode::Keep` maps to on SGLang's `/pause_generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepMode {
    /// Running requests go back to the waiting queue (their KV freed; a flush succeeds) and
    /// are recomputed after `continue_generation`.
    Retract,
    /// Running requests keep their KV in place (a flush is refused while they exist).
    InPlace,
}

impl KeepMode {
    /// SGLang's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            KeepMode::Retract => "retract",
            KeepMode::InPlace => "in_place",
        }
    }
}

/// `options` of the `sglang` engine component.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SglangOptions {
    /// Attach to this running server (`http://host:port`) instead of launching one; one
    /// engine rank only.
    pub url: Option<String>,
    /// Attach to these running servers, one per engine rank (rank r uses `urls[r]`).
    pub urls: Option<Vec<String>>,
    /// Python interpreter with SGLang installed (launch mode). Default: `$TANDEM_PYTHON`,
    /// else the venv `scripts/setup-python.sh` recorded.
    pub python: Option<String>,
    /// Alternative launcher, e.g. `["sglang", "serve"]` (flags appended). Exclusive with
    /// `python`.
    pub command: Option<Vec<String>>,
    /// Bind address of a launched server; loopback unless `allow_public_bind`.
    pub host: String,
    /// Port of rank 0 (rank r uses `port + r`); `0` picks a free port per rank.
    pub port: u16,
    /// Allow a non-loopback `host` (set `api_key` too).
    pub allow_public_bind: bool,
    /// Bearer token: passed as `--api-key` to a launched server, sent on every call.
    pub api_key: Option<String>,
    /// `--enable-memory-saver`: `release_memory` / `resume_memory` work only with it.
    pub enable_memory_saver: bool,
    /// `--enable-weights-cpu-backup` with the memory saver, so released weights come back
    /// bit-exact (without it SGLang discards their contents).
    pub weights_cpu_backup: bool,
    /// `--enable-lora`: adapter updates and `load_adapter` work only with it.
    pub enable_lora: bool,
    /// `--max-lora-rank` (needed by SGLang when it starts with no adapter).
    pub max_lora_rank: Option<u32>,
    /// `--lora-target-modules` (likewise).
    pub lora_target_modules: Vec<String>,
    /// `--mem-fraction-static` (share of GPU memory for weights + KV pool).
    pub mem_fraction_static: Option<f32>,
    /// `--tp-size`.
    pub tp_size: u32,
    /// `--random-seed` of rank 0 (rank r: seed + r).
    pub seed: u64,
    /// Seconds to wait for `/health_generate` after a launch or an attach.
    pub health_timeout_s: u64,
    /// Seconds a generation or scoring request may take.
    pub request_timeout_s: u64,
    /// Seconds a control call (pause, flush, release, updates, adapters) may take.
    pub control_timeout_s: u64,
    /// How often `/flush_cache` is retried (at 1 s) while SGLang refuses it (400).
    pub flush_retries: u32,
    /// What `PauseMode::Keep` maps to: `retract` (default) or `in_place`.
    pub keep_mode: KeepMode,
    /// Append one JSON line per HTTP exchange to this file
    /// (`{"method","path","query","status","request","response"}`).
    pub trace_requests: Option<String>,
    /// Extra `launch_server` arguments, verbatim.
    pub extra_args: Vec<String>,
    /// Extra environment variables of a launched server.
    pub env: BTreeMap<String, String>,
}

impl Default for SglangOptions {
    fn default() -> Self {
        SglangOptions {
            url: None,
            urls: None,
            python: None,
            command: None,
            host: "127.0.0.1".into(),
            port: 0,
            allow_public_bind: false,
            api_key: None,
            enable_memory_saver: false,
            weights_cpu_backup: true,
            enable_lora: false,
            max_lora_rank: None,
            lora_target_modules: Vec::new(),
            mem_fraction_static: None,
            tp_size: 1,
            seed: 0,
            health_timeout_s: 600,
            request_timeout_s: 600,
            control_timeout_s: 120,
            flush_retries: 60,
            keep_mode: KeepMode::Retract,
            trace_requests: None,
            extra_args: Vec::new(),
            env: BTreeMap::new(),
        }
    }
}

/// What the engine's errors about its options start with.
const WHAT: &str = "engine `sglang`";
/// The module `python -m` runs.
const SERVER_MODULE: &str = "sglang.launch_server";

fn is_url(u: &str) -> bool {
    (u.starts_with("http://") || u.starts_with("https://")) && u.len() > "https://".len()
}

impl SglangOptions {
    /// Parses and validates the options JSON (empty = defaults) for a component of
    /// `world_size` ranks: the constructor's side of [`SglangOptions::problems_of`].
    pub fn parse(json: &str, world_size: u32) -> Result<Self> {
        let opts: SglangOptions = sdk::parse_options(json).map_err(|p| p.to_error(WHAT))?;
        match opts.problems(world_size).first() {
            Some(p) => Err(p.to_error(WHAT)),
            None => Ok(opts),
        }
    }

    /// Every problem of the options JSON (`validate_config`).
    pub fn problems_of(json: &str, world_size: u32) -> Vec<ConfigProblem> {
        match sdk::parse_options::<SglangOptions>(json) {
            Ok(opts) => opts.problems(world_size),
            Err(p) => vec![p],
        }
    }

    /// `true` when the plugin attaches to running servers.
    pub fn attach(&self) -> bool {
        self.url.is_some() || self.urls.is_some()
    }

    /// The URL rank `rank` attaches to (attach mode), without a trailing `/`.
    pub fn url_of(&self, rank: u32) -> Option<String> {
        let u = match (&self.url, &self.urls) {
            (Some(u), _) => Some(u.clone()),
            (None, Some(us)) => us.get(rank as usize).cloned(),
            (None, None) => None,
        };
        u.map(|u| u.trim_end_matches('/').to_owned())
    }

    /// Static checks, each at its key.
    pub fn problems(&self, world_size: u32) -> Vec<ConfigProblem> {
        let mut p = Vec::new();
        self.attach_problems(world_size, &mut p);
        let public = PublicBind {
            why: "its control routes (weight updates, memory release, pause) would be reachable \
                  from the network",
            help: "bind to 127.0.0.1, or set allow_public_bind = true and api_key on a private \
                   network",
        };
        let launch = LaunchOptions {
            host: &self.host,
            allow_public_bind: self.allow_public_bind,
            python: self.python.as_deref(),
            command: self.command.as_deref(),
        };
        p.extend(launch_problems(&DIALECT, launch, public));
        if self.api_key.as_deref().is_some_and(str::is_empty) {
            p.push(ConfigProblem::new("api_key", "`api_key` is empty").with_help("remove it"));
        }
        if !self.enable_lora {
            if self.max_lora_rank.is_some() {
                p.push(lora_problem("max_lora_rank"));
            }
            if !self.lora_target_modules.is_empty() {
                p.push(lora_problem("lora_target_modules"));
            }
        }
        if self.max_lora_rank == Some(0) {
            p.push(ConfigProblem::new("max_lora_rank", "must be at least 1"));
        }
        p.extend(timeout_problems(&[
            ("health_timeout_s", self.health_timeout_s),
            ("request_timeout_s", self.request_timeout_s),
            ("control_timeout_s", self.control_timeout_s),
        ]));
        if self.tp_size == 0 {
            p.push(ConfigProblem::new("tp_size", "must be at least 1"));
        }
        if let Some(f) = self.mem_fraction_static
            && !(f > 0.0 && f < 1.0)
        {
            p.push(ConfigProblem::new(
                "mem_fraction_static",
                format!("must be in (0, 1), got {f}"),
            ));
        }
        if self.trace_requests.as_deref().is_some_and(str::is_empty) {
            p.push(ConfigProblem::new(
                "trace_requests",
                "the trace path is empty",
            ));
        }
        p
    }

    fn attach_problems(&self, world_size: u32, p: &mut Vec<ConfigProblem>) {
        match (&self.url, &self.urls) {
            (Some(_), Some(_)) => p.push(
                ConfigProblem::new("urls", "give either `url` or `urls`, not both")
                    .with_help("`url` for one engine rank, `urls` with one URL per rank"),
            ),
            (Some(u), None) => {
                if !is_url(u) {
                    p.push(bad_url("url", u));
                }
                if world_size > 1 {
                    p.push(
                        ConfigProblem::new(
                            "url",
                            format!("{world_size} engine ranks cannot share one server (`url`)"),
                        )
                        .with_help("give `urls` with one server URL per engine rank"),
                    );
                }
            }
            (None, Some(us)) => {
                for (i, u) in us.iter().enumerate() {
                    if !is_url(u) {
                        p.push(bad_url(&format!("urls[{i}]"), u));
                    }
                }
                if us.len() != world_size as usize {
                    p.push(
                        ConfigProblem::new(
                            "urls",
                            format!("{} URLs for {world_size} engine rank(s)", us.len()),
                        )
                        .with_help("give exactly one server URL per engine rank"),
                    );
                }
            }
            (None, None) => {}
        }
        if self.attach() {
            for (key, set) in [
                ("python", self.python.is_some()),
                ("command", self.command.is_some()),
                ("extra_args", !self.extra_args.is_empty()),
            ] {
                if set {
                    p.push(
                        ConfigProblem::new(
                            key,
                            format!("`{key}` launches a server; `url`/`urls` attach to one"),
                        )
                        .with_help("remove one of them"),
                    );
                }
            }
        }
    }

    /// The launcher (launch mode): `command`, else `python -m sglang.launch_server` with the
    /// interpreter from `python`, `$TANDEM_PYTHON` or the venv pointer file.
    pub fn launcher(&self) -> Result<Launcher> {
        let or_attach = ", or attach to a running server with `url`";
        let (command, python) = (self.command.as_deref(), self.python.as_deref());
        Launcher::resolve("sglang", command, python, SERVER_MODULE, or_attach)
    }

    /// The request trace of `trace_requests`, opened for appending.
    pub fn trace(&self) -> Result<Option<Trace>> {
        self.trace_requests
            .as_deref()
            .map(|p| {
                Trace::open(p).map_err(|e| {
                    PluginError::io(format!("{WHAT}: opening the trace file {p}: {e}"))
                        .with_help("point trace_requests at a writable path")
                })
            })
            .transpose()
    }

    /// What the engine does with these options serving `model`.
    pub fn caps(&self, model: &Path) -> ConfigCaps {
        // Adapter updates only with `--enable-lora`.
        let kinds = if self.enable_lora {
            vec![UpdateKind::Adapter, UpdateKind::CheckpointDir]
        } else {
            vec![UpdateKind::CheckpointDir]
        };
        // A launched server's context is the model's (unless `--context-length` is passed
        // through); an attached one's is its own, unknown here.
        let launched = !self.attach()
            && !self
                .extra_args
                .iter()
                .any(|a| a.starts_with("--context-length"));
        let max_seq_len = if launched {
            tandem_plugin_support::model::max_positions(model)
        } else {
            None
        };
        ConfigCaps {
            update_kinds: kinds.into(),
            max_seq_len: max_seq_len.unwrap_or(0),
            // Checkpoints reload in place (`/update_weights_from_disk`). Every update's files
            // are digested by the plugin before the server loads them (and an attached
            // `tandem serve` checksums what it loaded as well).
            reports_digest: true,
            ..ConfigCaps::default()
        }
    }

    /// `launch_server` arguments after the launcher.
    pub fn server_args(&self, model: &Path, port: u16, rank: u32, version: u64) -> Vec<String> {
        let mut a: Vec<String> = vec!["--model-path".into(), model.display().to_string()];
        a.extend(bind_args(&self.host, port));
        a.extend([
            "--skip-server-warmup".into(),
            "--weight-version".into(),
            version.to_string(),
            "--tp-size".into(),
            self.tp_size.to_string(),
            "--random-seed".into(),
            (self.seed + u64::from(rank)).to_string(),
        ]);
        if self.enable_memory_saver {
            a.push("--enable-memory-saver".into());
            if self.weights_cpu_backup {
                a.push("--enable-weights-cpu-backup".into());
            }
        }
        if self.enable_lora {
            a.push("--enable-lora".into());
            if let Some(r) = self.max_lora_rank {
                a.extend(["--max-lora-rank".into(), r.to_string()]);
            }
            if !self.lora_target_modules.is_empty() {
                a.push("--lora-target-modules".into());
                a.extend(self.lora_target_modules.iter().cloned());
            }
        }
        if let Some(f) = self.mem_fraction_static {
            a.extend(["--mem-fraction-static".into(), f.to_string()]);
        }
        if let Some(k) = &self.api_key {
            a.extend(["--api-key".into(), k.clone()]);
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// Environment of a launched server (on top of the inherited one): offline hubs, and
    /// logprobs before temperature / top-p / top-k as the ABI defines them.
    pub fn server_env(&self) -> Vec<(String, String)> {
        let mut e: Vec<(String, String)> = [
            ("SGLANG_RETURN_ORIGINAL_LOGPROB", "1"),
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("PYTHONUNBUFFERED", "1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        e.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        e
    }
}

fn lora_problem(key: &str) -> ConfigProblem {
    ConfigProblem::new(
        key,
        format!("`{key}` has no effect without enable_lora = true"),
    )
    .with_help("set enable_lora = true, or remove it")
}

fn bad_url(key: &str, u: &str) -> ConfigProblem {
    ConfigProblem::new(key, format!("`{u}` is not an http(s) URL"))
        .with_help("e.g. \"http://127.0.0.1:30000\"")
}

#[cfg(test)]
mod tests;
