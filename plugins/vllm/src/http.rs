//! Blocking JSON-over-HTTP calls to one vLLM server, every one with a timeout (a request sent
//! to a sleeping vLLM waits forever) and an error that carries the server's own message.

use std::time::Duration;

use serde_json::Value;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ErrorCode, PluginError};
use tandem_plugin_support::quote::error_message;

/// A client of one server (`http://host:port`).
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

/// What went wrong talking to the server.
#[derive(Debug)]
pub enum CallError {
    /// No connection (server not listening or gone).
    Connect(String),
    /// The deadline passed.
    Timeout(Duration),
    /// The server answered with an error status.
    Status(u16, String),
    /// The answer was not what the route documents.
    Body(String),
}

impl CallError {
    /// The ABI error for a call to `what`, naming the server's own message.
    pub fn to_plugin(&self, what: &str) -> PluginError {
        match self {
            CallError::Connect(m) => PluginError::new(
                ErrorCode::Unavailable,
                format!("engine `vllm`: {what}: cannot reach the server: {m}"),
            ),
            CallError::Timeout(d) => PluginError::new(
                ErrorCode::Timeout,
                format!(
                    "engine `vllm`: {what}: no answer within {} s",
                    d.as_secs_f64()
                ),
            )
            .with_help(
                "raise request_timeout_s / control_timeout_s, or check the server log (a \
                 sleeping or paused vLLM queues requests)",
            ),
            CallError::Status(code, m) => {
                let ec = match code {
                    400 | 404 | 422 => ErrorCode::InvalidInput,
                    503 => ErrorCode::InvalidState,
                    _ => ErrorCode::Runtime,
                };
                PluginError::new(
                    ec,
                    format!("engine `vllm`: {what}: server answered {code}: {m}"),
                )
            }
            CallError::Body(m) => {
                PluginError::runtime(format!("engine `vllm`: {what}: unexpected answer: {m}"))
            }
        }
    }
}

impl Client {
    /// A client of `http://{host}:{port}`.
    pub fn new(host: &str, port: u16) -> Client {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_idle_connections(0)
            .build();
        Client {
            base: format!("http://{host}:{port}"),
            agent: config.into(),
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path` → (status, body).
    pub fn get(&self, path: &str, timeout: Duration) -> std::result::Result<String, CallError> {
        let url = format!("{}{path}", self.base);
        let res = self
            .agent
            .get(&url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call();
        self.finish(res, timeout)
    }

    /// `POST path` with a JSON body (`None`: empty body) → body text.
    pub fn post(
        &self,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> std::result::Result<String, CallError> {
        let url = format!("{}{path}", self.base);
        let req = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(timeout))
            .build();
        let res = match body {
            Some(v) => req
                .header("content-type", "application/json")
                .send(v.to_string().as_bytes()),
            None => req.send_empty(),
        };
        self.finish(res, timeout)
    }

    /// `POST path` with a JSON body, parsing a JSON answer.
    pub fn post_json(&self, path: &str, body: &Value, timeout: Duration) -> Result<Value> {
        let text = self
            .post(path, Some(body), timeout)
            .map_err(|e| e.to_plugin(&format!("POST {path}")))?;
        serde_json::from_str(&text).map_err(|e| {
            CallError::Body(format!("{e}: {}", error_message(&text)))
                .to_plugin(&format!("POST {path}"))
        })
    }

    fn finish(
        &self,
        res: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
        timeout: Duration,
    ) -> std::result::Result<String, CallError> {
        let mut resp = res.map_err(|e| classify(e, timeout))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .map_err(|e| classify(e, timeout))?;
        if (200..300).contains(&status) {
            Ok(text)
        } else {
            Err(CallError::Status(status, error_message(&text)))
        }
    }
}

fn classify(e: ureq::Error, timeout: Duration) -> CallError {
    match e {
        ureq::Error::Timeout(_) => CallError::Timeout(timeout),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            CallError::Timeout(timeout)
        }
        ureq::Error::Io(io) => CallError::Connect(io.to_string()),
        ureq::Error::ConnectionFailed => CallError::Connect("connection failed".into()),
        other => CallError::Connect(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_the_servers_own_message_on_one_line() {
        let b = r#"{"error": {"message": "LoRA adapter\n 'x' not found", "type": "NotFound"}}"#;
        assert_eq!(error_message(b), "LoRA adapter 'x' not found");
        assert_eq!(error_message(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message("plain text\n"), "plain text");
    }
}
