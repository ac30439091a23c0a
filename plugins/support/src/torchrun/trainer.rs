//! [`TorchrunTrainer`]: the trainer ABI mapped onto the worker's operations (one request per
//! call, run on every rank). The torchrun job starts in `init` and stops when the trainer is
//! dropped.

use serde_json::{Value, json};
use tandem_plugin_api::sdk::{Result, TrainerImpl};
use tandem_plugin_api::{
    CheckpointInfo, ComponentStats, LossKind, Metric, PluginError, PolicyLoss, RString, RVec,
    TrainBatch, TrainerInfo, UpdateKind, UpdatePayload, WeightUpdate, WhichWeights,
};

use super::Job;
use super::worker::{Launch, Worker};

/// A torchrun trainer component (the plugin's [`Job`] and how to launch it).
pub struct TorchrunTrainer {
    job: &'static Job,
    launch: Launch,
    /// Metrics `stats` adds (the plugin's mode, e.g. `lora`, `tp`).
    extra: Vec<(String, f64)>,
    worker: Option<Worker>,
    version: u64,
}

impl TorchrunTrainer {
    /// A trainer of `job`; the torchrun job is launched by `init`.
    pub fn new(job: &'static Job, launch: Launch, extra: Vec<(String, f64)>) -> Result<Self> {
        if launch.model.as_os_str().is_empty() {
            return Err(PluginError::invalid_input(format!(
                "{} needs a model directory (model_path is empty)",
                job.what()
            )));
        }
        Ok(TorchrunTrainer {
            job,
            launch,
            extra,
            worker: None,
            version: 0,
        })
    }

    fn worker(&mut self, op: &str) -> Result<&mut Worker> {
        let what = self.job.what();
        self.worker.as_mut().ok_or_else(|| {
            PluginError::invalid_state(format!("{op}: {what} is not initialised; call init first"))
        })
    }

    fn call(&mut self, op: &str, args: Value) -> Result<Value> {
        self.worker(op)?.call(op, args)
    }
}

/// The batch as the worker reads it, its loss with the policy-loss variant (see
/// `tandem_torchrun/loss.py`).
fn batch_json(batch: &TrainBatch, policy: PolicyLoss) -> Value {
    let seqs: Vec<Value> = batch
        .sequences
        .iter()
        .map(|s| {
            json!({
                "tokens": s.tokens.as_slice(),
                "prompt_len": s.prompt_len,
                "advantage": s.advantage,
                "old_logprobs": s.old_logprobs.as_slice(),
                "ref_logprobs": s.ref_logprobs.as_slice(),
            })
        })
        .collect();
    let l = &batch.loss;
    json!({
        "sequences": seqs,
        "loss": {
            "kind": match l.kind { LossKind::Grpo => "grpo", LossKind::Sft => "sft" },
            "clip_eps_low": l.clip_eps_low,
            "clip_eps_high": l.clip_eps_high,
            "kl_coef": l.kl_coef,
            "learning_rate": l.learning_rate,
            "grad_clip": l.grad_clip,
            "aggregation": policy.aggregation,
            "constant_length": policy.constant_length,
            "ratio": policy.ratio,
            "kl_estimator": policy.kl_estimator,
        },
    })
}

fn bad_reply(op: &str, v: &Value) -> PluginError {
    PluginError::runtime(format!(
        "torchrun trainer: {op}: unexpected reply from rank 0: {}",
        v.to_string().chars().take(200).collect::<String>()
    ))
}

fn u64_of(v: &Value, key: &str, op: &str) -> Result<u64> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad_reply(op, v))
}

fn str_of(v: &Value, key: &str, op: &str) -> Result<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| bad_reply(op, v))
}

fn checkpoint_info(v: &Value, op: &str) -> Result<CheckpointInfo> {
    Ok(CheckpointInfo {
        dir: str_of(v, "dir", op)?.into(),
        weight_version: u64_of(v, "weight_version", op)?,
        bytes: u64_of(v, "bytes", op)?,
    })
}

impl TrainerImpl for TorchrunTrainer {
    fn component(&self) -> &str {
        self.job.component
    }

    fn init(&mut self) -> Result<TrainerInfo> {
        if self.worker.is_some() {
            return Err(PluginError::invalid_state(format!(
                "{} is already initialised",
                self.job.what()
            )));
        }
        let worker = Worker::launch(self.job, &self.launch)?;
        self.worker = Some(worker);
        let v = self.call("init", json!({}))?;
        self.version = u64_of(&v, "weight_version", "init")?;
        Ok(TrainerInfo {
            trainable_params: u64_of(&v, "trainable_params", "init")?,
            total_params: u64_of(&v, "total_params", "init")?,
            weight_version: self.version,
        })
    }

    fn compute_logprobs(
        &mut self,
        batch: TrainBatch,
        which: WhichWeights,
    ) -> Result<Vec<RVec<f32>>> {
        let snapshot = match which {
            WhichWeights::Current => Value::Null,
            WhichWeights::Snapshot(name) => Value::from(name.as_str()),
        };
        let n = batch.sequences.len();
        let v = self.call(
            "compute_logprobs",
            json!({"batch": batch_json(&batch, PolicyLoss::default()), "snapshot": snapshot}),
        )?;
        let rows = v
            .as_array()
            .filter(|r| r.len() == n)
            .ok_or_else(|| bad_reply("compute_logprobs", &v))?;
        rows.iter()
            .map(|row| {
                row.as_array()
                    .map(|xs| {
                        xs.iter()
                            .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                            .collect::<RVec<f32>>()
                    })
                    .ok_or_else(|| bad_reply("compute_logprobs", row))
            })
            .collect()
    }

    fn train_step(&mut self, batch: TrainBatch) -> Result<Vec<Metric>> {
        self.train_step_policy(batch, PolicyLoss::default())
    }

    fn train_step_policy(&mut self, batch: TrainBatch, loss: PolicyLoss) -> Result<Vec<Metric>> {
        if let Some(problem) = loss.problem(batch.loss.kind) {
            return Err(PluginError::invalid_input(format!(
                "train_step_policy: {problem}"
            )));
        }
        let v = self.call("train_step", json!({"batch": batch_json(&batch, loss)}))?;
        let obj = v.as_object().ok_or_else(|| bad_reply("train_step", &v))?;
        if let Some(w) = obj.get("weight_version").and_then(Value::as_f64) {
            self.version = w as u64;
        }
        Ok(obj
            .iter()
            .filter_map(|(k, x)| x.as_f64().map(|f| Metric::new(k, f)))
            .collect())
    }

    fn snapshot(&mut self, name: String) -> Result<()> {
        self.call("snapshot", json!({"name": name})).map(drop)
    }

    fn restore(&mut self, name: String) -> Result<()> {
        self.call("restore", json!({"name": name}))?;
        let s = self.call("stats", json!({}))?;
        self.version = u64_of(&s, "weight_version", "restore")?;
        Ok(())
    }

    fn save_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        let v = self.call("save_checkpoint", json!({"dir": dir}))?;
        checkpoint_info(&v, "save_checkpoint")
    }

    fn load_checkpoint(&mut self, dir: String) -> Result<CheckpointInfo> {
        let v = self.call("load_checkpoint", json!({"dir": dir}))?;
        let info = checkpoint_info(&v, "load_checkpoint")?;
        self.version = info.weight_version;
        Ok(info)
    }

    fn export_weight_update(&mut self, kind: UpdateKind) -> Result<WeightUpdate> {
        let op = "export_weight_update";
        if !self.job.exports.contains(&kind) {
            let kinds: Vec<&str> = self.job.exports.iter().map(|k| k.as_str()).collect();
            return Err(PluginError::not_supported(
                &format!("{op}({})", kind.as_str()),
                self.job.component,
            )
            .with_help(format!(
                "{} exports {} updates",
                self.job.what(),
                kinds.join(" and ")
            )));
        }
        let v = self.call("export", json!({"kind": kind.as_str()}))?;
        let dir = RString::from(str_of(&v, "dir", op)?);
        let payload = match kind {
            UpdateKind::Adapter => UpdatePayload::Adapter {
                name: str_of(&v, "name", op)?.into(),
                dir,
            },
            _ => UpdatePayload::CheckpointDir { dir },
        };
        // The st256 digest of the tensors written (empty with `digest = false`).
        Ok(WeightUpdate {
            version: u64_of(&v, "version", op)?,
            payload,
            digest: str_of(&v, "digest", op)?.into(),
        })
    }

    fn offload(&mut self, tags: Vec<String>) -> Result<()> {
        declared_tags(self.job, &tags, "offload")?;
        self.call("offload", json!({"tags": tags})).map(drop)
    }

    fn onload(&mut self, tags: Vec<String>) -> Result<()> {
        declared_tags(self.job, &tags, "onload")?;
        self.call("onload", json!({"tags": tags})).map(drop)
    }

    fn stats(&self) -> Result<ComponentStats> {
        // `stats` takes &self: report what the plugin knows without a round trip.
        let (state, mut metrics) = match &self.worker {
            None => ("uninitialised".to_string(), Vec::new()),
            Some(w) => (
                "ready".to_string(),
                vec![
                    Metric::new("ranks", f64::from(w.ranks)),
                    Metric::new("agent_pid", f64::from(w.agent_pid())),
                    Metric::new("rank0_pid", f64::from(w.rank0_pid)),
                ],
            ),
        };
        metrics.extend(self.extra.iter().map(|(k, v)| Metric::new(k, *v)));
        Ok(ComponentStats {
            weight_version: self.version,
            state: state.into(),
            metrics: metrics.into(),
        })
    }
}

/// Only the declared releasable tags ([`Job::releasable`]) are offloaded: on CPU the others
/// would free nothing, and capabilities are declared, never discovered by failure.
fn declared_tags(job: &Job, tags: &[String], op: &str) -> Result<()> {
    match tags.iter().find(|t| !job.releasable.contains(&t.as_str())) {
        Some(t) => Err(
            PluginError::not_supported(&format!("{op}({t})"), job.component)
                .with_help(job.releasable_help),
        ),
        None => Ok(()),
    }
}
