//! The file contract's behaviour on real files: digests equal across layouts and sensitive to
//! every change, corrupt files refused, the two-version rule, the state file.

use std::path::Path;

use super::digest::{combine, digest_dir, tensor_hash, verify_dir};
use super::safetensors::write;
use super::state::{STATE_FILE, TrainerState, read_state, saved_version, write_state};
use super::versions::{keep_only, prepare_stage, publish, version_dir, versions};
use super::{FilesError, dir_bytes};

fn bytes_f32(n: usize, seed: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (seed + i as f32 * 0.25).to_le_bytes())
        .collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

fn ok<T>(r: Result<T, FilesError>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// Name, dtype, shape, bytes.
type Tensor = (String, &'static str, Vec<u64>, Vec<u8>);

/// Three tensors: two F32, one BF16-sized (raw bytes).
fn tensors() -> Vec<Tensor> {
    vec![
        (
            "model.embed.weight".into(),
            "F32",
            vec![4, 3],
            bytes_f32(12, 1.0),
        ),
        (
            "model.norm.weight".into(),
            "F32",
            vec![3],
            bytes_f32(3, -2.0),
        ),
        (
            "lm_head.weight".into(),
            "BF16",
            vec![2, 3],
            (0u8..12).collect(),
        ),
    ]
}

fn write_all(path: &Path, ts: &[Tensor]) {
    let refs: Vec<_> = ts
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    ok(write(path, &refs));
}

fn in_memory(ts: &[Tensor]) -> String {
    let hashes = ts
        .iter()
        .map(|(n, d, s, b)| tensor_hash(n, d, s, b))
        .collect();
    combine(hashes).unwrap_or_else(|n| panic!("duplicate {n}"))
}

#[test]
fn the_digest_of_files_equals_the_digest_of_the_tensors_whatever_the_sharding() {
    let ts = tensors();
    let want = in_memory(&ts);
    assert!(want.starts_with("st256:3:"), "{want}");

    let one = tmp();
    write_all(&one.path().join("model.safetensors"), &ts);
    std::fs::write(one.path().join("optimizer.safetensors"), b"not weights").unwrap_or_default();
    assert_eq!(ok(digest_dir(one.path())), want);

    // Two shards, the tensors in another order, with an index naming them.
    let two = tmp();
    let mut rev = ts.clone();
    rev.reverse();
    write_all(
        &two.path().join("model-00001-of-00002.safetensors"),
        &rev[..1],
    );
    write_all(
        &two.path().join("model-00002-of-00002.safetensors"),
        &rev[1..],
    );
    let index = serde_json::json!({"weight_map": {
        "lm_head.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors",
        "model.embed.weight": "model-00002-of-00002.safetensors",
    }});
    std::fs::write(
        two.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ok(digest_dir(two.path())), want);
}

#[test]
fn every_change_to_a_tensor_changes_the_digest() {
    let base = in_memory(&tensors());
    let changes: [fn(&mut Vec<Tensor>); 5] = [
        |t| t[0].3[5] ^= 1,
        |t| t[1].0 = "model.norm.bias".into(),
        |t| t[0].2 = vec![3, 4],
        |t| t[2].1 = "F16",
        |t| {
            t.pop();
        },
    ];
    let mut seen = vec![base];
    for change in changes {
        let mut ts = tensors();
        change(&mut ts);
        let d = in_memory(&ts);
        assert!(!seen.contains(&d), "{d} repeats an earlier digest");
        seen.push(d);
    }
}

#[test]
fn a_damaged_or_truncated_file_is_refused_as_corrupt() {
    let ts = tensors();
    let want = in_memory(&ts);
    let dir = tmp();
    let file = dir.path().join("model.safetensors");
    write_all(&file, &ts);
    assert_eq!(ok(verify_dir(dir.path(), &want)), want);
    assert_eq!(
        ok(verify_dir(dir.path(), "")),
        "",
        "no digest asked: nothing read"
    );

    let mut raw = std::fs::read(&file).unwrap_or_default();
    let last = raw.len() - 1;
    raw[last] ^= 0x40;
    std::fs::write(&file, &raw).unwrap_or_else(|e| panic!("{e}"));
    let e = verify_dir(dir.path(), &want).err().map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains(&want) && e.contains("damaged")),
        "{e:?}"
    );

    std::fs::write(&file, &raw[..raw.len() - 4]).unwrap_or_else(|e| panic!("{e}"));
    let e = digest_dir(dir.path());
    assert!(
        matches!(&e, Err(FilesError::Corrupt { detail, .. }) if detail.contains("truncated")),
        "{e:?}"
    );
    std::fs::write(&file, b"\xff\xff\xff\xff\xff\xff\xff\x7f{}").unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        digest_dir(dir.path()),
        Err(FilesError::Corrupt { .. })
    ));
    let plugin: crate::PluginError = ok_err(digest_dir(dir.path())).into();
    assert_eq!(plugin.code, crate::ErrorCode::Corrupt);
}

fn ok_err<T: std::fmt::Debug>(r: Result<T, FilesError>) -> FilesError {
    r.err().unwrap_or_else(|| panic!("expected an error"))
}

#[test]
fn a_tensor_in_two_shards_and_a_directory_without_weights_are_refused() {
    let ts = tensors();
    let dir = tmp();
    write_all(&dir.path().join("a.safetensors"), &ts[..2]);
    write_all(&dir.path().join("b.safetensors"), &ts[1..]);
    let e = ok_err(digest_dir(dir.path())).to_string();
    assert!(
        e.contains("model.norm.weight") && e.contains("more than one"),
        "{e}"
    );
    let empty = tmp();
    let e = ok_err(digest_dir(empty.path())).to_string();
    assert!(e.contains("no *.safetensors"), "{e}");
}

/// One export of version `v` through the contract: stage, one file, publish.
fn export(parent: &Path, v: u64, recycle: bool) {
    let stage = ok(prepare_stage(parent, v, recycle));
    std::fs::create_dir_all(&stage).unwrap_or_else(|e| panic!("{e}"));
    if recycle && stage.join("w.bin").exists() {
        // A recycled stage still holds an older version's file until it is rewritten.
        ok(keep_only(&stage, &["w.bin", STATE_FILE]));
    }
    std::fs::write(stage.join("w.bin"), v.to_le_bytes()).unwrap_or_else(|e| panic!("{e}"));
    ok(write_state(&stage, &TrainerState::new(v, v * 10)));
    ok(publish(
        &stage,
        &version_dir(parent, v),
        v.is_multiple_of(2),
    ));
}

#[test]
fn a_parent_keeps_the_two_newest_versions_recycled_or_not() {
    for recycle in [false, true] {
        let run = tmp();
        let parent = run.path().join("weights");
        export(&parent, 1, recycle);
        assert_eq!(ok(versions(&parent)), [1]);
        for v in 2..=5 {
            export(&parent, v, recycle);
            assert_eq!(ok(versions(&parent)), [v - 1, v], "recycle {recycle}");
            assert_eq!(saved_version(&version_dir(&parent, v)), Some(v));
        }
        // A re-export of the newest version, and a stage left by an export that died.
        std::fs::create_dir_all(parent.join(".v9.stage")).unwrap_or_else(|e| panic!("{e}"));
        export(&parent, 5, recycle);
        assert_eq!(ok(versions(&parent)), [4, 5]);
        // A resume from an older checkpoint: the newer versions go.
        export(&parent, 3, recycle);
        assert_eq!(ok(versions(&parent)), [3]);
        let names: Vec<String> = std::fs::read_dir(&parent)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(names, ["v3"], "no stage left behind");
        let v3 = version_dir(&parent, 3);
        assert_eq!(
            std::fs::read(v3.join("w.bin")).ok(),
            Some(3u64.to_le_bytes().to_vec())
        );
        assert!(dir_bytes(&v3) > 8);
    }
}

#[test]
fn the_state_file_keeps_unknown_fields_and_refuses_garbage() {
    let dir = tmp();
    assert_eq!(ok(read_state(dir.path())), None);
    let mut s = TrainerState::new(7, 70);
    s.extra.insert("value_head".into(), true.into());
    ok(write_state(dir.path(), &s));
    assert_eq!(ok(read_state(dir.path())), Some(s));
    std::fs::write(dir.path().join(STATE_FILE), "{\"adam_step\": 3}").unwrap_or_default();
    assert!(matches!(
        read_state(dir.path()),
        Err(FilesError::Corrupt { .. })
    ));
    assert_eq!(saved_version(dir.path()), None);
}
