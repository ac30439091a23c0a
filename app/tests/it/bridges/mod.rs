//! Weight bridges end to end: a native trainer and native engines in real `tandem worker`
//! processes, one SFT step, a sync through [`BridgeDriver`] in each mode, and the engine's
//! `score` on a probe batch against the trainer's `compute_logprobs` (bit-exact for `ipc` and
//! `checkpoint`, ≤ 1e-5 for `lora`). Failure cases: a corrupt adapter, a mismatched adapter,
//! a checkpoint that vanished before the restart, an engine killed during its restart, a
//! layout mismatch at `ipc` setup — each one clear error with the previous version still
//! what the engine serves.

#![allow(clippy::unwrap_used)]

mod broadcast;
mod fixture;

use fixture::*;
use std::path::{Path, PathBuf};
use tandem_control::Role;
use tandem_plugin_api::{
    GenerateRequest, PauseMode, RVec, SamplingParams, Shipment, UpdateKind, UpdatePayload,
};
use tandem_rl::bridge::BridgeDriver;
// The built-in bridges, registered when linked.
use tandem_plugin_bridges as _;
use tandem_runtime::launch::{LaunchOptions, LocalLauncher, RemoteEngine};

#[test]
fn ipc_serves_the_trainers_memory_in_place_bit_exact() {
    let m = model("tiny", 3);
    let mut r = rig(&m, &m, "");
    let mut d = BridgeDriver::builtin("ipc", true, &no_options()).unwrap();
    assert!(!d.trainer_offload_tags().contains(&"weights".to_string()));
    assert!(!d.engine_release_tags().contains(&"weights".to_string()));
    assert_eq!(d.engine_release_tags(), ["kv_cache", "activations"]);
    r.pause();
    d.setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap();
    r.resume();
    let before = r.engine_probe(0);
    for step in 1..=2u64 {
        r.train_step();
        let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
        assert_eq!(
            (rec.version, rec.bytes_moved, rec.verified, rec.restarted),
            (step, 0, true, false),
            "{rec:?}"
        );
        assert_eq!(rec.mode, "ipc");
        assert!(rec.digest.starts_with("w64:"), "{rec:?}");
        assert!(rec.peak_rss_bytes > 0);
        r.resume();
        assert_eq!(bits(&r.engine_probe(0)), bits(&r.trainer_probe()));
        assert_eq!(r.version(), step);
    }
    assert_ne!(
        bits(&before),
        bits(&r.engine_probe(0)),
        "training changed nothing"
    );
    // The tensor layout travels with the first export of the region only (the driver keeps
    // it for engines that attach later).
    let again = r
        .trainer
        .export_weight_update(UpdateKind::SharedRegion)
        .unwrap();
    let UpdatePayload::SharedRegion { tensors, .. } = &again.payload else {
        panic!("{again:?}")
    };
    assert!(tensors.is_empty(), "{again:?}");
    let stats = r.engines[0].stats().unwrap();
    let shared = stats
        .metrics
        .iter()
        .find(|m| m.name.as_str() == "shared_weights");
    assert_eq!(shared.map(|m| m.value), Some(1.0), "{stats:?}");
    // The engine serving the shared weights refuses to release them (the bridge's plan keeps
    // them out of the tags the loop offloads and releases, checked above).
    r.engines[0].pause_generation(PauseMode::Wait).unwrap();
    let e = r.engines[0]
        .release_memory(&["weights".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ipc"), "{e}");
    // What the loop does offload/release still works.
    r.trainer.offload(&d.trainer_offload_tags()).unwrap();
    r.engines[0]
        .release_memory(&d.engine_release_tags())
        .unwrap();
    r.engines[0]
        .resume_memory(&d.engine_release_tags())
        .unwrap();
    r.trainer.onload(&d.trainer_offload_tags()).unwrap();
    r.resume();
    assert_eq!(bits(&r.engine_probe(0)), bits(&r.trainer_probe()));
    r.shutdown();
}

#[test]
fn ipc_setup_refuses_a_layout_mismatch_in_one_error() {
    let dir = tempfile::tempdir().unwrap();
    // Another architecture: the small preset for the engine, tiny for the trainer.
    let tiny = model("tiny", 3);
    let small = model("small", 3);
    let mut r = rig(&tiny, &small, "");
    let _ = dir;
    let mut d = BridgeDriver::builtin("ipc", true, &no_options()).unwrap();
    let before = r.engine_probe(0);
    r.pause();
    let e = d
        .setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap_err()
        .to_string();
    assert!(e.contains("layout mismatch"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    // The engine still serves its own weights (the refused update left it paused).
    r.resume();
    assert_eq!(bits(&before), bits(&r.engine_probe(0)));
}

#[test]
fn lora_hot_swaps_versioned_adapters_and_refuses_bad_ones() {
    let m = model("tiny", 3);
    let lora = r#"{"lora": {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"], "seed": 1}}"#;
    let mut r = rig(&m, &m, lora);
    let mut d = BridgeDriver::builtin("lora", true, &no_options()).unwrap();
    d.setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap();
    assert_eq!(d.request_adapter(), None);
    r.train_step();
    let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    assert_eq!((rec.version, rec.verified, rec.restarted), (1, true, false));
    assert!(rec.bytes_moved > 0, "{rec:?}");
    assert_eq!(d.request_adapter().as_deref(), Some("native-v1"));
    r.resume();
    let close = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5, "engine {a:?} vs trainer {b:?}");
        }
    };
    close(&r.engine_probe(0), &r.trainer_probe());
    let (tokens_v1, v) = r.generate(d.request_adapter());
    assert_eq!(v, 1);

    // Second step: v2 replaces v1 (v1 unloaded).
    r.train_step();
    d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    assert_eq!(d.request_adapter().as_deref(), Some("native-v2"));
    r.resume();
    close(&r.engine_probe(0), &r.trainer_probe());
    let stats = r.engines[0].stats().unwrap();
    let n = stats.metrics.iter().find(|m| m.name.as_str() == "adapters");
    assert_eq!(n.map(|m| m.value), Some(1.0), "previous adapter unloaded");
    let served_v2 = r.engine_probe(0);
    let _ = tokens_v1;

    // A corrupt adapter: refused, v2 still what generates.
    r.train_step();
    let update = r.trainer.export_weight_update(UpdateKind::Adapter).unwrap();
    let UpdatePayload::Adapter { dir, .. } = &update.payload else {
        panic!("{update:?}")
    };
    let file = Path::new(dir.as_str()).join("adapter_model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 8..].copy_from_slice(&[0x7f; 8]);
    std::fs::write(&file, &bytes).unwrap();
    let e = d
        .apply(
            Shipment::from_update(update.clone()),
            &r.trainer,
            &mut r.engines,
            &mut r.launcher,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("digest mismatch") && e.contains("previous weights"),
        "{e}"
    );
    assert_eq!(d.request_adapter().as_deref(), Some("native-v2"));
    r.resume();
    assert_eq!(r.version(), 2);
    assert_eq!(bits(&served_v2), bits(&r.engine_probe(0)));

    // A mismatched adapter (another rank, same names): refused, v2 still served.
    let other = r.run_dir.join("other-adapter");
    {
        let dir = tempfile::tempdir().unwrap();
        let mut o = LaunchOptions::new(dir.path());
        o.exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_tandem")));
        let mut l2 = LocalLauncher::new(o).unwrap();
        let lora8 = r#"{"lora": {"rank": 8, "alpha": 8.0, "targets": ["q_proj"], "seed": 2}}"#;
        let t2 = l2
            .spawn_trainers(&[spec(Role::Trainer, &m, lora8, dir.path())])
            .unwrap()
            .pop()
            .unwrap();
        t2.init().unwrap();
        t2.save_checkpoint(other.to_str().unwrap()).unwrap();
    }
    let mut mismatched = update.clone();
    mismatched.payload = UpdatePayload::Adapter {
        name: "native-v3".into(),
        dir: other.display().to_string().into(),
    };
    r.pause();
    let e = d
        .apply(
            Shipment::from_update(mismatched),
            &r.trainer,
            &mut r.engines,
            &mut r.launcher,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("digest mismatch"), "{e}");
    r.resume();
    assert_eq!(r.version(), 2);
    assert_eq!(bits(&served_v2), bits(&r.engine_probe(0)));

    // A fresh export of the same step goes through.
    r.pause();
    d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    r.resume();
    close(&r.engine_probe(0), &r.trainer_probe());
    assert_eq!(r.version(), 3);
    // The run dir keeps the two newest adapter versions (v1's dir was recycled for v3).
    let mut kept: Vec<String> = std::fs::read_dir(r.run_dir.join("adapters"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["v2", "v3"]);
}

#[test]
fn checkpoint_restarts_the_engine_on_an_atomic_checkpoint() {
    let m = model("tiny", 3);
    let mut r = rig(&m, &m, "");
    let mut d = BridgeDriver::builtin("checkpoint", true, &no_options()).unwrap();
    assert!(d.restarts());
    d.setup(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap();
    r.train_step();
    let old_pid = r.engines[0].pid();
    let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    assert_eq!((rec.version, rec.verified, rec.restarted), (1, true, true));
    assert!(rec.bytes_moved > 0);
    assert_ne!(r.engines[0].pid(), old_pid, "the engine was restarted");
    // The restarted engine serves at once, at the new version, bit-exact.
    assert!(r.engines[0].health().unwrap().ready);
    assert_eq!(r.version(), 1);
    assert_eq!(bits(&r.engine_probe(0)), bits(&r.trainer_probe()));
    assert!(r.run_dir.join("weights/v1/config.json").is_file());
    assert!(!r.run_dir.join("weights/.v1.stage").exists());
    let (tokens_v1, v) = r.generate(None);
    assert_eq!(v, 1);
    let served_v1 = r.engine_probe(0);

    // The checkpoint vanishes before the restart: clear error, v1 keeps serving.
    let (update, dir) = r.train_and_export_checkpoint();
    std::fs::remove_dir_all(&dir).unwrap();
    let pid = r.engines[0].pid();
    let e = d
        .apply(
            Shipment::from_update(update),
            &r.trainer,
            &mut r.engines,
            &mut r.launcher,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vanished") && e.contains("previous weights"),
        "{e}"
    );
    assert_eq!(r.engines[0].pid(), pid);
    r.resume();
    assert_eq!(r.generate(None), (tokens_v1.clone(), 1));
    assert_eq!(bits(&served_v1), bits(&r.engine_probe(0)));

    // The new engine is killed during its restart: clear error, v1 keeps serving.
    r.engines[0].pause_generation(PauseMode::Wait).unwrap();
    d.set_restart_hook(Some(Box::new(|e: &RemoteEngine| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(e.pid() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    })));
    let e = d
        .sync(&r.trainer, &mut r.engines, &mut r.launcher)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("previous weights") && e.contains("SIGKILL"),
        "{e}"
    );
    assert_eq!(r.engines[0].pid(), pid);
    r.resume();
    assert_eq!(r.generate(None), (tokens_v1, 1));

    // Without the hook the same step goes through.
    d.set_restart_hook(None);
    r.engines[0].pause_generation(PauseMode::Wait).unwrap();
    let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    assert_eq!(rec.version, 2);
    assert_eq!(bits(&r.engine_probe(0)), bits(&r.trainer_probe()));
    r.shutdown();
}

#[test]
fn checkpoint_without_restart_reloads_in_place() {
    let m = model("tiny", 3);
    let mut r = rig(&m, &m, "");
    let opts: toml::Table = toml::from_str("restart = false").unwrap();
    let mut d = BridgeDriver::builtin("checkpoint", true, &opts).unwrap();
    assert!(!d.restarts());
    r.train_step();
    let pid = r.engines[0].pid();
    let rec = d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
    assert_eq!((rec.version, rec.verified, rec.restarted), (1, true, false));
    assert_eq!(r.engines[0].pid(), pid);
    r.resume();
    let served_v1 = r.engine_probe(0);
    assert_eq!(bits(&served_v1), bits(&r.trainer_probe()));
    // A damaged checkpoint is refused before it touches the served weights (its digest is
    // streamed from the file before the read in place): v1 keeps serving, bit-exact.
    let (update, dir) = r.train_and_export_checkpoint();
    let file = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 6;
    bytes[at] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let e = d
        .apply(
            Shipment::from_update(update),
            &r.trainer,
            &mut r.engines,
            &mut r.launcher,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("digest mismatch") && e.contains("previous weights"),
        "{e}"
    );
    r.resume();
    assert_eq!(bits(&served_v1), bits(&r.engine_probe(0)));
    assert_eq!(r.version(), 1);
    // Later syncs go through; `weights/` keeps the newest two checkpoints, not one per sync.
    for _ in 0..3 {
        r.train_step();
        d.sync(&r.trainer, &mut r.engines, &mut r.launcher).unwrap();
        r.resume();
        assert_eq!(bits(&r.engine_probe(0)), bits(&r.trainer_probe()));
    }
    let mut kept: Vec<String> = std::fs::read_dir(r.run_dir.join("weights"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["v4", "v5"]);
    // Versions only go up: an older update is refused (by the lifecycle state machine), and
    // the engine keeps serving v5.
    r.engines[0].pause_generation(PauseMode::Wait).unwrap();
    let mut old = r
        .trainer
        .export_weight_update(UpdateKind::CheckpointDir)
        .unwrap();
    old.version = 0;
    let e = r.engines[0]
        .apply_weight_update(old)
        .unwrap_err()
        .to_string();
    assert!(e.contains("version 0 is below the served version 5"), "{e}");
    r.resume();
    assert_eq!(r.version(), 5);
    assert_eq!(bits(&r.engine_probe(0)), bits(&r.trainer_probe()));
    // The version survives a restart: a trainer started on the exported checkpoint goes on
    // from it.
    let dir = tempfile::tempdir().unwrap();
    let mut o = LaunchOptions::new(dir.path());
    o.exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_tandem")));
    let mut l2 = LocalLauncher::new(o).unwrap();
    let ckpt = r.run_dir.join("weights/v5");
    let t2 = l2
        .spawn_trainers(&[spec(Role::Trainer, &ckpt, "", dir.path())])
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(t2.init().unwrap().weight_version, 5);
}

#[test]
fn bad_bridge_settings_are_one_line_errors() {
    for (mode, opts, want) in [
        ("zip", "", "no loaded plugin provides the bridge `zip`"),
        ("broadcast", "bucket_mb = 0", "bucket_mb"),
        ("ipc", "restart = true", "bridge.options.restart"),
        ("checkpoint", "restart = 3", "bridge.options.restart"),
    ] {
        let t: toml::Table = toml::from_str(opts).unwrap();
        let e = BridgeDriver::builtin(mode, true, &t)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(want), "{mode}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn worker_components_get_host_regions_that_release_really_frees() {
    let m = model("tiny", 3);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = LaunchOptions::new(dir.path());
    opts.exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_tandem")));
    let mut launcher = LocalLauncher::new(opts).unwrap();
    let big_kv = r#"{"max_batch": 8, "max_seq_len": 1024}"#;
    let engine = launcher
        .spawn_engines(&[spec(Role::Engine, &m, big_kv, dir.path())])
        .unwrap()
        .pop()
        .unwrap();
    let stats = engine.stats().unwrap();
    let get = |name: &str| {
        stats
            .metrics
            .iter()
            .find(|x| x.name.as_str() == name)
            .map(|x| x.value)
    };
    assert_eq!(get("host_regions"), Some(1.0), "{stats:?}");
    let kv = get("allocated_bytes.kv_cache").unwrap() as u64;
    assert!(kv >= 32 << 20, "{kv}");
    let request = || GenerateRequest {
        prompts: vec![RVec::from(vec![1u32, 40, 41])].into(),
        sampling: SamplingParams {
            temperature: 0.0,
            max_tokens: 4,
            ..SamplingParams::default()
        },
        adapter: None.into(),
    };
    let before = engine.generate(request()).unwrap().completions[0]
        .tokens
        .to_vec();
    engine.pause_generation(PauseMode::Wait).unwrap();
    engine.flush_cache().unwrap(); // every KV page written (resident)
    // Pss of the worker's memfd mappings only (the memory layer's regions): the kernel's own
    // count for the regions, without the heap and thread stacks that move under load.
    let pss = || region_pss(engine.pid());
    let resident = pss();
    engine.release_memory(&["kv_cache".into()]).unwrap();
    let released = pss();
    assert!(
        resident.saturating_sub(released) >= kv * 9 / 10,
        "Pss {resident} -> {released}, KV cache {kv} bytes"
    );
    engine.resume_memory(&["kv_cache".into()]).unwrap();
    engine.continue_generation().unwrap();
    assert_eq!(
        engine.generate(request()).unwrap().completions[0]
            .tokens
            .to_vec(),
        before
    );
}
