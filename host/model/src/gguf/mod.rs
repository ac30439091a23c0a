//! `tandem model import FILE.gguf --out DIR`: a GGUF v3 file (llama.cpp's format) → a Hugging
//! Face model directory: `config.json`, `model.safetensors` (every tensor dequantized to
//! f32), the tokenizer files ([`tokenizer`]) and `generation_config.json`.
//!
//! Everything is checked before anything is written (architecture, every expected tensor
//! present once with its shape and a supported type, no stray tensor, the data inside the
//! file), and the directory is built beside `--out` and renamed into place: a bad file leaves
//! nothing at `--out`.

mod arch;
mod dequant;
mod reader;
#[cfg(test)]
mod tests;
mod tokenizer;

pub use arch::{ARCHITECTURES, Hparams};
pub use dequant::GgmlType;
pub use reader::{Gguf, ParseError, TensorInfo, Value};

use crate::error::{ModelError, Result};
use crate::write::{DirWriter, write_json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// What an import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// The model's hyper-parameters.
    pub hparams: Hparams,
    /// Parameters written (elements over all tensors).
    pub params: u64,
    /// Tensors per source GGML type name.
    pub types: BTreeMap<&'static str, usize>,
    /// Tokenizer vocabulary (with added tokens).
    pub vocab: usize,
    /// Whether a chat template was found.
    pub chat_template: bool,
}

/// Parses `bytes` (a whole GGUF file) far enough to list its metadata and tensors.
pub fn parse(bytes: &[u8]) -> std::result::Result<Gguf, ParseError> {
    reader::parse(bytes, |t| {
        GgmlType::from_id(t.type_id)
            .ok()
            .and_then(|ty| ty.bytes_for(t.dims[0], t.elements()))
    })
}

/// Imports `src` into a new Hugging Face model directory `out`.
pub fn import(src: &Path, out: &Path) -> Result<ImportSummary> {
    let writer = DirWriter::new(out)?;
    let bytes = std::fs::read(src).map_err(ModelError::io(src))?;
    let bad = |m: String| {
        ModelError::invalid(src, m).with_help(
            "pass a GGUF v3 file of a llama or qwen2 model (as llama.cpp's converter writes \
             them); re-download it if it was cut short",
        )
    };
    let g = parse(&bytes).map_err(|e| bad(e.to_string()))?;
    let hp = Hparams::read(&g).map_err(bad)?;
    let expected = hp.tensors();
    let by_name: HashMap<&str, &TensorInfo> =
        g.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    if let Some(stray) = g
        .tensors
        .iter()
        .find(|t| !expected.iter().any(|(n, _)| *n == t.name))
    {
        return Err(bad(format!(
            "unexpected tensor `{}` ({} tensors in the file, {} expected for a {}-layer {})",
            stray.name,
            g.tensors.len(),
            expected.len(),
            hp.layers,
            hp.arch
        )));
    }
    let mut plan = Vec::with_capacity(expected.len());
    let mut types = BTreeMap::new();
    for (name, target) in &expected {
        let t = by_name.get(name.as_str()).ok_or_else(|| {
            bad(format!(
                "tensor `{name}` is missing ({} tensors in the file, {} expected)",
                g.tensors.len(),
                expected.len()
            ))
        })?;
        let ty = GgmlType::from_id(t.type_id).map_err(|ty| {
            ModelError::invalid(
                src,
                format!("tensor `{name}` has type {ty}, which the importer cannot dequantize"),
            )
            .with_help("supported types: F32, F16, BF16, Q4_0, Q4_1, Q8_0; convert the file with llama.cpp's llama-quantize")
        })?;
        let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        if shape != target.shape {
            return Err(bad(format!(
                "tensor `{name}` has shape {shape:?}, the metadata implies {:?}",
                target.shape
            )));
        }
        *types.entry(ty.name()).or_insert(0) += 1;
        plan.push((*t, ty, target));
    }
    let tok = tokenizer::build(&g, hp.vocab).map_err(bad)?;

    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::with_capacity(plan.len());
    let mut params = 0u64;
    for (t, ty, target) in plan {
        let n = t.elements() as usize;
        let start = g.data_start + t.offset as usize;
        let len = ty.bytes_for(t.dims[0], t.elements()).unwrap_or(0) as usize;
        let mut values = vec![0f32; n];
        dequant::dequantize(ty, &bytes[start..start + len], &mut values);
        if let Some(heads) = target.unpermute_heads {
            values = arch::unpermute(&values, heads, target.shape[1]);
        }
        params += n as u64;
        tensors.push((target.hf.clone(), target.shape.clone(), values));
    }
    drop(bytes);

    let dir = writer.dir();
    crate::write::safetensors_f32(&dir.join("model.safetensors"), &tensors)?;
    write_json(
        &dir.join("config.json"),
        &hp.config_json(tok.bos, tok.eos, tok.pad),
    )?;
    let generation = serde_json::json!({
        "bos_token_id": tok.bos,
        "eos_token_id": tok.eos,
        "pad_token_id": tok.pad,
    });
    write_json(&dir.join("generation_config.json"), &generation)?;
    let path = dir.join("tokenizer.json");
    tok.tokenizer
        .save(&path, false)
        .map_err(|e| ModelError::invalid(&path, format!("writing the tokenizer: {e}")))?;
    write_json(&dir.join("tokenizer_config.json"), &tok.config)?;
    write_json(&dir.join("special_tokens_map.json"), &tok.special_map)?;
    if let Some(t) = &tok.chat_template {
        let path = dir.join("chat_template.jinja");
        std::fs::write(&path, t).map_err(ModelError::io(&path))?;
    }
    writer.publish()?;
    Ok(ImportSummary {
        vocab: tok.tokenizer.get_vocab_size(true),
        chat_template: tok.chat_template.is_some(),
        hparams: hp,
        params,
        types,
    })
}
