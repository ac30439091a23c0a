//! Drafter checkpoint I/O: `config.json` + safetensors with f32 parameters, the I64 `d2t`
//! offsets and the BOOL `t2d` mask (only for a reduced draft vocabulary; names in
//! [`crate::drafter`]'s module doc).
//!
//! Loading reads each file's header (length bounds, offsets, sizes and the data length
//! checked against the file before any read), every tensor's dtype and shape against the
//! config, the maps' consistency, and reports the first problem as one error naming the file;
//! a truncated or corrupt file is an error, never a panic. Saving is atomic (temp directory,
//! fsync, rename).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, TensorInfo, TensorView};

use super::config::DrafterConfig;
use super::layout::EMBED;
use super::{Drafter, NOT_DRAFTED, default_aux_layers};
use crate::buffer::BufferProvider;
use crate::error::{NativeError, Result};
use crate::model::Model;
use crate::st_io;

fn st_err(path: &Path, message: impl Into<String>) -> NativeError {
    NativeError::Safetensors {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Checks `d2t` against `cfg` (length, every target id in range and distinct) and derives
/// `t2d` and the target → draft map.
pub(crate) fn check_maps(
    cfg: &DrafterConfig,
    d2t: &[i64],
) -> std::result::Result<(Vec<bool>, Vec<u32>), String> {
    if d2t.len() != cfg.draft_vocab_size {
        return Err(format!(
            "d2t has {} entries, draft_vocab_size is {}",
            d2t.len(),
            cfg.draft_vocab_size
        ));
    }
    let mut t2d = vec![false; cfg.vocab_size];
    let mut inv = vec![NOT_DRAFTED; cfg.vocab_size];
    for (i, &off) in d2t.iter().enumerate() {
        let t = i as i64 + off;
        if t < 0 || t >= cfg.vocab_size as i64 {
            return Err(format!(
                "d2t[{i}] = {off} maps draft id {i} to target id {t}, outside 0..{}",
                cfg.vocab_size
            ));
        }
        let t = t as usize;
        if t2d[t] {
            return Err(format!(
                "target id {t} appears twice in d2t (draft ids {} and {i})",
                inv[t]
            ));
        }
        t2d[t] = true;
        inv[t] = i as u32;
    }
    Ok((t2d, inv))
}

/// Opens a safetensors file and reads its checked header: the file, the byte offset of its
/// data and the tensors.
fn open_checked(path: &Path) -> Result<(File, u64, Metadata)> {
    let mut f = File::open(path).map_err(|e| NativeError::io(path, e))?;
    let len = f.metadata().map_err(|e| NativeError::io(path, e))?.len();
    if len < 8 {
        return Err(st_err(path, format!("{len} bytes: not a safetensors file")));
    }
    let mut n8 = [0u8; 8];
    f.read_exact(&mut n8)
        .map_err(|e| NativeError::io(path, e))?;
    let n = u64::from_le_bytes(n8);
    if n > 100_000_000 || n > len - 8 {
        return Err(st_err(
            path,
            format!("header length {n} does not fit the file ({len} bytes): truncated or corrupt"),
        ));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text)
        .map_err(|e| NativeError::io(path, e))?;
    let meta: Metadata = serde_json::from_slice(&text)
        .map_err(|e| st_err(path, format!("invalid header (corrupt file?): {e}")))?;
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

fn read_bytes(f: &File, path: &Path, at: u64, info: &TensorInfo) -> Result<Vec<u8>> {
    let mut b = vec![0u8; info.data_offsets.1 - info.data_offsets.0];
    f.read_exact_at(&mut b, at)
        .map_err(|e| NativeError::io(path, e))?;
    Ok(b)
}

/// Reads one float tensor (F32 / BF16 / F16) into `out` as f32.
fn read_f32(
    f: &File,
    path: &Path,
    name: &str,
    info: &TensorInfo,
    at: u64,
    out: &mut [f32],
) -> Result<()> {
    if info.dtype == Dtype::F32 && cfg!(target_endian = "little") {
        return f
            .read_exact_at(bytemuck::cast_slice_mut(out), at)
            .map_err(|e| NativeError::io(path, e));
    }
    let b = read_bytes(f, path, at, info)?;
    match info.dtype {
        Dtype::F32 => out
            .iter_mut()
            .zip(b.chunks_exact(4))
            .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        Dtype::BF16 => out
            .iter_mut()
            .zip(b.chunks_exact(2))
            .for_each(|(o, c)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        Dtype::F16 => out
            .iter_mut()
            .zip(b.chunks_exact(2))
            .for_each(|(o, c)| *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        other => {
            return Err(st_err(
                path,
                format!("tensor `{name}` has dtype {other:?}; F32, BF16 or F16 expected"),
            ));
        }
    }
    Ok(())
}

/// A drafter directory whose headers, config and vocabulary maps are read and checked: what
/// is left is reading the parameters into a buffer ([`fill`]).
struct Opened {
    cfg: DrafterConfig,
    d2t: Vec<i64>,
    files: Vec<PathBuf>,
    found: HashMap<String, (PathBuf, u64, TensorInfo)>,
    opened: HashMap<PathBuf, File>,
}

/// Reads `dir`'s config and safetensors headers and its `d2t` (see [`Drafter::load`]).
fn open(dir: &Path, target: Option<&Model>) -> Result<Opened> {
    let default_aux = target.map(|t| default_aux_layers(t.cfg.num_hidden_layers));
    let cfg = DrafterConfig::from_dir(dir, default_aux)?;
    let files = st_io::model_files(dir)?;
    // First pass over the headers: where each tensor is.
    let mut found: HashMap<String, (PathBuf, u64, TensorInfo)> = HashMap::new();
    let mut opened: HashMap<PathBuf, File> = HashMap::new();
    for path in &files {
        let (f, start, meta) = open_checked(path)?;
        for name in meta.offset_keys() {
            let Some(info) = meta.info(&name) else {
                continue;
            };
            let at = start + info.data_offsets.0 as u64;
            if let Some(prev) = found.insert(name.clone(), (path.clone(), at, info.clone())) {
                return Err(st_err(
                    path,
                    format!("tensor `{name}` also present in {}", prev.0.display()),
                ));
            }
        }
        opened.insert(path.clone(), f);
    }
    let d2t = match found.remove("d2t") {
        Some((path, at, info)) => {
            if info.dtype != Dtype::I64 || info.shape != [cfg.draft_vocab_size] {
                return Err(st_err(
                    &path,
                    format!(
                        "`d2t` is {:?} {:?}, expected I64 [{}] (draft_vocab_size)",
                        info.dtype, info.shape, cfg.draft_vocab_size
                    ),
                ));
            }
            let b = read_bytes(&opened[&path], &path, at, &info)?;
            let v: Vec<i64> = b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            check_maps(&cfg, &v).map_err(|m| st_err(&path, m))?;
            v
        }
        None if cfg.draft_vocab_size == cfg.vocab_size => vec![0; cfg.vocab_size],
        None => {
            return Err(st_err(
                &files[0],
                format!(
                    "no `d2t` tensor, but draft_vocab_size {} < vocab_size {}",
                    cfg.draft_vocab_size, cfg.vocab_size
                ),
            ));
        }
    };
    Ok(Opened {
        cfg,
        d2t,
        files,
        found,
        opened,
    })
}

/// Loads a drafter directory (see [`Drafter::load`]).
pub(crate) fn load(
    dir: &Path,
    target: Option<&Model>,
    provider: &mut dyn BufferProvider,
) -> Result<Drafter> {
    let o = open(dir, target)?;
    let mut d = Drafter::with_d2t(o.cfg.clone(), o.d2t.clone(), provider)?;
    fill(dir, o, &mut d, target)?;
    Ok(d)
}

/// Reads the drafter in `dir` into `d`'s buffer (see [`Drafter::load_into`]).
pub(crate) fn load_into(dir: &Path, d: &mut Drafter) -> Result<()> {
    let o = open(dir, None)?;
    if o.cfg != d.cfg {
        return Err(NativeError::Config(format!(
            "drafter {}: its configuration differs from the loaded drafter's; load it as a new \
             drafter",
            dir.display()
        )));
    }
    if o.d2t != d.d2t {
        return Err(NativeError::Config(format!(
            "drafter {}: its draft vocabulary differs from the loaded drafter's",
            dir.display()
        )));
    }
    fill(dir, o, d, None)
}

/// Checks `t2d` and reads every parameter of `o` into `d` (whose config and `d2t` are `o`'s).
fn fill(dir: &Path, o: Opened, d: &mut Drafter, target: Option<&Model>) -> Result<()> {
    let Opened {
        files: _files,
        mut found,
        opened,
        ..
    } = o;
    if let Some((path, at, info)) = found.remove("t2d") {
        if info.dtype != Dtype::BOOL || info.shape != [d.cfg.vocab_size] {
            return Err(st_err(
                &path,
                format!(
                    "`t2d` is {:?} {:?}, expected BOOL [{}] (vocab_size)",
                    info.dtype, info.shape, d.cfg.vocab_size
                ),
            ));
        }
        let b = read_bytes(&opened[&path], &path, at, &info)?;
        if let Some(t) = (0..b.len()).find(|&t| (b[t] != 0) != d.t2d()[t]) {
            return Err(st_err(
                &path,
                format!(
                    "`t2d[{t}]` = {} disagrees with `d2t` (target id {t} {} the draft vocabulary)",
                    b[t] != 0,
                    if d.t2d()[t] { "is in" } else { "is not in" }
                ),
            ));
        }
    }
    let entries = d.layout.entries().to_vec();
    let w = d.weights.as_mut_slice();
    for e in &entries {
        let Some((path, at, info)) = found.remove(&e.name) else {
            match target {
                Some(t) if e.name == EMBED => {
                    let src = &t.w()[t.offs.embed.clone()];
                    if src.len() != e.numel() {
                        return Err(NativeError::Param(format!(
                            "{}: no `{EMBED}`, and the target's embedding is not [{}, {}]",
                            dir.display(),
                            e.shape[0],
                            e.shape[1]
                        )));
                    }
                    w[e.range()].copy_from_slice(src);
                    continue;
                }
                _ => {
                    return Err(NativeError::Param(format!(
                        "{}: tensor `{}` is missing from the checkpoint{}",
                        dir.display(),
                        e.name,
                        if e.name == EMBED {
                            " (load it with its target model to take the target's embedding)"
                        } else {
                            ""
                        }
                    )));
                }
            }
        };
        if info.shape != e.shape {
            return Err(st_err(
                &path,
                format!(
                    "tensor `{}` has shape {:?}, config.json implies {:?}",
                    e.name, info.shape, e.shape
                ),
            ));
        }
        read_f32(&opened[&path], &path, &e.name, &info, at, &mut w[e.range()])?;
    }
    if let Some((name, (path, ..))) = found.iter().next() {
        return Err(st_err(
            path,
            format!("unexpected tensor `{name}`: not part of an EAGLE-3 drafter"),
        ));
    }
    if let Some(t) = target {
        d.check_target(&t.cfg)?;
    }
    Ok(())
}

/// Serialises the drafter's tensors into one safetensors image.
fn serialize(d: &Drafter, path: &Path) -> Result<Vec<u8>> {
    let w = d.w();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = d
        .layout
        .entries()
        .iter()
        .map(|e| {
            let bytes: Vec<u8> = w[e.range()].iter().flat_map(|x| x.to_le_bytes()).collect();
            (e.name.clone(), Dtype::F32, e.shape.clone(), bytes)
        })
        .collect();
    // The maps only for a reduced draft vocabulary: with the full one vLLM has no
    // `draft_id_to_target_id` parameter and refuses a `d2t` tensor (`There is no module or
    // parameter named 'draft_id_to_target_id'`); `load` takes a missing `d2t` as identity.
    if d.cfg.draft_vocab_size < d.cfg.vocab_size {
        let d2t: Vec<u8> = d.d2t().iter().flat_map(|x| x.to_le_bytes()).collect();
        owned.push(("d2t".into(), Dtype::I64, vec![d2t.len() / 8], d2t));
        let t2d: Vec<u8> = d.t2d().iter().map(|&b| u8::from(b)).collect();
        owned.push(("t2d".into(), Dtype::BOOL, vec![t2d.len()], t2d));
    }
    let mut views = Vec::with_capacity(owned.len());
    for (name, dtype, shape, bytes) in &owned {
        let v = TensorView::new(*dtype, shape.clone(), bytes)
            .map_err(|e| st_err(path, format!("tensor `{name}`: {e}")))?;
        views.push((name.clone(), v));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(meta)).map_err(|e| st_err(path, e.to_string()))
}

/// Saves atomically (see [`Drafter::save`]).
pub(crate) fn save(d: &Drafter, dir: &Path) -> Result<()> {
    let name = dir.file_name().ok_or_else(|| {
        NativeError::Input(format!("drafter path {} has no file name", dir.display()))
    })?;
    let tmp = dir.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| NativeError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| NativeError::io(&tmp, e))?;
    d.cfg.save(&tmp)?;
    let st = tmp.join("model.safetensors");
    let bytes = serialize(d, &st)?;
    std::fs::write(&st, bytes).map_err(|e| NativeError::io(&st, e))?;
    for f in ["config.json", "model.safetensors"] {
        let p = tmp.join(f);
        File::open(&p)
            .and_then(|f| f.sync_all())
            .map_err(|e| NativeError::io(&p, e))?;
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| NativeError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| NativeError::io(dir, e))
}
