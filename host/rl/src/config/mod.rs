//! Job files: the TOML schema (`serde`, `deny_unknown_fields`), parsing with file:line:column
//! and key-path errors, and validation against the plugin registry before anything starts.

mod launcher;
mod plan;
mod schema;
mod validate;

pub use launcher::*;
pub use plan::{
    BridgeSetup, CapsSource, ComponentCaps, DrafterJobPlan, DrafterPlan, EnvPlan, EvalPlan,
    JobRecord, LauncherPlan, ModelPlan, Overrides, PlacementPlan, RankPlan, RlDrafterPlan,
    RolePlan, RunPlan, TransportPlan, device_of, options_json,
};
pub use schema::*;
pub use validate::{validate, validate_task_and_eval, validate_with};

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::de::{DeTable, DeValue};

/// One problem in a job file, printed as one line: `file:line:col: key.path: message`, then
/// its help (rendered the way every error renders its help).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigIssue {
    /// The job file.
    pub file: PathBuf,
    /// Dotted key path, e.g. `placement.train_frac` (empty for whole-file problems).
    pub key: String,
    /// 1-based line and column, where known.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
    /// How to fix it (may be empty).
    pub help: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.position {
            write!(f, ":{line}:{col}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        let help = Some(self.help.as_str()).filter(|h| !h.is_empty());
        let message = tandem_runtime::error::render(&self.message, help);
        write!(f, ": {message}")
    }
}

/// Errors of loading a job file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read job file: {source}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// One or more problems in the file; each is one line.
    #[error("{}", issues.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// The problems, in file order where possible.
        issues: Vec<ConfigIssue>,
    },
}

impl ConfigError {
    /// How to fix it, when it is one problem (each of several issues carries its own).
    pub fn help(&self) -> Option<String> {
        match self {
            ConfigError::Read { .. } => Some("check the path".to_owned()),
            ConfigError::Invalid { .. } => None,
        }
    }
}

/// A parsed job file plus where it came from (for error positions and relative paths).
#[derive(Debug, Clone)]
pub struct LoadedJob {
    /// The path it was read from.
    pub path: PathBuf,
    /// Its text.
    pub source: String,
    /// The parsed job.
    pub job: JobFile,
}

impl LoadedJob {
    /// Reads and parses a job file (syntax, unknown keys and types; no cross-checks).
    pub fn read(path: &Path) -> Result<LoadedJob, ConfigError> {
        let source = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, source)
    }

    /// Parses job-file text; `path` is used for messages and relative paths.
    pub fn parse(path: &Path, source: String) -> Result<LoadedJob, ConfigError> {
        let issue =
            |key: String, span: Option<std::ops::Range<usize>>, message: String| ConfigIssue {
                file: path.to_path_buf(),
                key,
                position: span.map(|s| line_col(&source, s.start)),
                message,
                help: "see examples/quickstart.toml for the schema".into(),
            };
        let de = toml::de::Deserializer::parse(&source).map_err(|e| ConfigError::Invalid {
            issues: vec![issue(String::new(), e.span(), one_line(e.message()))],
        })?;
        match serde_path_to_error::deserialize::<_, JobFile>(de) {
            Ok(job) => Ok(LoadedJob {
                path: path.to_path_buf(),
                source: source.clone(),
                job,
            }),
            Err(e) => {
                let key = e.path().to_string();
                let key = if key == "." { String::new() } else { key };
                let inner = e.into_inner();
                Err(ConfigError::Invalid {
                    issues: vec![issue(key, inner.span(), one_line(inner.message()))],
                })
            }
        }
    }

    /// 1-based line and column of a byte offset in the source.
    pub fn position(&self, offset: usize) -> (usize, usize) {
        line_col(&self.source, offset)
    }

    /// Byte span of a dotted key path in the source (`engine.options.max_batch`,
    /// `trainer.options.lora.targets[1]`): the key itself, or an array element's value. When
    /// the path is not all in the file (a defaulted or missing key), the span of its longest
    /// prefix that is; `None` when not even its first key is.
    pub fn span_of(&self, key_path: &str) -> Option<Range<usize>> {
        let doc = DeTable::parse(&self.source).ok()?;
        let mut best = None;
        let mut current: Option<&toml::Spanned<DeValue<'_>>> = None;
        for segment in key_segments(key_path) {
            let next = match segment {
                KeySegment::Key(name) => {
                    let table = match current {
                        None => doc.get_ref(),
                        Some(v) => match v.get_ref().as_table() {
                            Some(t) => t,
                            None => break,
                        },
                    };
                    table
                        .iter()
                        .find(|(k, _)| k.get_ref() == name)
                        .map(|(k, v)| (k.span(), v))
                }
                KeySegment::Index(i) => current
                    .and_then(|v| v.get_ref().as_array())
                    .and_then(|a| a.get(i))
                    .map(|v| (v.span(), v)),
            };
            let Some((span, value)) = next else { break };
            best = Some(span);
            current = Some(value);
        }
        best
    }

    /// Resolves a path from the job file relative to the job file's directory.
    pub fn resolve_path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.path.parent().unwrap_or_else(|| Path::new(".")).join(p)
        }
    }
}

/// One step of a dotted key path.
enum KeySegment<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[2].c` → `a`, `b`, `[2]`, `c` (keys containing `.` or `[` are not supported).
fn key_segments(path: &str) -> Vec<KeySegment<'_>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(KeySegment::Key(key));
        }
        while let Some((index, after)) = rest.split_once(']') {
            if let Ok(i) = index.parse() {
                out.push(KeySegment::Index(i));
            }
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..offset.min(source.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, col)
}
