//! Safetensors I/O in Hugging Face layout: single `model.safetensors` or sharded with
//! `model.safetensors.index.json`; f32/bf16/f16 are converted to f32 on load; saves f32.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

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

/// Converts raw little-endian tensor bytes to f32 into `out`.
fn convert(path: &Path, name: &str, view: &TensorView<'_>, out: &mut [f32]) -> Result<()> {
    let data = view.data();
    match view.dtype() {
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
        let bytes = std::fs::read(path).map_err(|e| NativeError::io(path, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| st_err(path, e.to_string()))?;
        for (fname, view) in st.tensors() {
            let Some(name) = rename(&fname) else {
                skipped.push(fname);
                continue;
            };
            let Some(entry) = layout.get(&name) else {
                skipped.push(fname);
                continue;
            };
            if view.shape() != entry.shape.as_slice() {
                return Err(st_err(
                    path,
                    format!(
                        "tensor `{fname}` has shape {:?}, config.json implies {:?}",
                        view.shape(),
                        entry.shape
                    ),
                ));
            }
            if let Some(prev) = seen.insert(name.clone(), path.clone()) {
                return Err(st_err(
                    path,
                    format!("tensor `{fname}` also present in {}", prev.display()),
                ));
            }
            convert(path, &fname, &view, &mut buf[entry.range()])?;
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
