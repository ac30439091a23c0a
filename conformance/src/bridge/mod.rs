//! The bridge under test and the bridge [`checks`]: what a bridge declares and plans, and that
//! it refuses update kinds it does not declare (here); a sync through both halves, twice
//! (`sync.rs`, over an in-process transport world from `world.rs` when the plan asks for one).
//!
//! A bridge is constructed the way a worker installs it: from its plugin's root module, with
//! the host services of the process whose half it runs (the trainer's for the trainer half,
//! the engine's for the engine half) and a run directory both halves share (the job's).

mod sync;
mod world;

use crate::expect::{ok, refused};
use crate::harness::{Failure, Outcome};
use crate::setup::{BridgeSetup, EngineSetup, Source, TrainerSetup, declaration};
use std::path::Path;
use tandem_memory::{ManagerConfig, MemoryManager};
use tandem_plugin_api::{
    BridgeBox, BridgePlan, ComponentConfig, ComponentDecl, ComponentKind, HostBox, PluginModuleRef,
    RString, RVec, SharedRegionRef, Shipment, UpdateKind, UpdatePayload, WeightUpdate, api_level,
};
use tandem_services::Services;

/// An option key no component has, for the unknown-option rule.
const UNKNOWN_OPTION: &str = "conformance_no_such_option";

/// The declaration of component `name` of `kind` in `source`'s plugin.
pub(crate) fn declared(
    source: &Source,
    kind: ComponentKind,
    name: &str,
) -> Result<ComponentDecl, Failure> {
    source
        .load()
        .and_then(|m| declaration(m, kind, name))
        .map(|(_, d)| d)
        .map_err(|e| Failure::new("the component is declared", e))
}

/// The bridge's root module and declaration, checked to be a bridge at API level
/// [`api_level::BRIDGE`] or later.
pub(crate) fn load(b: &BridgeSetup) -> Result<(PluginModuleRef, ComponentDecl), Failure> {
    let module = b.source.load().map_err(|e| Failure::new("setup", e))?;
    let (manifest, decl) = declaration(module, ComponentKind::Bridge, &b.component)
        .map_err(|e| Failure::new("the component is declared", e))?;
    if manifest.api_level < api_level::BRIDGE {
        return Err(Failure::new(
            "a bridge is at API level 4 or later",
            format!(
                "plugin `{}` is at API level {}; bridges are components from API level {}",
                manifest.name,
                manifest.api_level,
                api_level::BRIDGE
            ),
        ));
    }
    Ok((module, decl))
}

/// The bridge's first (trainer exports) and last (engines apply) declared update kinds.
pub(crate) fn kinds(decl: &ComponentDecl) -> Result<(UpdateKind, UpdateKind), Failure> {
    let declared = &decl.caps.update_kinds;
    match (declared.first(), declared.last()) {
        (Some(first), Some(last)) if declared.len() <= 2 => Ok((*first, *last)),
        _ => Err(Failure::new(
            "a bridge declares one or two update kinds",
            format!(
                "bridge `{}` declares {} update kinds: the first is what the trainer exports, \
                 the last what the engines apply",
                decl.name,
                declared.len()
            ),
        )),
    }
}

/// Host services with a CPU memory manager of their own (a process without transport).
fn plain_services(name: &str) -> Services {
    Services::with_memory(MemoryManager::new(ManagerConfig::cpu(format!(
        "conformance-{name}"
    ))))
}

/// The component config of the bridge with `options_json` (rank 0 of one, on CPU).
fn config(b: &BridgeSetup, options_json: &str, model: &Path, run_dir: &Path) -> ComponentConfig {
    ComponentConfig {
        component: b.component.as_str().into(),
        model_path: model.display().to_string().into(),
        options_json: options_json.into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        run_dir: run_dir.display().to_string().into(),
    }
}

/// Constructs an instance of the bridge with the setup's options and `host`'s services.
pub(crate) fn construct(
    b: &BridgeSetup,
    module: PluginModuleRef,
    model: &Path,
    run_dir: &Path,
    host: HostBox,
) -> Result<BridgeBox, Failure> {
    ok(
        (module.new_bridge())(config(b, &b.options_json, model, run_dir), host),
        "the bridge constructs",
        "new_bridge",
    )
}

/// The instance's plan, which must answer.
pub(crate) fn plan(bridge: &BridgeBox) -> Result<BridgePlan, Failure> {
    ok(bridge.plan(), "a bridge answers its plan", "plan")
}

/// The setup's options with [`UNKNOWN_OPTION`] added (JSON object text).
fn with_unknown_option(options_json: &str) -> String {
    let body = options_json.trim();
    let inner = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or("")
        .trim();
    if inner.is_empty() {
        format!("{{\"{UNKNOWN_OPTION}\": true}}")
    } else {
        format!("{{{inner}, \"{UNKNOWN_OPTION}\": true}}")
    }
}

/// An update of `kind` that no half could mistake for real weights.
fn update_of(kind: UpdateKind) -> WeightUpdate {
    let payload = match kind {
        UpdateKind::SharedRegion => UpdatePayload::SharedRegion {
            region: SharedRegionRef {
                key: "conformance:no-such-region".into(),
                device: "cpu".into(),
                len: 0,
            },
            tensors: RVec::new(),
        },
        UpdateKind::Adapter => UpdatePayload::Adapter {
            name: "conformance-v1".into(),
            dir: "/nonexistent/conformance-adapter".into(),
        },
        UpdateKind::CheckpointDir => UpdatePayload::CheckpointDir {
            dir: "/nonexistent/conformance-checkpoint".into(),
        },
        UpdateKind::TensorBuckets => UpdatePayload::TensorBuckets {
            group: tandem_plugin_api::BRIDGE_GROUP.into(),
            buckets: RVec::new(),
        },
    };
    WeightUpdate {
        version: 1,
        payload,
        digest: RString::new(),
    }
}

/// Every update kind.
const ALL_KINDS: [UpdateKind; 4] = [
    UpdateKind::SharedRegion,
    UpdateKind::Adapter,
    UpdateKind::CheckpointDir,
    UpdateKind::TensorBuckets,
];

/// The bridge checks. Each takes the bridge and the engine and trainer setups it moves
/// weights between (the first three checks construct no engine or trainer).
pub mod checks {
    pub use super::sync::syncs_twice;
    use super::*;

    /// A bridge at API level ≥ 4 declaring one or two update kinds; `plan` answers, and two
    /// instances with the same options answer the same plan (the host asks one instance and
    /// every worker's must agree); `validate_config` accepts the setup's options and refuses
    /// them with an unknown key added, with a problem at that key; the constructor refuses
    /// the unknown key too.
    pub fn declared_and_planned(b: &BridgeSetup, _e: &EngineSetup, t: &TrainerSetup) -> Outcome {
        let (module, decl) = load(b)?;
        kinds(&decl)?;
        let dir = tempfile::tempdir()
            .map_err(|e| Failure::new("setup", format!("creating a run dir: {e}")))?;
        let plans = [0, 1]
            .map(|i| {
                let services = plain_services(&format!("bridge-{i}"));
                construct(b, module, &t.model, dir.path(), services.handle())
                    .and_then(|bridge| plan(&bridge))
            })
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        if plans[0] != plans[1] {
            return Err(Failure::new(
                "every instance answers the same plan",
                format!(
                    "two instances with the same options: {:?} and {:?}",
                    plans[0], plans[1]
                ),
            ));
        }
        let rule = "unknown options are refused at their key";
        let Some(validate) = module.validate_config() else {
            return Err(Failure::new(
                rule,
                "the plugin's root module has no `validate_config` (API level 2)",
            ));
        };
        let problems = ok(
            validate(
                ComponentKind::Bridge,
                config(b, &b.options_json, &t.model, dir.path()),
            ),
            rule,
            "validate_config",
        )?;
        if let Some(p) = problems.first() {
            return Err(Failure::new(
                "the setup's options validate",
                format!(
                    "validate_config({}) found `{}`: {}",
                    b.options_json, p.key, p.message
                ),
            ));
        }
        let bad = with_unknown_option(&b.options_json);
        let problems = ok(
            validate(ComponentKind::Bridge, config(b, &bad, &t.model, dir.path())),
            rule,
            "validate_config",
        )?;
        if !problems.iter().any(|p| p.key.as_str() == UNKNOWN_OPTION) {
            let found: Vec<String> = problems
                .iter()
                .map(|p| format!("`{}`: {}", p.key, p.message))
                .collect();
            return Err(Failure::new(
                rule,
                format!(
                    "validate_config({bad}) must report a problem at key `{UNKNOWN_OPTION}`; \
                     it found [{}]",
                    found.join("; ")
                ),
            ));
        }
        let services = plain_services("bridge-bad-options");
        let built = (module.new_bridge())(config(b, &bad, &t.model, dir.path()), services.handle());
        refused(
            built.map(|_| "a bridge"),
            rule,
            &format!("new_bridge with options {bad}"),
        )
        .map(drop)
    }

    /// `ship` refuses every update kind but the bridge's first declared kind, and `receive`
    /// every kind but its last: an error (never a panic), never the update passed on.
    pub fn refuses_undeclared_kinds(
        b: &BridgeSetup,
        _e: &EngineSetup,
        t: &TrainerSetup,
    ) -> Outcome {
        let (module, decl) = load(b)?;
        let (first, last) = kinds(&decl)?;
        let dir = tempfile::tempdir()
            .map_err(|e| Failure::new("setup", format!("creating a run dir: {e}")))?;
        let services = plain_services("bridge-kinds");
        let bridge = construct(b, module, &t.model, dir.path(), services.handle())?;
        let rule = "a bridge half refuses an update kind it does not take";
        for kind in ALL_KINDS {
            if kind != first {
                refused(
                    bridge.ship(update_of(kind)),
                    rule,
                    &format!(
                        "ship of a `{}` update (the trainer exports `{}`)",
                        kind.as_str(),
                        first.as_str()
                    ),
                )?;
            }
            if kind != last {
                let shipment = Shipment::from_update(update_of(kind));
                refused(
                    bridge.receive(shipment, tandem_services::decoded::refusing_sink()),
                    rule,
                    &format!(
                        "receive of a `{}` update (the engines apply `{}`)",
                        kind.as_str(),
                        last.as_str()
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// Every tag the bridge keeps resident (its plan's, and each side's from `resident()`)
    /// is one the engine or the trainer declares releasable, or a well-known tag
    /// (`tandem_plugin_api::tags::ALL`): the host leaves exactly those out of what it
    /// offloads and releases.
    pub fn resident_tags_declared(b: &BridgeSetup, e: &EngineSetup, t: &TrainerSetup) -> Outcome {
        let (module, _) = load(b)?;
        let engine = declared(&e.source, ComponentKind::Engine, &e.component)?;
        let trainer = declared(&t.source, ComponentKind::Trainer, &t.component)?;
        let dir = tempfile::tempdir()
            .map_err(|e| Failure::new("setup", format!("creating a run dir: {e}")))?;
        let services = plain_services("bridge-tags");
        let bridge = construct(b, module, &t.model, dir.path(), services.handle())?;
        let plan = plan(&bridge)?;
        let resident = ok(
            bridge.resident(),
            "a bridge answers its resident tags",
            "resident",
        )?;
        let all = plan
            .resident_tags
            .iter()
            .chain(resident.trainer.iter())
            .chain(resident.engines.iter());
        for tag in all {
            let tag = tag.as_str();
            let declared = |d: &ComponentDecl| d.caps.releasable_tags.iter().any(|t| t == tag);
            if !(declared(&engine)
                || declared(&trainer)
                || tandem_plugin_api::tags::ALL.contains(&tag))
            {
                return Err(Failure::new(
                    "resident tags are declared tags",
                    format!(
                        "the bridge keeps `{tag}` resident: neither engine `{}` nor trainer `{}` \
                         declares it, and it is not a well-known tag",
                        e.component, t.component
                    ),
                ));
            }
        }
        Ok(())
    }
}
