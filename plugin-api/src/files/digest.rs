//! The weights digest: what a trainer computes over the tensors it exports and an engine over
//! the files it loads, equal whatever writes them — one file or many shards, any order of
//! tensors in them, Rust or Python (`tandem_torchrun.files`, the twin, computes the same).
//!
//! Definition (format `st256:<tensors>:<64 hex digits>`):
//! - each tensor's hash is SHA-256 over `name NUL dtype NUL shape NUL` followed by its raw
//!   bytes as stored (little-endian), where `dtype` is the safetensors name (`F32`, `BF16`)
//!   and `shape` the sizes joined by commas;
//! - the digest is SHA-256 over `st256 NUL`, the tensor count as 8 little-endian bytes, then
//!   the tensors' hashes in ascending byte order of their names. Two tensors of one name are
//!   an error.
//!
//! SHA-256 because Python's `hashlib` computes it as fast as Rust does (SHA-NI), so the torch
//! trainers need no native extension; a digest detects any changed, missing, added, renamed
//! or reshaped tensor. The weights of a directory are its `*.safetensors` files other than
//! [`OPTIMIZER_FILE`]; with a `model.safetensors.index.json`, the files its `weight_map`
//! names.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::FilesError;
use super::safetensors::{Entry, read_entries};
use crate::error::{ErrorCode, PluginError};
use crate::types::WeightUpdate;

/// The digest's format tag.
pub const PREFIX: &str = "st256";

/// The optimizer moments a checkpoint may hold beside its weights (not weights).
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor's hash, with its name (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHash {
    name: String,
    hash: [u8; 32],
}

/// The hash of one tensor, fed its bytes in pieces.
pub struct TensorHasher {
    name: String,
    sha: Sha256,
}

impl TensorHasher {
    /// Starts the hash of tensor `name` of safetensors dtype `dtype` and shape `shape`.
    pub fn new(name: &str, dtype: &str, shape: &[u64]) -> TensorHasher {
        let mut sha = Sha256::new();
        let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
        sha.update(format!("{name}\0{dtype}\0{}\0", dims.join(",")).as_bytes());
        TensorHasher {
            name: name.to_string(),
            sha,
        }
    }

    /// Feeds the next bytes of the tensor's data.
    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
    }

    /// The tensor's hash.
    pub fn finish(self) -> TensorHash {
        TensorHash {
            name: self.name,
            hash: self.sha.finalize().into(),
        }
    }
}

/// The hash of a tensor whose bytes are all at hand.
pub fn tensor_hash(name: &str, dtype: &str, shape: &[u64], bytes: &[u8]) -> TensorHash {
    let mut h = TensorHasher::new(name, dtype, shape);
    h.update(bytes);
    h.finish()
}

/// The digest of a set of tensors from their hashes, in any order; `Err(name)` when two
/// tensors share a name.
pub fn combine(hashes: Vec<TensorHash>) -> Result<String, String> {
    let mut by_name = BTreeMap::new();
    for h in hashes {
        if by_name.insert(h.name.clone(), h.hash).is_some() {
            return Err(h.name);
        }
    }
    let mut sha = Sha256::new();
    sha.update(format!("{PREFIX}\0").as_bytes());
    sha.update((by_name.len() as u64).to_le_bytes());
    for hash in by_name.values() {
        sha.update(hash);
    }
    let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{PREFIX}:{}:{hex}", by_name.len()))
}

/// The weight files of `dir` (see the module doc), sorted.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, FilesError> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| FilesError::io(format!("reading {}", index.display()), e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| FilesError::corrupt(&index, format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| FilesError::corrupt(&index, "no `weight_map` object"))?;
        let mut files: Vec<PathBuf> = map
            .values()
            .map(|v| {
                v.as_str().map(|f| dir.join(f)).ok_or_else(|| {
                    FilesError::corrupt(&index, "a `weight_map` value is not a file name")
                })
            })
            .collect::<Result<_, _>>()?;
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let rd = std::fs::read_dir(dir)
        .map_err(|e| FilesError::io(format!("reading {}", dir.display()), e))?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "safetensors")
                && p.file_name().is_some_and(|n| n != OPTIMIZER_FILE)
                && p.is_file()
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(FilesError::corrupt(dir, "holds no *.safetensors weights"));
    }
    Ok(files)
}

/// Bytes read per positioned read while hashing a tensor.
const CHUNK: u64 = 1 << 20;

/// The digest of the weights in `dir` (see the module doc), each tensor's bytes streamed from
/// its file. The tensors are hashed on rayon's pool: its threads live as long as the process,
/// so an engine that digests every update keeps the same allocator arenas instead of growing
/// new ones with a thread per call.
pub fn digest_dir(dir: &Path) -> Result<String, FilesError> {
    use rayon::prelude::*;
    let mut work: Vec<(PathBuf, Entry)> = Vec::new();
    for file in weight_files(dir)? {
        for e in read_entries(&file)? {
            work.push((file.clone(), e));
        }
    }
    // Largest first: the pool's threads finish close together.
    work.sort_by_key(|w| std::cmp::Reverse(w.1.len));
    let all = work
        .par_iter()
        .map(|(f, e)| hash_entry(f, e))
        .collect::<Result<Vec<TensorHash>, FilesError>>()?;
    combine(all).map_err(|name| {
        FilesError::corrupt(
            dir,
            format!("tensor `{name}` is in more than one weight file"),
        )
    })
}

fn hash_entry(file: &Path, e: &Entry) -> Result<TensorHash, FilesError> {
    let f = std::fs::File::open(file)
        .map_err(|err| FilesError::io(format!("opening {}", file.display()), err))?;
    // One read buffer per pool thread, kept for the thread's life: a buffer per tensor made
    // the engines' allocated memory settle at a different level from run to run.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut h = TensorHasher::new(&e.name, &e.dtype, &e.shape);
    BUF.with_borrow_mut(|buf| {
        buf.resize(CHUNK as usize, 0);
        let mut done = 0;
        while done < e.len {
            let n = (e.len - done).min(CHUNK) as usize;
            f.read_exact_at(&mut buf[..n], e.start + done)
                .map_err(|err| FilesError::io(format!("reading {}", file.display()), err))?;
            h.update(&buf[..n]);
            done += n as u64;
        }
        Ok(h.finish())
    })
}

/// Checks the weights in `dir` against `expected` (an exported digest) and returns their
/// digest: a [`FilesError::Corrupt`] naming both digests when they differ. With `expected`
/// empty (the update asks for no check) nothing is read and the result is empty.
pub fn verify_dir(dir: &Path, expected: &str) -> Result<String, FilesError> {
    if expected.is_empty() {
        return Ok(String::new());
    }
    let found = digest_dir(dir)?;
    if found != expected {
        return Err(FilesError::corrupt(
            dir,
            format!(
                "digest mismatch: the files hold {found}, the trainer exported {expected} (a \
                 file was damaged or replaced after the export)"
            ),
        ));
    }
    Ok(found)
}

/// What an engine does with a `checkpoint_dir` or `adapter` update before it loads a byte:
/// [`verify_dir`] of the update's directory against the update's digest. A mismatch or a
/// damaged file is one `corrupt` error that says the update was not applied (the engine
/// keeps serving what it served); the result is the digest to report as served.
pub fn verify_update(update: &WeightUpdate, dir: &Path) -> Result<String, PluginError> {
    verify_dir(dir, update.digest.as_str()).map_err(|e| {
        let code = match e {
            FilesError::Io { .. } => ErrorCode::Io,
            FilesError::Corrupt { .. } => ErrorCode::Corrupt,
        };
        PluginError::new(
            code,
            format!(
                "weight update v{}: {e}; the update was not applied",
                update.version
            ),
        )
        .with_help("the engine keeps serving its previous weights; export the version again")
    })
}
