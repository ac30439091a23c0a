//! `[bridge]`: the bridge component resolved as the sync driver runs it
//! ([`crate::bridge::resolve`]: found, at API level 4, its options checked by its plugin), the
//! plan it answers for its options, and the update kinds it moves, which the trainer (export)
//! and the engine (apply) must have *with their options* (a trainer that trains LoRA exports
//! adapters only; one that fine-tunes every weight exports no adapter); `verify` needs both
//! sides to report digests.

use super::issues::Issues;
use crate::config::JobFile;
use crate::config::plan::{BridgeSetup, CapsSource, RolePlan};
use tandem_plugin_api::UpdateKind;
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

/// The bridge and its plan, then the update kinds and digests both sides must have.
pub(super) fn check(
    issues: &mut Issues<'_>,
    j: &JobFile,
    registry: &Registry,
    engine: Option<&RolePlan>,
    trainer: Option<&RolePlan>,
) -> Option<BridgeSetup> {
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
            return None;
        }
    };
    for (side, verb, kind, role) in [
        ("trainer", "export", choice.export, trainer),
        ("engine", "apply", choice.apply, engine),
    ] {
        if let Some(r) = role
            && !r.caps.update_kinds.contains(&kind)
        {
            mismatch(issues, j, side, verb, kind, r);
        }
    }
    // A drafter job moves its drafter with `load_drafter`, not through the bridge's sync.
    if j.bridge.verify && !j.is_drafter_job() {
        for (side, role) in [("trainer", trainer), ("engine", engine)] {
            // A plugin below API level 5 cannot say; its sync reports what it has.
            if let Some(r) = role
                && r.caps.source == CapsSource::Options
                && !r.caps.reports_digest
            {
                issues.at(
                    "bridge.verify",
                    format!(
                        "verify = true compares weight digests, but {side} `{}` (plugin `{}`) reports none with its options",
                        r.component, r.plugin
                    ),
                    "set verify = false, or use components that report digests (see `tandem plugins`)",
                );
            }
        }
    }
    let planned = crate::bridge::plan_of(registry, &choice)
        .and_then(|plan| crate::bridge::resident_of(registry, &choice).map(|r| (plan, r)));
    let (plan, resident) = match planned {
        Ok(planned) => planned,
        Err(e) => {
            issues.push(
                plugin_key(issues.job),
                Some(j.bridge.plugin.span()),
                e.to_string(),
                "this is a bug in the bridge's plugin; report it".into(),
            );
            return None;
        }
    };
    Some(BridgeSetup {
        component: choice.component,
        plugin: choice.plugin,
        options_json: choice.options_json,
        export: choice.export,
        apply: choice.apply,
        verify: j.bridge.verify,
        plan,
        resident,
    })
}

/// `bridge NAME needs the SIDE to VERB KIND updates, which SIDE X does not with its options`.
fn mismatch(
    issues: &mut Issues<'_>,
    j: &JobFile,
    side: &str,
    verb: &str,
    kind: UpdateKind,
    r: &RolePlan,
) {
    let name = j.bridge.plugin.get_ref();
    let has = r.caps.kind_names();
    let has = if has.is_empty() {
        "none".to_owned()
    } else {
        has.join(", ")
    };
    let options = r.caps.source == CapsSource::Options;
    let why = match (kind, side) {
        _ if !options => format!(" declare (it declares: {has})"),
        (UpdateKind::Adapter, "trainer") => format!(
            ": with its options it fine-tunes every weight and exports no adapter (it exports: {has})"
        ),
        (_, "trainer") if r.caps.lora => {
            format!(": with its options it trains a LoRA adapter and exports only {has}")
        }
        _ => format!(" support with its options (it supports: {has})"),
    };
    let help = match (kind, side) {
        _ if !options => "pick a bridge both sides support; see `tandem plugins`".to_owned(),
        (UpdateKind::Adapter, "trainer") => format!(
            "give [{side}.options] the settings that train a LoRA adapter, or pick a bridge for full weights (ipc, checkpoint, broadcast)"
        ),
        (_, "trainer") if r.caps.lora => {
            "use bridge plugin = \"lora\" for a LoRA trainer, or drop its LoRA settings to fine-tune every weight".to_owned()
        }
        _ => "pick a bridge both sides support; see `tandem plugins`".to_owned(),
    };
    issues.push(
        plugin_key(issues.job),
        Some(j.bridge.plugin.span()),
        format!(
            "bridge `{name}` needs the {side} to {verb} {} updates, which {side} `{}` does not{why}{}",
            kind.as_str(),
            r.component,
            below_level_5(r)
        ),
        help,
    );
}

/// Why a component's capabilities are its manifest's, when they are.
fn below_level_5(r: &RolePlan) -> String {
    match r.caps.source {
        CapsSource::Options => String::new(),
        CapsSource::Manifest => format!(
            " (plugin API level {}: capabilities as its manifest declares them)",
            r.api_level
        ),
    }
}
