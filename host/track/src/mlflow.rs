//! MLflow through its REST API (`/api/2.0/mlflow/...`), from this process: the experiment
//! (found by name, created when missing), one run per Tandem run (its id kept in the tracking
//! state, so `--resume` continues it), the resolved plan as params, metrics in batches, and at
//! the end the final checkpoint as the tag `tandem.checkpoint` and the run marked finished.
//!
//! Credentials come from the environment MLflow's own client reads: `MLFLOW_TRACKING_TOKEN`
//! (bearer), or `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD` (basic).
//! Metric timestamps are the line's own time, so a step sent twice (an answer lost on the
//! way) is the same row to MLflow's store.

use crate::error::TrackError;
use crate::flatten::Line;
use crate::section::MlflowPlan;
use crate::sinks::{RunInfo, Sink};
use crate::state::SinkState;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// One call's limit: a tracker that does not answer in this long is down for now.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// MLflow's `log-batch` limits: 1000 metrics, 100 params per call.
const METRICS_PER_CALL: usize = 1000;
const PARAMS_PER_CALL: usize = 100;
/// MLflow's longest param value.
const PARAM_VALUE_MAX: usize = 6000;
const NAME: &str = "mlflow";

/// The MLflow tracker of a run.
pub(crate) struct MlflowSink {
    plan: MlflowPlan,
    agent: ureq::Agent,
    run_id: Option<String>,
}

impl MlflowSink {
    pub(crate) fn new(plan: MlflowPlan) -> MlflowSink {
        let loopback = ["://127.", "://localhost", "://[::1]"]
            .iter()
            .any(|p| plan.tracking_uri.contains(p));
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(CALL_TIMEOUT));
        if loopback {
            config = config.proxy(None);
        }
        MlflowSink {
            plan,
            agent: config.build().into(),
            run_id: None,
        }
    }

    /// `POST` (with a body) or `GET` (without) to `/api/2.0/mlflow/<path>`; the answer's JSON,
    /// or MLflow's `error_code: message`.
    fn call(&self, path: &str, body: Option<&Value>) -> Result<Value, TrackError> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.plan.tracking_uri);
        let res = match body {
            Some(b) => auth(self.agent.post(&url))
                .header("content-type", "application/json")
                .send(b.to_string().as_bytes()),
            None => auth(self.agent.get(&url)).call(),
        };
        let mut resp = res.map_err(|e| {
            TrackError::tracker(
                NAME,
                format!("{} did not answer: {e}", self.plan.tracking_uri),
            )
        })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if (200..300).contains(&status) {
            return serde_json::from_str(&text).map_err(|e| {
                TrackError::tracker(NAME, format!("{path}: not JSON ({e}) from {url}"))
            });
        }
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let code = v["error_code"].as_str().unwrap_or("HTTP");
        let msg = v["message"].as_str().map_or_else(
            || text.lines().next().unwrap_or_default().to_string(),
            str::to_string,
        );
        Err(TrackError::tracker(
            NAME,
            format!("{path}: {status} {code}: {msg}"),
        ))
    }

    fn experiment_id(&self) -> Result<String, TrackError> {
        let name = &self.plan.experiment;
        let query = format!("experiments/get-by-name?experiment_name={}", percent(name));
        match self.call(&query, None) {
            Ok(v) => id_of(&v["experiment"]["experiment_id"], "experiment_id"),
            Err(e) if e.to_string().contains("RESOURCE_DOES_NOT_EXIST") => {
                let v = self.call("experiments/create", Some(&json!({ "name": name })))?;
                id_of(&v["experiment_id"], "experiment_id")
            }
            Err(e) => Err(e),
        }
    }

    fn create_run(&self, run: &RunInfo) -> Result<String, TrackError> {
        let experiment_id = self.experiment_id()?;
        let body = json!({
            "experiment_id": experiment_id,
            "run_name": run.name,
            "start_time": millis(None),
            "tags": [
                {"key": "mlflow.runName", "value": run.name},
                {"key": "mlflow.source.name", "value": "tandem"},
                {"key": "tandem.run_dir", "value": run.run_dir.display().to_string()},
            ],
        });
        let v = self.call("runs/create", Some(&body))?;
        let run_id = id_of(&v["run"]["info"]["run_id"], "run_id")?;
        let mut params = Vec::new();
        leaves(&run.config, "", &mut params);
        for chunk in params.chunks(PARAMS_PER_CALL) {
            let params: Vec<Value> = chunk
                .iter()
                .map(|(k, v)| json!({"key": k, "value": v}))
                .collect();
            self.call(
                "runs/log-batch",
                Some(&json!({"run_id": run_id, "params": params})),
            )?;
        }
        Ok(run_id)
    }
}

impl Sink for MlflowSink {
    fn name(&self) -> &'static str {
        NAME
    }

    /// By experiment, not address: a server that moved (or restarted elsewhere on the same
    /// store) continues the same run.
    fn key(&self) -> String {
        format!("mlflow {}", self.plan.experiment)
    }

    fn open(&mut self, state: &mut SinkState, run: &RunInfo) -> Result<(), TrackError> {
        if let Some(id) = &state.run_id {
            let body = json!({"run_id": id, "status": "RUNNING"});
            match self.call("runs/update", Some(&body)) {
                Ok(_) => {
                    self.run_id = Some(id.clone());
                    return Ok(());
                }
                // Another server, which never had this run: a new run gets every line.
                Err(e) if e.to_string().contains("RESOURCE_DOES_NOT_EXIST") => state.sent = None,
                Err(e) => return Err(e),
            }
        }
        let id = self.create_run(run)?;
        state.run_id = Some(id.clone());
        self.run_id = Some(id);
        Ok(())
    }

    fn send(&mut self, lines: &[&Line]) -> Result<(), TrackError> {
        let Some(run_id) = self.run_id.clone() else {
            return Err(TrackError::tracker(NAME, "no run open"));
        };
        let metrics: Vec<Value> = lines
            .iter()
            .flat_map(|l| {
                let ts = millis(l.time);
                l.scalars.iter().filter(|(_, v)| v.is_finite()).map(
                    move |(k, v)| json!({"key": k, "value": v, "timestamp": ts, "step": l.step}),
                )
            })
            .collect();
        for chunk in metrics.chunks(METRICS_PER_CALL) {
            let body = json!({"run_id": run_id, "metrics": chunk});
            self.call("runs/log-batch", Some(&body))?;
        }
        Ok(())
    }

    fn finish(&mut self, checkpoint: Option<&Path>, failed: bool) -> Result<(), TrackError> {
        let Some(run_id) = self.run_id.clone() else {
            return Ok(());
        };
        if let Some(c) = checkpoint {
            let body = json!({"run_id": run_id, "key": "tandem.checkpoint", "value": c.display().to_string()});
            self.call("runs/set-tag", Some(&body))?;
        }
        let status = if failed { "FAILED" } else { "FINISHED" };
        let body = json!({"run_id": run_id, "status": status, "end_time": millis(None)});
        self.call("runs/update", Some(&body)).map(|_| ())
    }
}

/// The request with the credentials of the environment, if any.
fn auth<B>(req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
    use base64::Engine;
    if let Ok(token) = std::env::var("MLFLOW_TRACKING_TOKEN") {
        return req.header("authorization", format!("Bearer {token}"));
    }
    match (
        std::env::var("MLFLOW_TRACKING_USERNAME"),
        std::env::var("MLFLOW_TRACKING_PASSWORD"),
    ) {
        (Ok(u), Ok(p)) => {
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            req.header("authorization", format!("Basic {b}"))
        }
        _ => req,
    }
}

fn id_of(v: &Value, what: &str) -> Result<String, TrackError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| TrackError::tracker(NAME, format!("the answer has no {what}")))
}

/// Milliseconds since the epoch of `time` (s), or of now.
fn millis(time: Option<f64>) -> i64 {
    (time.unwrap_or_else(crate::tensorboard::unix_now) * 1000.0) as i64
}

/// Every leaf of a JSON value as `(a.b.c, text)` (lists as their JSON text).
fn leaves(v: &Value, prefix: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, inner) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(inner, &key, out);
            }
        }
        Value::Null => {}
        Value::String(s) => out.push((prefix.to_string(), clip(s))),
        other => out.push((prefix.to_string(), clip(&other.to_string()))),
    }
}

fn clip(s: &str) -> String {
    s.chars().take(PARAM_VALUE_MAX).collect()
}

/// `s` as a query-string value (unreserved characters kept, the rest `%XX`).
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_the_plans_leaves_and_names_are_percent_encoded() {
        let mut out = Vec::new();
        leaves(
            &json!({"a": {"b": 1, "c": "x"}, "d": [1, 2], "e": null}),
            "",
            &mut out,
        );
        out.sort();
        assert_eq!(
            out,
            [
                ("a.b".to_string(), "1".to_string()),
                ("a.c".to_string(), "x".to_string()),
                ("d".to_string(), "[1,2]".to_string())
            ]
        );
        assert_eq!(percent("my exp/1"), "my%20exp%2F1");
    }
}
