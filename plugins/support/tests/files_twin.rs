//! The Python twin of the run-directory file contract (`tandem_torchrun.files`, what the
//! torch trainers run) against the Rust one (`tandem_plugin_api::files`, what every engine
//! runs), on the same files: digests of one-file and sharded directories, of tensors at hand,
//! of damaged files, and the versions a parent keeps after the same exports.

use std::path::{Path, PathBuf};
use std::process::Command;

use tandem_plugin_api::files::digest::{combine, digest_dir, tensor_hash};
use tandem_plugin_api::files::safetensors::write;
use tandem_plugin_api::files::state::{TrainerState, write_state};
use tandem_plugin_api::files::versions::{prepare_stage, publish, version_dir, versions};

/// The Python the plugins would drive (`TANDEM_PYTHON`), else `python3`: the twin needs only
/// the standard library.
fn python() -> String {
    std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// Runs `code` with the twin importable as `files`; returns its stdout as JSON.
fn run_python(code: &str, arg: &Path) -> serde_json::Value {
    let prelude = "import json, os, sys\nfrom tandem_torchrun import files\n";
    let out = Command::new(python())
        .arg("-c")
        .arg(format!("{prelude}{code}"))
        .arg(arg)
        .env("PYTHONPATH", package_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e} (set TANDEM_PYTHON to a Python 3)",
                python()
            )
        });
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn f32_bytes(n: usize, seed: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (seed - i as f32 / 3.0).to_le_bytes())
        .collect()
}

type Tensor = (String, &'static str, Vec<u64>, Vec<u8>);

fn tensors() -> Vec<Tensor> {
    vec![
        (
            "model.layers.0.mlp.up_proj.weight".into(),
            "F32",
            vec![64, 33],
            f32_bytes(64 * 33, 0.5),
        ),
        (
            "model.embed_tokens.weight".into(),
            "BF16",
            vec![10, 8],
            (0..160).map(|i| (i * 7) as u8).collect(),
        ),
        (
            "lm_head.weight".into(),
            "F16",
            vec![3, 5],
            (0..30).map(|i| i as u8).collect(),
        ),
        (
            "model.norm.weight".into(),
            "F32",
            vec![8],
            f32_bytes(8, -1.0),
        ),
    ]
}

fn write_file(path: &Path, ts: &[Tensor]) {
    let refs: Vec<_> = ts
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    write(path, &refs).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn python_and_rust_compute_the_same_digests_of_the_same_files() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ts = tensors();
    let one = root.path().join("one");
    let sharded = root.path().join("sharded");
    let damaged = root.path().join("damaged");
    for d in [&one, &sharded, &damaged] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
    }
    write_file(&one.join("model.safetensors"), &ts);
    std::fs::write(one.join("optimizer.safetensors"), b"moments").unwrap_or_default();
    let mut rev = ts.clone();
    rev.reverse();
    write_file(&sharded.join("model-1.safetensors"), &rev[..3]);
    write_file(&sharded.join("model-2.safetensors"), &rev[3..]);
    write_file(&damaged.join("model.safetensors"), &ts);
    let file = damaged.join("model.safetensors");
    let mut raw = std::fs::read(&file).unwrap_or_default();
    raw.truncate(raw.len() - 2);
    std::fs::write(&file, raw).unwrap_or_default();

    // The tensors at hand, as a trainer hashes them before writing: the same bytes in hex.
    let at_hand: Vec<serde_json::Value> = ts
        .iter()
        .map(|(n, d, s, b)| {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            serde_json::json!([n, d, s, hex])
        })
        .collect();
    let spec = root.path().join("tensors.json");
    std::fs::write(&spec, serde_json::Value::from(at_hand).to_string()).unwrap_or_default();

    let py = run_python(
        r#"
root = sys.argv[1]
ts = json.load(open(f"{root}/tensors.json"))
def digest_or_error(d):
    try:
        return files.digest_dir(d)
    except files.CorruptError as e:
        return "corrupt: " + str(e)
print(json.dumps({
    "at_hand": files.combine([files.tensor_hash(n, d, s, bytes.fromhex(h)) for n, d, s, h in ts]),
    "one": digest_or_error(f"{root}/one"),
    "sharded": digest_or_error(f"{root}/sharded"),
    "damaged": digest_or_error(f"{root}/damaged"),
}))
"#,
        root.path(),
    );
    let rust_at_hand = combine(
        ts.iter()
            .map(|(n, d, s, b)| tensor_hash(n, d, s, b))
            .collect(),
    )
    .unwrap_or_else(|n| panic!("duplicate {n}"));
    let rust_one = digest_dir(&one).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rust_one, rust_at_hand);
    assert_eq!(digest_dir(&sharded).ok().as_ref(), Some(&rust_one));
    assert_eq!(py["at_hand"], rust_at_hand.as_str());
    assert_eq!(py["one"], rust_one.as_str());
    assert_eq!(py["sharded"], rust_one.as_str());
    let rust_damaged = digest_dir(&damaged).err().map(|e| e.to_string());
    assert!(
        rust_damaged
            .as_deref()
            .is_some_and(|e| e.contains("truncated")),
        "{rust_damaged:?}"
    );
    let py_damaged = py["damaged"].as_str().unwrap_or_default();
    assert!(
        py_damaged.starts_with("corrupt: ") && py_damaged.contains("truncated"),
        "{py_damaged}"
    );
}

#[test]
fn python_and_rust_keep_the_same_versions_after_the_same_exports() {
    // (version, recycle) in order: a run, a re-export, a resume from an older version.
    let plan = [
        (1, false),
        (2, true),
        (3, false),
        (4, true),
        (4, true),
        (6, false),
        (2, true),
    ];
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let rust_parent = root.path().join("rust/weights");
    let mut rust_after = Vec::new();
    for (v, recycle) in plan {
        let stage = prepare_stage(&rust_parent, v, recycle).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&stage).unwrap_or_default();
        write_state(&stage, &TrainerState::new(v, 0)).unwrap_or_else(|e| panic!("{e}"));
        publish(&stage, &version_dir(&rust_parent, v), !recycle).unwrap_or_else(|e| panic!("{e}"));
        rust_after.push(versions(&rust_parent).unwrap_or_default());
    }
    let plan_json = serde_json::to_string(&plan).unwrap_or_default();
    let py = run_python(
        &format!(
            r#"
parent = sys.argv[1] + "/py/weights"
after = []
for v, recycle in json.loads({plan_json:?}):
    stage = files.prepare_stage(parent, v, recycle)
    os.makedirs(stage, exist_ok=True)
    files.write_state(stage, {{"weight_version": v, "adam_step": 0}})
    files.publish(stage, files.version_dir(parent, v), not recycle)
    after.append(files.versions(parent))
print(json.dumps({{"after": after, "saved": files.saved_version(files.version_dir(parent, 2))}}))
"#
        ),
        root.path(),
    );
    let rust_json = serde_json::to_value(&rust_after).unwrap_or_default();
    assert_eq!(py["after"], rust_json);
    assert_eq!(rust_after.last().map(Vec::as_slice), Some(&[2u64][..]));
    assert_eq!(py["saved"], 2);
}
