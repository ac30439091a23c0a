//! `[placement]` (memory fractions, devices, the CPU cores of `[placement.cpus]`), the
//! `[engine]` / `[trainer]` components the registry must provide, and the trainer's rank
//! count the loop can drive.

use super::issues::Issues;
use crate::config::{JobFile, PlacementMode, PlacementSection};
use tandem_plugin_api::{Capabilities, ComponentDecl, ComponentKind};
use tandem_runtime::registry::{LoadedPlugin, Registry};

/// Headroom that colocated placement keeps free on each device (fraction of capacity).
pub const COLOCATE_HEADROOM: f64 = 0.10;

/// A component the registry found, with what its manifest declares.
#[derive(Debug, Clone)]
pub(super) struct Found {
    /// Component name.
    pub component: String,
    /// Plugin providing it.
    pub plugin: String,
    /// Where the plugin came from.
    pub source: String,
    /// The plugin's API level.
    pub api_level: u32,
    /// What the manifest declares.
    pub caps: Capabilities,
}

impl Found {
    /// The component `decl` of `plugin`.
    pub fn of(plugin: &LoadedPlugin, decl: &ComponentDecl) -> Found {
        Found {
            component: decl.name.to_string(),
            plugin: plugin.manifest.name.to_string(),
            source: plugin.source.to_string(),
            api_level: plugin.manifest.api_level,
            caps: decl.caps.clone(),
        }
    }
}

/// A component the registry resolved (`None`: an issue is recorded).
pub(super) type Resolved = Option<Found>;

/// Memory fractions and devices; returns whether every device is known (the transport plan
/// needs them).
pub(super) fn check(issues: &mut Issues<'_>, p: &PlacementSection) -> bool {
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
    devices(issues, &p.devices)
}

/// `[placement.cpus]`: with workers on this machine (the local launcher), every core listed
/// is one this process may run on.
pub(super) fn check_cpus(issues: &mut Issues<'_>, j: &JobFile) {
    if j.launcher.kind != crate::config::LauncherKind::Local {
        return;
    }
    let allowed = tandem_runtime::worker::allowed_cpus();
    for (role, cpus) in [
        ("engine", &j.placement.cpus.engine),
        ("trainer", &j.placement.cpus.trainer),
    ] {
        if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
            issues.at(
                &format!("placement.cpus.{role}"),
                format!("CPU {bad} is not one this machine lets Tandem run on"),
                format!("name cores among {allowed:?}"),
            );
        }
    }
}

/// Every device is `cpu` or `cuda:N`, and there is at least one.
fn devices(issues: &mut Issues<'_>, devices: &[String]) -> bool {
    let mut ok = true;
    if devices.is_empty() {
        ok = false;
        issues.at(
            "placement.devices",
            "no devices listed",
            "e.g. devices = [\"cpu\"]",
        );
    }
    for (i, d) in devices.iter().enumerate() {
        let known = d == "cpu"
            || d.strip_prefix("cuda:")
                .is_some_and(|n| n.parse::<u32>().is_ok());
        if !known {
            ok = false;
            let span = issues.job.span_of(&format!("placement.devices[{i}]"));
            issues.push(
                "placement.devices",
                span,
                format!("unknown device `{d}`"),
                "use \"cpu\" or \"cuda:N\"".into(),
            );
        }
    }
    ok
}

/// The engine and the trainer the job names, resolved through the registry (in that
/// order), then the trainer's rank count.
pub(super) fn components(
    issues: &mut Issues<'_>,
    registry: &Registry,
    j: &JobFile,
) -> (Resolved, Resolved) {
    let engine = component(
        issues,
        registry,
        ComponentKind::Engine,
        (&j.engine.plugin, j.engine.ranks),
    );
    let trainer = component(
        issues,
        registry,
        ComponentKind::Trainer,
        (&j.trainer.plugin, j.trainer.ranks),
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
    (engine, trainer)
}

/// `[SECTION] plugin` and `ranks` of one component.
pub(super) fn component(
    issues: &mut Issues<'_>,
    registry: &Registry,
    kind: ComponentKind,
    (name, ranks): (&toml::Spanned<String>, u32),
) -> Resolved {
    let section = kind.as_str();
    if ranks == 0 {
        issues.at(&format!("{section}.ranks"), "must be at least 1", "");
    }
    let Some((plugin, decl)) = registry.component(kind, name.get_ref()) else {
        let known = registry.component_names(kind);
        issues.push(
            &format!("{section}.plugin"),
            Some(name.span()),
            format!("unknown {section} plugin `{}`", name.get_ref()),
            format!(
                "known {section}s: {}; add a plugin directory with --plugin-dir or [plugins] dirs",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        );
        return None;
    };
    Some(Found::of(plugin, decl))
}
