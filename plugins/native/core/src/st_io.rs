//! Safetensors I/O in Hugging Face layout: single `model.safetensors` or sharded with
//! `model.safetensors.index.json`; f32/bf16/f16 are converted to f32 on load; saves f32.
//!
//! Loading streams each file: the header is read and checked (offsets contiguous, sizes
//! matching shapes, data ending with the file), then every wanted tensor is read straight
//! into its place in the destination buffer (f32 on a little-endian machine: one positional read
//! (split over the cores when large) from the page cache per run of tensors adjacent both in the file and in the buffer — a
//! file written in the buffer's order is one read —, no intermediate copy of the file;
//! other dtypes through a buffer of one tensor). Tensors the caller skips are not read.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, TensorInfo, TensorView};

use crate::error::{NativeError, Result};
use crate::layout::ParamLayout;

fn st_err(path: &Path, message: impl Into<String>) -> NativeError {
    NativeError::Safetensors {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The safetensors files of a model directory (one file, or the shards named by the index).
pub fn model_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Err(st_err(
            dir,
            "no model.safetensors nor model.safetensors.index.json in this directory",
        ));
    }
    let text = std::fs::read_to_string(&index).map_err(|e| NativeError::io(&index, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| NativeError::Json {
        path: index.clone(),
        message: e.to_string(),
    })?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| NativeError::Json {
            path: index.clone(),
            message: "missing object `weight_map`".into(),
        })?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(|f| f.as_str().map(String::from))
        .collect();
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Converts raw little-endian tensor bytes of `dtype` to f32 into `out`.
fn convert(path: &Path, name: &str, dtype: Dtype, data: &[u8], out: &mut [f32]) -> Result<()> {
    match dtype {
        Dtype::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::BF16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Dtype::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        other => {
            return Err(st_err(
                path,
                format!("tensor `{name}` has dtype {other:?}; only F32, BF16 and F16 load"),
            ));
        }
    }
    Ok(())
}

/// Largest header accepted (the safetensors format's own limit).
const MAX_HEADER: u64 = 100_000_000;

/// Opens a safetensors file and reads its checked header: the file, the byte offset where
/// its data starts and the tensors.
fn open_checked(path: &Path) -> Result<(File, u64, Metadata)> {
    let mut f = File::open(path).map_err(|e| NativeError::io(path, e))?;
    let len = f.metadata().map_err(|e| NativeError::io(path, e))?.len();
    let mut n8 = [0u8; 8];
    if len < 8 {
        return Err(st_err(path, format!("{len} bytes: not a safetensors file")));
    }
    f.read_exact(&mut n8)
        .map_err(|e| NativeError::io(path, e))?;
    let n = u64::from_le_bytes(n8);
    if n > MAX_HEADER || n > len - 8 {
        return Err(st_err(
            path,
            format!(
                "header length {n} does not fit the file ({len} bytes): not a safetensors file"
            ),
        ));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text)
        .map_err(|e| NativeError::io(path, e))?;
    let meta: Metadata =
        serde_json::from_slice(&text).map_err(|e| st_err(path, format!("invalid header: {e}")))?;
    let start = 8 + n;
    if start + meta.data_len() as u64 != len {
        return Err(st_err(
            path,
            format!(
                "the header describes {} data bytes, the file holds {} (truncated or padded)",
                meta.data_len(),
                len - start
            ),
        ));
    }
    Ok((f, start, meta))
}

/// Reads raw little-endian f32 values at byte `at` of `f` into `out` (their bytes are the
/// values' in-memory bytes on a little-endian machine: one positional read, split over the
/// cores when large ([`crate::par_io`]), no conversion).
fn read_run(f: &File, path: &Path, at: u64, out: &mut [f32]) -> Result<()> {
    crate::par_io::read_exact_at(f, at, bytemuck::cast_slice_mut(out))
        .map_err(|e| NativeError::io(path, e))
}

/// Reads one tensor at byte `at` of `f` into `out` (f32, converted from its dtype).
fn read_tensor(
    f: &mut File,
    path: &Path,
    name: &str,
    info: &TensorInfo,
    at: u64,
    out: &mut [f32],
) -> Result<()> {
    f.seek(SeekFrom::Start(at))
        .map_err(|e| NativeError::io(path, e))?;
    let len = info.data_offsets.1 - info.data_offsets.0;
    let mut data = vec![0u8; len];
    f.read_exact(&mut data)
        .map_err(|e| NativeError::io(path, e))?;
    convert(path, name, info.dtype, &data, out)
}

/// Loads every tensor of `layout` from `files` into `buf`, with the names mapped through
/// `rename` (file name -> layout name; `None` skips the tensor). Tensors in the files that
/// the layout lacks are ignored only if `ignore(name)` says so; every layout tensor must be
/// found exactly once. Returns the names that were skipped.
pub fn load_into(
    files: &[PathBuf],
    layout: &ParamLayout,
    buf: &mut [f32],
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>> {
    if buf.len() < layout.total_len() {
        return Err(NativeError::Buffer(format!(
            "weights buffer has {} f32, layout needs {}",
            buf.len(),
            layout.total_len()
        )));
    }
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut skipped = Vec::new();
    for path in files {
        let (mut f, start, meta) = open_checked(path)?;
        // Raw f32 tensors adjacent in the file and in `buf` are read as one run (file byte
        // offset, buffer range).
        let mut run: Option<(u64, std::ops::Range<usize>)> = None;
        // In file order: the reads go forward through the file.
        for fname in meta.offset_keys() {
            let Some(view) = meta.info(&fname) else {
                continue;
            };
            let Some(name) = rename(&fname) else {
                skipped.push(fname);
                continue;
            };
            let Some(entry) = layout.get(&name) else {
                skipped.push(fname);
                continue;
            };
            if view.shape != entry.shape {
                return Err(st_err(
                    path,
                    format!(
                        "tensor `{fname}` has shape {:?}, config.json implies {:?}",
                        view.shape, entry.shape
                    ),
                ));
            }
            if let Some(prev) = seen.insert(name.clone(), path.clone()) {
                return Err(st_err(
                    path,
                    format!("tensor `{fname}` also present in {}", prev.display()),
                ));
            }
            let at = start + view.data_offsets.0 as u64;
            let dest = entry.range();
            if !(view.dtype == Dtype::F32 && cfg!(target_endian = "little")) {
                read_tensor(&mut f, path, &fname, view, at, &mut buf[dest])?;
                continue;
            }
            // Raw f32: extend the current run while file and buffer are both contiguous.
            run = match run {
                Some((pos, cur)) if pos + 4 * (cur.len() as u64) == at && cur.end == dest.start => {
                    Some((pos, cur.start..dest.end))
                }
                other => {
                    if let Some((pos, cur)) = other {
                        read_run(&f, path, pos, &mut buf[cur])?;
                    }
                    Some((at, dest))
                }
            };
        }
        if let Some((pos, cur)) = run.take() {
            read_run(&f, path, pos, &mut buf[cur])?;
        }
    }
    let missing: Vec<&str> = layout
        .entries()
        .iter()
        .filter(|e| !seen.contains_key(&e.name))
        .map(|e| e.name.as_str())
        .collect();
    if !missing.is_empty() {
        let shown: Vec<&str> = missing.iter().take(5).copied().collect();
        return Err(NativeError::Param(format!(
            "{} tensor(s) missing from the checkpoint, e.g. {shown:?}; is config.json for this \
             checkpoint?",
            missing.len()
        )));
    }
    Ok(skipped)
}

/// The file of `files` whose data section is byte for byte the f32 buffer of `layout` (one
/// file, every tensor raw F32 at its layout offset, nothing skipped or missing: what
/// [`save_from`] and the trainer's streaming writer produce on a little-endian machine),
/// opened, with the byte offset its data starts at; `None` for any other file set (the
/// general [`load_into`] handles those, and reports their errors).
fn single_run(
    files: &[PathBuf],
    layout: &ParamLayout,
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(File, PathBuf, u64)>> {
    let [path] = files else {
        return Ok(None);
    };
    if !cfg!(target_endian = "little") {
        return Ok(None);
    }
    let (f, start, meta) = open_checked(path)?;
    let names = meta.offset_keys();
    if names.len() != layout.entries().len() || meta.data_len() != layout.total_len() * 4 {
        return Ok(None);
    }
    for fname in names {
        let entry = rename(&fname).and_then(|n| layout.get(&n));
        let (Some(view), Some(entry)) = (meta.info(&fname), entry) else {
            return Ok(None);
        };
        if view.dtype != Dtype::F32
            || view.shape != entry.shape
            || view.data_offsets.0 != entry.offset * 4
        {
            return Ok(None);
        }
    }
    Ok(Some((f, path.clone(), start)))
}

/// Whether `files` are byte for byte the f32 buffer of `layout` (see `single_run`): a
/// [`load_into`] of them reads straight into the buffer, one run.
pub fn is_weights_bytes(
    files: &[PathBuf],
    layout: &ParamLayout,
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<bool> {
    single_run(files, layout, rename).map(|r| r.is_some())
}

/// [`load_into`] that also returns the digest ([`crate::digest`]) of `buf` once loaded,
/// computed inside the read (each block hashed while it is in the cache) when the files are
/// the buffer's bytes, else in a pass after it.
pub fn load_into_digest(
    files: &[PathBuf],
    layout: &ParamLayout,
    buf: &mut [f32],
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<String>, String)> {
    if buf.len() == layout.total_len()
        && let Some((f, path, start)) = single_run(files, layout, rename)?
    {
        let d = crate::digest::digest_reading(buf, |at, c| {
            f.read_exact_at(bytemuck::cast_slice_mut(c), start + 4 * at as u64)
        })
        .map_err(|e| NativeError::io(&path, e))?;
        return Ok((Vec::new(), d));
    }
    let skipped = load_into(files, layout, buf, rename)?;
    Ok((skipped, crate::digest::digest(buf)))
}

/// The digest of the buffer [`load_into`] would fill from `files`, read through a scratch
/// block per thread (no buffer of the model's size), when the files are the buffer's bytes;
/// `None` for other file sets.
pub fn digest_files(
    files: &[PathBuf],
    layout: &ParamLayout,
    rename: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>> {
    let Some((f, path, start)) = single_run(files, layout, rename)? else {
        return Ok(None);
    };
    let d = crate::digest::digest_streaming(layout.total_len(), |at, c| {
        f.read_exact_at(bytemuck::cast_slice_mut(c), start + 4 * at as u64)
    })
    .map_err(|e| NativeError::io(&path, e))?;
    Ok(Some(d))
}

/// Loads flat f32 tensors by name from the safetensors file `path` into their buffers: each
/// must be in the file as F32 with shape `[len of its buffer]`, all checked before any is read
/// (a mismatch leaves every buffer as it was); other tensors in the file are ignored. The
/// trainer's optimizer file (moments `m` and `v`) is read with it.
pub fn load_flat(path: &Path, tensors: &mut [(&str, &mut [f32])]) -> Result<()> {
    let (mut f, start, meta) = open_checked(path)?;
    let mut infos = Vec::with_capacity(tensors.len());
    for (name, buf) in tensors.iter() {
        let info = meta
            .info(name)
            .ok_or_else(|| st_err(path, format!("no tensor `{name}`")))?;
        if info.dtype != Dtype::F32 || info.shape != [buf.len()] {
            return Err(st_err(
                path,
                format!(
                    "tensor `{name}` is {:?} {:?}, the trainer needs F32 [{}]",
                    info.dtype,
                    info.shape,
                    buf.len()
                ),
            ));
        }
        infos.push(info.clone());
    }
    for ((name, buf), info) in tensors.iter_mut().zip(&infos) {
        let at = start + info.data_offsets.0 as u64;
        if cfg!(target_endian = "little") {
            read_run(&f, path, at, buf)?;
        } else {
            read_tensor(&mut f, path, name, info, at, buf)?;
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` over an existing file's pages (then cut to size), or creates it.
/// Unlike `std::fs::write` (which truncates first), rewriting a file that already exists
/// costs no freeing and re-allocating of its page-cache pages, nor a truncate in the journal.
pub fn write_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    f.write_all(bytes)?;
    f.set_len(bytes.len() as u64)
}

/// Writes the tensors of `layout` (names mapped through `rename`) from `buf` as one f32
/// safetensors file with `{"format": "pt"}` metadata.
pub fn save_from(
    path: &Path,
    layout: &ParamLayout,
    buf: &[f32],
    rename: &dyn Fn(&str) -> String,
) -> Result<()> {
    let mut bytes: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for e in layout.entries() {
        let data: Vec<u8> = buf[e.range()]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        bytes.insert(rename(&e.name), (e.shape.clone(), data));
    }
    let mut views = Vec::with_capacity(bytes.len());
    for (name, (shape, data)) in &bytes {
        let v = TensorView::new(Dtype::F32, shape.clone(), data)
            .map_err(|err| st_err(path, format!("tensor `{name}`: {err}")))?;
        views.push((name.clone(), v));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let out = safetensors::serialize(views, Some(meta)).map_err(|e| st_err(path, e.to_string()))?;
    let tmp = path.with_extension("safetensors.tmp");
    std::fs::write(&tmp, out).map_err(|e| NativeError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| NativeError::io(path, e))
}
