//! `[bridge]`: the bridge component resolved as the sync driver resolves it
//! ([`crate::bridge::resolve`]: found, at API level 4, its options checked by its plugin), and
//! the update kinds it declares, which the trainer (export) and the engine (apply) must
//! declare too.

use super::issues::Issues;
use super::placement::Resolved;
use crate::config::JobFile;
use crate::config::plan::ResolvedBridge;
use tandem_runtime::registry::Registry;

/// The key a job chose its bridge with: `bridge.plugin`, or `bridge.mode` (the older name)
/// when that is what the file says — problems are reported at the key the user wrote.
pub(super) fn plugin_key(job: &crate::config::LoadedJob) -> &'static str {
    if job.span_of("bridge.mode").is_some() {
        "bridge.mode"
    } else {
        "bridge.plugin"
    }
}

/// The bridge, then the components' update kinds.
pub(super) fn check(
    issues: &mut Issues<'_>,
    j: &JobFile,
    registry: &Registry,
    engine: &Resolved,
    trainer: &Resolved,
) {
    let name = j.bridge.plugin.get_ref();
    let choice = match crate::bridge::resolve(registry, name, &j.bridge.options) {
        Ok(c) => c,
        Err(problems) => {
            for p in problems {
                let key = match p.key.as_str() {
                    "plugin" => plugin_key(issues.job).to_owned(),
                    k => format!("bridge.{k}"),
                };
                let span = (p.key == "plugin").then(|| j.bridge.plugin.span());
                issues.push(&key, span, p.message, p.help);
            }
            return;
        }
    };
    for (side, verb, kind, resolved) in [
        ("trainer", "export", choice.export, trainer),
        ("engine", "apply", choice.apply, engine),
    ] {
        if let Some((c, caps)) = resolved
            && !caps.update_kinds.contains(&kind)
        {
            let declared: Vec<&str> = caps.update_kinds.iter().map(|k| k.as_str()).collect();
            issues.push(
                plugin_key(issues.job),
                Some(j.bridge.plugin.span()),
                format!(
                    "bridge `{name}` needs the {side} to {verb} {} updates, which {side} `{}` does not declare (it declares: {})",
                    kind.as_str(),
                    c.component,
                    if declared.is_empty() {
                        "none".to_owned()
                    } else {
                        declared.join(", ")
                    }
                ),
                "pick a bridge both sides support; see `tandem plugins`".into(),
            );
        }
    }
}

/// The bridge as `tandem check` prints it.
pub(super) fn resolved(j: &JobFile, registry: &Registry) -> ResolvedBridge {
    let name = j.bridge.plugin.get_ref();
    let found = crate::bridge::resolve(registry, name, &j.bridge.options).ok();
    ResolvedBridge {
        mode: name.clone(),
        export_kind: found
            .as_ref()
            .map(|c| c.export.as_str().to_owned())
            .unwrap_or_default(),
        apply_kind: found
            .as_ref()
            .map(|c| c.apply.as_str().to_owned())
            .unwrap_or_default(),
        provider: found.map(|c| c.plugin),
        verify: j.bridge.verify,
    }
}
