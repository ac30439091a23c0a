//! The suite catches broken plugins: a small, correct fixture engine + trainer passes every
//! check, and four copies of it, each broken in one way, fail the rule they break (and only
//! through the plugin interface, as any plugin would be driven).
//!
//! The fixture "model" is one number `w`: every token's logprob is `-(1 + w) / 10`, a train
//! step adds one to `w`, a checkpoint-dir update carries `w` in a file.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::checks;
use crate::{EngineHarness, EngineSetup, Source, TrainerHarness, TrainerSetup};
use std::path::Path;
use std::sync::Mutex;
use tandem_plugin_api::lifecycle::EngineMachine;
use tandem_plugin_api::sdk::{self, EngineImpl, Plugin, TrainerImpl};
use tandem_plugin_api::*;

const CORRECT: u8 = 0;
/// Applies an update below the served version.
const LOWER_VERSION: u8 = 1;
/// Generates while paused.
const GENERATES_PAUSED: u8 = 2;
/// Declares `kv_cache` releasable but cannot release it.
const FALSE_CAPABILITY: u8 = 3;
/// Declares the policy-loss variants, and its default variant steps twice as far.
const POLICY_DIFFERS: u8 = 4;

fn lp(w: u64) -> f32 {
    -(1.0 + w as f32) / 10.0
}

fn digest(w: u64) -> String {
    format!("{w:016x}")
}

fn bad_state(e: impl std::fmt::Display) -> PluginError {
    PluginError::invalid_state(e.to_string())
}

struct ToyEngine<const BUG: u8> {
    st: Mutex<(EngineMachine, u64)>,
}

impl<const BUG: u8> EngineImpl for ToyEngine<BUG> {
    fn component(&self) -> &str {
        "toy"
    }
    fn health(&self) -> sdk::Result<EngineHealth> {
        let st = self.st.lock().unwrap();
        Ok(EngineHealth {
            ready: st.0.can_generate(),
            weight_version: st.0.version(),
            detail: st.0.state().to_string().into(),
        })
    }
    fn stats(&self) -> sdk::Result<ComponentStats> {
        let st = self.st.lock().unwrap();
        Ok(ComponentStats {
            weight_version: st.0.version(),
            ..ComponentStats::default()
        })
    }
    fn generate(&self, request: GenerateRequest) -> sdk::Result<GenerateResponse> {
        let st = self.st.lock().unwrap();
        if !st.0.can_generate() && BUG != GENERATES_PAUSED {
            return Err(bad_state(format!("toy is {}", st.0.state())));
        }
        let n = request.sampling.max_tokens as usize;
        let completions = request
            .prompts
            .iter()
            .map(|p| {
                let tokens: RVec<u32> = (0..n).map(|i| p[0] + i as u32).collect();
                Completion::new(tokens, vec![lp(st.1); n], FinishReason::Length)
            })
            .collect();
        Ok(GenerateResponse {
            completions,
            weight_version: st.0.version(),
        })
    }
    fn score(&self, sequences: Vec<RVec<u32>>) -> sdk::Result<Vec<RVec<f32>>> {
        let st = self.st.lock().unwrap();
        if !st.0.can_generate() {
            return Err(bad_state(st.0.state()));
        }
        Ok(sequences
            .iter()
            .map(|s| vec![lp(st.1); s.len() - 1].into())
            .collect())
    }
    fn pause_generation(&self, mode: PauseMode) -> sdk::Result<()> {
        if mode == PauseMode::Keep {
            return Err(PluginError::not_supported("pause(keep)", "toy"));
        }
        self.st
            .lock()
            .unwrap()
            .0
            .pause()
            .map(drop)
            .map_err(bad_state)
    }
    fn continue_generation(&self) -> sdk::Result<()> {
        let mut st = self.st.lock().unwrap();
        st.0.continue_generation().map(drop).map_err(bad_state)
    }
    fn flush_cache(&self) -> sdk::Result<()> {
        self.st
            .lock()
            .unwrap()
            .0
            .flush()
            .map(drop)
            .map_err(bad_state)
    }
    fn release_memory(&self, tags: Vec<String>) -> sdk::Result<()> {
        if BUG == FALSE_CAPABILITY || tags.iter().any(|t| t != "kv_cache") {
            return Err(PluginError::invalid_input(format!(
                "toy cannot release {tags:?}"
            )));
        }
        self.st
            .lock()
            .unwrap()
            .0
            .release(&tags)
            .map(drop)
            .map_err(bad_state)
    }
    fn resume_memory(&self, tags: Vec<String>) -> sdk::Result<()> {
        self.st
            .lock()
            .unwrap()
            .0
            .resume(&tags)
            .map(drop)
            .map_err(bad_state)
    }
    fn apply_weight_update(&self, update: WeightUpdate) -> sdk::Result<UpdateReport> {
        let UpdatePayload::CheckpointDir { dir } = &update.payload else {
            return Err(PluginError::not_supported("this update kind", "toy"));
        };
        let mut st = self.st.lock().unwrap();
        let mut next = st.0.clone();
        if BUG == LOWER_VERSION && update.version < st.0.version() {
            next = EngineMachine::new(update.version);
            next.pause().map_err(bad_state)?;
        } else {
            next.begin_update(update.version).map_err(bad_state)?;
            next.end_update().map_err(bad_state)?;
        }
        let w = std::fs::read_to_string(Path::new(dir.as_str()).join("w"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if !update.digest.is_empty() && update.digest.as_str() != digest(w) {
            return Err(PluginError::new(ErrorCode::Corrupt, "toy: digest mismatch"));
        }
        *st = (next, w);
        Ok(UpdateReport {
            version: update.version,
            digest: digest(w).into(),
            bytes_copied: 8,
        })
    }
}

#[derive(Default)]
struct ToyTrainer {
    w: u64,
    run_dir: String,
    snapshots: Vec<(String, u64)>,
    /// `train_step_policy(default)` differs from `train_step` ([`POLICY_DIFFERS`]).
    policy_bug: bool,
}

impl TrainerImpl for ToyTrainer {
    fn component(&self) -> &str {
        "toy"
    }
    fn init(&mut self) -> sdk::Result<TrainerInfo> {
        Ok(TrainerInfo {
            trainable_params: 1,
            total_params: 1,
            weight_version: self.w,
        })
    }
    fn compute_logprobs(&mut self, b: TrainBatch, _: WhichWeights) -> sdk::Result<Vec<RVec<f32>>> {
        let n = |s: &TrainSequence| s.tokens.len() - s.prompt_len as usize;
        Ok(b.sequences
            .iter()
            .map(|s| vec![lp(self.w); n(s)].into())
            .collect())
    }
    fn train_step(&mut self, _: TrainBatch) -> sdk::Result<Vec<Metric>> {
        self.w += 1;
        Ok(vec![Metric::new("loss", 1.0)])
    }
    fn train_step_policy(&mut self, b: TrainBatch, _: PolicyLoss) -> sdk::Result<Vec<Metric>> {
        if self.policy_bug {
            self.w += 1;
        }
        self.train_step(b)
    }
    fn snapshot(&mut self, name: String) -> sdk::Result<()> {
        self.snapshots.push((name, self.w));
        Ok(())
    }
    fn restore(&mut self, name: String) -> sdk::Result<()> {
        let found = self.snapshots.iter().rev().find(|(n, _)| *n == name);
        self.w = found
            .ok_or_else(|| PluginError::invalid_input("no such snapshot"))?
            .1;
        Ok(())
    }
    fn save_checkpoint(&mut self, dir: String) -> sdk::Result<CheckpointInfo> {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(Path::new(&dir).join("w"), self.w.to_string()).unwrap();
        Ok(CheckpointInfo {
            dir: dir.into(),
            weight_version: self.w,
            bytes: 8,
        })
    }
    fn load_checkpoint(&mut self, dir: String) -> sdk::Result<CheckpointInfo> {
        let text = std::fs::read_to_string(Path::new(&dir).join("w")).unwrap();
        self.w = text.trim().parse().unwrap();
        Ok(CheckpointInfo {
            dir: dir.into(),
            weight_version: self.w,
            bytes: 8,
        })
    }
    fn export_weight_update(&mut self, kind: UpdateKind) -> sdk::Result<WeightUpdate> {
        if kind != UpdateKind::CheckpointDir {
            return Err(PluginError::not_supported("this export", "toy"));
        }
        let dir = format!("{}/v{}", self.run_dir, self.w);
        self.save_checkpoint(dir.clone())?;
        Ok(WeightUpdate {
            version: self.w,
            payload: UpdatePayload::CheckpointDir { dir: dir.into() },
            digest: digest(self.w).into(),
        })
    }
}

struct Toy<const BUG: u8>;

impl<const BUG: u8> Plugin for Toy<BUG> {
    fn manifest() -> PluginManifest {
        let caps = |kinds: Vec<UpdateKind>, modes: Vec<PauseMode>, tags: Vec<&str>| Capabilities {
            update_kinds: kinds.into(),
            releasable_tags: tags.into_iter().map(RString::from).collect(),
            pause_modes: modes.into(),
            ..Capabilities::default()
        };
        let decl = |kind, caps| ComponentDecl {
            kind,
            name: "toy".into(),
            description: "conformance fixture".into(),
            caps,
        };
        let engine = caps(
            vec![UpdateKind::CheckpointDir],
            vec![PauseMode::Abort, PauseMode::Wait],
            vec!["kv_cache"],
        );
        let trainer = caps(vec![UpdateKind::CheckpointDir], vec![], vec![]);
        sdk::manifest(
            "toy",
            "0.1.0",
            vec![
                decl(ComponentKind::Engine, engine),
                decl(ComponentKind::Trainer, trainer),
            ],
        )
    }
    fn new_engine(_: ComponentConfig, _: HostBox) -> sdk::Result<EngineBox> {
        Ok(sdk::engine_box(ToyEngine::<BUG> {
            st: Mutex::new((EngineMachine::new(0), 0)),
        }))
    }
    fn new_trainer(config: ComponentConfig, _: HostBox) -> sdk::Result<TrainerBox> {
        Ok(sdk::trainer_box(ToyTrainer {
            run_dir: config.run_dir.into(),
            policy_bug: BUG == POLICY_DIFFERS,
            ..ToyTrainer::default()
        }))
    }
    fn describe_config(kind: ComponentKind, _: &ComponentConfig) -> Option<ConfigCaps> {
        (kind == ComponentKind::Trainer).then(|| ConfigCaps {
            update_kinds: vec![UpdateKind::CheckpointDir].into(),
            loss_variants: true,
            ..ConfigCaps::default()
        })
    }
}

fn engine<const BUG: u8>(model: &Path) -> EngineHarness {
    let source = Source::Module(sdk::module_of::<Toy<BUG>>());
    EngineHarness::new(EngineSetup::new(source, "toy", model)).unwrap()
}

fn trainer<const BUG: u8>(model: &Path) -> TrainerHarness {
    let source = Source::Module(sdk::module_of::<Toy<BUG>>());
    TrainerHarness::new(TrainerSetup::new(source, "toy", model)).unwrap()
}

type EngineCheck = fn(&mut EngineHarness) -> crate::Outcome;
type PairCheck = fn(&mut EngineHarness, &mut TrainerHarness) -> crate::Outcome;

const ENGINE_CHECKS: [(&str, EngineCheck); 7] = [
    ("declared_and_healthy", checks::engine::declared_and_healthy),
    (
        "generate_is_well_formed",
        checks::engine::generate_is_well_formed,
    ),
    (
        "score_agrees_with_generate",
        checks::engine::score_agrees_with_generate,
    ),
    ("pause_modes", checks::engine::pause_modes),
    ("release_and_resume", checks::engine::release_and_resume),
    ("undeclared_updates", checks::engine::undeclared_updates),
    (
        "follows_the_state_machine",
        checks::engine::follows_the_state_machine,
    ),
];

const PAIR_CHECKS: [(&str, PairCheck); 3] = [
    ("exports_are_served", checks::pair::exports_are_served),
    ("lower_version_refused", checks::pair::lower_version_refused),
    (
        "digest_mismatch_refused",
        checks::pair::digest_mismatch_refused,
    ),
];

/// Runs every engine and pair check on a fresh fixture of kind `BUG`; returns the failures
/// as (check, rule, detail).
fn failures<const BUG: u8>() -> Vec<(&'static str, &'static str, String)> {
    let model = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    for (name, check) in ENGINE_CHECKS {
        let mut e = engine::<BUG>(model.path());
        if let Err(f) = check(&mut e) {
            out.push((name, f.rule, f.detail));
        }
    }
    for (name, check) in PAIR_CHECKS {
        let (mut e, mut t) = (
            engine::<BUG>(model.path()),
            trainer::<CORRECT>(model.path()),
        );
        if let Err(f) = check(&mut e, &mut t) {
            out.push((name, f.rule, f.detail));
        }
    }
    let mut t = trainer::<BUG>(model.path());
    for check in [
        checks::trainer::init_twice,
        checks::trainer::snapshot_restore_round_trip,
        checks::trainer::save_load_keeps_version,
        checks::trainer::offload_onload,
        checks::trainer::undeclared_exports,
        checks::trainer::policy_loss_default_is_train_step,
        checks::trainer::value_model_as_declared,
        checks::trainer::token_advantages_as_declared,
    ] {
        if let Err(f) = check(&mut t) {
            out.push(("trainer", f.rule, f.detail));
        }
    }
    out
}

#[test]
fn a_correct_plugin_passes_every_check() {
    assert_eq!(failures::<CORRECT>(), vec![]);
}

#[test]
fn accepting_a_lower_version_fails_the_version_rule() {
    let f = failures::<LOWER_VERSION>();
    assert!(
        f.iter().any(|(c, r, d)| *c == "lower_version_refused"
            && *r == "versions never go down"
            && d.contains("was accepted")),
        "{f:#?}"
    );
    // The state-machine oracle draws updates too: a lower version accepted shows there.
    assert!(
        f.iter()
            .all(|(c, ..)| *c == "lower_version_refused" || *c == "follows_the_state_machine"),
        "{f:#?}"
    );
}

#[test]
fn generating_while_paused_fails_the_pause_rule_and_the_oracle() {
    let f = failures::<GENERATES_PAUSED>();
    assert!(
        f.iter()
            .any(|(c, r, _)| *c == "pause_modes" && *r == "no generation while paused"),
        "{f:#?}"
    );
    assert!(
        f.iter().any(|(c, r, d)| *c == "follows_the_state_machine"
            && *r == "lifecycle follows the engine state machine"
            && d.contains("forbids `generate`")),
        "{f:#?}"
    );
}

#[test]
fn a_declared_capability_that_does_not_work_fails_its_check() {
    let f = failures::<FALSE_CAPABILITY>();
    assert!(
        f.iter().any(|(c, r, d)| *c == "release_and_resume"
            && *r == "declared tags release and resume bit-exact"
            && d.contains("release_memory([kv_cache]) failed")),
        "{f:#?}"
    );
    assert!(
        f.iter().any(|(c, _, d)| *c == "follows_the_state_machine"
            && d.contains("allows `release(kv_cache)`")),
        "{f:#?}"
    );
}

#[test]
fn a_default_policy_step_unlike_train_step_fails_the_policy_rule() {
    let f = failures::<POLICY_DIFFERS>();
    assert!(
        f.iter().any(|(c, r, d)| *c == "trainer"
            && *r == "train_step_policy(default) is train_step"
            && d.contains("logprobs differ")),
        "{f:#?}"
    );
    assert!(f.iter().all(|(c, ..)| *c == "trainer"), "{f:#?}");
}
