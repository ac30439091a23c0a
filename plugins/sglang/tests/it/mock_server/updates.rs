//! Weight updates through the stand-in: a checkpoint's files checked against the update's
//! digest before the server is asked, the server's checksum checked after the load (a
//! mismatch rolls back), the version read back; adapters loaded under versioned names.

use super::*;
use tandem_plugin_api::files;

#[test]
fn updates_read_the_version_back_and_roll_back_a_wrong_digest() {
    // Two checkpoint dirs of real files; the stand-in's checksum is always `a`'s digest.
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ckpt = |name: &str, fill: u8| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let bytes = [fill; 16];
        let t = [("w", "F32", &[4u64][..], &bytes[..])];
        files::safetensors::write(&dir.join("model.safetensors"), &t)
            .unwrap_or_else(|e| panic!("{e}"));
        let digest = files::digest::digest_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        (dir.display().to_string(), digest)
    };
    let (a, da) = ckpt("a", 1);
    let (b, db) = ckpt("b", 2);
    let served = da.clone();
    let mock = Mock::start(Box::new(move |_, path, _| {
        (path == "/weights_checker").then(|| {
            Reply::Json(
                200,
                json!({"success": true, "message": "", "checksum": served}),
            )
        })
    }));
    let h = engine(&mock, "");
    let update = |version: u64, dir: &str, digest: &str| WeightUpdate {
        version,
        payload: UpdatePayload::CheckpointDir { dir: dir.into() },
        digest: digest.into(),
    };
    ok(h.engine.pause_generation(PauseMode::Wait));
    let report = ok(h.engine.apply_weight_update(update(2, &a, &da)));
    assert_eq!((report.version, report.digest.as_str()), (2, da.as_str()));
    // A lower version is the machine's refusal.
    assert_eq!(
        err(h.engine.apply_weight_update(update(1, &a, ""))).code,
        ErrorCode::InvalidState
    );
    // Files that do not match the update's digest: refused before the server is asked.
    let e = err(h.engine.apply_weight_update(update(3, &b, &da)));
    assert_eq!(e.code, ErrorCode::Corrupt);
    assert!(
        e.message.contains("digest mismatch") && e.message.contains(&db),
        "{e}"
    );
    // Files that match, a server that checksums otherwise: rolled back to `a` at v2.
    let e = err(h.engine.apply_weight_update(update(3, &b, &db)));
    assert_eq!(e.code, ErrorCode::Corrupt);
    assert!(e.message.contains("digest mismatch"), "{e}");
    ok(h.engine.continue_generation());
    assert_eq!(ok(h.engine.health()).weight_version, 2);
    let disk = |dir: &str, v: &str| json!({"model_path": dir, "weight_version": v});
    let checksum = json!({"action": "checksum"});
    assert_eq!(
        calls(&mock)[1..],
        want(&[
            ("/update_weights_from_disk", disk(&a, "2")),
            ("/weights_checker", checksum.clone()),
            ("/update_weights_from_disk", disk(&b, "3")),
            ("/weights_checker", checksum),
            ("/update_weights_from_disk", disk(&a, "2")),
            ("/continue_generation", json!({})),
        ])
    );
    // An adapter update loads the versioned name, labels the version, unloads the previous.
    ok(h.engine.pause_generation(PauseMode::Wait));
    for (v, name) in [(4, "tandem-v4"), (5, "tandem-v5")] {
        let u = WeightUpdate {
            version: v,
            payload: UpdatePayload::Adapter {
                name: name.into(),
                dir: "/a".into(),
            },
            digest: "".into(),
        };
        ok(h.engine.apply_weight_update(u));
    }
    assert_eq!(
        calls(&mock)[3..],
        want(&[
            (
                "/load_lora_adapter",
                json!({"lora_name": "tandem-v5", "lora_path": "/a"})
            ),
            ("/unload_lora_adapter", json!({"lora_name": "tandem-v4"})),
            (
                "/update_weight_version",
                json!({"new_version": "5", "abort_all_requests": false})
            ),
        ])
    );
    ok(h.engine.continue_generation());
    assert_eq!(ok(h.engine.health()).weight_version, 5);
}
