//! Attach mode: the running server at `urls[rank]` (or `url`), its served version read from
//! `/model_info`, its flags checked against the options, and the job's model loaded into it
//! when it serves another.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tandem_plugin_api::lifecycle::EngineMachine;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{LogLevel, PluginError};
use tandem_plugin_support::server_engine::http::parse;
use tandem_plugin_support::server_engine::{Client, Deadline, Server};

use super::{DIALECT, Sglang, SglangEngine};
use crate::response;

impl Sglang {
    pub(super) fn attach(&self, engine: &SglangEngine, url: &str) -> Result<Server> {
        let server = Server::attach(
            &DIALECT,
            url,
            self.opts.api_key.clone(),
            self.opts.trace()?,
            self.health_wait(),
        )?;
        let control = engine.timeout(Deadline::Control);
        let info = server.client.get_json(&DIALECT, "/model_info", control)?;
        let version = response::model_info_version(&info)?;
        self.check_server_flags(&server.client, control)?;
        self.load_job_model(engine, &server.client, &info, version)?;
        let mut st = engine.state();
        st.machine = EngineMachine::new(version);
        st.version = version;
        Ok(server)
    }

    /// An attached server must have been started with the features the options declare.
    fn check_server_flags(&self, client: &Client, control: Duration) -> Result<()> {
        let info = client.get_json(&DIALECT, "/server_info", control)?;
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
    fn load_job_model(
        &self,
        engine: &SglangEngine,
        client: &Client,
        info: &Value,
        version: u64,
    ) -> Result<()> {
        let job = engine.state().served_dir.clone();
        let served = info.get("model_path").and_then(Value::as_str).unwrap_or("");
        let same = match (Path::new(served).canonicalize(), job.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => Path::new(served) == job,
        };
        if job.as_os_str().is_empty() || same {
            return Ok(());
        }
        engine.log(
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
                Some(&body),
                engine.timeout(Deadline::Control),
            )
            .map_err(|e| e.to_plugin(&DIALECT, what))
            .and_then(|text| response::success(&parse(&DIALECT, &text, what)?, what))
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
}
