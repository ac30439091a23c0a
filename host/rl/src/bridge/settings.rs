//! `[bridge] mode` and `[bridge.options]` read without side effects: what `tandem check`
//! (config validation) and [`BridgeDriver::new`](super::BridgeDriver::new) both run, so the
//! driver never refuses a job the check let through.

use crate::error::RlError;
use tandem_plugin_api::BridgeMode;

/// `[bridge] mode` and `[bridge.options]` as the sync driver runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgeSettings {
    /// `ipc`, `lora` or `checkpoint` (`broadcast` is refused).
    pub mode: BridgeMode,
    /// Checkpoint syncs restart the engines (`restart`, default true) or reload in place.
    pub restart: bool,
}

/// A problem of the `[bridge]` table, keyed relative to it (`mode`, `options.restart`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeProblem {
    /// `mode` or `options.KEY`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: String,
}

impl BridgeProblem {
    fn new(key: impl Into<String>, message: impl Into<String>, help: &str) -> BridgeProblem {
        BridgeProblem {
            key: key.into(),
            message: message.into(),
            help: help.to_owned(),
        }
    }

    /// The problem's line without its help: `bridge.KEY: message`.
    pub fn message_line(&self) -> String {
        format!("bridge.{}: {}", self.key, self.message)
    }
}

impl std::fmt::Display for BridgeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = tandem_runtime::error::render(&self.message_line(), Some(&self.help));
        f.write_str(&line)
    }
}

const MODES_HELP: &str = "use `ipc`, `lora` or `checkpoint`";

/// Parses `[bridge] mode` and `[bridge.options]`; every problem is returned.
pub fn parse_settings(
    mode: &str,
    options: &toml::Table,
) -> Result<BridgeSettings, Vec<BridgeProblem>> {
    let m = match BridgeMode::parse(mode) {
        Some(m @ (BridgeMode::Ipc | BridgeMode::Lora | BridgeMode::Checkpoint)) => m,
        Some(BridgeMode::Broadcast) => {
            return Err(vec![BridgeProblem::new(
                "mode",
                "bridge mode `broadcast` is not implemented by the sync driver yet",
                MODES_HELP,
            )]);
        }
        None => {
            return Err(vec![BridgeProblem::new(
                "mode",
                format!("unknown bridge mode `{mode}`"),
                MODES_HELP,
            )]);
        }
    };
    let mut restart = true;
    let mut problems = Vec::new();
    for (k, v) in options {
        match (k.as_str(), m, v) {
            ("restart", BridgeMode::Checkpoint, toml::Value::Boolean(b)) => restart = *b,
            ("restart", BridgeMode::Checkpoint, other) => problems.push(BridgeProblem::new(
                format!("options.{k}"),
                format!("must be true or false, not `{other}`"),
                "restart = true starts each engine anew on the checkpoint, false reloads it in \
                 place",
            )),
            _ => problems.push(BridgeProblem::new(
                format!("options.{k}"),
                format!("`{k}` is not an option of bridge mode `{mode}`"),
                "the checkpoint mode takes `restart = true|false`; ipc and lora take none",
            )),
        }
    }
    if problems.is_empty() {
        Ok(BridgeSettings { mode: m, restart })
    } else {
        Err(problems)
    }
}

/// The problems as one error: a line each, the last one's help as the error's help (the
/// edge renders it on that line, like the lines before it carry theirs).
pub(super) fn problems_error(problems: &[BridgeProblem]) -> RlError {
    let Some((last, before)) = problems.split_last() else {
        return RlError::usage("bridge: invalid settings");
    };
    let mut lines: Vec<String> = before.iter().map(ToString::to_string).collect();
    lines.push(last.message_line());
    RlError::usage(lines.join("\n")).with_help(last.help.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_a_line_with_its_help() {
        let options: toml::Table = toml::from_str("a = 1\nb = 2").unwrap_or_default();
        let problems = parse_settings("ipc", &options).err().unwrap_or_default();
        assert_eq!(problems.len(), 2, "{problems:?}");
        let e = problems_error(&problems);
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        // The first line carries its help; the last one's is the error's (the edge renders it).
        assert_eq!(lines[0], problems[0].to_string());
        assert_eq!(lines[1], problems[1].message_line());
        assert_eq!(e.help().as_deref(), Some(problems[1].help.as_str()));
        let first = &problems[0];
        let rendered = tandem_runtime::error::render(&first.message_line(), Some(&first.help));
        assert_eq!(lines[0], rendered);
    }
}
