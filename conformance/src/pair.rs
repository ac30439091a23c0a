//! Engine + trainer checks: every update kind both sides declare (and the trainer's options
//! allow) goes from the trainer's export to the engine, which then serves exactly the
//! trainer's weights; versions never go down; every sync carries a digest the engine
//! verifies, and a damaged update (a wrong digest, a weights file damaged between export and
//! load) is refused with the previous weights still served; the run directory keeps at most
//! the two newest exported versions.

use crate::engine::EngineHarness;
use crate::expect::{ok, one, refused};
use crate::harness::{Failure, Outcome};
use crate::trainer::{TrainerHarness, max_diff};
use std::path::{Path, PathBuf};

use tandem_plugin_api::UpdatePayload;
use tandem_plugin_api::files::digest::weight_files;
use tandem_plugin_api::files::versions::versions;
use tandem_plugin_api::lifecycle::EngineOp;
use tandem_plugin_api::{ErrorCode, RVec, UpdateKind, UpdateReport, WeightUpdate};

/// Update kinds both sides declare, restricted to the trainer setup's `kinds` when given.
fn common_kinds(e: &EngineHarness, t: &TrainerHarness) -> Vec<UpdateKind> {
    e.decl
        .caps
        .update_kinds
        .iter()
        .copied()
        .filter(|k| t.decl.caps.update_kinds.contains(k))
        .filter(|k| t.setup.kinds.as_ref().is_none_or(|only| only.contains(k)))
        .collect()
}

/// The engine's logprobs of the trainer setup's completions (`score`, completion part).
pub(crate) fn engine_logprobs(
    e: &EngineHarness,
    t: &TrainerHarness,
) -> Result<Vec<Vec<f32>>, Failure> {
    let seqs: RVec<RVec<u32>> = t
        .setup
        .sequences
        .iter()
        .map(|(s, _)| s.iter().copied().collect())
        .collect();
    let scores = ok(
        e.engine.score(seqs),
        "the engine serves the trainer's weights",
        "score",
    )?;
    Ok(scores
        .iter()
        .zip(&t.setup.sequences)
        .map(|(s, (tokens, prompt_len))| {
            let n = tokens.len() - *prompt_len as usize;
            s[s.len().saturating_sub(n)..].to_vec()
        })
        .collect())
}

/// Pauses, applies `update` through the mirror, continues.
pub(crate) fn apply(e: &mut EngineHarness, update: WeightUpdate) -> Result<UpdateReport, Failure> {
    let rule = "declared updates are applied";
    let Some(mode) = e.pause_mode() else {
        return Err(Failure::new(
            rule,
            "the engine declares update kinds but no pause mode to apply them in",
        ));
    };
    ok(e.step(EngineOp::Pause, mode), rule, "pause_generation")?;
    let version = update.version;
    let report = ok(
        e.engine.apply_weight_update(update),
        rule,
        &format!("apply_weight_update(version {version})"),
    )?;
    e.advance(EngineOp::BeginUpdate(version));
    ok(
        e.step(EngineOp::Continue, mode),
        rule,
        "continue_generation",
    )?;
    Ok(report)
}

/// Trains a step (for `rule`) and exports `kind`, which must work: the pair declares it.
fn train_and_export(
    t: &mut TrainerHarness,
    kind: UpdateKind,
    rule: &'static str,
) -> Result<WeightUpdate, Failure> {
    t.train(rule)?;
    ok(
        t.trainer.export_weight_update(kind),
        "declared exports work",
        &format!("export_weight_update({})", kind.as_str()),
    )
}

/// Train a step, export `kind`, apply it, and check the engine serves it.
fn sync(
    e: &mut EngineHarness,
    t: &mut TrainerHarness,
    kind: UpdateKind,
) -> Result<WeightUpdate, Failure> {
    let rule = "the engine serves the trainer's weights";
    let update = train_and_export(t, kind, rule)?;
    let report = apply(e, update.clone())?;
    let served = ok(e.engine.health(), "health", "health")?.weight_version;
    if report.version != update.version || served != update.version {
        return Err(Failure::new(
            "the engine serves the update's version",
            format!(
                "applied version {}: report says {}, health {served}",
                update.version, report.version
            ),
        ));
    }
    if e.setup.digests && !update.digest.is_empty() && report.digest != update.digest {
        return Err(Failure::new(
            "digests agree",
            format!(
                "trainer digest {}, engine digest {}",
                update.digest, report.digest
            ),
        ));
    }
    let want = t.logprobs(rule)?;
    let got = engine_logprobs(e, t)?;
    let d = max_diff(&want, &got);
    if d > e.setup.tolerance {
        return Err(Failure::new(
            rule,
            format!(
                "{} update: engine and trainer logprobs differ by {d} (tolerance {})",
                kind.as_str(),
                e.setup.tolerance
            ),
        ));
    }
    Ok(update)
}

/// The first common kind, or a failure saying there is none.
fn first_kind(e: &EngineHarness, t: &TrainerHarness) -> Result<UpdateKind, Failure> {
    common_kinds(e, t).first().copied().ok_or_else(|| {
        Failure::new(
            "engine and trainer share an update kind",
            format!(
                "engine `{}` and trainer `{}` declare no update kind in common",
                e.decl.name, t.decl.name
            ),
        )
    })
}

/// Refuses `bad` and checks the engine still serves `version` with logprobs `served`.
fn refused_keeps_serving(
    e: &mut EngineHarness,
    t: &TrainerHarness,
    bad: WeightUpdate,
    rule: &'static str,
    what: &str,
    served: &[Vec<f32>],
) -> Result<tandem_plugin_api::PluginError, Failure> {
    let mode = e.pause_mode().unwrap_or(tandem_plugin_api::PauseMode::Wait);
    ok(e.step(EngineOp::Pause, mode), rule, "pause_generation")?;
    let version = e.machine.version();
    let err = refused(e.engine.apply_weight_update(bad), rule, what)?;
    ok(
        e.step(EngineOp::Continue, mode),
        rule,
        "continue_generation",
    )?;
    let now = ok(e.engine.health(), "health", "health")?.weight_version;
    if now != version {
        return Err(Failure::new(
            rule,
            format!("after the refused update the engine serves version {now}, not {version}"),
        ));
    }
    let d = if served.is_empty() {
        0.0
    } else {
        max_diff(served, &engine_logprobs(e, t)?)
    };
    if d > 0.0 {
        return Err(Failure::new(
            rule,
            format!("after the refused update the served logprobs moved by {d}"),
        ));
    }
    Ok(err)
}

/// The common kinds that ship a directory of files (`checkpoint_dir`, `adapter`).
fn file_kinds(e: &EngineHarness, t: &TrainerHarness) -> Vec<UpdateKind> {
    common_kinds(e, t)
        .into_iter()
        .filter(|k| matches!(k, UpdateKind::CheckpointDir | UpdateKind::Adapter))
        .collect()
}

/// The directory a file update ships.
fn update_dir(update: &WeightUpdate, rule: &'static str) -> Result<PathBuf, Failure> {
    match &update.payload {
        UpdatePayload::CheckpointDir { dir } | UpdatePayload::Adapter { dir, .. } => {
            Ok(PathBuf::from(dir.as_str()))
        }
        other => Err(Failure::new(
            rule,
            format!("a file update carries a {} payload", other.kind().as_str()),
        )),
    }
}

/// Flips the last byte of the largest weights file of `dir` (the data of its last tensor);
/// returns the file and the byte's position, to undo it with a second call of [`flip`].
fn damage(dir: &Path, rule: &'static str) -> Result<(PathBuf, u64), Failure> {
    let files = weight_files(dir).map_err(|e| Failure::new(rule, e.to_string()))?;
    let largest = files
        .into_iter()
        .max_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .ok_or_else(|| Failure::new(rule, format!("{} holds no weights file", dir.display())))?;
    let len = std::fs::metadata(&largest)
        .map(|m| m.len())
        .map_err(|e| Failure::new(rule, format!("{}: {e}", largest.display())))?;
    let at = len.saturating_sub(1);
    flip(&largest, at, rule)?;
    Ok((largest, at))
}

/// XORs the byte at `at` of `file` with 0x40.
fn flip(file: &Path, at: u64, rule: &'static str) -> Result<(), Failure> {
    use std::os::unix::fs::FileExt;
    let io = |e: std::io::Error| Failure::new(rule, format!("{}: {e}", file.display()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .map_err(io)?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).map_err(io)?;
    b[0] ^= 0x40;
    f.write_all_at(&b, at).map_err(io)
}

/// The engine + trainer checks.
pub mod checks {
    use super::*;

    /// Every update kind both declare: export → apply → the engine's logprobs equal the
    /// trainer's (within the engine setup's tolerance), at the update's version.
    pub fn exports_are_served(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        first_kind(e, t)?;
        for kind in common_kinds(e, t) {
            sync(e, t, kind)?;
        }
        Ok(())
    }

    /// An update below the served version is refused; the engine keeps serving.
    pub fn lower_version_refused(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        let kind = first_kind(e, t)?;
        let good = sync(e, t, kind)?;
        let served = engine_logprobs(e, t)?;
        let mut bad = good.clone();
        bad.version = good.version.saturating_sub(1);
        if bad.version == good.version {
            return Err(Failure::new(
                "versions never go down",
                "the trainer exported version 0 after a train step",
            ));
        }
        refused_keeps_serving(
            e,
            t,
            bad,
            "versions never go down",
            &format!(
                "applying version {} over {}",
                good.version - 1,
                good.version
            ),
            &served,
        )
        .map(drop)
    }

    /// An update whose digest does not match its weights is refused (`corrupt`); the engine
    /// keeps serving the previous weights (for a shared region, which *is* the trainer's
    /// memory, only its version), and the good update applies afterwards.
    pub fn digest_mismatch_refused(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        let rule = "a digest mismatch is refused";
        let mut kinds = common_kinds(e, t);
        kinds.sort_by_key(|k| *k == UpdateKind::SharedRegion);
        let kind = match kinds.first() {
            Some(k) => *k,
            None => return first_kind(e, t).map(drop),
        };
        sync(e, t, kind)?;
        let good = train_and_export(t, kind, rule)?;
        if good.digest.is_empty() {
            return Err(Failure::new(
                rule,
                "the trainer's export carries no digest (mark the suite `no_digests`)",
            ));
        }
        let served = if kind == UpdateKind::SharedRegion {
            Vec::new()
        } else {
            engine_logprobs(e, t)?
        };
        let mut bad = good.clone();
        let flipped: String = good
            .digest
            .chars()
            .map(|c| if c == '0' { '1' } else { '0' })
            .collect();
        bad.digest = flipped.as_str().into();
        let err = refused_keeps_serving(e, t, bad, rule, "an update with a wrong digest", &served)?;
        if err.code != ErrorCode::Corrupt {
            return Err(Failure::new(
                rule,
                format!("a digest mismatch must be `corrupt`, got {}", one(&err)),
            ));
        }
        let report = apply(e, good.clone())?;
        if report.version != good.version {
            return Err(Failure::new(
                rule,
                format!(
                    "the good update after a refused one reports version {}",
                    report.version
                ),
            ));
        }
        Ok(())
    }

    /// A pair declared digest-free (`no_digests`) really carries none: the trainer's export
    /// or the engine's report has an empty digest (otherwise the digest rule must be checked).
    pub fn carries_no_digests(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        let kind = first_kind(e, t)?;
        let rule = "a pair declared digest-free carries no digests";
        let update = train_and_export(t, kind, rule)?;
        let digest = update.digest.clone();
        let report = apply(e, update)?;
        if !digest.is_empty() && !report.digest.is_empty() {
            return Err(Failure::new(
                rule,
                format!(
                    "trainer digest {digest} and engine digest {}: remove `no_digests` so the \
                     digest rule is checked",
                    report.digest
                ),
            ));
        }
        Ok(())
    }

    /// Every sync of every common kind carries a digest, and the engine reports the same
    /// digest for what it then serves (it verified what it loaded).
    pub fn syncs_carry_verified_digests(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        let rule = "a sync carries a digest the engine verifies";
        first_kind(e, t)?;
        for kind in common_kinds(e, t) {
            let update = train_and_export(t, kind, rule)?;
            if update.digest.is_empty() {
                return Err(Failure::new(
                    rule,
                    format!(
                        "the trainer's {} export carries no digest (a pair that cannot digest \
                         declares `no_digests` with the reason)",
                        kind.as_str()
                    ),
                ));
            }
            let report = apply(e, update.clone())?;
            if report.digest != update.digest {
                let got = if report.digest.is_empty() {
                    "none"
                } else {
                    report.digest.as_str()
                };
                return Err(Failure::new(
                    rule,
                    format!(
                        "{} v{}: the trainer exported {}, the engine reports {got}",
                        kind.as_str(),
                        update.version,
                        update.digest
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A weights file damaged between export and load (one byte of tensor data) is refused
    /// as `corrupt`, the previous weights still served; the same update, repaired, applies.
    pub fn damaged_file_refused(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        let rule = "a weights file damaged after the export is refused";
        for kind in file_kinds(e, t) {
            sync(e, t, kind)?;
            let served = engine_logprobs(e, t)?;
            let good = train_and_export(t, kind, rule)?;
            let dir = update_dir(&good, rule)?;
            let (file, at) = damage(&dir, rule)?;
            let what = format!(
                "{} v{} with {} damaged",
                kind.as_str(),
                good.version,
                file.display()
            );
            let err = refused_keeps_serving(e, t, good.clone(), rule, &what, &served)?;
            if err.code != ErrorCode::Corrupt {
                return Err(Failure::new(
                    rule,
                    format!(
                        "a damaged weights file must be `corrupt`, got {}",
                        one(&err)
                    ),
                ));
            }
            flip(&file, at, rule)?;
            let report = apply(e, good.clone())?;
            if report.version != good.version {
                return Err(Failure::new(
                    rule,
                    format!("the repaired update reports version {}", report.version),
                ));
            }
        }
        Ok(())
    }

    /// After three syncs of a file kind, the exports' parent directory (`weights/`,
    /// `adapters/`) holds at most the two newest versions, the newest being the last sync's,
    /// and no stage directory.
    pub fn keeps_two_versions(e: &mut EngineHarness, t: &mut TrainerHarness) -> Outcome {
        let rule = "the run directory keeps at most the two newest versions";
        for kind in file_kinds(e, t) {
            let mut last = None;
            for _ in 0..3 {
                let update = train_and_export(t, kind, rule)?;
                apply(e, update.clone())?;
                last = Some(update);
            }
            let Some(last) = last else { continue };
            let dir = update_dir(&last, rule)?;
            let parent = dir.parent().unwrap_or(&dir);
            let found = versions(parent).map_err(|e| Failure::new(rule, e.to_string()))?;
            let stages: Vec<String> = std::fs::read_dir(parent)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.ends_with(".stage"))
                        .collect()
                })
                .unwrap_or_default();
            if found.len() > 2 || found.last() != Some(&last.version) || !stages.is_empty() {
                return Err(Failure::new(
                    rule,
                    format!(
                        "after exporting v{} {}, {} holds versions {found:?} and stages {stages:?}",
                        last.version,
                        kind.as_str(),
                        parent.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}
