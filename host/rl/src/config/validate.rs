//! Cross-checks of a parsed job file against itself, the plugin registry and the model
//! directory, producing the resolved plan `tandem check` prints. It is the one validation of a
//! job: `tandem run` calls it before it creates anything (run directory, model, workers), so
//! every check the run would otherwise make later lives here — the plugins' own checks of
//! `[engine.options]` / `[trainer.options]` (`validate_config`, with rank 0's component config
//! as the run builds it), `[bridge]` ([`crate::bridge::parse_settings`]), the model directory,
//! the task, the algorithm's values. All problems are collected, one line each, in file order,
//! each pointing at its key in the job file.

use super::{ConfigError, ConfigIssue, LoadedJob, PlacementMode};
use tandem_runtime::registry::Registry;
use serde::Serialize;
use std::ops::Range;
use std::path::{Path, PathBuf};
use tandem_plugin_api::{BridgeMode, ComponentConfig, ComponentKind};

/// Headroom that colocated placement keeps free on each device (fraction of capacity).
pub const COLOCATE_HEADROOM: f64 = 0.10;

/// What `tandem check` resolved a job file to.
#[derive(Debug, Clone, Serialize)]
pub struct ResolvedPlan {
    /// Run name.
    pub name: String,
    /// Run directory (absolute or relative to the working directory).
    pub output_dir: PathBuf,
    /// Model directory.
    pub model_path: PathBuf,
    /// Whether the model will be created from a preset.
    pub model_init_preset: Option<String>,
    /// `colocate` or `disaggregated`.
    pub placement: PlacementMode,
    /// Devices.
    pub devices: Vec<String>,
    /// Trainer's memory fraction per device.
    pub train_frac: f64,
    /// Engine's memory fraction per device.
    pub infer_frac: f64,
    /// The engine component.
    pub engine: ResolvedComponent,
    /// The trainer component.
    pub trainer: ResolvedComponent,
    /// The bridge.
    pub bridge: ResolvedBridge,
    /// Transport backend requested.
    pub transport: String,
    /// Transport chosen per group, one line each (e.g. `trainers [0, 1]: shm (1 pair)`).
    pub transport_groups: Vec<String>,
}

/// A resolved engine or trainer.
#[derive(Debug, Clone, Serialize)]
pub struct ResolvedComponent {
    /// Component name.
    pub component: String,
    /// Plugin providing it.
    pub plugin: String,
    /// Where the plugin came from.
    pub source: String,
    /// Number of ranks.
    pub ranks: u32,
    /// Memory tags it declares releasable: the loop offloads / releases only these.
    pub releasable_tags: Vec<String>,
}

/// A resolved bridge.
#[derive(Debug, Clone, Serialize)]
pub struct ResolvedBridge {
    /// Mode name.
    pub mode: String,
    /// Update kind both sides must support.
    pub update_kind: String,
    /// Plugin providing the bridge, or `None` if no loaded plugin implements the mode.
    pub provider: Option<String>,
    /// Verify every sync.
    pub verify: bool,
}

/// What the command line changes about a job before it is validated.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Run directory instead of `[run] output_dir` (`tandem run --output-dir`, `--resume`).
    pub output_dir: Option<PathBuf>,
}

/// The options table of a component as the JSON its plugin receives.
pub fn options_json(table: &toml::Table) -> Result<String, serde_json::Error> {
    serde_json::to_string(table)
}

/// The device of rank `rank` of a role: the job's devices, round-robin (`cpu` when none).
pub fn device_of(devices: &[String], rank: u32) -> String {
    devices
        .get(rank as usize % devices.len().max(1))
        .cloned()
        .unwrap_or_else(|| "cpu".into())
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

struct Issues<'a> {
    job: &'a LoadedJob,
    list: Vec<ConfigIssue>,
}

impl Issues<'_> {
    /// A problem at `key`; `span` where the caller knows it, else the key's place in the file.
    fn push(&mut self, key: &str, span: Option<Range<usize>>, message: String, help: String) {
        let span = span.filter(|s| s.end > 0).or_else(|| self.job.span_of(key));
        let position = span.map(|s| self.job.position(s.start));
        self.list.push(ConfigIssue {
            file: self.job.path.clone(),
            key: key.to_owned(),
            position,
            message,
            help,
        });
    }

    /// A problem at `key` found by its place in the file.
    fn at(&mut self, key: &str, message: impl Into<String>, help: impl Into<String>) {
        self.push(key, None, message.into(), help.into());
    }
}

/// Validates `job` against itself and `registry`, with the job's own run directory.
pub fn validate(job: &LoadedJob, registry: &Registry) -> Result<ResolvedPlan, ConfigError> {
    validate_with(job, registry, &Overrides::default())
}

/// Validates `job` against itself and `registry` as it will run with `overrides`.
pub fn validate_with(
    job: &LoadedJob,
    registry: &Registry,
    overrides: &Overrides,
) -> Result<ResolvedPlan, ConfigError> {
    let j = &job.job;
    let mut issues = Issues {
        job,
        list: Vec::new(),
    };

    let p = &j.placement;
    for (key, v) in [
        ("placement.train_frac", &p.train_frac),
        ("placement.infer_frac", &p.infer_frac),
    ] {
        if !(*v.get_ref() > 0.0 && *v.get_ref() <= 1.0) {
            issues.push(
                key,
                Some(v.span()),
                format!("must be in (0, 1], got {}", v.get_ref()),
                "it is the fraction of each device's memory this side may use".into(),
            );
        }
    }
    let (tf, inf) = (*p.train_frac.get_ref(), *p.infer_frac.get_ref());
    if p.mode == PlacementMode::Colocate && tf + inf + COLOCATE_HEADROOM > 1.0 + 1e-9 {
        issues.push(
            "placement.train_frac",
            Some(p.train_frac.span()),
            format!(
                "train_frac + infer_frac + {COLOCATE_HEADROOM:.2} headroom = {:.2} > 1.0 in colocate mode",
                tf + inf + COLOCATE_HEADROOM
            ),
            format!("lower them so that they sum to at most {:.2}", 1.0 - COLOCATE_HEADROOM),
        );
    }
    let mut devices_ok = true;
    if p.devices.is_empty() {
        devices_ok = false;
        issues.at(
            "placement.devices",
            "no devices listed",
            "e.g. devices = [\"cpu\"]",
        );
    }
    for (i, d) in p.devices.iter().enumerate() {
        let ok = d == "cpu"
            || d.strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<u32>().is_ok());
        if !ok {
            devices_ok = false;
            issues.push(
                "placement.devices",
                job.span_of(&format!("placement.devices[{i}]")),
                format!("unknown device `{d}`"),
                "use \"cpu\" or \"cuda:N\"".into(),
            );
        }
    }

    let mut resolve =
        |kind: ComponentKind, key: &str, name: &toml::Spanned<String>, ranks: u32| {
            if ranks == 0 {
                issues.at(&key.replace("plugin", "ranks"), "must be at least 1", "");
            }
            match registry.component(kind, name.get_ref()) {
                Some((plugin, decl)) => Some((
                    ResolvedComponent {
                        component: decl.name.to_string(),
                        plugin: plugin.manifest.name.to_string(),
                        source: plugin.source.to_string(),
                        ranks,
                        releasable_tags: decl
                            .caps
                            .releasable_tags
                            .iter()
                            .map(ToString::to_string)
                            .collect(),
                    },
                    decl.caps.clone(),
                )),
                None => {
                    let known = registry.component_names(kind);
                    issues.push(
                    key,
                    Some(name.span()),
                    format!("unknown {} plugin `{}`", kind.as_str(), name.get_ref()),
                    format!(
                        "known {}s: {}; add a plugin directory with --plugin-dir or [plugins] dirs",
                        kind.as_str(),
                        if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                    ),
                );
                    None
                }
            }
        };
    let engine = resolve(
        ComponentKind::Engine,
        "engine.plugin",
        &j.engine.plugin,
        j.engine.ranks,
    );
    let trainer = resolve(
        ComponentKind::Trainer,
        "trainer.plugin",
        &j.trainer.plugin,
        j.trainer.ranks,
    );
    if j.trainer.ranks > 1 {
        issues.at(
            "trainer.ranks",
            format!(
                "the loop drives one trainer worker, got ranks = {}",
                j.trainer.ranks
            ),
            "set ranks = 1; a multi-rank trainer launches its ranks itself (fsdp: [trainer.options] ranks = N)",
        );
    }

    let mode_name = j.bridge.mode.get_ref();
    let mode = BridgeMode::parse(mode_name);
    let mut mode_runs = true;
    if let Err(problems) = crate::bridge::parse_settings(mode_name, &j.bridge.options) {
        for p in problems {
            let key = format!("bridge.{}", p.key);
            let span = (p.key == "mode").then(|| j.bridge.mode.span());
            mode_runs &= p.key != "mode";
            issues.push(&key, span, p.message, p.help);
        }
    }
    // Which updates the components must declare (for a mode the sync driver runs).
    if let Some(mode) = mode.filter(|_| mode_runs) {
        let kind = mode.update_kind();
        for (side, resolved) in [("engine", &engine), ("trainer", &trainer)] {
            if let Some((c, caps)) = resolved
                && !caps.update_kinds.contains(&kind)
            {
                let declared: Vec<&str> = caps.update_kinds.iter().map(|k| k.as_str()).collect();
                issues.push(
                    "bridge.mode",
                    Some(j.bridge.mode.span()),
                    format!(
                        "bridge mode `{mode_name}` needs {} updates, which {side} `{}` does not declare (it declares: {})",
                        kind.as_str(),
                        c.component,
                        if declared.is_empty() { "none".to_owned() } else { declared.join(", ") }
                    ),
                    "pick a bridge mode both sides support; see `tandem plugins`".into(),
                );
            }
        }
    }

    let model_path = job.resolve_path(&j.model.path);
    check_model(&mut issues, registry, &model_path, j.model.init_preset.as_deref());
    if let Err(e) = crate::task::build(&j.task, j.run.seed) {
        let msg = e.0;
        let (key, rest) = match msg.split_once(": ") {
            Some((k, r)) if !k.contains(' ') => (format!("task.{k}"), r.to_string()),
            _ => ("task".to_string(), msg.clone()),
        };
        let (message, help) = match rest.split_once(" (help: ") {
            Some((m, h)) => (m.to_string(), h.trim_end_matches(')').to_string()),
            None => (
                rest,
                format!("built-in tasks: {}", crate::task::KINDS.join(", ")),
            ),
        };
        issues.at(&key, message, help);
    }
    check_algorithm(&mut issues, &j.algorithm);
    let transport_groups = if devices_ok {
        match crate::placement::Layout::of(j)
            .and_then(|layout| layout.transport_plan(&j.transport.backend))
        {
            Ok(groups) => groups.iter().map(ToString::to_string).collect(),
            Err(message) => {
                issues.at(
                    "transport.backend",
                    message,
                    "use auto, shm, tcp or nccl; nccl needs CUDA and distinct GPUs",
                );
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let t = j.transport.timeout_secs;
    if !(t > 0.0 && t.is_finite()) {
        issues.at(
            "transport.timeout_secs",
            format!("must be > 0 (seconds), got {t}"),
            "seconds before a silent peer is declared dead, e.g. 60",
        );
    }
    if j.memory.cpu_capacity_bytes == Some(0) {
        issues.at(
            "memory.cpu_capacity_bytes",
            "must be at least 1",
            "remove it to use the machine's MemTotal",
        );
    }

    let output_dir = overrides
        .output_dir
        .clone()
        .unwrap_or_else(|| job.resolve_path(&j.run.output_dir));
    // The plugins check their own options, with rank 0's config as the run builds it.
    for (kind, section, resolved, table) in [
        (ComponentKind::Engine, "engine", &engine, &j.engine.options),
        (
            ComponentKind::Trainer,
            "trainer",
            &trainer,
            &j.trainer.options,
        ),
    ] {
        let Some((c, _)) = resolved else { continue };
        check_plugin_options(
            &mut issues,
            registry,
            kind,
            section,
            c,
            table,
            ComponentSite {
                model_path: &model_path,
                devices: &p.devices,
                run_dir: &output_dir,
            },
        );
    }

    let bridge = ResolvedBridge {
        mode: mode_name.clone(),
        update_kind: mode
            .map(|m| m.update_kind().as_str().to_owned())
            .unwrap_or_default(),
        provider: registry
            .component(ComponentKind::Bridge, mode_name)
            .map(|(p, _)| p.manifest.name.to_string()),
        verify: j.bridge.verify,
    };
    match (engine, trainer) {
        (Some((engine, _)), Some((trainer, _))) if issues.list.is_empty() => Ok(ResolvedPlan {
            name: j.run.name.clone(),
            output_dir,
            model_path,
            model_init_preset: j.model.init_preset.clone(),
            placement: p.mode,
            devices: p.devices.clone(),
            train_frac: tf,
            infer_frac: inf,
            engine,
            trainer,
            bridge,
            transport: j.transport.backend.clone(),
            transport_groups,
        }),
        _ => {
            let mut list = issues.list;
            // File order; issues without a position (none should remain) last.
            list.sort_by_key(|i| i.position.unwrap_or((usize::MAX, usize::MAX)));
            Err(ConfigError::Invalid { issues: list })
        }
    }
}

/// The model directory must be usable by the run: a Hugging Face directory whose config and
/// tokenizer the controller loads, or absent (or empty) when `init_preset` creates it.
fn check_model(
    issues: &mut Issues<'_>,
    registry: &Registry,
    model_path: &Path,
    preset: Option<&str>,
) {
    if model_path.join("config.json").is_file() {
        if !model_path.join("tokenizer.json").is_file() {
            issues.at(
                "model.path",
                format!(
                    "model directory {} has no tokenizer.json",
                    model_path.display()
                ),
                "the controller needs the model's tokenizer.json (Hugging Face layout)",
            );
            return;
        }
        // What the run loads on the controller before its first step.
        if let Err(e) = crate::prompt::PromptCodec::load(model_path) {
            let help = e
                .help()
                .unwrap_or_else(|| "point it at a Hugging Face model directory".to_owned());
            issues.at("model.path", e.to_string(), help);
        }
        return;
    }
    match preset {
        Some(preset) => {
            check_preset(issues, registry, model_path, preset);
            let occupied = if model_path.is_dir() {
                std::fs::read_dir(model_path).map_or(true, |mut d| d.next().is_some())
            } else {
                model_path.exists()
            };
            if occupied {
                issues.at(
                    "model.path",
                    format!(
                        "{} exists but holds no model (no config.json), so init_preset cannot create one there",
                        model_path.display()
                    ),
                    "point path at a new directory, or at a Hugging Face model directory",
                );
            }
        }
        None if !model_path.exists() => issues.at(
            "model.path",
            format!("model directory {} does not exist", model_path.display()),
            "point it at a Hugging Face model directory, or set init_preset = \"tiny\"",
        ),
        None => issues.at(
            "model.path",
            format!(
                "model directory {} has no config.json",
                model_path.display()
            ),
            "point it at a Hugging Face model directory, or set init_preset = \"tiny\" with a new path",
        ),
    }
}

/// Asks the model tool's trainer (`warmstart::MODEL_TOOL`) whether it can create `preset`.
fn check_preset(issues: &mut Issues<'_>, registry: &Registry, model_path: &Path, preset: &str) {
    let tool = crate::warmstart::MODEL_TOOL;
    let config = ComponentConfig {
        component: tool.into(),
        model_path: absolute(model_path).to_string_lossy().as_ref().into(),
        options_json: serde_json::json!({ "init_preset": preset }).to_string().into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: "".into(),
    };
    match registry.validate_config(ComponentKind::Trainer, config) {
        Ok(Some(problems)) => {
            for p in problems {
                issues.at("model.init_preset", p.message.to_string(), p.help.to_string());
            }
        }
        Ok(None) => {
            if registry.component(ComponentKind::Trainer, tool).is_none() {
                issues.at(
                    "model.init_preset",
                    format!("preset models are created by the `{tool}` trainer, which is not loaded"),
                    "point [model] path at a Hugging Face model directory",
                );
            }
        }
        Err(e) => issues.at("model.init_preset", e.to_string(), "this is a bug in the plugin; report it"),
    }
}

/// Values of `[algorithm]` the loop cannot run with.
fn check_algorithm(issues: &mut Issues<'_>, a: &super::AlgorithmSection) {
    if a.name != "grpo" {
        issues.at(
            "algorithm.name",
            format!("unknown algorithm `{}`", a.name),
            "use \"grpo\"",
        );
    }
    for (key, v, what) in [
        ("prompts_per_step", a.prompts_per_step, "prompts per step"),
        ("max_tokens", a.max_tokens, "new tokens per completion"),
        (
            "train_steps_per_rollout",
            a.train_steps_per_rollout,
            "optimiser steps per RL step",
        ),
    ] {
        if v == 0 {
            issues.at(
                &format!("algorithm.{key}"),
                "must be at least 1",
                format!("it is the number of {what}"),
            );
        }
    }
    if a.group_size < 2 {
        issues.at(
            "algorithm.group_size",
            format!(
                "GRPO needs groups of at least 2 completions, got {}",
                a.group_size
            ),
            "set group_size = 8",
        );
    }
    let float = |v: f32, ok: fn(f32) -> bool| v.is_finite() && ok(v);
    for (key, v, ok, rule, help) in [
        (
            "temperature",
            a.temperature,
            (|v| v >= 0.0) as fn(f32) -> bool,
            ">= 0",
            "0 samples greedily; 1.0 samples from the model's distribution",
        ),
        (
            "learning_rate",
            a.learning_rate,
            |v| v > 0.0,
            "> 0",
            "e.g. learning_rate = 0.0003",
        ),
        (
            "clip_eps",
            a.clip_eps,
            |v| v >= 0.0,
            ">= 0",
            "the PPO clip range, e.g. clip_eps = 0.2",
        ),
        (
            "kl_coef",
            a.kl_coef,
            |v| v >= 0.0,
            ">= 0",
            "0 disables the KL penalty (and the reference snapshot)",
        ),
        (
            "grad_clip",
            a.grad_clip,
            |v| v > 0.0,
            "> 0",
            "the global gradient-norm clip, e.g. grad_clip = 1.0",
        ),
    ] {
        if !float(v, ok) {
            issues.at(
                &format!("algorithm.{key}"),
                format!("must be a number {rule}, got {v}"),
                help,
            );
        }
    }
}

/// Where the run puts a component: what its config carries besides the options.
struct ComponentSite<'a> {
    model_path: &'a Path,
    devices: &'a [String],
    run_dir: &'a Path,
}

/// Asks the component's plugin to check `[SECTION.options]` (rank 0's config, as
/// `rl::driver` builds it for the worker).
fn check_plugin_options(
    issues: &mut Issues<'_>,
    registry: &Registry,
    kind: ComponentKind,
    section: &str,
    c: &ResolvedComponent,
    table: &toml::Table,
    site: ComponentSite<'_>,
) {
    let options_key = format!("{section}.options");
    let json = match options_json(table) {
        Ok(json) => json,
        Err(e) => {
            issues.at(
                &options_key,
                format!("cannot be handed to the plugin as JSON: {e}"),
                "use strings, numbers, booleans, arrays and tables only",
            );
            return;
        }
    };
    let config = ComponentConfig {
        component: c.component.as_str().into(),
        model_path: absolute(site.model_path).to_string_lossy().as_ref().into(),
        options_json: json.as_str().into(),
        rank: 0,
        world_size: c.ranks,
        device: device_of(site.devices, 0).as_str().into(),
        run_dir: absolute(site.run_dir).to_string_lossy().as_ref().into(),
    };
    let what = format!(
        "{} `{}` (plugin `{}`)",
        kind.as_str(),
        c.component,
        c.plugin
    );
    match registry.validate_config(kind, config) {
        Ok(None) => {}
        Ok(Some(problems)) => {
            for p in problems {
                let key = if p.key.is_empty() {
                    options_key.clone()
                } else {
                    format!("{options_key}.{}", p.key)
                };
                let help = if p.help.is_empty() {
                    format!("see `tandem plugins` for the {what}")
                } else {
                    p.help.to_string()
                };
                issues.at(&key, format!("{what}: {}", p.message), help);
            }
        }
        Err(e) => issues.at(
            &options_key,
            e.to_string(),
            "this is a bug in the plugin; report it",
        ),
    }
}
