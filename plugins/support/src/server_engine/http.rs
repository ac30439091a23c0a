//! Blocking JSON-over-HTTP calls to one inference server: a timeout on every call (a request
//! sent to a sleeping or paused server may wait forever), the bearer token when one is
//! configured, errors that quote the server's own message on one line, and the optional
//! request trace (one JSON line per exchange).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tandem_plugin_api::{ErrorCode, PluginError};

use super::Dialect;
use crate::quote::error_message;

/// Where exchanges are traced: one JSON object per line
/// (`{"method","path","query","status","request","response"}`).
#[derive(Clone)]
pub struct Trace(Arc<Mutex<File>>);

impl Trace {
    /// Opens (appends to) the trace file.
    pub fn open(path: &str) -> std::io::Result<Trace> {
        if let Some(dir) = std::path::Path::new(path).parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)?;
        }
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Trace(Arc::new(Mutex::new(f))))
    }

    fn record(
        &self,
        method: &str,
        path: &str,
        status: Option<u16>,
        req: Option<&Value>,
        resp: &str,
    ) {
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Value::String(q.to_owned())),
            None => (path, Value::Null),
        };
        let response = serde_json::from_str::<Value>(resp).unwrap_or(Value::Null);
        let line = json!({
            "method": method,
            "path": path,
            "query": query,
            "status": status,
            "request": req.cloned().unwrap_or(Value::Null),
            "response": response,
        });
        let mut f = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(f, "{line}");
    }
}

/// A client of one server.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    api_key: Option<String>,
    trace: Option<Trace>,
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
}

impl CallError {
    /// The ABI error for a call to `what` (`POST /generate`) of a `dialect` server, naming
    /// the server's own message and how to fix it.
    pub fn to_plugin(&self, dialect: &Dialect, what: &str) -> PluginError {
        let component = dialect.component;
        match self {
            CallError::Connect(m) => PluginError::new(
                ErrorCode::Unavailable,
                format!("engine `{component}`: {what}: cannot reach the server: {m}"),
            )
            .with_help(format!(
                "check that the {} server is running (its log), then restart the engine",
                dialect.display
            )),
            CallError::Timeout(d) => PluginError::new(
                ErrorCode::Timeout,
                format!(
                    "engine `{component}`: {what}: no answer within {} s",
                    d.as_secs_f64()
                ),
            )
            .with_help(format!(
                "raise request_timeout_s / control_timeout_s, or read the server log (a paused \
                 or sleeping {} holds requests)",
                dialect.display
            )),
            CallError::Status(code, m) => {
                let ec = match code {
                    400 | 404 | 422 => ErrorCode::InvalidInput,
                    401 | 403 => ErrorCode::InvalidInput,
                    503 => dialect.status_503,
                    _ => ErrorCode::Runtime,
                };
                let help: String = match code {
                    401 | 403 => "set api_key in [engine] options to the server's --api-key".into(),
                    404 => format!("the server lacks this route: is it {}?", dialect.server),
                    503 => "the server is starting, shutting down, paused or unhealthy: read its \
                            log"
                    .into(),
                    _ => "read the server's message and log".into(),
                };
                PluginError::new(
                    ec,
                    format!("engine `{component}`: {what}: server answered {code}: {m}"),
                )
                .with_help(help)
            }
        }
    }
}

impl Client {
    /// A client of `base` (`http://host:port`, a trailing `/` is dropped).
    pub fn new(base: &str, api_key: Option<String>, trace: Option<Trace>) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .max_idle_connections(0)
            .build();
        Client {
            base: base.trim_end_matches('/').to_owned(),
            agent: config.into(),
            api_key,
            trace,
        }
    }

    /// `http://host:port` (an IPv6 host in brackets).
    pub fn base_of(host: &str, port: u16) -> String {
        if host.contains(':') {
            format!("http://[{host}]:{port}")
        } else {
            format!("http://{host}:{port}")
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path` → body text of a 2xx answer.
    pub fn get(&self, path: &str, timeout: Duration) -> Result<String, CallError> {
        self.call("GET", path, None, timeout)
    }

    /// `GET path` → the JSON of a 2xx answer (before the server is in the engine's slot).
    pub fn get_json(
        &self,
        dialect: &Dialect,
        path: &str,
        timeout: Duration,
    ) -> tandem_plugin_api::sdk::Result<Value> {
        let what = format!("GET {path}");
        let text = self
            .get(path, timeout)
            .map_err(|e| e.to_plugin(dialect, &what))?;
        parse(dialect, &text, &what)
    }

    /// `POST path` with a JSON body (`None`: an empty body) → body text of a 2xx answer.
    pub fn post(
        &self,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<String, CallError> {
        self.call("POST", path, body, timeout)
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<String, CallError> {
        let url = format!("{}{path}", self.base);
        let auth = self.api_key.as_ref().map(|k| format!("Bearer {k}"));
        let res = if method == "GET" {
            let mut req = self
                .agent
                .get(&url)
                .config()
                .timeout_global(Some(timeout))
                .build();
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            req.call()
        } else {
            let mut req = self
                .agent
                .post(&url)
                .config()
                .timeout_global(Some(timeout))
                .build();
            if let Some(a) = &auth {
                req = req.header("authorization", a);
            }
            match body {
                Some(v) => req
                    .header("content-type", "application/json")
                    .send(v.to_string().as_bytes()),
                None => req.send_empty(),
            }
        };
        let out = finish(res, timeout);
        if let Some(t) = &self.trace {
            match &out {
                Ok((status, text)) => t.record(method, path, Some(*status), body, text),
                Err(_) => t.record(method, path, None, body, ""),
            }
        }
        let (status, text) = out?;
        if (200..300).contains(&status) {
            Ok(text)
        } else {
            Err(CallError::Status(status, error_message(&text)))
        }
    }
}

/// The JSON of an answer of `route`, or the dialect's "unexpected answer: not JSON" error.
pub fn parse(dialect: &Dialect, text: &str, route: &str) -> tandem_plugin_api::sdk::Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        dialect.unexpected(
            route,
            &format!(
                "not JSON ({e}): {}",
                text.chars().take(200).collect::<String>()
            ),
        )
    })
}

fn finish(
    res: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    timeout: Duration,
) -> Result<(u16, String), CallError> {
    let mut resp = res.map_err(|e| classify(e, timeout))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .map_err(|e| classify(e, timeout))?;
    Ok((status, text))
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

    const DIALECT: Dialect = Dialect::new("x", "X", "X 1.0");

    #[test]
    fn a_status_maps_to_a_code_and_a_fix() {
        let e = CallError::Status(401, "unauthorized".into()).to_plugin(&DIALECT, "POST /generate");
        assert_eq!(e.code, ErrorCode::InvalidInput);
        assert!(
            e.message
                .contains("engine `x`: POST /generate: server answered 401"),
            "{e}"
        );
        assert!(e.help.contains("api_key"), "{e}");
        let e = CallError::Status(503, "paused".into()).to_plugin(&DIALECT, "POST /generate");
        assert_eq!(e.code, ErrorCode::Unavailable);
        let e = CallError::Timeout(Duration::from_secs(2)).to_plugin(&DIALECT, "POST /generate");
        assert_eq!(e.code, ErrorCode::Timeout);
        assert!(e.help.contains("paused or sleeping X"), "{e}");
        let e = CallError::Status(404, "no".into()).to_plugin(&DIALECT, "GET /x");
        assert!(e.help.contains("is it X 1.0?"), "{e}");
        let e = CallError::Connect("refused".into()).to_plugin(&DIALECT, "GET /health");
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(e.help.contains("X server is running"), "{e}");
    }

    #[test]
    fn an_ipv6_host_is_bracketed() {
        assert_eq!(Client::base_of("::1", 80), "http://[::1]:80");
        assert_eq!(Client::base_of("127.0.0.1", 80), "http://127.0.0.1:80");
        assert_eq!(Client::new("http://h:1/", None, None).base(), "http://h:1");
    }
}
