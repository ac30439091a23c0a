//! `[logging]` of a job file: what it may say ([`LoggingSection`]), what `tandem check`
//! refuses ([`LoggingSection::problems`]) and the resolved [`TrackPlan`] a run tracks with.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[logging]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingSection {
    /// TensorBoard event files: `true` (in `<run dir>/tensorboard`) or a directory.
    pub tensorboard: TensorboardSetting,
    /// The Python that runs the W&B sidecar (default: `$TANDEM_TRACK_PYTHON`, else the one
    /// `scripts/setup-track.sh` recorded, else `python3`).
    pub python: Option<PathBuf>,
    /// `[logging.wandb]`.
    pub wandb: Option<WandbSection>,
    /// `[logging.mlflow]`.
    pub mlflow: Option<MlflowSection>,
}

/// `tensorboard = true | false | "DIR"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum TensorboardSetting {
    /// On (in `<run dir>/tensorboard`) or off.
    On(bool),
    /// On, in this directory (relative to the job file).
    Dir(PathBuf),
}

impl Default for TensorboardSetting {
    fn default() -> Self {
        TensorboardSetting::On(false)
    }
}

/// `[logging.wandb]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WandbSection {
    /// W&B project.
    pub project: String,
    /// W&B entity (user or team; default: the account's).
    pub entity: Option<String>,
    /// Run group.
    pub group: Option<String>,
    /// Run name (default: `[run] name`).
    pub name: Option<String>,
    /// `online` or `offline` (offline runs land where `wandb sync` finds them).
    pub mode: WandbMode,
}

impl Default for WandbSection {
    fn default() -> Self {
        WandbSection {
            project: "tandem".to_string(),
            entity: None,
            group: None,
            name: None,
            mode: WandbMode::Online,
        }
    }
}

/// Where W&B data goes.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WandbMode {
    /// To the W&B server as the run goes.
    Online,
    /// To `<run dir>/wandb/` only, for `wandb sync`.
    Offline,
}

impl WandbMode {
    /// The name `wandb.init(mode=...)` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            WandbMode::Online => "online",
            WandbMode::Offline => "offline",
        }
    }
}

/// `[logging.mlflow]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MlflowSection {
    /// The MLflow tracking server, `http://` or `https://`.
    pub tracking_uri: String,
    /// Experiment name (created when missing).
    pub experiment: String,
}

impl Default for MlflowSection {
    fn default() -> Self {
        MlflowSection {
            tracking_uri: String::new(),
            experiment: "tandem".to_string(),
        }
    }
}

/// The trackers of a run, resolved.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TrackPlan {
    /// Directory of the TensorBoard event files.
    pub tensorboard: Option<PathBuf>,
    /// Weights & Biases.
    pub wandb: Option<WandbPlan>,
    /// MLflow.
    pub mlflow: Option<MlflowPlan>,
}

impl TrackPlan {
    /// Whether no tracker is on.
    pub fn is_empty(&self) -> bool {
        self.tensorboard.is_none() && self.wandb.is_none() && self.mlflow.is_none()
    }
}

/// W&B, resolved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WandbPlan {
    /// `[logging.wandb]`.
    #[serde(flatten)]
    pub section: WandbSection,
    /// The sidecar's Python.
    pub python: PathBuf,
}

/// MLflow, resolved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MlflowPlan {
    /// The server, without a trailing `/`.
    pub tracking_uri: String,
    /// Experiment name.
    pub experiment: String,
}

/// A problem of `[logging]`: the key, what is wrong, how to fix it.
pub type Problem = (String, String, String);

impl LoggingSection {
    /// The plan: `run_dir` is where a `tensorboard = true` writes, `base` where a relative
    /// directory resolves (the job file's directory).
    pub fn plan(&self, run_dir: &Path, base: &Path) -> TrackPlan {
        let tensorboard = match &self.tensorboard {
            TensorboardSetting::On(false) => None,
            TensorboardSetting::On(true) => Some(run_dir.join("tensorboard")),
            TensorboardSetting::Dir(d) => Some(base.join(d)),
        };
        TrackPlan {
            tensorboard,
            wandb: self.wandb.as_ref().map(|w| WandbPlan {
                section: w.clone(),
                python: track_python(self.python.as_deref()),
            }),
            mlflow: self.mlflow.as_ref().map(|m| MlflowPlan {
                tracking_uri: m.tracking_uri.trim_end_matches('/').to_string(),
                experiment: m.experiment.clone(),
            }),
        }
    }

    /// What `tandem check` refuses, one line each: an MLflow URI that is not an HTTP(S)
    /// server, an empty name, a sidecar Python without the `wandb` package.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if let TensorboardSetting::Dir(d) = &self.tensorboard
            && d.as_os_str().is_empty()
        {
            out.push((
                "logging.tensorboard".into(),
                "is an empty directory".into(),
                "write true (event files in the run directory) or a directory".into(),
            ));
        }
        if let Some(m) = &self.mlflow {
            if let Some(p) = uri_problem(&m.tracking_uri) {
                out.push(("logging.mlflow.tracking_uri".into(), p.0, p.1));
            }
            if m.experiment.trim().is_empty() {
                out.push((
                    "logging.mlflow.experiment".into(),
                    "is empty".into(),
                    "name the MLflow experiment, e.g. \"tandem\"".into(),
                ));
            }
        }
        if let Some(w) = &self.wandb {
            if w.project.trim().is_empty() {
                out.push((
                    "logging.wandb.project".into(),
                    "is empty".into(),
                    "name the W&B project, e.g. \"tandem\"".into(),
                ));
            }
            let python = track_python(self.python.as_deref());
            if let Err(e) = crate::wandb::check_python(&python) {
                let key = if self.python.is_some() {
                    "logging.python"
                } else {
                    "logging.wandb"
                };
                out.push((key.into(), e, crate::wandb::INSTALL_HELP.into()));
            }
        }
        out
    }
}

/// Why `uri` is not an MLflow server address: `(what, help)`.
fn uri_problem(uri: &str) -> Option<(String, String)> {
    let help = "give the http:// or https:// address of an MLflow tracking server \
                (`mlflow server`), e.g. \"http://127.0.0.1:5000\"";
    if uri.is_empty() {
        return Some(("is missing".into(), help.into()));
    }
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Some((format!("'{uri}' is not a URI"), help.into()));
    };
    if scheme != "http" && scheme != "https" {
        return Some((
            format!("'{uri}': Tandem talks to MLflow over its REST API, not through '{scheme}://'"),
            help.into(),
        ));
    }
    if rest.split('/').next().is_none_or(str::is_empty) {
        return Some((format!("'{uri}' names no host"), help.into()));
    }
    None
}

/// The Python of the W&B sidecar: `configured`, else `$TANDEM_TRACK_PYTHON`, else the one
/// `scripts/setup-track.sh` recorded (`$TANDEM_VENV_ROOT` or `~/.cache/tandem`, file
/// `track-python`), else `python3`.
pub fn track_python(configured: Option<&Path>) -> PathBuf {
    if let Some(p) = configured {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("TANDEM_TRACK_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let root = std::env::var_os("TANDEM_VENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tandem")));
    if let Some(root) = root
        && let Ok(text) = std::fs::read_to_string(root.join("track-python"))
        && !text.trim().is_empty()
    {
        return PathBuf::from(text.trim());
    }
    PathBuf::from("python3")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_schemes_other_than_http_are_refused_with_the_scheme_named() {
        assert!(uri_problem("http://127.0.0.1:5000").is_none());
        assert!(uri_problem("https://mlflow.example.com/base").is_none());
        let (what, _) = uri_problem("file:///tmp/mlruns").unwrap_or_default();
        assert!(what.contains("'file://'"), "{what}");
        let (what, _) = uri_problem("databricks").unwrap_or_default();
        assert!(what.contains("not a URI"), "{what}");
        let (what, _) = uri_problem("http:///x").unwrap_or_default();
        assert!(what.contains("names no host"), "{what}");
    }

    #[test]
    fn the_plan_resolves_tensorboard_against_the_run_and_job_directories() {
        let on = LoggingSection {
            tensorboard: TensorboardSetting::On(true),
            ..LoggingSection::default()
        };
        let p = on.plan(Path::new("/runs/a"), Path::new("/jobs"));
        assert_eq!(p.tensorboard, Some(PathBuf::from("/runs/a/tensorboard")));
        let dir = LoggingSection {
            tensorboard: TensorboardSetting::Dir("tb".into()),
            ..LoggingSection::default()
        };
        let p = dir.plan(Path::new("/runs/a"), Path::new("/jobs"));
        assert_eq!(p.tensorboard, Some(PathBuf::from("/jobs/tb")));
        assert!(
            LoggingSection::default()
                .plan(Path::new("/r"), Path::new("/j"))
                .is_empty()
        );
    }
}
