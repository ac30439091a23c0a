//! The safetensors format: the header read by hand: an 8-byte little-endian length, a JSON object of
//! `name -> {dtype, shape, data_offsets}` (and `__metadata__`), then the data. Written here
//! rather than taken from the `safetensors` crate because that crate parses a byte slice of
//! the whole file (read into memory or mapped, which needs `unsafe`), where the digest wants
//! only the header and then each tensor's bytes streamed with positioned reads.

use std::io::Read;
use std::path::Path;

use super::FilesError;

/// One tensor of a safetensors file (see [`read_entries`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The tensor's name.
    pub name: String,
    /// Its safetensors dtype (`F32`, `BF16`, ...).
    pub dtype: String,
    /// Its sizes.
    pub shape: Vec<u64>,
    /// Absolute offset of its data in the file.
    pub start: u64,
    /// Bytes of data.
    pub len: u64,
}

/// Largest header accepted (the format's own readers use the same bound).
const MAX_HEADER: u64 = 100 << 20;

/// Bytes per element of the safetensors dtypes (`None`: a dtype this reader does not size,
/// whose byte range is taken as it is).
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// The tensors of the safetensors file `path`, each checked to lie inside the file and to
/// hold as many bytes as its dtype and shape say.
pub fn read_entries(path: &Path) -> Result<Vec<Entry>, FilesError> {
    let bad = |detail: String| FilesError::corrupt(path, detail);
    let mut file = std::fs::File::open(path)
        .map_err(|e| FilesError::io(format!("opening {}", path.display()), e))?;
    let file_len = file
        .metadata()
        .map_err(|e| FilesError::io(format!("reading {}", path.display()), e))?
        .len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|_| {
        bad(format!(
            "{file_len} bytes: too short for a safetensors header"
        ))
    })?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER || n > file_len - 8 {
        return Err(bad(format!(
            "the header claims {n} bytes, the file has {file_len}: not a safetensors file, or a truncated one"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| FilesError::io(format!("reading {}", path.display()), e))?;
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("the safetensors header is not a JSON object: {e}")))?;
    let base = 8 + n;
    let mut entries = Vec::with_capacity(json.len());
    for (name, v) in json {
        if name == "__metadata__" {
            continue;
        }
        let field = |key: &str| {
            v.get(key)
                .ok_or_else(|| bad(format!("tensor `{name}` has no `{key}`")))
        };
        let dtype = field("dtype")?
            .as_str()
            .ok_or_else(|| bad(format!("tensor `{name}`: `dtype` is not a string")))?
            .to_string();
        let as_u64s = |key: &str| -> Result<Vec<u64>, FilesError> {
            field(key)?
                .as_array()
                .and_then(|a| a.iter().map(serde_json::Value::as_u64).collect())
                .ok_or_else(|| bad(format!("tensor `{name}`: `{key}` is not a list of sizes")))
        };
        let shape = as_u64s("shape")?;
        let offsets = as_u64s("data_offsets")?;
        let [begin, end] = offsets[..] else {
            return Err(bad(format!(
                "tensor `{name}`: `data_offsets` is not [begin, end]"
            )));
        };
        if begin > end || base + end > file_len {
            return Err(bad(format!(
                "tensor `{name}` spans bytes {begin}..{end} of the data, the file holds {}: truncated",
                file_len - base
            )));
        }
        if let Some(size) = dtype_size(&dtype) {
            let want = shape.iter().try_fold(size, |a, &d| a.checked_mul(d));
            if want != Some(end - begin) {
                return Err(bad(format!(
                    "tensor `{name}` ({dtype} {shape:?}) has {} bytes of data, its shape needs {}",
                    end - begin,
                    want.map_or("more than 2^64".to_string(), |w| w.to_string())
                )));
            }
        }
        entries.push(Entry {
            name,
            dtype,
            shape,
            start: base + begin,
            len: end - begin,
        });
    }
    Ok(entries)
}

/// One tensor to write with [`write`]: name, safetensors dtype, shape, raw bytes.
pub type TensorBytes<'a> = (&'a str, &'a str, &'a [u64], &'a [u8]);

/// Writes a safetensors file of `tensors` in the order given (a small-file writer: fixtures,
/// tests, adapters built at hand; trainers stream their own).
pub fn write(path: &Path, tensors: &[TensorBytes<'_>]) -> Result<(), FilesError> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, bytes) in tensors {
        let end = offset + bytes.len() as u64;
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut head = serde_json::Value::Object(header).to_string().into_bytes();
    // Data starts 8-byte aligned, as the format recommends.
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + head.len() + offset as usize);
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    std::fs::write(path, out).map_err(|e| FilesError::io(format!("writing {}", path.display()), e))
}
