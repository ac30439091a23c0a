//! The server side of the engine: the server slot (started on first use, relaunched by a
//! restart) and HTTP calls with their timeouts, a dead server's error carrying its log tail.

use std::path::Path;

use serde_json::{Value, json};
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, LogLevel, PluginError};

use super::{VllmEngine, lock};
use crate::http::{CallError, Client};
use crate::server::Server;

impl VllmEngine {
    fn log(&self, level: LogLevel, msg: &str) {
        self.host.log(level, "vllm".into(), msg.into());
    }

    /// Starts the server if it is not running; returns its client (or the dead server's
    /// error with the log tail).
    pub(super) fn client(&self) -> Result<Client> {
        let mut slot = lock(&self.server);
        if let Some(s) = slot.as_ref() {
            if let Some(e) = s.dead_error() {
                return Err(e);
            }
            return Ok(s.client.clone());
        }
        let dir = lock(&self.state).served_dir.clone();
        let server = self.launch(&dir)?;
        let client = server.client.clone();
        *slot = Some(server);
        drop(slot);
        let version = lock(&self.state).version;
        self.report_version(&client, version)?;
        Ok(client)
    }

    pub(super) fn launch(&self, dir: &Path) -> Result<Server> {
        self.log(
            LogLevel::Info,
            &format!(
                "starting vLLM for rank {} on {} (log {})",
                self.rank,
                dir.display(),
                self.log.display()
            ),
        );
        let server = Server::launch(&self.opts, dir, &self.tokenizer, self.rank, &self.log)?;
        self.log(
            LogLevel::Info,
            &format!(
                "vLLM rank {} healthy at {} after {:.1} s (pid {})",
                self.rank,
                server.client.base(),
                server.startup_s,
                server.pid
            ),
        );
        lock(&self.state).set_metric("startup_s", server.startup_s);
        Ok(server)
    }

    /// Maps a failed call: a dead server becomes its own error with the log tail.
    pub(super) fn call_error(&self, e: CallError, what: &str) -> PluginError {
        if matches!(e, CallError::Connect(_)) {
            // Give the supervisor a moment to record the exit.
            std::thread::sleep(std::time::Duration::from_millis(300));
            if let Some(dead) = lock(&self.server).as_ref().and_then(Server::dead_error) {
                return dead;
            }
        }
        e.to_plugin(what)
    }

    pub(super) fn post(&self, path: &str, body: Option<&Value>, control: bool) -> Result<String> {
        let client = self.client()?;
        let timeout = if control {
            self.opts.control_timeout()
        } else {
            self.opts.request_timeout()
        };
        client
            .post(path, body, timeout)
            .map_err(|e| self.call_error(e, &format!("POST {path}")))
    }

    pub(super) fn post_json(&self, path: &str, body: &Value, control: bool) -> Result<Value> {
        let text = self.post(path, Some(body), control)?;
        serde_json::from_str(&text).map_err(|e| {
            PluginError::runtime(format!(
                "engine `vllm`: POST {path}: answer is not JSON ({e}): {}",
                text.chars().take(200).collect::<String>()
            ))
        })
    }

    pub(super) fn report_version(&self, client: &Client, version: u64) -> Result<()> {
        client
            .post(
                "/update_weight_version",
                Some(&json!({ "new_version": version.to_string() })),
                self.opts.control_timeout(),
            )
            .map_err(|e| self.call_error(e, "POST /update_weight_version"))?;
        Ok(())
    }

    /// `/reset_prefix_cache`.
    pub(super) fn flush_prefix_cache(&self) -> Result<()> {
        let v = self.post_json("/reset_prefix_cache", &json!({}), true);
        // Older servers answer an empty body; a JSON answer must say success.
        match v {
            Ok(v) if v.get("success") == Some(&Value::Bool(false)) => Err(PluginError::new(
                ErrorCode::InvalidState,
                "engine `vllm`: /reset_prefix_cache refused (requests still running)",
            )
            .with_help("pause the engine before flushing its cache")),
            Ok(_) => Ok(()),
            Err(e) if e.code == ErrorCode::Runtime && e.message.contains("not JSON") => Ok(()),
            Err(e) => Err(e),
        }
    }
}
