//! `[bridge]`: the mode and its options as the sync driver parses them
//! ([`crate::bridge::parse_settings`]), and the update kind the mode needs, which both
//! components must declare.

use super::issues::Issues;
use super::placement::Resolved;
use crate::config::JobFile;
use crate::config::plan::ResolvedBridge;
use tandem_plugin_api::{BridgeMode, ComponentKind};
use tandem_runtime::registry::Registry;

/// The bridge's settings, then (for a mode the driver runs) the components' update kinds.
pub(super) fn check(issues: &mut Issues<'_>, j: &JobFile, engine: &Resolved, trainer: &Resolved) {
    let mode_name = j.bridge.mode.get_ref();
    let mut mode_runs = true;
    if let Err(problems) = crate::bridge::parse_settings(mode_name, &j.bridge.options) {
        for p in problems {
            let key = format!("bridge.{}", p.key);
            let span = (p.key == "mode").then(|| j.bridge.mode.span());
            mode_runs &= p.key != "mode";
            issues.push(&key, span, p.message, p.help);
        }
    }
    let Some(mode) = BridgeMode::parse(mode_name).filter(|_| mode_runs) else {
        return;
    };
    let kind = mode.update_kind();
    for (side, resolved) in [("engine", engine), ("trainer", trainer)] {
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
                    if declared.is_empty() {
                        "none".to_owned()
                    } else {
                        declared.join(", ")
                    }
                ),
                "pick a bridge mode both sides support; see `tandem plugins`".into(),
            );
        }
    }
}

/// The bridge as `tandem check` prints it.
pub(super) fn resolved(j: &JobFile, registry: &Registry) -> ResolvedBridge {
    let mode_name = j.bridge.mode.get_ref();
    ResolvedBridge {
        mode: mode_name.clone(),
        update_kind: BridgeMode::parse(mode_name)
            .map(|m| m.update_kind().as_str().to_owned())
            .unwrap_or_default(),
        provider: registry
            .component(ComponentKind::Bridge, mode_name)
            .map(|(p, _)| p.manifest.name.to_string()),
        verify: j.bridge.verify,
    }
}
