//! The `[engine] options` table of the `vllm` engine (serde, `deny_unknown_fields`), its
//! validation (loopback bind unless `allow_public_bind`), and the server command line built
//! from it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use tandem_plugin_api::sdk::{self, Result};
use tandem_plugin_api::{ConfigCaps, ConfigProblem, UpdateKind};
use tandem_plugin_support::server_engine::Launcher;
use tandem_plugin_support::server_engine::launch::bind_args;
use tandem_plugin_support::server_engine::options::{
    LaunchOptions, PublicBind, launch_problems, timeout_problems,
};

use crate::engine::DIALECT;

/// `options` of the `vllm` engine component.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VllmOptions {
    /// Python interpreter with vLLM installed; runs
    /// `python -m vllm.entrypoints.openai.api_server`. Default: `$TANDEM_PYTHON`, else the
    /// venv `scripts/setup-python.sh` recorded.
    pub python: Option<String>,
    /// Alternative launcher, e.g. `["vllm", "serve"]` (the model path is appended). Exclusive
    /// with `python`.
    pub command: Option<Vec<String>>,
    /// Bind address of the server. Loopback only unless `allow_public_bind = true`: vLLM's
    /// dev-mode lifecycle routes (`/pause`, `/sleep`, `/collective_rpc`) are unauthenticated.
    pub host: String,
    /// Port of rank 0; rank `r` listens on `port + r`. `0` picks a free port per rank.
    pub port: u16,
    /// Allow a non-loopback `host`.
    pub allow_public_bind: bool,
    /// `--dtype` (`float32` on CPU matches the native engine; `auto`, `bfloat16`, ...).
    pub dtype: String,
    /// `--max-model-len` (prompt + completion); `None` keeps the model's.
    pub max_model_len: Option<u32>,
    /// `--max-num-seqs`: sequences scheduled together.
    pub max_num_seqs: u32,
    /// KV cache size in GiB on CPU (`VLLM_CPU_KVCACHE_SPACE`).
    pub cpu_kvcache_gib: u32,
    /// `--gpu-memory-utilization` (GPU only; ignored by the CPU backend).
    pub gpu_memory_utilization: Option<f32>,
    /// `--enforce-eager` (no torch.compile / CUDA graphs; saves ~20 s of start-up on CPU).
    pub enforce_eager: bool,
    /// `--enable-lora` + runtime adapter loading (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`).
    pub enable_lora: bool,
    /// `--max-loras`: adapters resident at once.
    pub max_loras: u32,
    /// `--max-lora-rank`.
    pub max_lora_rank: u32,
    /// `--seed`.
    pub seed: u64,
    /// How `checkpoint_dir` updates are applied: `reload` (default: the weights reloaded into
    /// the running server through Tandem's worker extension, ~0.2 s) or `restart` (a new
    /// server on the directory, ~40–70 s here).
    pub checkpoint_apply: CheckpointApply,
    /// Seconds to wait for `/health` after launch.
    pub startup_timeout_s: u64,
    /// Seconds a generation or scoring request may take.
    pub request_timeout_s: u64,
    /// Seconds a control call (pause, adapters, reload, version) may take.
    pub control_timeout_s: u64,
    /// Extra command-line arguments passed to the server verbatim.
    pub extra_args: Vec<String>,
    /// Extra environment variables for the server.
    pub env: BTreeMap<String, String>,
}

/// How a checkpoint directory reaches the served weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointApply {
    /// Stop the server and start a new one on the directory.
    Restart,
    /// `/collective_rpc tandem_reload_weights` (vLLM's `reload_weights` + the tied-`lm_head`
    /// repair of the worker extension) into the running server.
    Reload,
}

impl Default for VllmOptions {
    fn default() -> Self {
        VllmOptions {
            python: None,
            command: None,
            host: "127.0.0.1".into(),
            port: 0,
            allow_public_bind: false,
            dtype: "float32".into(),
            max_model_len: None,
            max_num_seqs: 8,
            cpu_kvcache_gib: 1,
            gpu_memory_utilization: None,
            enforce_eager: true,
            enable_lora: false,
            max_loras: 2,
            max_lora_rank: 16,
            seed: 0,
            checkpoint_apply: CheckpointApply::Reload,
            startup_timeout_s: 300,
            request_timeout_s: 300,
            control_timeout_s: 60,
            extra_args: Vec::new(),
            env: BTreeMap::new(),
        }
    }
}

/// The module `python -m` runs.
const SERVER_MODULE: &str = "vllm.entrypoints.openai.api_server";

/// The name the model is served under (requests without an adapter use it).
pub const SERVED_NAME: &str = "tandem-base";

/// What the engine's errors about its options start with.
const WHAT: &str = "engine `vllm`";

impl VllmOptions {
    /// Parses the options JSON (empty = defaults) and validates it: the constructor's side of
    /// [`VllmOptions::problems_of`] (same parse, same checks).
    pub fn parse(json: &str) -> Result<Self> {
        let opts: VllmOptions = sdk::parse_options(json).map_err(|p| p.to_error(WHAT))?;
        match opts.problems().first() {
            Some(p) => Err(p.to_error(WHAT)),
            None => Ok(opts),
        }
    }

    /// Every problem of the options JSON (`validate_config`): the parse error, or the static
    /// checks'. Looks for no interpreter and starts nothing.
    pub fn problems_of(json: &str) -> Vec<ConfigProblem> {
        match sdk::parse_options::<VllmOptions>(json) {
            Ok(opts) => opts.problems(),
            Err(p) => vec![p],
        }
    }

    /// Static checks: bind address, launcher, timeouts, counts.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let public = PublicBind {
            why: "its dev-mode lifecycle routes (/pause, /sleep, /collective_rpc, adapter \
                  loading) have no authentication",
            help: "bind to 127.0.0.1, or set allow_public_bind = true on a private network only",
        };
        let launch = LaunchOptions {
            host: &self.host,
            allow_public_bind: self.allow_public_bind,
            python: self.python.as_deref(),
            command: self.command.as_deref(),
        };
        let mut p = launch_problems(&DIALECT, launch, public);
        p.extend(timeout_problems(&[
            ("startup_timeout_s", self.startup_timeout_s),
            ("request_timeout_s", self.request_timeout_s),
            ("control_timeout_s", self.control_timeout_s),
        ]));
        for (what, v) in [
            ("max_num_seqs", self.max_num_seqs),
            ("cpu_kvcache_gib", self.cpu_kvcache_gib),
            ("max_loras", self.max_loras),
            ("max_lora_rank", self.max_lora_rank),
        ] {
            if v == 0 {
                p.push(ConfigProblem::new(what, "must be at least 1"));
            }
        }
        if self.max_model_len == Some(0) {
            p.push(
                ConfigProblem::new("max_model_len", "must be at least 1")
                    .with_help("remove it to keep the model's context length"),
            );
        }
        if let Some(u) = self.gpu_memory_utilization
            && !(u > 0.0 && u <= 1.0)
        {
            p.push(ConfigProblem::new(
                "gpu_memory_utilization",
                format!("must be in (0, 1], got {u}"),
            ));
        }
        p
    }

    /// The launcher: `command`, else `python -m vllm.entrypoints.openai.api_server` with the
    /// interpreter from `python`, `$TANDEM_PYTHON` or the venv `scripts/setup-python.sh`
    /// recorded (`tandem_plugin_support::python`).
    pub fn launcher(&self) -> Result<Launcher> {
        let (command, python) = (self.command.as_deref(), self.python.as_deref());
        Launcher::resolve("vllm", command, python, SERVER_MODULE, "")
    }

    /// What the engine does with these options serving `model`.
    pub fn caps(&self, model: &Path) -> ConfigCaps {
        // Adapters only with `--enable-lora` (the kit refuses them otherwise).
        let kinds = if self.enable_lora {
            vec![UpdateKind::Adapter, UpdateKind::CheckpointDir]
        } else {
            vec![UpdateKind::CheckpointDir]
        };
        // `--max-model-len`, else vLLM takes the model's position table.
        let max_seq_len = self
            .max_model_len
            .or_else(|| tandem_plugin_support::model::max_positions(model));
        ConfigCaps {
            update_kinds: kinds.into(),
            max_seq_len: max_seq_len.unwrap_or(0),
            // `checkpoint_apply = "restart"` starts a new server on the directory.
            restarts_on_checkpoint: self.checkpoint_apply == CheckpointApply::Restart,
            // Every update's files are digested by the plugin before vLLM loads them.
            reports_digest: true,
            // No speculation it manages (no `load_drafter`); `tandem serve` in front of
            // vLLM's own server is untried, so it does not claim to serve.
            ..ConfigCaps::default()
        }
    }

    /// Server arguments after the launcher.
    pub fn server_args(&self, model: &Path, tokenizer: &Path, port: u16, rank: u32) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--model".into(),
            model.display().to_string(),
            // Trainer checkpoints carry weights + config only: the tokenizer stays the
            // original model's.
            "--tokenizer".into(),
            tokenizer.display().to_string(),
        ];
        a.extend(bind_args(&self.host, port));
        a.extend([
            "--served-model-name".into(),
            SERVED_NAME.into(),
            "--dtype".into(),
            self.dtype.clone(),
            "--max-num-seqs".into(),
            self.max_num_seqs.to_string(),
            "--seed".into(),
            (self.seed + u64::from(rank)).to_string(),
            "--disable-uvicorn-access-log".into(),
            // Sampling defaults come from the request only, never from generation_config.json.
            "--generation-config".into(),
            "vllm".into(),
        ]);
        if let Some(n) = self.max_model_len {
            a.extend(["--max-model-len".into(), n.to_string()]);
        }
        if let Some(u) = self.gpu_memory_utilization {
            a.extend(["--gpu-memory-utilization".into(), u.to_string()]);
        }
        if self.enforce_eager {
            a.push("--enforce-eager".into());
        }
        if self.enable_lora {
            a.extend([
                "--enable-lora".into(),
                "--max-loras".into(),
                self.max_loras.to_string(),
                "--max-lora-rank".into(),
                self.max_lora_rank.to_string(),
            ]);
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// Server environment (on top of the inherited one).
    pub fn server_env(&self) -> Vec<(String, String)> {
        let mut e: Vec<(String, String)> = vec![
            ("VLLM_SERVER_DEV_MODE".into(), "1".into()),
            ("HF_HUB_OFFLINE".into(), "1".into()),
            ("TRANSFORMERS_OFFLINE".into(), "1".into()),
            ("VLLM_NO_USAGE_STATS".into(), "1".into()),
            ("DO_NOT_TRACK".into(), "1".into()),
            (
                "VLLM_CPU_KVCACHE_SPACE".into(),
                self.cpu_kvcache_gib.to_string(),
            ),
            ("PYTHONUNBUFFERED".into(), "1".into()),
        ];
        if self.enable_lora {
            e.push(("VLLM_ALLOW_RUNTIME_LORA_UPDATING".into(), "True".into()));
        }
        e.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        e
    }
}

/// The worker extension module (see `python/tandem_vllm_ext.py`), written into a directory
/// on the server's `PYTHONPATH`.
pub const EXTENSION_MODULE: (&str, &str) = (
    "tandem_vllm_ext.py",
    include_str!("../python/tandem_vllm_ext.py"),
);

/// `--worker-extension-cls` value of [`EXTENSION_MODULE`].
pub const EXTENSION_CLASS: &str = "tandem_vllm_ext.TandemWorkerExtension";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tandem_plugin_support::server_engine::testing::model_with_positions;

    #[test]
    fn public_bind_is_refused_unless_allowed() {
        let e = VllmOptions::parse(r#"{"host": "0.0.0.0", "python": "p"}"#).unwrap_err();
        assert!(e.message.contains("refusing to bind"), "{e}");
        VllmOptions::parse(r#"{"host": "0.0.0.0", "python": "p", "allow_public_bind": true}"#)
            .unwrap();
        VllmOptions::parse(r#"{"host": "::1", "python": "p"}"#).unwrap();
    }

    #[test]
    fn the_python_option_and_command_name_their_origin() {
        let o = VllmOptions::parse(r#"{"python": "/venv/bin/python"}"#).unwrap();
        let l = o.launcher().unwrap();
        assert_eq!(l.program, "/venv/bin/python");
        assert_eq!(l.args, ["-m", "vllm.entrypoints.openai.api_server"]);
        assert_eq!(l.origin, "the `python` option");
        let o = VllmOptions::parse(r#"{"command": ["vllm", "serve"]}"#).unwrap();
        let l = o.launcher().unwrap();
        assert_eq!(
            (l.program.as_str(), l.args.as_slice()),
            ("vllm", &["serve".to_owned()][..])
        );
        assert_eq!(l.origin, "the `command` option");
    }

    #[test]
    fn unknown_options_are_refused() {
        let e = VllmOptions::parse(r#"{"max_model_length": 3}"#).unwrap_err();
        assert!(e.message.contains("max_model_length"), "{e}");
        let p = VllmOptions::problems_of(r#"{"max_model_length": 3}"#);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key.as_str(), "max_model_length");
    }

    #[test]
    fn validation_reports_every_problem_at_its_key() {
        assert!(VllmOptions::problems_of("").is_empty());
        let p = VllmOptions::problems_of(
            r#"{"host": "0.0.0.0", "python": "p", "command": ["vllm"], "max_num_seqs": 0}"#,
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["host", "command", "max_num_seqs"]);
        let p = VllmOptions::problems_of(r#"{"checkpoint_apply": "swap"}"#);
        assert_eq!(p[0].key.as_str(), "checkpoint_apply");
        assert!(p[0].message.contains("unknown variant `swap`"), "{}", p[0]);
    }

    #[test]
    fn it_says_lora_restarts_and_its_longest_sequence_as_its_options_do() {
        let m = model_with_positions(128).unwrap();
        let plain = VllmOptions::parse("{}").unwrap().caps(&m);
        assert_eq!(plain.update_kinds.as_slice(), &[UpdateKind::CheckpointDir]);
        assert_eq!(plain.max_seq_len, 128, "the model's positions");
        assert!(!plain.restarts_on_checkpoint && plain.reports_digest && !plain.serves);
        let opts = r#"{"enable_lora": true, "checkpoint_apply": "restart", "max_model_len": 96}"#;
        let c = VllmOptions::parse(opts).unwrap().caps(&m);
        assert_eq!(
            c.update_kinds.as_slice(),
            &[UpdateKind::Adapter, UpdateKind::CheckpointDir]
        );
        assert!(c.restarts_on_checkpoint);
        assert_eq!(c.max_seq_len, 96);
    }

    #[test]
    fn lora_flags_and_dev_mode_env() {
        let o = VllmOptions::parse(r#"{"enable_lora": true, "max_lora_rank": 8}"#).unwrap();
        let a = o
            .server_args(Path::new("/m"), Path::new("/m"), 9000, 1)
            .join(" ");
        assert!(
            a.contains("--enable-lora --max-loras 2 --max-lora-rank 8"),
            "{a}"
        );
        assert!(a.contains("--port 9000") && a.contains("--seed 1"), "{a}");
        let env = o.server_env();
        assert!(env.contains(&("VLLM_SERVER_DEV_MODE".into(), "1".into())));
        assert!(
            env.iter()
                .any(|(k, _)| k == "VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        );
    }
}
