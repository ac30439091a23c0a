//! `tandem model merge-lora`: a PEFT LoRA adapter folded into its base model, written as a
//! full Hugging Face model directory.
//!
//! For every adapted linear weight `W` (`[out, in]`) the merge writes
//! `W' = W + scale · B · A` with `A` `[r, in]` and `B` `[out, r]` from the adapter and
//! `scale = lora_alpha / r` (`lora_alpha / sqrt(r)` with `use_rslora`), computed in f32 and
//! stored in the base tensor's dtype (F32, BF16 or F16; or F32 throughout with
//! [`MergeOptions::to_f32`]). Every other tensor is copied as it is, in the base's file
//! layout (one `model.safetensors` or the same shards and index). `config.json` and the
//! companion files ([`crate::companion`]) come from the base.
//!
//! Everything is checked before anything is written (the adapter's config, that every
//! adapted tensor exists in the base with matching shapes); the output is built in a
//! sibling temporary directory, fsynced and renamed to `out`, so an error leaves nothing.

mod adapter;
mod tensors;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::companion;
use crate::error::{ModelError, Result};
use adapter::{AdapterConfig, Pair};
use tensors::{Out, Weights};

/// How to merge.
#[derive(Debug, Clone, Copy, Default)]
pub struct MergeOptions {
    /// Store every float tensor as F32 (else each keeps the base's dtype).
    pub to_f32: bool,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeReport {
    /// Base weights changed by the adapter.
    pub merged: usize,
    /// Tensors written in all.
    pub tensors: usize,
    /// The adapter's rank.
    pub rank: usize,
    /// The factor of `B·A`.
    pub scale: f32,
    /// Weight files written.
    pub files: usize,
}

/// Merges the PEFT adapter in `adapter` into the model in `base` and writes the result to
/// `out` (absent or an empty directory).
pub fn merge_lora(
    base: &Path,
    adapter: &Path,
    out: &Path,
    opts: &MergeOptions,
) -> Result<MergeReport> {
    check_out(out)?;
    let config_path = base.join("config.json");
    if !config_path.is_file() {
        return Err(ModelError::invalid(
            base,
            "no config.json: not a Hugging Face model directory",
        )
        .with_help("give --base the model the adapter was trained on"));
    }
    let config = tensors::read_json(&config_path)?;
    let cfg = AdapterConfig::read(adapter)?;
    let pairs = adapter::pairs(adapter, &cfg)?;
    let weights = Weights::read(base)?;
    check_shapes(base, &weights, &pairs)?;
    let adapter_file = adapter.join(adapter::WEIGHTS);
    let adapter_bytes = std::fs::read(&adapter_file).map_err(ModelError::io(&adapter_file))?;
    let adapter_st = SafeTensors::deserialize(&adapter_bytes)
        .map_err(|e| ModelError::invalid(&adapter_file, format!("not safetensors: {e}")))?;
    let job = Job {
        base,
        weights: &weights,
        pairs: &pairs,
        adapter: &adapter_st,
        adapter_file: &adapter_file,
        scale: cfg.scale(),
        opts,
    };
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(ModelError::io(&parent))?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "merged".into());
    let stage = parent.join(format!(".{name}.merge-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir(&stage).map_err(ModelError::io(&stage))?;
    let written = job.write(&stage, config).and_then(|report| {
        std::fs::rename(&stage, out).map_err(ModelError::io(out))?;
        tensors::sync(&parent)?;
        Ok(report)
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&stage);
    }
    written.map(|tensors| MergeReport {
        merged: pairs.len(),
        tensors,
        rank: cfg.r,
        scale: cfg.scale(),
        files: weights.files.len(),
    })
}

/// `out` must be absent or an empty directory.
fn check_out(out: &Path) -> Result<()> {
    let taken = if out.is_dir() {
        std::fs::read_dir(out)
            .map_err(ModelError::io(out))?
            .next()
            .is_some()
    } else {
        out.exists()
    };
    if taken {
        return Err(
            ModelError::invalid(out, "exists and is not an empty directory")
                .with_help("choose a new --out"),
        );
    }
    Ok(())
}

/// Every adapted tensor exists in the base as a float matrix `[out, in]` with A `[r, in]`
/// and B `[out, r]`.
fn check_shapes(base: &Path, weights: &Weights, pairs: &BTreeMap<String, Pair>) -> Result<()> {
    let help = "was the adapter trained for another base model? give --base the model it was \
                trained on";
    for (name, pair) in pairs {
        let Some((_, w)) = weights.tensors.get(name) else {
            return Err(ModelError::invalid(
                base,
                format!(
                    "the adapter's `{}` adapts `{name}`, which the base model does not have",
                    pair.a.0
                ),
            )
            .with_help(help));
        };
        if !tensors::is_float(w.dtype) || w.shape.len() != 2 {
            return Err(ModelError::invalid(
                base,
                format!(
                    "`{name}` is {:?} {:?}; a merge needs a 2-D F32, BF16 or F16 weight",
                    w.dtype, w.shape
                ),
            ));
        }
        let (rows, cols) = (w.shape[0], w.shape[1]);
        for ((key, info), fits) in [
            (&pair.a, info_fits(&pair.a.1.shape, 1, cols)),
            (&pair.b, info_fits(&pair.b.1.shape, 0, rows)),
        ] {
            if !fits {
                return Err(ModelError::invalid(
                    base,
                    format!(
                        "adapter tensor `{key}` has shape {:?} but base tensor `{name}` has shape \
                         {:?}",
                        info.shape, w.shape
                    ),
                )
                .with_help(help));
            }
        }
    }
    Ok(())
}

fn info_fits(shape: &[usize], axis: usize, want: usize) -> bool {
    shape.get(axis) == Some(&want)
}

/// A checked merge, ready to write.
struct Job<'a> {
    base: &'a Path,
    weights: &'a Weights,
    pairs: &'a BTreeMap<String, Pair>,
    adapter: &'a SafeTensors<'a>,
    adapter_file: &'a Path,
    scale: f32,
    opts: &'a MergeOptions,
}

impl Job<'_> {
    /// Writes the weight files, the index, `config.json` and the companion files into
    /// `stage`; returns the number of tensors written.
    fn write(&self, stage: &Path, mut config: Value) -> Result<usize> {
        let mut count = 0;
        let mut total_size = 0u64;
        for file in &self.weights.files {
            let path = self.base.join(file);
            let bytes = std::fs::read(&path).map_err(ModelError::io(&path))?;
            let bad = |e: safetensors::SafeTensorError| {
                ModelError::invalid(&path, format!("not safetensors: {e}"))
            };
            let st = SafeTensors::deserialize(&bytes).map_err(bad)?;
            let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(bad)?;
            let mut outs = Vec::new();
            for (name, view) in st.iter() {
                let out = self.tensor(name, view.dtype(), view.shape(), view.data())?;
                total_size += out.data.len() as u64;
                outs.push((name.to_string(), out));
            }
            count += outs.len();
            tensors::write(&stage.join(file), &outs, meta.metadata().clone())?;
        }
        if let Some(index) = &self.weights.index {
            let mut index = index.clone();
            if let Some(m) = index.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("total_size".into(), total_size.into());
            }
            write_json(&stage.join(tensors::INDEX), &index)?;
        }
        if self.opts.to_f32
            && let Some(c) = config.as_object_mut()
        {
            for key in ["torch_dtype", "dtype"] {
                if c.contains_key(key) {
                    c.insert(key.into(), "float32".into());
                }
            }
        }
        write_json(&stage.join("config.json"), &config)?;
        for name in companion::complete(self.base, stage)? {
            tensors::sync(&stage.join(name))?;
        }
        tensors::sync(stage)?;
        Ok(count)
    }

    /// One output tensor: merged when the adapter adapts it, else the base's (converted to
    /// F32 when asked).
    fn tensor<'d>(
        &self,
        name: &str,
        dtype: Dtype,
        shape: &[usize],
        data: &'d [u8],
    ) -> Result<Out<'d>> {
        let to = if self.opts.to_f32 && tensors::is_float(dtype) {
            Dtype::F32
        } else {
            dtype
        };
        let data = match self.pairs.get(name) {
            Some(pair) => {
                let mut w = tensors::to_f32(dtype, data);
                let a = self.adapter_matrix(&pair.a.0)?;
                let b = self.adapter_matrix(&pair.b.0)?;
                add_scaled_product(&mut w, &b, &a, shape[1], self.scale);
                Cow::Owned(tensors::from_f32(to, &w))
            }
            None if to != dtype => Cow::Owned(tensors::from_f32(to, &tensors::to_f32(dtype, data))),
            None => Cow::Borrowed(data),
        };
        Ok(Out {
            dtype: to,
            shape: shape.to_vec(),
            data,
        })
    }

    fn adapter_matrix(&self, key: &str) -> Result<Vec<f32>> {
        let v = self
            .adapter
            .tensor(key)
            .map_err(|e| ModelError::invalid(self.adapter_file, format!("tensor `{key}`: {e}")))?;
        Ok(tensors::to_f32(v.dtype(), v.data()))
    }
}

/// `w += scale · b · a` for `w` `[out, cols]`, `b` `[out, r]`, `a` `[r, cols]` (row-major):
/// each row's `Σₖ b[o,k] a[k,:]` is summed first and then scaled, as PEFT's
/// `W + (B @ A) * scale`.
fn add_scaled_product(w: &mut [f32], b: &[f32], a: &[f32], cols: usize, scale: f32) {
    let r = a.len() / cols;
    let mut delta = vec![0f32; cols];
    for (row, brow) in w.chunks_exact_mut(cols).zip(b.chunks_exact(r)) {
        delta.fill(0.0);
        for (&c, arow) in brow.iter().zip(a.chunks_exact(cols)) {
            for (d, &x) in delta.iter_mut().zip(arow) {
                *d += c * x;
            }
        }
        for (x, d) in row.iter_mut().zip(&delta) {
            *x += scale * d;
        }
    }
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| ModelError::invalid(path, format!("encoding JSON: {e}")))?;
    std::fs::write(path, text).map_err(ModelError::io(path))?;
    tensors::sync(path)
}
