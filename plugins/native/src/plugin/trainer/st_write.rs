//! A streaming safetensors writer for weight exports: the header, then every tensor's f32
//! values converted to little-endian bytes through one 1 MiB buffer straight into the file.
//! Unlike building the whole file in memory first, it needs no second copy of the weights
//! (the checkpoint bridge's peak memory stays at the weights themselves) and writes at close
//! to disk speed.

use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::layout::ParamLayout;

/// f32 elements converted per write.
const CHUNK: usize = 1 << 18;

/// Writes the tensors of `layout` from `buf` (names as in the layout) to `path` as one f32
/// safetensors file (`format = pt`), tensors in name order.
pub fn write(path: &Path, layout: &ParamLayout, buf: &[f32]) -> std::io::Result<()> {
    let mut entries: Vec<_> = layout.entries().iter().collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for e in &entries {
        let bytes = e.numel() * 4;
        header.insert(
            e.name.clone(),
            json!({"dtype": "F32", "shape": e.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    // The data starts 8-byte aligned.
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut f = std::io::BufWriter::with_capacity(4 * CHUNK, std::fs::File::create(path)?);
    f.write_all(&(text.len() as u64).to_le_bytes())?;
    f.write_all(&text)?;
    let mut out = Vec::with_capacity(4 * CHUNK);
    for e in &entries {
        for chunk in buf[e.range()].chunks(CHUNK) {
            out.clear();
            for x in chunk {
                out.extend_from_slice(&x.to_le_bytes());
            }
            f.write_all(&out)?;
        }
    }
    f.flush()?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::buffer::VecProvider;
    use crate::config::ModelConfig;
    use crate::init::Preset;
    use crate::model::Model;
    use crate::st_io;

    #[test]
    fn streamed_file_loads_back_bit_exact() {
        let cfg: ModelConfig = Preset::Tiny.config();
        let mut m = Model::new_zeroed(cfg, &mut VecProvider::new()).unwrap();
        m.init_random(5, 0.02);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        super::write(&path, &m.layout, m.w()).unwrap();
        let mut back = vec![0f32; m.layout.total_len()];
        st_io::load_into(&[path], &m.layout, &mut back, &|n| Some(n.to_string())).unwrap();
        let a: Vec<u32> = m.w().iter().map(|x| x.to_bits()).collect();
        let b: Vec<u32> = back.iter().map(|x| x.to_bits()).collect();
        assert!(a == b);
    }
}
