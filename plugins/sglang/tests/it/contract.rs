//! Every request the `sglang` engine sends validates against SGLang 0.5.23's own request
//! definitions: the engine, attached to a fresh `tandem serve`, is driven through every route
//! it uses (generate, score, the three pause modes, flush, release/resume, a checkpoint and an
//! adapter update from the native trainer, load/unload, health) with `trace_requests` on, and
//! `python/sglang_contract/check.py` judges the trace with SGLang's own types (and the
//! responses where SGLang defines their shape). Needs the workspace built and a Python with
//! the sglang wheel (`TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1)`): `--ignored`.

#[allow(dead_code)] // `server_for` serves the conformance suite only.
use crate::support;
use tandem_conformance::tiny_model;
use tandem_conformance::{EngineHarness, EngineSetup, Source, TrainerHarness, TrainerSetup};
use tandem_plugin_api::{PResult, PauseMode, RResult, RString, RVec, UpdateKind};

fn ok<T>(r: PResult<T>, what: &str) -> T {
    match r {
        RResult::ROk(v) => v,
        RResult::RErr(e) => panic!("{what}: {e}"),
    }
}

fn tags(t: &[&str]) -> RVec<RString> {
    t.iter().map(|s| RString::from(*s)).collect()
}

#[test]
#[ignore = "needs TANDEM_PYTHON with the sglang wheel (scripts/setup-python.sh)"]
fn every_request_validates_against_sglangs_own_types() {
    let python = std::env::var("TANDEM_PYTHON").unwrap_or_else(|_| panic!("set TANDEM_PYTHON"));
    let model = tiny_model("sglang-contract");
    let url = support::serve(
        "contract",
        &model,
        &["--enable-memory-saver", "--enable-lora"],
    );
    let trace = support::logs_dir().join("contract.trace.jsonl");
    let _ = std::fs::remove_file(&trace);
    let options = serde_json::json!({"url": url, "enable_memory_saver": true,
        "enable_lora": true, "trace_requests": trace});
    let setup = EngineSetup::new(Source::built("tandem_sglang"), "sglang", &model);
    let h =
        EngineHarness::new(setup.options(&options.to_string())).unwrap_or_else(|f| panic!("{f}"));
    let e = &h.engine;
    let mut sampled = h.greedy();
    sampled.sampling.temperature = 1.0;
    sampled.sampling.seed = tandem_plugin_api::ROption::RSome(u64::MAX);
    ok(e.generate(sampled), "generate with a seed");
    let out = ok(e.generate(h.greedy()), "generate");
    let seqs: RVec<RVec<u32>> = out
        .completions
        .iter()
        .map(|c| c.tokens.iter().chain([5, 6].iter()).copied().collect())
        .collect();
    ok(e.score(seqs), "score");
    for mode in [PauseMode::Abort, PauseMode::Keep, PauseMode::Wait] {
        ok(e.pause_generation(mode), "pause");
        ok(e.continue_generation(), "continue");
    }
    ok(e.pause_generation(PauseMode::Wait), "pause");
    ok(e.flush_cache(), "flush");
    ok(e.release_memory(tags(&["weights", "kv_cache"])), "release");
    ok(e.resume_memory(tags(&["weights", "kv_cache"])), "resume");
    let source =
        |o: &str| TrainerSetup::new(Source::built("tandem_native"), "native", &model).options(o);
    for (options, kind) in [
        ("{}", UpdateKind::CheckpointDir),
        (r#"{"lora": {"rank": 4, "alpha": 8}}"#, UpdateKind::Adapter),
    ] {
        let mut t = TrainerHarness::new(source(options)).unwrap_or_else(|f| panic!("{f}"));
        t.train("train").unwrap_or_else(|f| panic!("{f}"));
        let update = ok(t.trainer.export_weight_update(kind), "export");
        if let tandem_plugin_api::UpdatePayload::Adapter { dir, .. } = &update.payload {
            ok(
                e.load_adapter("contract".into(), dir.clone()),
                "load_adapter",
            );
            ok(e.unload_adapter("contract".into()), "unload_adapter");
        }
        ok(e.apply_weight_update(update), "apply");
    }
    ok(e.continue_generation(), "continue");
    ok(e.generate(h.greedy()), "generate with the adapter");
    ok(e.health(), "health");
    let out = std::process::Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../python/sglang_contract/check.py"
        ))
        .arg(&trace)
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "check.py {}: {text}", trace.display());
    assert!(text.contains("against sglang 0.5.23"), "{text}");
}
