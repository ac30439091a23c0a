//! Engine checks of a serving engine: declarations, greedy generation, `score` against
//! `generate`.

use super::EngineHarness;
use crate::expect::ok;
use crate::harness::{Failure, Outcome};
use tandem_plugin_api::{ErrorCode, GenerateResponse, RResult, RVec};

/// The engine is declared, starts, reports ready, and its declared capabilities are
/// well-formed (known tags, no duplicates).
pub fn declared_and_healthy(h: &mut EngineHarness) -> Outcome {
    let rule = "declarations are well-formed";
    let caps = &h.decl.caps;
    for t in caps.releasable_tags.iter() {
        if !tandem_plugin_api::tags::ALL.contains(&t.as_str()) {
            return Err(Failure::new(rule, format!("unknown releasable tag `{t}`")));
        }
    }
    let mut modes: Vec<&str> = caps.pause_modes.iter().map(|m| m.as_str()).collect();
    modes.sort_unstable();
    modes.dedup();
    if modes.len() != caps.pause_modes.len() {
        return Err(Failure::new(rule, "a pause mode is declared twice"));
    }
    let health = ok(h.engine.health(), "health", "health")?;
    let stats = ok(h.engine.stats(), "stats", "stats")?;
    if health.weight_version != stats.weight_version {
        return Err(Failure::new(
            "one weight version",
            format!(
                "health says version {} and stats {}",
                health.weight_version, stats.weight_version
            ),
        ));
    }
    Ok(())
}

/// Greedy generation: one completion per prompt, at most `max_tokens`, a logprob per
/// token when asked, the served version, and the same tokens twice.
pub fn generate_is_well_formed(h: &mut EngineHarness) -> Outcome {
    let rule = "generate answers every prompt";
    let a = h.generate(rule)?;
    let b = h.generate(rule)?;
    let req = h.greedy();
    if a.completions.len() != req.prompts.len() {
        return Err(Failure::new(
            rule,
            format!(
                "{} prompts, {} completions",
                req.prompts.len(),
                a.completions.len()
            ),
        ));
    }
    for (i, c) in a.completions.iter().enumerate() {
        if c.tokens.len() > req.sampling.max_tokens as usize {
            return Err(Failure::new(
                "max_tokens is respected",
                format!("completion {i} has {} tokens", c.tokens.len()),
            ));
        }
        if c.logprobs.len() != c.tokens.len() {
            return Err(Failure::new(
                "a logprob per token when asked",
                format!(
                    "completion {i}: {} tokens, {} logprobs",
                    c.tokens.len(),
                    c.logprobs.len()
                ),
            ));
        }
        if c.logprobs.iter().any(|l| !l.is_finite() || *l > 1e-6) {
            return Err(Failure::new(
                "a logprob per token when asked",
                format!("completion {i}: logprobs {:?} are not <= 0", c.logprobs),
            ));
        }
    }
    let tokens = |r: &GenerateResponse| -> Vec<Vec<u32>> {
        r.completions.iter().map(|c| c.tokens.to_vec()).collect()
    };
    if tokens(&a) != tokens(&b) {
        return Err(Failure::new(
            "greedy generation is deterministic",
            format!("{:?} then {:?}", tokens(&a), tokens(&b)),
        ));
    }
    let version = ok(h.engine.health(), "health", "health")?.weight_version;
    if a.weight_version != version {
        return Err(Failure::new(
            "one weight version",
            format!(
                "generate says version {}, health {version}",
                a.weight_version
            ),
        ));
    }
    Ok(())
}

/// `score` of prompt + completion gives the completion's logprobs `generate` returned
/// (or `score` is not supported at all).
pub fn score_agrees_with_generate(h: &mut EngineHarness) -> Outcome {
    let rule = "score agrees with generate's logprobs";
    let out = h.generate(rule)?;
    let seqs: RVec<RVec<u32>> = h
        .greedy()
        .prompts
        .iter()
        .zip(out.completions.iter())
        .map(|(p, c)| p.iter().chain(c.tokens.iter()).copied().collect())
        .collect();
    let scores = match h.engine.score(seqs.clone()) {
        RResult::RErr(e) if e.code == ErrorCode::NotSupported => return Ok(()),
        r => ok(r, rule, "score")?,
    };
    for (i, ((s, c), seq)) in scores
        .iter()
        .zip(out.completions.iter())
        .zip(&seqs)
        .enumerate()
    {
        if s.len() + 1 != seq.len() {
            return Err(Failure::new(
                rule,
                format!(
                    "sequence {i} of {} tokens got {} scores (one per token after the first)",
                    seq.len(),
                    s.len()
                ),
            ));
        }
        let tail = &s[s.len() - c.tokens.len()..];
        for (j, (a, b)) in tail.iter().zip(c.logprobs.iter()).enumerate() {
            if (a - b).abs() > h.setup.tolerance {
                return Err(Failure::new(
                    rule,
                    format!(
                        "sequence {i} token {j}: score {a} vs generate {b} (tolerance {})",
                        h.setup.tolerance
                    ),
                ));
            }
        }
    }
    Ok(())
}
