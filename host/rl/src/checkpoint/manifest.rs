//! The manifest of a checkpoint, [`MANIFEST`]: every other file of the directory (relative
//! path, size, xxh3-64 digest in hex), written last into the `.tmp` directory, before it is
//! fsynced and renamed; [`verify`] checks a checkpoint against it before `--resume` trusts it.
//! Files added to a checkpoint after it was published (the companion files `--resume` gives a
//! checkpoint written before checkpoints carried them) are not in its manifest and are not
//! checked.

use crate::error::RlError;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Component, Path};

/// File inside a checkpoint listing every other file with its size and digest.
pub const MANIFEST: &str = "tandem_manifest.json";

/// The manifest's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Every file of the checkpoint but the manifest, sorted by path.
    pub files: Vec<Entry>,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Path relative to the checkpoint directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3-64 of the contents, 16 hex digits.
    pub xxh3: String,
}

/// Writes the manifest of every file now in `dir` (recursively) into `dir`.
pub fn write(dir: &Path) -> Result<(), RlError> {
    let mut paths = Vec::new();
    list(dir, "", &mut paths).map_err(RlError::io(format!("listing {}", dir.display())))?;
    paths.sort();
    let mut files = Vec::with_capacity(paths.len());
    for rel in paths {
        let path = dir.join(&rel);
        let (size, xxh3) =
            digest(&path).map_err(RlError::io(format!("hashing {}", path.display())))?;
        files.push(Entry {
            path: rel,
            size,
            xxh3,
        });
    }
    let text = serde_json::to_string_pretty(&Manifest { files })
        .map_err(|e| RlError::failed(format!("encoding the checkpoint manifest: {e}")))?;
    let path = dir.join(MANIFEST);
    std::fs::write(&path, text).map_err(RlError::io(format!("writing {}", path.display())))
}

/// Checks `dir` against its manifest: `Ok(true)` when every file it lists is there with its
/// size and digest, `Ok(false)` when `dir` has no manifest (a checkpoint written before
/// checkpoints carried one), `Err(why)` otherwise.
pub fn verify(dir: &Path) -> Result<bool, String> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{MANIFEST} cannot be read ({e})")),
    };
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| format!("{MANIFEST} is not a checkpoint manifest ({e})"))?;
    for e in &manifest.files {
        let rel = Path::new(&e.path);
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(format!(
                "{MANIFEST} lists `{}`, not a path inside it",
                e.path
            ));
        }
        let file = dir.join(rel);
        let size = match std::fs::metadata(&file) {
            Ok(m) => m.len(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("{} is missing", e.path));
            }
            Err(err) => return Err(format!("{} cannot be read ({err})", e.path)),
        };
        if size != e.size {
            return Err(format!(
                "{} is {size} bytes, its manifest says {}",
                e.path, e.size
            ));
        }
        let (_, xxh3) =
            digest(&file).map_err(|err| format!("{} cannot be read ({err})", e.path))?;
        if xxh3 != e.xxh3 {
            return Err(format!(
                "{} does not match its digest (xxh3 {xxh3}, its manifest says {})",
                e.path, e.xxh3
            ));
        }
    }
    Ok(true)
}

/// Appends the `/`-separated paths (under `prefix`) of the files below `dir`, the manifest at
/// the top excepted.
fn list(dir: &Path, prefix: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = format!("{prefix}{name}");
        let meta = std::fs::metadata(e.path())?;
        if meta.is_dir() {
            list(&e.path(), &format!("{rel}/"), out)?;
        } else if meta.is_file() && rel != MANIFEST {
            out.push(rel);
        }
    }
    Ok(())
}

/// Size and xxh3-64 (hex) of a file, read in 1 MiB blocks.
fn digest(path: &Path) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, format!("{:016x}", h.digest())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn checkpoint() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("model.safetensors"), vec![7u8; 3000]).unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        std::fs::write(t.path().join("sub/a.json"), "{}").unwrap();
        write(t.path()).unwrap();
        t
    }

    #[test]
    fn a_written_checkpoint_verifies_and_lists_every_other_file() {
        let t = checkpoint();
        assert_eq!(verify(t.path()), Ok(true));
        let m: Manifest =
            serde_json::from_str(&std::fs::read_to_string(t.path().join(MANIFEST)).unwrap())
                .unwrap();
        let paths: Vec<&str> = m.files.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["model.safetensors", "sub/a.json"]);
        assert_eq!(m.files[0].size, 3000);
        assert_eq!(
            m.files[0].xxh3,
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&[7u8; 3000]))
        );
        // A file added later is not checked.
        std::fs::write(t.path().join("tokenizer.json"), "{}").unwrap();
        assert_eq!(verify(t.path()), Ok(true));
    }

    #[test]
    fn truncated_flipped_and_missing_files_are_named() {
        let t = checkpoint();
        let model = t.path().join("model.safetensors");
        std::fs::write(&model, vec![7u8; 100]).unwrap();
        let why = verify(t.path()).unwrap_err();
        assert!(why.contains("model.safetensors is 100 bytes"), "{why}");
        let mut bytes = vec![7u8; 3000];
        bytes[1234] = 8;
        std::fs::write(&model, bytes).unwrap();
        let why = verify(t.path()).unwrap_err();
        assert!(
            why.contains("model.safetensors does not match its digest"),
            "{why}"
        );
        std::fs::remove_file(&model).unwrap();
        assert_eq!(verify(t.path()), Err("model.safetensors is missing".into()));
        std::fs::write(t.path().join(MANIFEST), "{").unwrap();
        assert!(
            verify(t.path())
                .unwrap_err()
                .contains("not a checkpoint manifest")
        );
        std::fs::remove_file(t.path().join(MANIFEST)).unwrap();
        assert_eq!(verify(t.path()), Ok(false));
    }
}
