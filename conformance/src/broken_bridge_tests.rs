//! The bridge checks catch broken bridges: a small, correct fixture bridge passes the checks
//! that need no engine or trainer (declarations and plan, kind refusals, resident tags), and
//! copies of it, each broken in one way, fail the rule they break. (The sync check runs on
//! the real bridges, `plugins/bridges/tests/conformance.rs`.)

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::{BridgeCheck, BridgeSetup, EngineSetup, Source, TrainerSetup, checks};
use std::sync::atomic::{AtomicU32, Ordering};
use tandem_plugin_api::sdk::{self, BridgeImpl, Plugin};
use tandem_plugin_api::*;

const CORRECT: u8 = 0;
/// Passes any update kind through either half.
const ANY_KIND: u8 = 1;
/// Answers a different plan from each instance.
const UNSTABLE_PLAN: u8 = 2;
/// Keeps a tag resident that nobody declares.
const UNKNOWN_TAG: u8 = 3;
/// Accepts an unknown option.
const LAX_OPTIONS: u8 = 4;
/// Declares three update kinds.
const THREE_KINDS: u8 = 5;
/// Panics on an update kind it does not take.
const PANICS: u8 = 6;
/// Keeps a tag resident on the engines' side (level-7 `resident`) that nobody declares.
const UNKNOWN_ENGINE_TAG: u8 = 7;

const UNKNOWN_OPTION: &str = "conformance_no_such_option";

struct ToyBridge<const BUG: u8> {
    instance: u32,
}

impl<const BUG: u8> ToyBridge<BUG> {
    fn take(&self, update: WeightUpdate) -> sdk::Result<WeightUpdate> {
        if BUG == ANY_KIND || update.payload.kind() == UpdateKind::CheckpointDir {
            return Ok(update);
        }
        if BUG == PANICS {
            panic!("toy bridge: unexpected kind");
        }
        Err(PluginError::invalid_input(
            "toy bridge: checkpoint_dir only",
        ))
    }
}

impl<const BUG: u8> BridgeImpl for ToyBridge<BUG> {
    fn trainer_side(&self, exported: WeightUpdate) -> sdk::Result<WeightUpdate> {
        self.take(exported)
    }

    fn engine_side(&self, shipped: WeightUpdate) -> sdk::Result<WeightUpdate> {
        self.take(shipped)
    }

    fn plan(&self) -> sdk::Result<BridgePlan> {
        let tag = if BUG == UNKNOWN_TAG {
            "scratchpad"
        } else {
            "weights"
        };
        Ok(BridgePlan {
            resident_tags: RVec::from(vec![RString::from(tag)]),
            restart_engines: BUG == UNSTABLE_PLAN && self.instance % 2 == 1,
            ..BridgePlan::default()
        })
    }

    fn resident(&self) -> sdk::Result<ResidentTags> {
        let plan = self.plan()?;
        let engines = if BUG == UNKNOWN_ENGINE_TAG {
            RVec::from(vec![RString::from("scratchpad")])
        } else {
            plan.resident_tags.clone()
        };
        Ok(ResidentTags {
            trainer: plan.resident_tags,
            engines,
        })
    }
}

struct Toy<const BUG: u8>;

fn decl(kind: ComponentKind, kinds: &[UpdateKind]) -> ComponentDecl {
    ComponentDecl {
        kind,
        name: "toy".into(),
        description: "fixture".into(),
        caps: Capabilities {
            update_kinds: RVec::from(kinds.to_vec()),
            ..Capabilities::default()
        },
    }
}

impl<const BUG: u8> Plugin for Toy<BUG> {
    fn manifest() -> PluginManifest {
        let kinds: &[UpdateKind] = if BUG == THREE_KINDS {
            &[
                UpdateKind::CheckpointDir,
                UpdateKind::SharedRegion,
                UpdateKind::CheckpointDir,
            ]
        } else {
            &[UpdateKind::CheckpointDir]
        };
        sdk::manifest(
            "toy-bridge",
            "0.1.0",
            vec![
                decl(ComponentKind::Bridge, kinds),
                decl(ComponentKind::Engine, &[UpdateKind::CheckpointDir]),
                decl(ComponentKind::Trainer, &[UpdateKind::CheckpointDir]),
            ],
        )
    }

    fn new_bridge(config: ComponentConfig, _: HostBox) -> sdk::Result<BridgeBox> {
        static INSTANCES: AtomicU32 = AtomicU32::new(0);
        if BUG != LAX_OPTIONS && config.options_json.contains(UNKNOWN_OPTION) {
            return Err(PluginError::invalid_input(format!(
                "bridge.options.{UNKNOWN_OPTION}: unknown field"
            )));
        }
        // Counted for the unstable fixture only (one test uses it): consecutive instances.
        let instance = if BUG == UNSTABLE_PLAN {
            INSTANCES.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        Ok(sdk::bridge_box(ToyBridge::<BUG> { instance }))
    }

    fn validate_config(_: ComponentKind, config: &ComponentConfig) -> Vec<ConfigProblem> {
        if BUG != LAX_OPTIONS && config.options_json.contains(UNKNOWN_OPTION) {
            vec![ConfigProblem::new(UNKNOWN_OPTION, "unknown field")]
        } else {
            Vec::new()
        }
    }
}

const CHECKS: [(&str, BridgeCheck); 3] = [
    ("declared_and_planned", checks::bridge::declared_and_planned),
    (
        "refuses_undeclared_kinds",
        checks::bridge::refuses_undeclared_kinds,
    ),
    (
        "resident_tags_declared",
        checks::bridge::resident_tags_declared,
    ),
];

/// Runs the checks on the fixture of kind `BUG`; returns the failures as (check, rule,
/// detail).
fn failures<const BUG: u8>() -> Vec<(&'static str, &'static str, String)> {
    let source = Source::Module(sdk::module_of::<Toy<BUG>>());
    let model = tempfile::tempdir().unwrap();
    let b = BridgeSetup::new(source.clone(), "toy", "{}");
    let e = EngineSetup::new(source.clone(), "toy", model.path());
    let t = TrainerSetup::new(source, "toy", model.path());
    CHECKS
        .iter()
        .filter_map(|(name, check)| check(&b, &e, &t).err().map(|f| (*name, f.rule, f.detail)))
        .collect()
}

#[test]
fn a_correct_bridge_passes() {
    assert_eq!(failures::<CORRECT>(), vec![]);
}

/// Each broken fixture fails exactly the check and rule it breaks.
#[test]
fn each_broken_bridge_fails_its_rule() {
    for (bug, got, check, rule) in [
        (
            "any kind",
            failures::<ANY_KIND>(),
            "refuses_undeclared_kinds",
            "a bridge half refuses an update kind it does not take",
        ),
        (
            "unstable plan",
            failures::<UNSTABLE_PLAN>(),
            "declared_and_planned",
            "every instance answers the same plan",
        ),
        (
            "unknown tag",
            failures::<UNKNOWN_TAG>(),
            "resident_tags_declared",
            "resident tags are declared tags",
        ),
        (
            "unknown engine-side tag",
            failures::<UNKNOWN_ENGINE_TAG>(),
            "resident_tags_declared",
            "resident tags are declared tags",
        ),
        (
            "lax options",
            failures::<LAX_OPTIONS>(),
            "declared_and_planned",
            "unknown options are refused at their key",
        ),
        (
            "panics",
            failures::<PANICS>(),
            "refuses_undeclared_kinds",
            "no panic",
        ),
    ] {
        assert_eq!(got.len(), 1, "{bug}: {got:?}");
        assert_eq!((got[0].0, got[0].1), (check, rule), "{bug}: {got:?}");
    }
    // Three kinds break every check that reads them.
    let got = failures::<THREE_KINDS>();
    let rules: Vec<_> = got.iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        rules,
        [
            (
                "declared_and_planned",
                "a bridge declares one or two update kinds"
            ),
            (
                "refuses_undeclared_kinds",
                "a bridge declares one or two update kinds"
            ),
        ],
        "{got:?}"
    );
}
