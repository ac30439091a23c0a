//! The server side of the engine: the server slot (launched or attached on first use) and the
//! HTTP calls with their timeouts; a launched server found dead becomes one error with its
//! log tail, an attached one a refused connection naming its URL.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tandem_plugin_api::lifecycle::EngineMachine;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{LogLevel, PluginError};

use super::{SglangEngine, lock};
use crate::http::{CallError, Client};
use crate::response::{self, unexpected};
use crate::server::Server;

/// Which deadline a call gets.
#[derive(Clone, Copy)]
pub(super) enum Deadline {
    /// `request_timeout_s`: generation and scoring.
    Request,
    /// `control_timeout_s`: everything else.
    Control,
}

impl SglangEngine {
    pub(super) fn log(&self, level: LogLevel, msg: &str) {
        self.host.log(level, "sglang".into(), msg.into());
    }

    /// Starts (or attaches to) the server if that has not happened; returns its client, or
    /// the dead server's error with the log tail.
    pub(super) fn client(&self) -> Result<Client> {
        let mut slot = lock(&self.server);
        if let Some(s) = slot.as_ref() {
            if let Some(e) = s.dead_error() {
                return Err(e);
            }
            return Ok(s.client.clone());
        }
        let server = self.connect()?;
        let client = server.client.clone();
        *slot = Some(server);
        Ok(client)
    }

    /// Attach mode: the server at `urls[rank]`, its served version read from `/model_info`
    /// and its flags checked against the options. Launch mode: a new server on the served
    /// directory at the engine's version.
    fn connect(&self) -> Result<Server> {
        let server = match self.opts.url_of(self.rank) {
            Some(url) => {
                let server = Server::attach(&self.opts, &url)?;
                let info = get_value(&server.client, "/model_info", self.opts.control_timeout())?;
                let version = response::model_info_version(&info)?;
                self.check_server_flags(&server.client)?;
                self.load_job_model(&server.client, &info, version)?;
                let mut st = lock(&self.state);
                st.machine = EngineMachine::new(version);
                st.version = version;
                server
            }
            None => {
                let (dir, version) = {
                    let st = lock(&self.state);
                    (st.served_dir.clone(), st.version)
                };
                self.log(
                    LogLevel::Info,
                    &format!(
                        "starting SGLang for rank {} on {} (log {})",
                        self.rank,
                        dir.display(),
                        self.log.display()
                    ),
                );
                Server::launch(&self.opts, &dir, self.rank, version, &self.log)?
            }
        };
        self.log(
            LogLevel::Info,
            &format!(
                "SGLang rank {} healthy at {} after {:.1} s",
                self.rank,
                server.client.base(),
                server.startup_s
            ),
        );
        lock(&self.state).set_metric("startup_s", server.startup_s);
        Ok(server)
    }

    /// An attached server must have been started with the features the options declare.
    fn check_server_flags(&self, client: &Client) -> Result<()> {
        let info = get_value(client, "/server_info", self.opts.control_timeout())?;
        for (flag, want) in [
            ("enable_memory_saver", self.opts.enable_memory_saver),
            ("enable_lora", self.opts.enable_lora),
        ] {
            let has = info.get(flag).and_then(Value::as_bool).unwrap_or(false);
            if want && !has {
                return Err(PluginError::invalid_input(format!(
                    "engine `sglang`: the server at {} was started without --{}, but the \
                     options set {flag} = true",
                    client.base(),
                    flag.replace('_', "-")
                ))
                .with_help("restart the server with that flag, or set the option to false"));
            }
        }
        Ok(())
    }

    /// An attached server must serve the job's model (the trainer's starting weights): when
    /// `/model_info` names another directory, the job's is loaded into it with
    /// `/update_weights_from_disk` at the served version; a server that cannot load it (a
    /// path it cannot read, another architecture) is one error line.
    fn load_job_model(&self, client: &Client, info: &Value, version: u64) -> Result<()> {
        let job = lock(&self.state).served_dir.clone();
        let served = info.get("model_path").and_then(Value::as_str).unwrap_or("");
        let same = match (Path::new(served).canonicalize(), job.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => Path::new(served) == job,
        };
        if job.as_os_str().is_empty() || same {
            return Ok(());
        }
        self.log(
            LogLevel::Info,
            &format!(
                "the server at {} serves {served}: loading the job's model {} into it",
                client.base(),
                job.display()
            ),
        );
        let what = "POST /update_weights_from_disk";
        let body = json!({
            "model_path": job.display().to_string(),
            "weight_version": version.to_string(),
        });
        client
            .post(
                "/update_weights_from_disk",
                &body,
                self.opts.control_timeout(),
            )
            .map_err(|e| e.to_plugin(what))
            .and_then(|text| response::success(&parse(&text, what)?, what))
            .map_err(|e| {
                PluginError::invalid_input(format!(
                    "engine `sglang`: the server at {} serves {served}, not the job's model {}, \
                     and could not load it: {}",
                    client.base(),
                    job.display(),
                    e.message
                ))
                .with_help(
                    "start the server on the job's model (a directory it can read), or point \
                     [model] path at the server's",
                )
            })
    }

    /// Maps a failed call: a dead launched server becomes its own error with the log tail.
    pub(super) fn call_error(&self, e: CallError, what: &str) -> PluginError {
        if matches!(e, CallError::Connect(_)) {
            // Give the supervisor a moment to record the exit.
            std::thread::sleep(Duration::from_millis(300));
            if let Some(dead) = lock(&self.server).as_ref().and_then(Server::dead_error) {
                return dead;
            }
        }
        e.to_plugin(what)
    }

    fn timeout(&self, d: Deadline) -> Duration {
        match d {
            Deadline::Request => self.opts.request_timeout(),
            Deadline::Control => self.opts.control_timeout(),
        }
    }

    /// `POST path` with a JSON body; the text of a 2xx answer.
    pub(super) fn post_text(&self, path: &str, body: &Value, d: Deadline) -> Result<String> {
        let client = self.client()?;
        client
            .post(path, body, self.timeout(d))
            .map_err(|e| self.call_error(e, &format!("POST {path}")))
    }

    /// `POST path` with a JSON body; the JSON of a 2xx answer.
    pub(super) fn post_json(&self, path: &str, body: &Value, d: Deadline) -> Result<Value> {
        let text = self.post_text(path, body, d)?;
        parse(&text, &format!("POST {path}"))
    }

    /// `GET path`; the text of a 2xx answer (raw [`CallError`] for the caller to classify).
    pub(super) fn get_raw(&self, path: &str) -> Result<std::result::Result<String, CallError>> {
        let client = self.client()?;
        Ok(client.get(path, self.opts.control_timeout()))
    }

    /// `GET path`; the JSON of a 2xx answer.
    pub(super) fn get_json(&self, path: &str) -> Result<Value> {
        let text = self
            .get_raw(path)?
            .map_err(|e| self.call_error(e, &format!("GET {path}")))?;
        parse(&text, &format!("GET {path}"))
    }

    /// The version `/model_info` reports.
    pub(super) fn served_version(&self) -> Result<u64> {
        response::model_info_version(&self.get_json("/model_info")?)
    }

    /// `/update_weight_version`: labels the served weights with `version` (adapter updates,
    /// which do not move SGLang's label themselves).
    pub(super) fn label_version(&self, version: u64) -> Result<()> {
        let v = self.post_json(
            "/update_weight_version",
            &json!({ "new_version": version.to_string(), "abort_all_requests": false }),
            Deadline::Control,
        )?;
        response::success(&v, "POST /update_weight_version")
    }
}

fn parse(text: &str, route: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        unexpected(
            route,
            &format!(
                "not JSON ({e}): {}",
                text.chars().take(200).collect::<String>()
            ),
        )
    })
}

/// `GET path` on `client` (before the server is in the slot); the JSON of a 2xx answer.
fn get_value(client: &Client, path: &str, timeout: Duration) -> Result<Value> {
    let what = format!("GET {path}");
    let text = client.get(path, timeout).map_err(|e| e.to_plugin(&what))?;
    parse(&text, &what)
}
