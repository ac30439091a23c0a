//! Cross-checks of a parsed job file against itself and the plugin registry, producing the
//! resolved plan `tandem check` prints. All problems are collected, one line each.

use super::{ConfigError, ConfigIssue, LoadedJob, PlacementMode};
use crate::registry::Registry;
use serde::Serialize;
use std::ops::Range;
use std::path::PathBuf;
use tandem_plugin_api::{BridgeMode, ComponentKind};

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

struct Issues<'a> {
    job: &'a LoadedJob,
    list: Vec<ConfigIssue>,
}

impl Issues<'_> {
    fn push(&mut self, key: &str, span: Option<Range<usize>>, message: String, help: String) {
        let position = span
            .filter(|s| s.end > 0)
            .map(|s| self.job.position(s.start));
        self.list.push(ConfigIssue {
            file: self.job.path.clone(),
            key: key.to_owned(),
            position,
            message,
            help,
        });
    }
}

/// Validates `job` against itself and `registry`.
pub fn validate(job: &LoadedJob, registry: &Registry) -> Result<ResolvedPlan, ConfigError> {
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
    if p.devices.is_empty() {
        issues.push(
            "placement.devices",
            None,
            "no devices listed".into(),
            "e.g. devices = [\"cpu\"]".into(),
        );
    }
    for d in &p.devices {
        let ok = d == "cpu"
            || d.strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<u32>().is_ok());
        if !ok {
            issues.push(
                "placement.devices",
                None,
                format!("unknown device `{d}`"),
                "use \"cpu\" or \"cuda:N\"".into(),
            );
        }
    }

    let mut resolve =
        |kind: ComponentKind, key: &str, name: &toml::Spanned<String>, ranks: u32| {
            if ranks == 0 {
                issues.push(
                    &key.replace("plugin", "ranks"),
                    None,
                    "must be at least 1".into(),
                    String::new(),
                );
            }
            match registry.component(kind, name.get_ref()) {
                Some((plugin, decl)) => Some((
                    ResolvedComponent {
                        component: decl.name.to_string(),
                        plugin: plugin.manifest.name.to_string(),
                        source: plugin.source.to_string(),
                        ranks,
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

    let mode_name = j.bridge.mode.get_ref();
    let mode = BridgeMode::parse(mode_name);
    if mode.is_none() {
        issues.push(
            "bridge.mode",
            Some(j.bridge.mode.span()),
            format!("unknown bridge mode `{mode_name}`"),
            format!(
                "use one of: {}",
                BridgeMode::ALL.map(BridgeMode::as_str).join(", ")
            ),
        );
    }
    if let Some(mode) = mode {
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
    if let Some(preset) = &j.model.init_preset {
        if let Err(e) = tandem_plugin_native::init::Preset::parse(preset) {
            issues.push(
                "model.init_preset",
                None,
                format!("unknown preset `{preset}`"),
                format!("{e}"),
            );
        }
    } else if !model_path.exists() {
        issues.push(
            "model.path",
            None,
            format!("model directory {} does not exist", model_path.display()),
            "point it at a Hugging Face model directory, or set init_preset = \"tiny\"".into(),
        );
    }
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
        issues.push(&key, None, message, help);
    }
    let a = &j.algorithm;
    if a.prompts_per_step == 0 || a.max_tokens == 0 {
        issues.push(
            "algorithm",
            None,
            format!(
                "prompts_per_step = {}, max_tokens = {}",
                a.prompts_per_step, a.max_tokens
            ),
            "a rollout needs prompts_per_step >= 1 and max_tokens >= 1".into(),
        );
    }
    let transport_groups = match crate::placement::Layout::of(j)
        .and_then(|layout| layout.transport_plan(&j.transport.backend))
    {
        Ok(groups) => groups.iter().map(ToString::to_string).collect(),
        Err(message) => {
            issues.push(
                "transport.backend",
                None,
                message,
                "use auto, shm, tcp or nccl; nccl needs CUDA and distinct GPUs".into(),
            );
            Vec::new()
        }
    };
    let a = &j.algorithm;
    if a.name != "grpo" {
        issues.push(
            "algorithm.name",
            None,
            format!("unknown algorithm `{}`", a.name),
            "use \"grpo\"".into(),
        );
    }
    if a.group_size < 2 {
        issues.push(
            "algorithm.group_size",
            None,
            format!(
                "GRPO needs groups of at least 2 completions, got {}",
                a.group_size
            ),
            "set group_size = 8".into(),
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
            output_dir: job.resolve_path(&j.run.output_dir),
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
        _ => Err(ConfigError::Invalid {
            issues: issues.list,
        }),
    }
}
