//! The server side of the engine: the server slot (started or attached on first use,
//! replaced by a restart) and the HTTP calls with their deadlines; a launched server found
//! dead becomes one error with its log tail.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tandem_plugin_api::LogLevel;
use tandem_plugin_api::PluginError;
use tandem_plugin_api::sdk::Result;

use super::engine::{ServerEngine, lock};
use super::http::parse;
use super::{Backend, CallError, Client, Deadline, Server};

impl<B: Backend> ServerEngine<B> {
    /// Starts (or attaches to) the server if that has not happened; returns its client, or
    /// the dead server's error with the log tail.
    pub fn client(&self) -> Result<Client> {
        let mut slot = lock(&self.server);
        if let Some(s) = slot.as_ref() {
            if let Some(e) = s.dead_error(B::DIALECT) {
                return Err(e);
            }
            return Ok(s.client.clone());
        }
        let server = self.backend.start(self)?;
        self.started(&server);
        let client = server.client.clone();
        *slot = Some(server);
        drop(slot);
        self.backend.started(self, &client)?;
        Ok(client)
    }

    /// Logs that a server is being launched on `dir` (the backend calls it before
    /// [`Server::launch`]).
    pub fn launching(&self, dir: &Path) {
        self.log(
            LogLevel::Info,
            &format!(
                "starting {} for rank {} on {} (log {})",
                B::DIALECT.display,
                self.rank,
                dir.display(),
                self.log.display()
            ),
        );
    }

    fn started(&self, server: &Server) {
        let pid = server
            .pid()
            .map(|p| format!(" (pid {p})"))
            .unwrap_or_default();
        self.log(
            LogLevel::Info,
            &format!(
                "{} rank {} healthy at {} after {:.1} s{pid}",
                B::DIALECT.display,
                self.rank,
                server.client.base(),
                server.startup_s
            ),
        );
        lock(&self.state).set_metric("startup_s", server.startup_s);
    }

    /// Stops the running server and puts the one `start` returns in its place (a restart on
    /// another checkpoint); the new server has no adapters loaded.
    pub fn replace_server(&self, start: impl FnOnce() -> Result<Server>) -> Result<()> {
        let mut slot = lock(&self.server);
        if let Some(mut old) = slot.take() {
            old.stop();
        }
        let server = start()?;
        self.started(&server);
        *slot = Some(server);
        let mut st = lock(&self.state);
        st.adapters.clear();
        st.active_adapter = None;
        Ok(())
    }

    /// Maps a failed call: a dead launched server becomes its own error with the log tail.
    pub fn call_error(&self, e: CallError, what: &str) -> PluginError {
        let dialect = B::DIALECT;
        if matches!(e, CallError::Connect(_)) {
            // Give the supervisor a moment to record the exit.
            std::thread::sleep(Duration::from_millis(300));
            if let Some(dead) = lock(&self.server)
                .as_ref()
                .and_then(|s| s.dead_error(dialect))
            {
                return dead;
            }
        }
        e.to_plugin(dialect, what)
    }

    /// `POST path` with a JSON body (`None`: empty); the text of a 2xx answer.
    pub fn post(&self, path: &str, body: Option<&Value>, d: Deadline) -> Result<String> {
        let client = self.client()?;
        client
            .post(path, body, self.timeout(d))
            .map_err(|e| self.call_error(e, &format!("POST {path}")))
    }

    /// `POST path` with a JSON body; the JSON of a 2xx answer.
    pub fn post_json(&self, path: &str, body: &Value, d: Deadline) -> Result<Value> {
        let text = self.post(path, Some(body), d)?;
        parse(B::DIALECT, &text, &format!("POST {path}"))
    }

    /// `GET path` with the control deadline; the text of a 2xx answer, or the raw
    /// [`CallError`] for the caller to classify.
    pub fn get(&self, path: &str) -> Result<std::result::Result<String, CallError>> {
        let client = self.client()?;
        Ok(client.get(path, self.timeout(Deadline::Control)))
    }

    /// `GET path`; the JSON of a 2xx answer.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        let text = self
            .get(path)?
            .map_err(|e| self.call_error(e, &format!("GET {path}")))?;
        parse(B::DIALECT, &text, &format!("GET {path}"))
    }
}
