//! A streaming safetensors writer for weight exports: the header, then the tensors' f32
//! values straight into the file in the buffer's order (on a little-endian machine the
//! values' bytes are the file's: one positional write per run of adjacent tensors from the
//! weights themselves, split over the cores when large ([`tandem_native_core::par_io`]); otherwise
//! converted through one 1 MiB buffer). Unlike building the whole file in memory first, it needs no second
//! copy of the weights (the checkpoint bridge's peak memory stays at the weights themselves)
//! and writes at close to disk speed.
//!
//! An existing file at the path is overwritten in place, then cut to size: rewriting the
//! pages a previous export left in the page cache costs a copy, where a new (or truncated)
//! file first has the kernel free and allocate every page again (4× slower for a 26 MB
//! adapter here).

use std::os::unix::fs::FileExt;
use std::path::Path;

use serde_json::{Map, Value, json};

use tandem_native_core::layout::ParamLayout;

/// f32 elements converted per write.
const CHUNK: usize = 1 << 18;

/// Writes the tensors of `layout` from `buf` (names as in the layout) to `path` as one f32
/// safetensors file (`format = pt`). The data section follows the layout's order, so each
/// run of tensors lying back to back in `buf` is one positional write (the whole adapter, usually),
/// and a reader with the same layout can read it back as one run too. With `digest`, also
/// returns the file's weights digest ([`digest`], the run directory's `st256`).
pub fn write(
    path: &Path,
    layout: &ParamLayout,
    buf: &[f32],
    digest: bool,
) -> std::io::Result<Option<String>> {
    let mut entries: Vec<_> = layout.entries().iter().collect();
    entries.sort_by_key(|e| e.offset);
    let (f, data_start, offset) = open_with_header(
        path,
        entries.iter().map(|e| (e.name.as_str(), &e.shape[..])),
    )?;
    // (file byte offset, buffer range) of the current run of back-to-back tensors.
    let mut run: Option<(u64, std::ops::Range<usize>)> = None;
    let mut at = data_start;
    for e in &entries {
        let r = e.range();
        run = match run {
            Some((pos, cur)) if cur.end == r.start => Some((pos, cur.start..r.end)),
            Some((pos, cur)) => {
                write_values(&f, pos, &buf[cur])?;
                Some((at, r))
            }
            None => Some((at, r)),
        };
        at += (e.numel() * 4) as u64;
    }
    if let Some((pos, cur)) = run {
        write_values(&f, pos, &buf[cur])?;
    }
    f.set_len(data_start + offset as u64)?;
    digest.then(|| self::digest(layout, buf)).transpose()
}

/// The weights digest ([`tandem_plugin_api::files::digest`]) of the tensors of `layout` in
/// `buf` as [`write`] stores them: F32, their bytes the values' (little-endian machines).
/// The tensors are hashed in parallel.
pub fn digest(layout: &ParamLayout, buf: &[f32]) -> std::io::Result<String> {
    use rayon::prelude::*;
    use tandem_plugin_api::files::digest::{combine, tensor_hash};
    let hashes = layout
        .entries()
        .par_iter()
        .map(|e| {
            let shape: Vec<u64> = e.shape.iter().map(|&d| d as u64).collect();
            tensor_hash(
                &e.name,
                "F32",
                &shape,
                bytemuck::cast_slice(&buf[e.range()]),
            )
        })
        .collect();
    combine(hashes).map_err(|name| {
        std::io::Error::other(format!("two tensors of the layout are named `{name}`"))
    })
}

/// Writes the flat f32 tensors `(name, values)` (shape `[values.len()]`, in this order) to
/// `path` as one safetensors file, each streamed from its buffer as [`write`] streams weights:
/// the trainer's optimizer file (moments `m` and `v`, each as large as the trainable
/// parameters) is written with it.
pub fn write_flat(path: &Path, tensors: &[(&str, &[f32])]) -> std::io::Result<()> {
    let shapes: Vec<[usize; 1]> = tensors.iter().map(|(_, v)| [v.len()]).collect();
    let names = tensors.iter().map(|(n, _)| *n);
    let (f, start, len) = open_with_header(path, names.zip(shapes.iter().map(|s| &s[..])))?;
    let mut at = start;
    for (_, values) in tensors {
        write_values(&f, at, values)?;
        at += 4 * values.len() as u64;
    }
    f.set_len(start + len as u64)
}

/// Opens `path` for writing in place and writes the safetensors header of the F32 tensors
/// `(name, shape)`, their data back to back in this order; returns the file, the byte offset
/// where the data starts and the data's length in bytes.
fn open_with_header<'a>(
    path: &Path,
    tensors: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> std::io::Result<(std::fs::File, u64, usize)> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * 4;
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = (0u64).to_le_bytes().to_vec();
    text.extend_from_slice(Value::Object(header).to_string().as_bytes());
    // The data starts 8-byte aligned.
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let n = (text.len() - 8) as u64;
    text[..8].copy_from_slice(&n.to_le_bytes());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    f.write_all_at(&text, 0)?;
    Ok((f, text.len() as u64, offset))
}

/// Writes f32 values as little-endian bytes at byte `at` (large runs split over the cores,
/// [`tandem_native_core::par_io`]).
fn write_values(f: &std::fs::File, mut at: u64, values: &[f32]) -> std::io::Result<()> {
    if cfg!(target_endian = "little") {
        return tandem_native_core::par_io::write_all_at(f, at, bytemuck::cast_slice(values));
    }
    let mut out = Vec::with_capacity(4 * CHUNK.min(values.len()));
    for chunk in values.chunks(CHUNK) {
        out.clear();
        for x in chunk {
            out.extend_from_slice(&x.to_le_bytes());
        }
        f.write_all_at(&out, at)?;
        at += out.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use tandem_native_core::buffer::VecProvider;
    use tandem_native_core::config::ModelConfig;
    use tandem_native_core::init::Preset;
    use tandem_native_core::model::Model;
    use tandem_native_core::st_io;

    fn tiny(seed: u64) -> Model {
        let cfg: ModelConfig = Preset::Tiny.config();
        let mut m = Model::new_zeroed(cfg, &mut VecProvider::new()).unwrap();
        m.init_random(seed, 0.02);
        m
    }

    /// Writes `m`'s weights to `path` and checks that they load back bit for bit.
    fn write_and_check_bit_exact(m: &tandem_native_core::model::Model, path: &std::path::Path) {
        super::write(path, &m.layout, m.w(), false).unwrap();
        let mut back = vec![0f32; m.layout.total_len()];
        st_io::load_into(&[path.to_path_buf()], &m.layout, &mut back, &|n| {
            Some(n.to_string())
        })
        .unwrap();
        let a: Vec<u32> = m.w().iter().map(|x| x.to_bits()).collect();
        let b: Vec<u32> = back.iter().map(|x| x.to_bits()).collect();
        assert!(a == b);
    }

    #[test]
    fn streamed_file_loads_back_bit_exact() {
        let m = tiny(5);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        write_and_check_bit_exact(&m, &path);
    }

    #[test]
    fn a_longer_file_at_the_path_is_overwritten_and_cut_to_size() {
        let m = tiny(6);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let longer = vec![0x7fu8; m.layout.total_len() * 4 + 100_000];
        std::fs::write(&path, &longer).unwrap();
        write_and_check_bit_exact(&m, &path);
    }

    #[test]
    fn the_digest_is_the_run_directory_digest_of_the_file_written() {
        let m = tiny(8);
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let (fa, fb) = (a.join("model.safetensors"), b.join("model.safetensors"));
        assert_eq!(super::write(&fa, &m.layout, m.w(), false).unwrap(), None);
        let d = super::write(&fb, &m.layout, m.w(), true).unwrap();
        assert!(std::fs::read(&fa).unwrap() == std::fs::read(&fb).unwrap());
        // What an engine computes from the files equals what the trainer computed.
        let from_files = tandem_plugin_api::files::digest::digest_dir(&b).unwrap();
        assert_eq!(d.as_deref(), Some(from_files.as_str()));
        assert!(from_files.starts_with("st256:"), "{from_files}");
        let mut back = vec![0f32; m.layout.total_len()];
        let same = |n: &str| Some(n.to_string());
        st_io::load_into(&[fb], &m.layout, &mut back, &same).unwrap();
        assert!(
            back.iter()
                .zip(m.w())
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
    }

    #[test]
    fn flat_tensors_load_back_bit_exact_and_a_mismatch_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        let m: Vec<f32> = (0..1000).map(|i| (i as f32).sin() * 1e-3).collect();
        let v: Vec<f32> = (0..1000).map(|i| (i as f32).cos().powi(2) * 1e-6).collect();
        // Over a longer file: cut to size.
        std::fs::write(&path, vec![0x7fu8; 20_000]).unwrap();
        super::write_flat(&path, &[("m", &m), ("v", &v)]).unwrap();
        let (mut m2, mut v2) = (vec![0f32; 1000], vec![0f32; 1000]);
        st_io::load_flat(&path, &mut [("m", &mut m2), ("v", &mut v2)]).unwrap();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&m2), bits(&m));
        assert_eq!(bits(&v2), bits(&v));
        // `v` of another length: refused before `m` is read.
        let (mut m3, mut v3) = (vec![0f32; 1000], vec![0f32; 999]);
        let err = st_io::load_flat(&path, &mut [("m", &mut m3), ("v", &mut v3)]).unwrap_err();
        assert!(err.to_string().contains("`v`"), "{err}");
        assert!(m3.iter().all(|x| *x == 0.0));
    }
}
