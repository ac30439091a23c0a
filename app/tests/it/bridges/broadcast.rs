//! The `broadcast` bridge end to end: a native trainer and two native engines in real worker
//! processes joined in a transport world (shm), the trainer's weights streamed in buckets to
//! both engines at once. Bit-exact scores vs the trainer after two steps; a manifest of another
//! model refused with the previous weights still served (and the broadcast completes for the
//! sender); a damaged or short bucket (the `fixture-lossy` test bridge) refused — before the
//! first copy with the previous weights still served, after it with the weights marked
//! damaged until a complete sync; an engine killed during a sync is one clear error, never a
//! hang.

use super::fixture::*;
use crate::common::{cdylib, plugin_dir};
use tandem_rl::bridge::BridgeDriver;
use tandem_runtime::registry::Registry;

fn options(text: &str) -> toml::Table {
    toml::from_str(text).unwrap()
}

/// A small bucket so the tiny model (12 MB) travels in a dozen buckets.
const ONE_MB: &str = "bucket_mb = 1.0";

#[test]
fn broadcast_streams_buckets_to_two_engines_bit_exact() {
    let m = model("tiny", 3);
    let mut r = rig_n(&m, &m, "", 2, Some(60.0), &[]);
    let mut d = BridgeDriver::builtin("broadcast", true, &options(ONE_MB)).unwrap();
    assert!(d.needs_transport());
    assert!(!d.restarts());
    // Nothing stays resident for the bridge: the trainer may offload its weights.
    assert!(d.trainer_offload_tags().contains(&"weights".to_string()));
    assert!(d.engine_release_tags().contains(&"weights".to_string()));
    r.pause();
    d.setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap();
    r.resume();
    let before = r.engine_probe(0);
    let weights = std::fs::metadata(m.join("model.safetensors"))
        .unwrap()
        .len();
    for step in 1..=2u64 {
        r.train_step();
        let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
        assert_eq!(
            (rec.version, rec.verified, rec.restarted),
            (step, true, false),
            "{rec:?}"
        );
        assert_eq!(rec.mode, "broadcast");
        // Every engine received the whole weights once (the safetensors file is the weights
        // plus a small header).
        let each = rec.bytes_moved / 2;
        assert!(
            each <= weights && each + 64 * 1024 > weights,
            "{} bytes per engine for {weights} bytes of weights",
            each
        );
        r.resume();
        let trainer = bits(&r.trainer_probe());
        for i in 0..2 {
            assert_eq!(
                bits(&r.engine_probe(i)),
                trainer,
                "engine {i} at step {step}"
            );
            assert_eq!(r.engines[i].health().unwrap().weight_version, step);
        }
    }
    assert_ne!(
        bits(&before),
        bits(&r.engine_probe(0)),
        "training changed nothing"
    );
    r.shutdown();
}

#[test]
fn broadcast_of_another_model_is_refused_and_the_previous_weights_serve() {
    let tiny = model("tiny", 3);
    let small = model("small", 3);
    let mut r = rig_n(&tiny, &small, "", 2, Some(60.0), &[]);
    let mut d = BridgeDriver::builtin("broadcast", true, &options(ONE_MB)).unwrap();
    r.pause();
    d.setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap();
    r.resume();
    let before: Vec<_> = (0..2).map(|i| bits(&r.engine_probe(i))).collect();
    r.train_step();
    // Both engines refuse the manifest before a byte is copied, and still take every bucket
    // off the group: the sender's broadcast completes (no timeout), the error is the engines'.
    let e = d
        .sync(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not take v1"), "{e}");
    assert!(e.contains("the engine serves F32"), "{e}");
    assert!(e.contains("previous weights keep serving"), "{e}");
    assert!(!e.contains("trainer's send"), "the sender finished: {e}");
    assert_eq!(d.version(), None);
    r.resume();
    for (i, b) in before.iter().enumerate() {
        assert_eq!(r.engines[i].health().unwrap().weight_version, 0);
        assert_eq!(&bits(&r.engine_probe(i)), b, "engine {i}");
    }
    r.shutdown();
}

#[test]
fn an_engine_killed_during_a_broadcast_is_one_clear_error() {
    let m = model("small", 3);
    // A short transport timeout: the surviving engine waits for buckets the trainer stopped
    // sending when its peer died, and gives up after it.
    let mut r = rig_n(&m, &m, "", 2, Some(15.0), &[]);
    let mut d = BridgeDriver::builtin("broadcast", true, &options(ONE_MB)).unwrap();
    r.pause();
    d.setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap();
    r.resume();
    r.train_step();
    let victim = r.engines[1].pid();
    // Killed while the sync runs (before its first bucket or during the stream: the outcome
    // must be the same error either way).
    let killer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(30));
        let _ = std::process::Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status();
    });
    let e = d
        .sync(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap_err()
        .to_string();
    killer.join().unwrap();
    eprintln!("the sync's error: {e}");
    assert!(e.contains("broadcast bridge: engine rank 1"), "{e}");
    assert!(e.contains("did not take v1"), "{e}");
    assert_eq!(d.version(), None);
    // The survivor serves either its previous weights or nothing (damaged), never a mix.
    let h = r.engines[0].health().unwrap();
    assert!(h.weight_version == 0, "{h:?}");
    let _ = r.launcher.shutdown(std::time::Duration::from_secs(10));
}

/// A driver for the `lossy` fixture bridge (found in `dir`) damaging bucket `k` as `damage`.
fn lossy(dir: &std::path::Path, k: u32, damage: &str) -> BridgeDriver {
    let registry = Registry::discover(&[dir.to_path_buf()]).unwrap();
    let opts = options(&format!(
        "bucket_mb = 1.0\ndamage_bucket = {k}\ndamage = \"{damage}\""
    ));
    BridgeDriver::from_registry(&registry, "lossy", true, &opts).unwrap()
}

#[test]
fn a_damaged_bucket_is_never_served() {
    let lib = cdylib("fixture_lossy");
    let dir = plugin_dir(&[(&lib, "libfixture_lossy.so")]);
    let m = model("tiny", 3);
    let dirs = [dir.path().to_path_buf()];
    let mut r = rig_n(&m, &m, "", 2, Some(60.0), &dirs);
    let before: Vec<_> = (0..2).map(|i| bits(&r.engine_probe(i))).collect();
    r.train_step();

    // The first bucket damaged: nothing was copied, the previous weights keep serving.
    let mut d = lossy(dir.path(), 0, "flip");
    let e = d
        .sync(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum does not match"), "{e}");
    assert!(e.contains("previous weights keep serving"), "{e}");
    assert!(!e.contains("trainer's send"), "the sender finished: {e}");
    r.resume();
    for (i, b) in before.iter().enumerate() {
        assert_eq!(r.engines[i].health().unwrap().weight_version, 0);
        assert_eq!(&bits(&r.engine_probe(i)), b, "engine {i}");
    }

    // A later bucket short: the buckets before it were copied, so the engines refuse to serve
    // the mix until a complete sync.
    r.pause();
    let mut d = lossy(dir.path(), 2, "short");
    let e = d
        .sync(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bytes expected"), "{e}");
    assert!(e.contains("buckets before it were already copied"), "{e}");
    r.resume();
    for e in &r.engines {
        let h = e.health().unwrap();
        assert!(!h.ready, "{h:?}");
        let refused = e.score(vec![PROBE.to_vec()]).unwrap_err().to_string();
        assert!(refused.contains("damaged"), "{refused}");
    }

    // A complete sync over the real bridge heals them, bit-exact.
    r.pause();
    let mut d = BridgeDriver::builtin("broadcast", true, &options(ONE_MB)).unwrap();
    let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    assert_eq!(rec.version, 1);
    r.resume();
    let trainer = bits(&r.trainer_probe());
    for i in 0..2 {
        assert!(r.engines[i].health().unwrap().ready);
        assert_eq!(bits(&r.engine_probe(i)), trainer, "engine {i}");
    }
    r.shutdown();
}
