//! `tandem bench serve`: requests/s and tokens/s of `tandem serve` (in process, on a free
//! loopback port, over real HTTP) at 1, 8 and 64 concurrent clients, each beside the same
//! requests through the engine in process in batches of the client count, measured in the
//! same run on the same engine. Every request is greedy with a fixed budget (EOS ignored), so
//! both sides generate exactly the same tokens.

use std::time::Instant;

use super::Figure;
use serde_json::json;
use tandem_cli::error::CliError;
use tandem_plugin_api::{GenerateRequest, ROption, RVec, SamplingParams};
use tandem_runtime::RuntimeError;
use tandem_runtime::registry::Registry;
use tandem_serve::ServeOptions;

const PROMPT_LEN: usize = 16;

fn prompt(i: usize) -> Vec<u32> {
    (0..PROMPT_LEN)
        .map(|j| ((i * 31 + j * 7) % 200 + 3) as u32)
        .collect()
}

/// Runs the benchmark (`quick`: fewer requests and tokens).
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let tmp = std::env::temp_dir().join(format!("tandem-bench-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let result = run_in(&tmp, quick);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn run_in(tmp: &std::path::Path, quick: bool) -> Result<Vec<Figure>, CliError> {
    let registry = Registry::discover(&[]).map_err(RuntimeError::Plugins)?;
    let model = tmp.join("model");
    tandem_rl::warmstart::create_preset(&registry, &model, "tiny", 0)?;
    let opts = ServeOptions {
        model,
        adapter: None,
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        memory_saver: false,
        lora: false,
        weight_version: None,
        served_model_name: None,
        engine: None,
        engine_options: serde_json::from_value(
            serde_json::json!({"max_batch": 64, "max_seq_len": 256}),
        )
        .unwrap_or_default(),
        max_running_requests: 256,
        batch_wait: std::time::Duration::from_millis(5),
        signals: false,
    };
    let fail = |e: tandem_serve::ServeError| CliError::failed(format!("bench serve: {e}"));
    let (engine, max_seq_len) = tandem_serve::construct(&registry, &opts).map_err(fail)?;
    let running = tandem_serve::start(engine, max_seq_len, &opts).map_err(fail)?;
    let max_new: u32 = if quick { 16 } else { 32 };
    let mut figures = Vec::new();
    for clients in [1usize, 8, 64] {
        let total = if quick {
            clients.max(4) * 2
        } else {
            (clients * 4).max(16)
        };
        // Warm-up of both paths at this width (first allocations), then alternating rounds;
        // the best round of each side counts (the machine is shared: noise only slows).
        http_run(&running.url(), clients, clients, max_new)?;
        local_run(&running, clients, clients, max_new)?;
        let (mut http_s, mut local_s) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..if quick { 2 } else { 3 } {
            let t = Instant::now();
            http_run(&running.url(), clients, total, max_new)?;
            http_s = http_s.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            local_run(&running, clients, total, max_new)?;
            local_s = local_s.min(t.elapsed().as_secs_f64());
        }
        let tokens = (total as u32 * max_new) as f64;
        let case = format!("{clients} clients, {total} requests x {max_new} tokens");
        figures.push(
            Figure::new(
                "serve",
                &format!("{case}: requests/s"),
                total as f64 / http_s,
                "req/s",
                total as f64 / local_s,
            )
            .limit_name("in-process batch")
            .target(if clients >= 8 { ">= 0.8" } else { "" }),
        );
        figures.push(
            Figure::new(
                "serve",
                &format!("{case}: tokens/s"),
                tokens / http_s,
                "tok/s",
                tokens / local_s,
            )
            .limit_name("in-process batch"),
        );
    }
    running.stop().map_err(fail)?;
    Ok(figures)
}

/// The same `total` requests through the engine in process, in batches of `clients`.
fn local_run(
    running: &tandem_serve::Running,
    clients: usize,
    total: usize,
    max_new: u32,
) -> Result<(), CliError> {
    for start in (0..total).step_by(clients) {
        let prompts: RVec<RVec<u32>> = (start..(start + clients).min(total))
            .map(|i| prompt(i).into())
            .collect();
        let request = GenerateRequest {
            prompts,
            sampling: SamplingParams {
                temperature: 0.0,
                max_tokens: max_new,
                seed: ROption::RNone,
                ..SamplingParams::default()
            },
            adapter: ROption::RNone,
        };
        running
            .server
            .engine
            .generate(request)
            .into_result()
            .map_err(|e| CliError::plugin("bench serve: in-process generate", e))?;
    }
    Ok(())
}

/// `total` greedy `/generate` requests from `clients` threads, each request after the
/// previous one's answer.
fn http_run(url: &str, clients: usize, total: usize, max_new: u32) -> Result<(), CliError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .proxy(None)
                        .build()
                        .into();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= total {
                            return Ok(());
                        }
                        let body = json!({"input_ids": prompt(i), "sampling_params":
                            {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": true}});
                        let mut r = agent
                            .post(format!("{url}/generate"))
                            .header("content-type", "application/json")
                            .send(body.to_string().as_bytes())
                            .map_err(|e| e.to_string())?;
                        let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
                        if r.status().as_u16() != 200 {
                            return Err(text);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
                .map_err(|e| CliError::failed(format!("bench serve: a request failed: {e}")))?;
        }
        Ok(())
    })
}
