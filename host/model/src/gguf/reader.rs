//! The GGUF v3 container: header, metadata key/values and the tensor table, parsed from the
//! bytes of a whole file with every read bounds-checked.
//!
//! Written here rather than taken from a crate: `ggus` 0.5 (the maintained GGUF parser)
//! slices the data section unchecked and asserts on shapes, so a truncated or corrupt file
//! panics instead of giving the one-line error (with the byte offset) an import owes its user.

use std::collections::BTreeMap;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any unsigned integer type.
    Uint(u64),
    /// Any signed integer type.
    Int(i64),
    /// `f32` or `f64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values (all of one type).
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float (integers too).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::Uint(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost (contiguous) first, as GGML stores them.
    pub dims: Vec<u64>,
    /// GGML type id.
    pub type_id: u32,
    /// Byte offset inside the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file: metadata, tensor table and where the data section starts.
#[derive(Debug)]
pub struct Gguf {
    /// Format version (3).
    pub version: u32,
    /// Metadata by key.
    pub meta: BTreeMap<String, Value>,
    /// The tensor table in file order.
    pub tensors: Vec<TensorInfo>,
    /// Byte offset of the data section in the file.
    pub data_start: usize,
}

/// What is wrong with the bytes and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {offset}")]
pub struct ParseError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What is wrong.
    pub what: String,
}

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays and strings longer than this are refused as corrupt (the largest real ones are
/// vocabularies of a few hundred thousand entries).
const MAX_LEN: u64 = 1 << 28;

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn fail<T>(&self, what: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            offset: self.pos,
            what: what.into(),
        })
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ParseError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.fail(format!(
                "file ends inside {what} ({n} bytes needed, {} left)",
                self.bytes.len() - self.pos
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ParseError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, ParseError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, ParseError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn len(&mut self, what: &str) -> Result<usize, ParseError> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > MAX_LEN {
            return Err(ParseError {
                offset: at,
                what: format!("{what} claims length {n}"),
            });
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        let n = self.len(what)?;
        let at = self.pos;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| ParseError {
            offset: at,
            what: format!("{what} is not UTF-8"),
        })
    }

    fn value(&mut self, type_id: u32, key: &str) -> Result<Value, ParseError> {
        Ok(match type_id {
            0 => Value::Uint(u64::from(self.array::<1>(key)?[0])),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.array(key)?))),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.array(key)?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.array(key)?))),
            4 => Value::Uint(u64::from(self.u32(key)?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.array(key)?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.array(key)?))),
            7 => Value::Bool(self.array::<1>(key)?[0] != 0),
            8 => Value::Str(self.string(key)?),
            9 => {
                let item = self.u32(key)?;
                if item == 9 {
                    return self.fail(format!("{key}: nested arrays are not supported"));
                }
                let n = self.len(key)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(item, key)?);
                }
                Value::Array(items)
            }
            10 => Value::Uint(self.u64(key)?),
            11 => Value::Int(i64::from_le_bytes(self.array(key)?)),
            12 => Value::Float(f64::from_le_bytes(self.array(key)?)),
            other => return self.fail(format!("{key}: unknown metadata type {other}")),
        })
    }
}

/// Parses the header, metadata and tensor table of `bytes` (a whole file) and checks that
/// every tensor's data lies inside the file (`bytes_of` gives each tensor's byte size, or
/// `None` for a type the caller does not know; those are checked later by the caller).
pub fn parse(
    bytes: &[u8],
    bytes_of: impl Fn(&TensorInfo) -> Option<u64>,
) -> Result<Gguf, ParseError> {
    let mut c = Cursor { bytes, pos: 0 };
    if bytes.len() < 4 || &bytes[..4] != MAGIC {
        return c.fail("not a GGUF file (the first bytes are not `GGUF`)");
    }
    c.pos = 4;
    let version = c.u32("the version")?;
    if version != 3 {
        return Err(ParseError {
            offset: 4,
            what: format!("GGUF version {version} (only version 3 is supported)"),
        });
    }
    let tensor_count = c.len("the tensor count")?;
    let kv_count = c.len("the metadata count")?;
    let mut meta = BTreeMap::new();
    for _ in 0..kv_count {
        let key = c.string("a metadata key")?;
        let type_id = c.u32(&key)?;
        let value = c.value(type_id, &key)?;
        if meta.insert(key.clone(), value).is_some() {
            return c.fail(format!("metadata key `{key}` appears twice"));
        }
    }
    let mut tensors = Vec::with_capacity(tensor_count.min(1 << 16));
    for _ in 0..tensor_count {
        let name = c.string("a tensor name")?;
        let n_dims = c.u32(&name)?;
        if n_dims == 0 || n_dims > 4 {
            return c.fail(format!("tensor `{name}` has {n_dims} dimensions"));
        }
        let dims = (0..n_dims)
            .map(|_| c.u64(&name))
            .collect::<Result<Vec<_>, _>>()?;
        let type_id = c.u32(&name)?;
        let offset = c.u64(&name)?;
        tensors.push(TensorInfo {
            name,
            dims,
            type_id,
            offset,
        });
    }
    let alignment = match meta.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => return c.fail(format!("general.alignment {v:?} is not a power of two")),
        },
    };
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    for t in &tensors {
        let Some(size) = bytes_of(t) else { continue };
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(size));
        if end.is_none_or(|e| e > file_len) {
            return Err(ParseError {
                offset: bytes.len(),
                what: format!(
                    "file is truncated: tensor `{}` needs bytes {}..{} of the data section, the \
                     file has {}",
                    t.name,
                    t.offset,
                    t.offset.saturating_add(size),
                    file_len.saturating_sub(data_start)
                ),
            });
        }
    }
    Ok(Gguf {
        version,
        meta,
        tensors,
        data_start: data_start as usize,
    })
}
