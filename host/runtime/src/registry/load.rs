//! Loading one plugin: from a built-in root module or from a library file via
//! `lib_header_from_path(..)?.init_root_module()` — never the `RootModule::load_*` helpers,
//! which cache the first module per type and silently return it for every later path.

use super::{LoadedPlugin, PluginSource};
use abi_stable::library::{LibraryError, RootModule, lib_header_from_path};
use std::path::{Path, PathBuf};
use tandem_plugin_api::{MIN_API_LEVEL, PluginModuleRef, RResult};

/// Why a plugin could not be loaded; every variant displays as one actionable line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The library was built against another version of `tandem-plugin-api`.
    #[error(
        "plugin `{name}` ({}): built against tandem-plugin-api {found}, this host needs {expected}",
        path.display()
    )]
    IncompatibleVersion {
        /// Plugin name (from the file name: the manifest cannot be read safely).
        name: String,
        /// Library path.
        path: PathBuf,
        /// Version this host was built with.
        expected: String,
        /// Version the plugin was built with.
        found: String,
    },
    /// Same version, different type layouts (a modified API crate).
    #[error(
        "plugin `{name}` ({}): its ABI types do not match this host's tandem-plugin-api {expected}: {detail}",
        path.display()
    )]
    AbiMismatch {
        /// Plugin name (from the file name).
        name: String,
        /// Library path.
        path: PathBuf,
        /// Version this host was built with.
        expected: String,
        /// Last lines of abi_stable's report.
        detail: String,
    },
    /// The plugin's API level is older than this host drives.
    #[error(
        "plugin `{name}` ({}): API level {found} is older than the minimum {min} this host supports",
        path
    )]
    ApiLevelTooOld {
        /// Plugin name.
        name: String,
        /// Source (path or built-in).
        path: String,
        /// Declared level.
        found: u32,
        /// Minimum supported level.
        min: u32,
    },
    /// The file is not a loadable library or has no Tandem root module.
    #[error(
        "{}: not a Tandem plugin ({reason})",
        path.display()
    )]
    NotAPlugin {
        /// Library path.
        path: PathBuf,
        /// Short reason.
        reason: String,
    },
    /// The plugin's manifest function failed (returned an error or panicked).
    #[error("plugin at {path}: reading its manifest failed: {message}")]
    Manifest {
        /// Source (path or built-in).
        path: String,
        /// The plugin's error.
        message: String,
    },
    /// Two plugins with the same name.
    #[error("two plugins are named `{name}`: {first} and {second}")]
    Duplicate {
        /// Plugin name.
        name: String,
        /// Where the first one came from.
        first: String,
        /// Where the second one came from.
        second: String,
    },
    /// Two plugins provide a component with the same kind and name.
    #[error("two plugins provide the {kind} `{name}`: {first} and {second}")]
    DuplicateComponent {
        /// Component kind.
        kind: &'static str,
        /// Component name.
        name: String,
        /// The first provider.
        first: String,
        /// The second provider.
        second: String,
    },
    /// A plugin directory could not be read.
    #[error("{}: cannot read plugin directory: {source}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl LoadError {
    /// How to fix it, when there is something to say.
    pub fn help(&self) -> Option<String> {
        Some(match self {
            LoadError::IncompatibleVersion { expected, .. } => {
                format!("rebuild the plugin against tandem-plugin-api {expected}")
            }
            LoadError::AbiMismatch { .. } => "rebuild the plugin against the published \
                tandem-plugin-api; run with -vv for the full layout report"
                .into(),
            LoadError::ApiLevelTooOld { .. } => {
                "rebuild the plugin against the current tandem-plugin-api".into()
            }
            LoadError::NotAPlugin { .. } => "remove it from the plugin directory, or build it \
                with tandem_plugin_api::export_plugin!"
                .into(),
            LoadError::Duplicate { .. } | LoadError::DuplicateComponent { .. } => {
                "remove one of them from the plugin directories".into()
            }
            LoadError::Dir { .. } => {
                "check --plugin-dir, [plugins] dirs and TANDEM_PLUGIN_PATH".into()
            }
            LoadError::Manifest { .. } => return None,
        })
    }
}

/// Directories listed in `TANDEM_PLUGIN_PATH` (colon-separated).
pub fn plugin_dirs_from_env() -> Vec<PathBuf> {
    std::env::var_os("TANDEM_PLUGIN_PATH")
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// File-name prefix of the plugin libraries picked up next to the executable.
const EXE_DIR_PREFIX: &str = "libtandem_";

/// Library files (`*.so`, `*.dylib`) in `dirs`, sorted per directory; a directory that cannot
/// be read is an error.
pub(super) fn library_files(dirs: &[PathBuf], errors: &mut Vec<LoadError>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        match libraries_in(dir, |_| true) {
            Ok(files) => out.extend(files),
            Err(source) => errors.push(LoadError::Dir {
                path: dir.clone(),
                source,
            }),
        }
    }
    out
}

/// The directory of the running executable (symlinks resolved), where a build puts `tandem`
/// beside the plugin libraries of its workspace; `None` when it cannot be found.
pub(super) fn exe_dir() -> Option<PathBuf> {
    match std::env::current_exe() {
        Ok(exe) => exe.parent().map(Path::to_path_buf),
        Err(e) => {
            tracing::debug!(error = %e, "cannot locate the tandem executable: its directory is not searched for plugins");
            None
        }
    }
}

/// The `libtandem_*` library files in `dir` (the executable's directory), sorted. Only that
/// prefix: a build directory also holds other libraries (test fixtures, proc macros). The
/// directory is searched implicitly, so one that cannot be read is skipped, not an error.
pub(super) fn exe_dir_files(dir: &Path) -> Vec<PathBuf> {
    let prefixed = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(EXE_DIR_PREFIX))
    };
    libraries_in(dir, prefixed).unwrap_or_else(|e| {
        tracing::debug!(dir = %dir.display(), error = %e, "cannot read the executable's directory: no plugins from there");
        Vec::new()
    })
}

/// Library files in `dir` accepted by `keep`, sorted by path.
fn libraries_in(dir: &Path, keep: impl Fn(&Path) -> bool) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("so") | Some("dylib")
                )
                && keep(p)
        })
        .collect();
    files.sort();
    Ok(files)
}

fn name_from_path(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
    stem.strip_prefix("lib").unwrap_or(stem).to_owned()
}

/// Loads the plugin library at `path`.
pub(super) fn from_path(path: &Path) -> Result<LoadedPlugin, LoadError> {
    let name = name_from_path(path);
    let header = lib_header_from_path(path).map_err(|e| classify(e, path, &name))?;
    // Compare versions first: a different tandem-plugin-api also changes type layouts, and
    // abi_stable would report that as a thousand-line layout mismatch.
    if let (Ok(found), Ok(expected)) = (
        header.version_strings().parsed(),
        PluginModuleRef::VERSION_STRINGS.parsed(),
    ) && !expected.is_loosely_compatible(found)
    {
        if tracing::enabled!(tracing::Level::DEBUG)
            && let Err(e) = header.init_root_module::<PluginModuleRef>()
        {
            tracing::debug!(path = %path.display(), report = %e, "plugin load failure (full report)");
        }
        return Err(LoadError::IncompatibleVersion {
            name,
            path: path.to_path_buf(),
            expected: compatible_range(&expected.to_string()),
            found: found.to_string(),
        });
    }
    // Also accepts a plugin built before fields were appended to the root module.
    let module = tandem_plugin_api::module::init_root_module(header)
        .map_err(|e| classify(e, path, &name))?;
    from_module(module, PluginSource::Path(path.to_path_buf()))
}

/// Reads the manifest of an already-initialised root module and checks its API level.
pub(super) fn from_module(
    module: PluginModuleRef,
    source: PluginSource,
) -> Result<LoadedPlugin, LoadError> {
    let manifest = match (module.manifest())() {
        RResult::ROk(m) => m,
        RResult::RErr(e) => {
            return Err(LoadError::Manifest {
                path: source.to_string(),
                message: e.to_string(),
            });
        }
    };
    if manifest.api_level < MIN_API_LEVEL {
        return Err(LoadError::ApiLevelTooOld {
            name: manifest.name.to_string(),
            path: source.to_string(),
            found: manifest.api_level,
            min: MIN_API_LEVEL,
        });
    }
    // A plugin below API level 6 has no `environments` field; one at it or above lists them.
    let environments = match module.environments() {
        Some(list) if manifest.api_level >= tandem_plugin_api::api_level::ENVIRONMENT => {
            list().into_iter().collect()
        }
        _ => Vec::new(),
    };
    Ok(LoadedPlugin {
        manifest,
        source,
        module,
        environments,
    })
}

fn classify(err: LibraryError, path: &Path, name: &str) -> LoadError {
    let expected = PluginModuleRef::VERSION_STRINGS.version.to_string();
    let full = err.to_string();
    tracing::debug!(path = %path.display(), report = %full, "plugin load failure (full report)");
    match err {
        LibraryError::IncompatibleVersionNumber { actual_version, .. } => {
            LoadError::IncompatibleVersion {
                name: name.to_owned(),
                path: path.to_path_buf(),
                expected: compatible_range(&expected),
                found: actual_version.to_string(),
            }
        }
        LibraryError::AbiInstability(_) | LibraryError::InvalidCAbi { .. } => {
            let detail = full
                .lines()
                .rev()
                .filter(|l| !l.trim().is_empty())
                .take(3)
                .map(str::trim)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" ");
            LoadError::AbiMismatch {
                name: name.to_owned(),
                path: path.to_path_buf(),
                expected,
                detail,
            }
        }
        LibraryError::OpenError { err, .. } => LoadError::NotAPlugin {
            path: path.to_path_buf(),
            reason: first_line(&err.to_string()),
        },
        LibraryError::GetSymbolError { .. } => LoadError::NotAPlugin {
            path: path.to_path_buf(),
            reason: "it exports no Tandem root module".into(),
        },
        other => LoadError::NotAPlugin {
            path: path.to_path_buf(),
            reason: first_line(&other.to_string()),
        },
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// `0.1.0` -> `0.1.x`; `1.2.3` -> `1.x` (abi_stable's semver compatibility rule).
fn compatible_range(version: &str) -> String {
    let parts: Vec<&str> = version.split('.').collect();
    match parts.as_slice() {
        ["0", minor, ..] => format!("0.{minor}.x"),
        [major, ..] => format!("{major}.x"),
        _ => version.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;

    #[test]
    fn compatible_range_follows_semver() {
        assert_eq!(compatible_range("0.1.0"), "0.1.x");
        assert_eq!(compatible_range("2.3.4"), "2.x");
    }

    #[test]
    fn only_libtandem_libraries_are_taken_from_the_executables_dir() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "libtandem_b.so",
            "libtandem_a.so",
            "libfixture_beta.so",
            "libtandem_notes.txt",
            "tandem",
        ] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("libtandem_dir.so")).unwrap();
        let names: Vec<String> = exe_dir_files(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["libtandem_a.so", "libtandem_b.so"]);
        let mut errors = Vec::new();
        assert_eq!(
            library_files(&[dir.path().to_path_buf()], &mut errors).len(),
            3
        );
        assert!(errors.is_empty());
        assert!(exe_dir_files(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn plugin_name_comes_from_file_stem() {
        assert_eq!(name_from_path(Path::new("/x/libfoo_bar.so")), "foo_bar");
        assert_eq!(name_from_path(Path::new("/x/baz.so")), "baz");
    }
}
