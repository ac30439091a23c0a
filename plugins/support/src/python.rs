//! Which Python interpreter a plugin drives (a vLLM server, a torchrun job).
//!
//! In order: the component's `python` option, else `$TANDEM_PYTHON`, else the interpreter
//! `scripts/setup-python.sh` recorded in its pointer file
//! `${TANDEM_VENV_ROOT:-$HOME/.cache/tandem}/python` (one line: the venv's python), used
//! only when that python exists. Otherwise one error naming all three, whose help is to run
//! `bash scripts/setup.sh`.
//!
//! [`resolve_python`] reads the process environment; [`resolve_python_from`] takes the
//! environment values as arguments, so it is a pure function of them and the file system.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Environment variable naming the interpreter.
pub const PYTHON_ENV: &str = "TANDEM_PYTHON";

/// Environment variable overriding the root of the venvs and of the pointer file
/// (default `$HOME/.cache/tandem`), as in `scripts/setup-python.sh`.
pub const VENV_ROOT_ENV: &str = "TANDEM_VENV_ROOT";

/// File name of the pointer file under the venv root.
pub const POINTER_FILE: &str = "python";

/// How to get an interpreter when none is found.
pub const SETUP_HELP: &str =
    "run `bash scripts/setup.sh`, which creates the venv and records its python";

/// Where the interpreter came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PythonSource {
    /// The component's `python` option.
    Option,
    /// `$TANDEM_PYTHON`.
    Env,
    /// The pointer file at this path.
    PointerFile(PathBuf),
}

impl fmt::Display for PythonSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PythonSource::Option => f.write_str("the `python` option"),
            PythonSource::Env => write!(f, "${PYTHON_ENV}"),
            PythonSource::PointerFile(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A resolved interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Python {
    /// The interpreter (as given: a bare name is looked up on `PATH` by the caller's spawn).
    pub path: PathBuf,
    /// Where it came from (for error messages: "Python `…` (from …)").
    pub source: PythonSource,
}

/// The environment values the resolution reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonEnv {
    /// `$TANDEM_PYTHON`.
    pub python: Option<OsString>,
    /// `$TANDEM_VENV_ROOT`.
    pub venv_root: Option<OsString>,
    /// `$HOME`.
    pub home: Option<OsString>,
}

impl PythonEnv {
    /// The values of this process's environment.
    pub fn from_process() -> PythonEnv {
        PythonEnv {
            python: std::env::var_os(PYTHON_ENV),
            venv_root: std::env::var_os(VENV_ROOT_ENV),
            home: std::env::var_os("HOME"),
        }
    }

    /// The pointer file: `$TANDEM_VENV_ROOT/python`, else `$HOME/.cache/tandem/python` (an
    /// empty variable counts as unset, like `${VAR:-default}` in the script); `None` when
    /// both are unset.
    pub fn pointer_file(&self) -> Option<PathBuf> {
        if let Some(root) = non_empty(&self.venv_root) {
            return Some(Path::new(root).join(POINTER_FILE));
        }
        non_empty(&self.home).map(|h| Path::new(h).join(".cache/tandem").join(POINTER_FILE))
    }
}

fn non_empty(v: &Option<OsString>) -> Option<&OsString> {
    v.as_ref().filter(|s| !s.is_empty())
}

/// What the pointer file had to say when it named no usable interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointerState {
    /// Neither `$TANDEM_VENV_ROOT` nor `$HOME` is set: no place to look.
    NoLocation,
    /// The file does not exist.
    Missing(PathBuf),
    /// The file exists but could not be read.
    Unreadable {
        /// The pointer file.
        file: PathBuf,
        /// The I/O error.
        error: String,
    },
    /// The file names no interpreter.
    Empty(PathBuf),
    /// The file names an interpreter that does not exist (the venv was removed).
    Stale {
        /// The pointer file.
        file: PathBuf,
        /// The interpreter it names.
        python: PathBuf,
    },
}

impl fmt::Display for PointerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointerState::NoLocation => write!(
                f,
                "no pointer file (neither ${VENV_ROOT_ENV} nor $HOME is set)"
            ),
            PointerState::Missing(p) => write!(f, "no pointer file {}", p.display()),
            PointerState::Unreadable { file, error } => {
                write!(f, "pointer file {} is unreadable ({error})", file.display())
            }
            PointerState::Empty(p) => write!(f, "pointer file {} is empty", p.display()),
            PointerState::Stale { file, python } => write!(
                f,
                "pointer file {} names {}, which does not exist",
                file.display(),
                python.display()
            ),
        }
    }
}

/// No interpreter was found. Displays as one line (what was looked at); [`PythonError::help`]
/// says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PythonError {
    /// None of the three places names a usable interpreter.
    #[error(
        "no Python environment: no `python` option, ${PYTHON_ENV} unset, {pointer} (scripts/setup-python.sh writes the pointer file)"
    )]
    NotFound {
        /// What the pointer file had to say.
        pointer: PointerState,
    },
}

impl PythonError {
    /// How to fix it: [`SETUP_HELP`].
    pub fn help(&self) -> &'static str {
        SETUP_HELP
    }
}

/// The interpreter for a component whose `python` option is `option`, reading
/// `$TANDEM_PYTHON`, `$TANDEM_VENV_ROOT` and `$HOME` from this process's environment.
pub fn resolve_python(option: Option<&Path>) -> Result<Python, PythonError> {
    resolve_python_from(option, &PythonEnv::from_process())
}

/// [`resolve_python`] with the environment values given: the option, else `env.python`
/// (non-empty), else the interpreter named by the pointer file if it exists, else an error.
pub fn resolve_python_from(option: Option<&Path>, env: &PythonEnv) -> Result<Python, PythonError> {
    if let Some(p) = option {
        return Ok(Python {
            path: p.to_path_buf(),
            source: PythonSource::Option,
        });
    }
    if let Some(p) = non_empty(&env.python) {
        return Ok(Python {
            path: PathBuf::from(p),
            source: PythonSource::Env,
        });
    }
    let pointer = match env.pointer_file() {
        None => PointerState::NoLocation,
        Some(file) => match read_pointer(&file) {
            Ok(python) => {
                return Ok(Python {
                    path: python,
                    source: PythonSource::PointerFile(file),
                });
            }
            Err(state) => state,
        },
    };
    Err(PythonError::NotFound { pointer })
}

/// The interpreter the pointer file names, if it exists.
fn read_pointer(file: &Path) -> Result<PathBuf, PointerState> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PointerState::Missing(file.to_path_buf()));
        }
        Err(e) => {
            return Err(PointerState::Unreadable {
                file: file.to_path_buf(),
                error: e.to_string(),
            });
        }
    };
    let Some(line) = text.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return Err(PointerState::Empty(file.to_path_buf()));
    };
    let python = PathBuf::from(line);
    if python.is_file() {
        Ok(python)
    } else {
        Err(PointerState::Stale {
            file: file.to_path_buf(),
            python,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;

    /// A venv root holding a fake interpreter and a pointer file naming it.
    fn root_with_python() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let python = root.path().join("venv-0123/bin/python");
        std::fs::create_dir_all(python.parent().unwrap()).unwrap();
        std::fs::write(&python, "#!/bin/sh\n").unwrap();
        std::fs::write(
            root.path().join(POINTER_FILE),
            format!("{}\n", python.display()),
        )
        .unwrap();
        (root, python)
    }

    fn env(python: Option<&str>, root: Option<&Path>) -> PythonEnv {
        PythonEnv {
            python: python.map(OsString::from),
            venv_root: root.map(|r| r.as_os_str().to_owned()),
            home: None,
        }
    }

    #[test]
    fn the_option_wins_over_everything() {
        let (root, _) = root_with_python();
        let got = resolve_python_from(
            Some(Path::new("/opt/py/bin/python")),
            &env(Some("/env/python"), Some(root.path())),
        )
        .unwrap();
        assert_eq!(got.path, Path::new("/opt/py/bin/python"));
        assert_eq!(got.source, PythonSource::Option);
    }

    #[test]
    fn the_env_var_wins_over_the_pointer_file() {
        let (root, _) = root_with_python();
        let got = resolve_python_from(None, &env(Some("/env/python"), Some(root.path()))).unwrap();
        assert_eq!(got.path, Path::new("/env/python"));
        assert_eq!(got.source, PythonSource::Env);
        // An empty variable counts as unset.
        let got = resolve_python_from(None, &env(Some(""), Some(root.path()))).unwrap();
        assert!(matches!(got.source, PythonSource::PointerFile(_)));
    }

    #[test]
    fn the_pointer_file_names_the_venv_python() {
        let (root, python) = root_with_python();
        let got = resolve_python_from(None, &env(None, Some(root.path()))).unwrap();
        assert_eq!(got.path, python);
        assert_eq!(
            got.source,
            PythonSource::PointerFile(root.path().join(POINTER_FILE))
        );
    }

    #[test]
    fn the_pointer_file_lives_under_the_venv_root_else_home() {
        let e = PythonEnv {
            python: None,
            venv_root: Some("/r".into()),
            home: Some("/home/u".into()),
        };
        assert_eq!(e.pointer_file(), Some(PathBuf::from("/r/python")));
        let e = PythonEnv {
            venv_root: Some("".into()),
            ..e
        };
        assert_eq!(
            e.pointer_file(),
            Some(PathBuf::from("/home/u/.cache/tandem/python"))
        );
        assert_eq!(PythonEnv::default().pointer_file(), None);
    }

    /// The one-line error names the option, the variable, the pointer file and the script.
    fn assert_names_all(err: &PythonError, pointer_text: &str) {
        let line = err.to_string();
        assert!(!line.contains('\n'), "{line}");
        for want in [
            "`python` option",
            "$TANDEM_PYTHON",
            "scripts/setup-python.sh",
            pointer_text,
        ] {
            assert!(line.contains(want), "`{want}` missing: {line}");
        }
        assert!(
            err.help().contains("bash scripts/setup.sh"),
            "{}",
            err.help()
        );
    }

    #[test]
    fn nothing_found_is_one_line_naming_all_three() {
        let root = tempfile::tempdir().unwrap();
        let err = resolve_python_from(None, &env(None, Some(root.path()))).unwrap_err();
        let file = root.path().join(POINTER_FILE);
        assert_eq!(
            err,
            PythonError::NotFound {
                pointer: PointerState::Missing(file.clone())
            }
        );
        assert_names_all(&err, &format!("no pointer file {}", file.display()));

        let err = resolve_python_from(None, &PythonEnv::default()).unwrap_err();
        assert_names_all(&err, "neither $TANDEM_VENV_ROOT nor $HOME is set");
    }

    #[test]
    fn a_pointer_to_a_removed_venv_or_an_empty_pointer_is_not_used() {
        let (root, python) = root_with_python();
        std::fs::remove_file(&python).unwrap();
        let err = resolve_python_from(None, &env(None, Some(root.path()))).unwrap_err();
        let file = root.path().join(POINTER_FILE);
        assert_eq!(
            err,
            PythonError::NotFound {
                pointer: PointerState::Stale {
                    file: file.clone(),
                    python: python.clone()
                }
            }
        );
        assert_names_all(&err, "which does not exist");

        std::fs::write(&file, "\n").unwrap();
        let err = resolve_python_from(None, &env(None, Some(root.path()))).unwrap_err();
        assert_eq!(
            err,
            PythonError::NotFound {
                pointer: PointerState::Empty(file)
            }
        );
    }
}
