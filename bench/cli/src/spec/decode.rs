//! Decoding with and without the drafter (see the module doc of `spec`): two `native` engines
//! of one configuration, one with the `drafter` option; the same held-out prompts, greedy,
//! exactly N new tokens; calls alternate between the engines so a neighbour's load lands on
//! both.

use std::path::Path;
use std::time::Instant;

use super::{BATCHES, BENCH, Ctx, DRAFT_TOKENS, HELD_OUT_SEED, Plan, prompts};
use crate::Figure;
use crate::native::{config, greedy, median, metric};
use serde_json::json;
use tandem_cli::error::CliError;
use tandem_plugin_api::GenerateResponse;
use tandem_runtime::role::{Engine, Local};
use tandem_runtime::services::Services;

/// The speculative engine's counters (`spec.*` of its stats).
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    rounds: f64,
    emitted: f64,
    verifies: f64,
    draft_s: f64,
    verify_s: f64,
}

impl Counters {
    fn read(engine: &impl Engine) -> Result<Counters, CliError> {
        let m = engine.stats()?.metrics;
        Ok(Counters {
            rounds: metric(&m, "spec.rounds"),
            emitted: metric(&m, "spec.emitted"),
            verifies: metric(&m, "spec.verifies"),
            draft_s: metric(&m, "spec.draft_s"),
            verify_s: metric(&m, "spec.verify_s"),
        })
    }

    fn minus(self, o: Counters) -> Counters {
        Counters {
            rounds: self.rounds - o.rounds,
            emitted: self.emitted - o.emitted,
            verifies: self.verifies - o.verifies,
            draft_s: self.draft_s - o.draft_s,
            verify_s: self.verify_s - o.verify_s,
        }
    }

    fn plus(self, o: Counters) -> Counters {
        Counters {
            rounds: self.rounds + o.rounds,
            emitted: self.emitted + o.emitted,
            verifies: self.verifies + o.verifies,
            draft_s: self.draft_s + o.draft_s,
            verify_s: self.verify_s + o.verify_s,
        }
    }
}

/// One batch size's measurement.
struct Measured {
    plain_s: f64,
    spec_s: f64,
    /// Summed over the timed speculative calls.
    spec: Counters,
    spec_total_s: f64,
    same_tokens: bool,
}

/// Times `engine.generate` on `prompts`, checking that every sequence got `n` tokens.
fn timed(
    engine: &impl Engine,
    prompts: &[Vec<u32>],
    n: usize,
) -> Result<(f64, GenerateResponse), CliError> {
    let t = Instant::now();
    let out = engine.generate(greedy(prompts, n))?;
    let secs = t.elapsed().as_secs_f64();
    if let Some(c) = out.completions.iter().find(|c| c.tokens.len() != n) {
        return Err(CliError::failed(format!(
            "tandem bench spec: the engine generated {} tokens, not {n} ({:?})",
            c.tokens.len(),
            c.finish_reason
        )));
    }
    Ok((secs, out))
}

fn same(a: &GenerateResponse, b: &GenerateResponse) -> bool {
    a.completions.len() == b.completions.len()
        && a.completions
            .iter()
            .zip(b.completions.iter())
            .all(|(x, y)| x.tokens == y.tokens)
}

/// The decode figures of `model` with the drafter in `drafter`.
pub(super) fn measure(
    ctx: &Ctx<'_>,
    model: &Path,
    drafter: &Path,
    plan: &Plan,
) -> Result<Vec<Figure>, CliError> {
    let name = plan.name;
    let n = plan.new_tokens;
    let max_batch = BATCHES[BATCHES.len() - 1];
    let prompts = prompts(model, HELD_OUT_SEED, max_batch)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let options = json!({
        "max_batch": max_batch,
        "max_seq_len": longest + n + DRAFT_TOKENS + 2,
        "draft_tokens": DRAFT_TOKENS,
    });
    let mut spec_options = options.clone();
    spec_options["drafter"] = json!(drafter.display().to_string());
    let services = Services::new();
    let plain = Local(
        ctx.registry
            .new_engine(config(model, options), services.handle())?,
    );
    let spec = Local(
        ctx.registry
            .new_engine(config(model, spec_options), services.handle())?,
    );
    if metric(&spec.stats()?.metrics, "spec.drafter") != 1.0 {
        return Err(CliError::failed(format!(
            "tandem bench spec: the engine did not load the drafter {} (see its log line above)",
            drafter.display()
        )));
    }
    eprintln!(
        "spec: {name}: decode warm-up (batch {max_batch}, {n} new tokens, {DRAFT_TOKENS} draft \
         tokens)"
    );
    timed(&plain, &prompts, n)?;
    timed(&spec, &prompts, n)?;
    let mut figures = Vec::new();
    for b in BATCHES {
        let m = measure_batch(&plain, &spec, &prompts[..b], n, plan.reps)?;
        figures.extend(report(ctx, name, b, n, &m, &plain)?);
    }
    Ok(figures)
}

fn measure_batch(
    plain: &impl Engine,
    spec: &impl Engine,
    prompts: &[Vec<u32>],
    n: usize,
    reps: usize,
) -> Result<Measured, CliError> {
    let (mut plain_s, mut spec_s) = (Vec::new(), Vec::new());
    let mut counters = Counters::default();
    let mut same_tokens = true;
    for _ in 0..reps {
        let (s, a) = timed(plain, prompts, n)?;
        plain_s.push(s);
        let before = Counters::read(spec)?;
        let (s, b) = timed(spec, prompts, n)?;
        counters = counters.plus(Counters::read(spec)?.minus(before));
        spec_s.push(s);
        same_tokens &= same(&a, &b);
    }
    Ok(Measured {
        spec_total_s: spec_s.iter().sum(),
        plain_s: median(plain_s),
        spec_s: median(spec_s),
        spec: counters,
        same_tokens,
    })
}

/// The three figures of one batch size, and the round's cost on stderr.
fn report(
    ctx: &Ctx<'_>,
    name: &str,
    b: usize,
    n: usize,
    m: &Measured,
    plain: &impl Engine,
) -> Result<Vec<Figure>, CliError> {
    let tokens = (b * n) as f64;
    let (plain_tok_s, spec_tok_s) = (tokens / m.plain_s, tokens / m.spec_s);
    let c = m.spec;
    let accept = if c.rounds > 0.0 {
        c.emitted / c.rounds
    } else {
        f64::NAN
    };
    if !m.same_tokens {
        eprintln!(
            "tandem bench spec: warning: {name} b{b}: the greedy tokens with the drafter differ \
             from those without it"
        );
    }
    // Per verify round of the batch: drafting, verifying and the rest (sampling, acceptance,
    // bookkeeping, prefill spread over the rounds); beside one plain decode step.
    let verifies = c.verifies.max(1.0);
    let round_ms = 1e3 * m.spec_total_s / verifies;
    let step_ms = 1e3 * m.plain_s / n as f64;
    eprintln!(
        "spec: {name} b{b}: plain {plain_tok_s:.1} tok/s ({step_ms:.2} ms/step), spec \
         {spec_tok_s:.1} tok/s = {:.2}x; acceptance {accept:.2} tokens/round; round \
         {round_ms:.2} ms = draft {:.2} + verify {:.2} + rest {:.2} ({:.2} plain steps)",
        spec_tok_s / plain_tok_s,
        1e3 * c.draft_s / verifies,
        1e3 * c.verify_s / verifies,
        round_ms - 1e3 * (c.draft_s + c.verify_s) / verifies,
        round_ms / step_ms,
    );
    let weight_bytes = metric(&plain.stats()?.metrics, "allocated_bytes.weights");
    let mach = &ctx.machine;
    let params = weight_bytes / 4.0;
    let bound =
        (b as f64 * mach.memcpy_bytes_per_s / weight_bytes).min(mach.gemm_flops / (2.0 * params));
    let speedup = spec_tok_s / plain_tok_s;
    let target = if name == "small" && b == 1 {
        ">= 1.5"
    } else {
        ""
    };
    Ok(vec![
        Figure::new(
            BENCH,
            &format!("{name} decode b{b}"),
            plain_tok_s,
            "tok/s",
            bound,
        )
        .limit_name("memcpy/GEMM bound"),
        Figure::new(
            BENCH,
            &format!("{name} spec decode b{b}"),
            spec_tok_s,
            "tok/s",
            plain_tok_s,
        )
        .limit_name("decode without drafter")
        .target(target),
        Figure::new(
            BENCH,
            &format!("{name} spec speedup b{b}"),
            speedup,
            "x",
            accept,
        )
        .limit_name("acceptance length"),
    ])
}
