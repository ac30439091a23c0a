//! One step of a drafter job (see the module doc of `drafter`): generate, features + train,
//! eval, save, record.

use super::DrafterLoop;
use super::launch::pair_group;
use super::metrics::DrafterStepMetrics;
use crate::config::FeatureRouteKind;
use crate::error::RlError;
use crate::metrics::resident;
use std::time::Instant;
use tandem_plugin_api::{
    ComponentStats, FeatureBatch, FeatureRoute, FeatureSource, GenerateRequest, HiddenStatesReport,
    HiddenStatesRequest, LossConfig, LossKind, Metric, ROption, RString, RVec, SamplingParams,
    TrainBatch, TrainSequence, UpdateKind, UpdatePayload,
};
use tandem_runtime::launch::RemoteEngine;

/// Sequences (prompt + completion) of one engine rank, and their prompt lengths.
struct Shard {
    tokens: Vec<Vec<u32>>,
    prompt_lens: Vec<u32>,
}

impl DrafterLoop<'_> {
    /// Step 0: the untrained drafter's acceptance (a metrics line with `step` 0, the
    /// acceptance figures and memory only). Loading the drafter here sizes every engine's
    /// drafter and verify buffers before the first step.
    pub(super) fn step_zero(&mut self) -> Result<(), RlError> {
        let started = Instant::now();
        let (accept, tok_s) = self.eval(0)?;
        let mut m = DrafterStepMetrics {
            step: 0,
            route: self.settings.route,
            acceptance_length: Some(accept),
            eval_tokens_per_s: Some(tok_s),
            ..DrafterStepMetrics::default()
        };
        m.phases
            .insert("eval".into(), started.elapsed().as_secs_f64());
        self.memory_figures(&mut m);
        m.step_s = started.elapsed().as_secs_f64();
        self.progress.println(&format!(
            "step 0: acceptance length {accept:.2} with the untrained drafter"
        ));
        self.metrics.push(m)
    }

    /// Runs step `step` of `total`.
    pub(super) fn step(&mut self, step: u32, total: u32) -> Result<(), RlError> {
        let started = Instant::now();
        let mut m = DrafterStepMetrics {
            step,
            route: self.settings.route,
            ..DrafterStepMetrics::default()
        };
        let t = Instant::now();
        let shards = self.generate(step)?;
        m.phases
            .insert("generate".into(), t.elapsed().as_secs_f64());
        m.sequences = shards.iter().map(|s| s.tokens.len() as u64).sum();
        let completion: usize = shards
            .iter()
            .flat_map(|s| s.tokens.iter().zip(&s.prompt_lens))
            .map(|(t, &p)| t.len() - p as usize)
            .sum();
        m.completion_tokens = completion as f64 / m.sequences.max(1) as f64;
        let t = Instant::now();
        let (metrics, reports) = self.features_and_train(step, &shards)?;
        m.phases
            .insert("features_train".into(), t.elapsed().as_secs_f64());
        m.set_trainer(&metrics);
        m.transfer_bytes = reports.iter().map(|r| r.bytes_sent).sum();
        m.feature_rows = reports.iter().map(|r| r.rows).sum();
        let d = self.settings;
        let eval_now = step == total || (d.eval_every > 0 && step.is_multiple_of(d.eval_every));
        if eval_now {
            let t = Instant::now();
            let (accept, tok_s) = self.eval(step)?;
            m.phases.insert("eval".into(), t.elapsed().as_secs_f64());
            m.acceptance_length = Some(accept);
            m.eval_tokens_per_s = Some(tok_s);
        }
        let save_every = self.plan.run.save_every;
        if step == total || (save_every > 0 && step.is_multiple_of(save_every)) {
            let t = Instant::now();
            let dir = self
                .opts
                .run_dir
                .join("checkpoints")
                .join(format!("step-{step}"));
            let dir = crate::driver::rundir::absolute(&dir);
            self.trainer.save_checkpoint(&dir.to_string_lossy())?;
            self.events.record(
                step,
                "trainer",
                "save_checkpoint",
                &dir.display().to_string(),
            );
            self.last_checkpoint = Some(dir);
            m.phases.insert("save".into(), t.elapsed().as_secs_f64());
        }
        self.memory_figures(&mut m);
        m.step_s = started.elapsed().as_secs_f64();
        self.progress.drafter_step(&m);
        self.metrics.push(m)?;
        if step.is_multiple_of(10) || step == total {
            self.events.flush();
            let title = &self.plan.run.name;
            if let Err(e) = super::plot::draw(&self.files.plot, title, &self.metrics.steps) {
                self.progress.println(&format!("warning: {e}"));
            }
        }
        Ok(())
    }

    /// The step's completions, whole prompts per engine rank, engines in parallel.
    fn generate(&mut self, step: u32) -> Result<Vec<Shard>, RlError> {
        let a = &self.plan.algorithm;
        let prompts = (0..u64::from(a.prompts_per_step))
            .map(|i| {
                let p = self.env.problem(self.data_position + i)?;
                self.codec.prompt_of(&p)
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.data_position += u64::from(a.prompts_per_step);
        let n = self.engines.len();
        let stop = if self.settings.ignore_eos {
            Vec::new()
        } else {
            self.codec.stop_ids().to_vec()
        };
        let seed = self.plan.run.seed ^ u64::from(step).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let assignment: Vec<Vec<Vec<u32>>> = (0..n)
            .map(|e| {
                (e..prompts.len())
                    .step_by(n)
                    .flat_map(|g| std::iter::repeat_n(prompts[g].clone(), a.group_size as usize))
                    .collect()
            })
            .collect();
        let requests: Vec<GenerateRequest> = assignment
            .iter()
            .enumerate()
            .map(|(e, batch)| GenerateRequest {
                prompts: batch.iter().map(|p| RVec::from(p.clone())).collect(),
                sampling: SamplingParams {
                    temperature: a.temperature,
                    top_p: 1.0,
                    top_k: 0,
                    max_tokens: a.max_tokens,
                    stop_token_ids: RVec::from(stop.clone()),
                    seed: ROption::RSome(seed ^ (e as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)),
                    logprobs: false,
                    return_hidden_states: false,
                },
                adapter: ROption::RNone,
            })
            .collect();
        let replies = in_parallel(&self.engines, requests, |e, r| e.generate(r))?;
        let mut shards = Vec::with_capacity(n);
        for (batch, reply) in assignment.into_iter().zip(replies) {
            if reply.completions.len() != batch.len() {
                return Err(RlError::failed(format!(
                    "an engine returned {} completions for {} prompts",
                    reply.completions.len(),
                    batch.len()
                )));
            }
            let mut shard = Shard {
                tokens: Vec::with_capacity(batch.len()),
                prompt_lens: Vec::with_capacity(batch.len()),
            };
            for (mut prompt, c) in batch.into_iter().zip(reply.completions.iter()) {
                shard.prompt_lens.push(prompt.len() as u32);
                prompt.extend_from_slice(&c.tokens);
                shard.tokens.push(prompt);
            }
            shards.push(shard);
        }
        Ok(shards)
    }

    /// Every engine rank computes its sequences' features and sends them along the job's
    /// route while the trainer steps on them all.
    fn features_and_train(
        &self,
        step: u32,
        shards: &[Shard],
    ) -> Result<(Vec<Metric>, Vec<HiddenStatesReport>), RlError> {
        let transport = self.settings.route == FeatureRouteKind::Transport;
        let requests: Vec<HiddenStatesRequest> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| HiddenStatesRequest {
                sequences: s.tokens.iter().map(|t| RVec::from(t.clone())).collect(),
                layers: RVec::from(self.layers.clone()),
                adapter: ROption::RNone,
                route: if transport {
                    FeatureRoute::Transport {
                        group: RString::from(pair_group(i)),
                        peer: 1,
                        tag: u64::from(step),
                    }
                } else {
                    FeatureRoute::Inline
                },
            })
            .collect();
        let rows = |s: &Shard| s.tokens.iter().map(|t| t.len() as u64).sum::<u64>();
        let batch = self.batch(shards);
        if transport {
            let features = FeatureBatch {
                width: self.width,
                layers: RVec::from(self.layers.clone()),
                sources: shards
                    .iter()
                    .enumerate()
                    .map(|(i, s)| FeatureSource {
                        route: FeatureRoute::Transport {
                            group: RString::from(pair_group(i)),
                            peer: 0,
                            tag: u64::from(step),
                        },
                        rows: rows(s),
                        features: RVec::new(),
                    })
                    .collect(),
            };
            // The engines send while the trainer receives: a send completes once its
            // receiver has taken the data, so both sides must run at once.
            std::thread::scope(|scope| {
                let sent =
                    scope.spawn(|| in_parallel(&self.engines, requests, |e, r| e.hidden_states(r)));
                let trained = self
                    .trainer
                    .train_step_features(batch, features)
                    .map_err(RlError::from);
                let sent = sent
                    .join()
                    .unwrap_or_else(|_| Err(RlError::failed("a feature thread panicked")));
                // An engine's failure explains the trainer's (a receive that timed out).
                let reports = sent?;
                Ok((trained?, reports))
            })
        } else {
            let reports = in_parallel(&self.engines, requests, |e, r| e.hidden_states(r))?;
            let features = FeatureBatch {
                width: self.width,
                layers: RVec::from(self.layers.clone()),
                sources: reports
                    .iter()
                    .map(|r| FeatureSource {
                        route: FeatureRoute::Inline,
                        rows: r.rows,
                        features: r.features.clone(),
                    })
                    .collect(),
            };
            let metrics = self.trainer.train_step_features(batch, features)?;
            let reports = reports
                .into_iter()
                .map(|mut r| {
                    r.bytes_sent = r.rows * u64::from(r.width) * 4;
                    r.features = RVec::new();
                    r
                })
                .collect();
            Ok((metrics, reports))
        }
    }

    /// The trainer's batch: every shard's sequences, in engine-rank order.
    fn batch(&self, shards: &[Shard]) -> TrainBatch {
        let a = &self.plan.algorithm;
        TrainBatch {
            sequences: shards
                .iter()
                .flat_map(|s| s.tokens.iter().zip(&s.prompt_lens))
                .map(|(t, &p)| TrainSequence {
                    tokens: RVec::from(t.clone()),
                    prompt_len: p,
                    advantage: 0.0,
                    old_logprobs: RVec::new(),
                    ref_logprobs: RVec::new(),
                })
                .collect(),
            loss: LossConfig {
                kind: LossKind::Sft,
                clip_eps_low: 0.0,
                clip_eps_high: 0.0,
                kl_coef: 0.0,
                learning_rate: a.learning_rate,
                grad_clip: a.grad_clip,
            },
        }
    }

    /// Ships the drafter to every engine and decodes the held-out prompts greedily with it:
    /// the mean acceptance length (emitted tokens per verification round) and decode
    /// tokens/s over that decode.
    fn eval(&mut self, step: u32) -> Result<(f64, f64), RlError> {
        let update = self
            .trainer
            .export_weight_update(UpdateKind::CheckpointDir)?;
        let UpdatePayload::CheckpointDir { dir } = &update.payload else {
            return Err(RlError::failed(format!(
                "the trainer exported a {} update for the drafter, not a checkpoint_dir",
                update.payload.kind().as_str()
            )));
        };
        for e in &self.engines {
            e.load_drafter(dir.as_str())?;
        }
        self.events
            .record(step, "engines", "load_drafter", dir.as_str());
        let d = self.settings;
        let max_tokens = d.eval_max_tokens;
        let stop = if d.ignore_eos {
            Vec::new()
        } else {
            self.codec.stop_ids().to_vec()
        };
        let n = self.engines.len();
        let requests: Vec<GenerateRequest> = (0..n)
            .map(|e| GenerateRequest {
                prompts: (e..self.held_out.len())
                    .step_by(n)
                    .map(|i| RVec::from(self.held_out[i].clone()))
                    .collect(),
                sampling: SamplingParams {
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                    max_tokens,
                    stop_token_ids: RVec::from(stop.clone()),
                    seed: ROption::RSome(0),
                    logprobs: false,
                    return_hidden_states: false,
                },
                adapter: ROption::RNone,
            })
            .collect();
        let before = self.spec_counters()?;
        let t = Instant::now();
        let replies = in_parallel(&self.engines, requests, |e, r| e.generate(r))?;
        let secs = t.elapsed().as_secs_f64();
        let after = self.spec_counters()?;
        let tokens: usize = replies
            .iter()
            .flat_map(|r| r.completions.iter())
            .map(|c| c.tokens.len())
            .sum();
        let rounds = after.0 - before.0;
        let emitted = after.1 - before.1;
        if rounds <= 0.0 {
            return Err(RlError::failed(
                "the engines report no speculative rounds after loading the drafter; \
                 does the engine speculate (spec.rounds in its stats)?",
            ));
        }
        Ok((emitted / rounds, tokens as f64 / secs.max(1e-9)))
    }

    /// `(spec.rounds, spec.emitted)` summed over the engines.
    fn spec_counters(&self) -> Result<(f64, f64), RlError> {
        let mut sum = (0.0, 0.0);
        for e in &self.engines {
            let s = e.stats()?;
            sum.0 += stat(&s, "spec.rounds");
            sum.1 += stat(&s, "spec.emitted");
        }
        Ok(sum)
    }

    /// Resident memory and memory-ledger bytes of every worker.
    fn memory_figures(&self, m: &mut DrafterStepMetrics) {
        let ledger = |name: String, s: Option<ComponentStats>, m: &mut DrafterStepMetrics| {
            if let Some(s) = s {
                m.ledger.insert(
                    name,
                    crate::metrics::bytes_with_prefix(&s, "allocated_bytes."),
                );
            }
        };
        let mut workers: Vec<(String, Option<u32>)> = Vec::new();
        for (rank, e) in self.engines.iter().enumerate() {
            workers.push((format!("engine-{rank}"), e.local_pid()));
            ledger(format!("engine-{rank}"), e.stats().ok(), m);
        }
        workers.push(("trainer".into(), self.trainer.local_pid()));
        ledger("trainer".into(), self.trainer.stats().ok(), m);
        for (name, pid) in workers {
            let Some(pid) = pid else { continue };
            let r = resident(pid);
            m.rss.insert(name.clone(), r.total);
            m.rss_data.insert(name, r.data);
        }
    }
}

fn stat(s: &ComponentStats, name: &str) -> f64 {
    s.metrics
        .iter()
        .find(|m| m.name.as_str() == name)
        .map_or(0.0, |m| m.value)
}

/// Runs `call(engine i, items[i])` for every engine at once; the results in rank order, or
/// the first error.
fn in_parallel<I: Send, O: Send>(
    engines: &[RemoteEngine],
    items: Vec<I>,
    call: impl Fn(&RemoteEngine, I) -> Result<O, tandem_runtime::RuntimeError> + Sync,
) -> Result<Vec<O>, RlError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .iter()
            .zip(items)
            .map(|(e, item)| {
                let call = &call;
                s.spawn(move || call(e, item))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| {
                        Err(tandem_runtime::RuntimeError::runtime(
                            "an engine call thread panicked",
                        ))
                    })
                    .map_err(RlError::from)
            })
            .collect()
    })
}
