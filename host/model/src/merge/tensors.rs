//! The safetensors side of a merge: a Hugging Face model's weight files (one
//! `model.safetensors` or the shards of `model.safetensors.index.json`), their headers read
//! without the data (so a merge checks every shape before it writes anything), and float
//! conversions between F32 / BF16 / F16 bytes and `f32`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::View;
use serde_json::Value;

use crate::error::{ModelError, Result};

/// The single-file weights of a Hugging Face model.
pub(crate) const SINGLE: &str = "model.safetensors";
/// The index of a sharded one.
pub(crate) const INDEX: &str = "model.safetensors.index.json";

/// Name, dtype and shape of one tensor, from a file's header.
#[derive(Debug, Clone)]
pub(crate) struct Info {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

/// The weight files of a model directory and every tensor's header entry.
pub(crate) struct Weights {
    /// Shard file names in the directory (one for an unsharded model).
    pub files: Vec<String>,
    /// Tensor name → (index into `files`, info).
    pub tensors: HashMap<String, (usize, Info)>,
    /// The parsed index when the model is sharded.
    pub index: Option<Value>,
}

impl Weights {
    /// Reads the headers of `dir`'s weight files.
    pub fn read(dir: &Path) -> Result<Weights> {
        let index_path = dir.join(INDEX);
        let (files, index) = if dir.join(SINGLE).is_file() {
            (vec![SINGLE.to_string()], None)
        } else if index_path.is_file() {
            let index = read_json(&index_path)?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| ModelError::invalid(&index_path, "no `weight_map` object"))?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            files.sort();
            files.dedup();
            (files, Some(index))
        } else {
            return Err(ModelError::invalid(
                dir,
                format!("no {SINGLE} or {INDEX} (the model's weights)"),
            )
            .with_help("give a Hugging Face model directory with safetensors weights"));
        };
        let mut tensors = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for (name, info) in header(&dir.join(f))? {
                tensors.insert(name, (i, info));
            }
        }
        Ok(Weights {
            files,
            tensors,
            index,
        })
    }
}

/// Parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(ModelError::io(path))?;
    serde_json::from_str(&text).map_err(|e| ModelError::invalid(path, format!("not JSON: {e}")))
}

/// The tensors named in a safetensors file's header (its data is not read).
pub(crate) fn header(path: &Path) -> Result<Vec<(String, Info)>> {
    let bad = |m: String| ModelError::invalid(path, format!("not a safetensors file: {m}"));
    let mut f = std::fs::File::open(path).map_err(ModelError::io(path))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(ModelError::io(path))?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return Err(bad(format!("a header of {n} bytes")));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text).map_err(ModelError::io(path))?;
    let v: BTreeMap<String, Value> =
        serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for (name, entry) in v {
        if name == "__metadata__" {
            continue;
        }
        let dtype: Dtype = serde_json::from_value(entry["dtype"].clone())
            .map_err(|e| bad(format!("tensor `{name}`: dtype {e}")))?;
        let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone())
            .map_err(|e| bad(format!("tensor `{name}`: shape {e}")))?;
        out.push((name, Info { dtype, shape }));
    }
    Ok(out)
}

/// Whether merges compute on this dtype.
pub(crate) fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::BF16 | Dtype::F16)
}

/// `bytes` of `dtype` (F32, BF16 or F16, little-endian) as `f32`s.
pub(crate) fn to_f32(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// `values` as little-endian bytes of `dtype` (F32, BF16 or F16; rounded to nearest).
pub(crate) fn from_f32(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// A tensor to write: borrowed from the input file, or computed.
pub(crate) struct Out<'a> {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Cow<'a, [u8]>,
}

impl View for &Out<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `tensors` to `path` with `metadata` (which always says `format = pt`: transformers
/// refuses a file whose metadata names no known format), then fsyncs it.
pub(crate) fn write(
    path: &Path,
    tensors: &[(String, Out<'_>)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let mut metadata = metadata.unwrap_or_default();
    metadata
        .entry("format".to_string())
        .or_insert_with(|| "pt".to_string());
    let views = tensors.iter().map(|(n, t)| (n.as_str(), t));
    safetensors::tensor::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| ModelError::invalid(path, format!("writing safetensors: {e}")))?;
    sync(path)
}

/// fsyncs a file or directory.
pub(crate) fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(ModelError::io(path))
}
