//! The peers of `tandem bench native`: vLLM's decode and torch's GRPO step on the same model
//! and inputs, each a Python script in `bench/cli/python/` run by the Python of
//! [`tandem_model::fetch::python`] (`$TANDEM_PYTHON`, else the venv `scripts/setup-python.sh`
//! recorded).
//!
//! The scripts are compiled into the binary (`include_str!`) and written into the bench's
//! scratch directory for each run, as the `fsdp` plugin embeds its worker package: an
//! installed `tandem` runs them without its source tree, and the script that ran is always
//! the one this binary was built with. Each reads one JSON request file and prints its result
//! as the last line of stdout; lines it prints to stderr starting with `tandem-bench: ` are
//! progress, echoed; the rest is kept for the error. A script runs in its own process group
//! (vLLM starts an engine-core process and a worker), killed as a whole after it exits or
//! when it runs past its time limit.
//!
//! Any failure — no Python, no vLLM or torch in it, a crash, a timeout — is a reason (one
//! line), never a failure of the bench: the figure then stands beside the machine bound.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const VLLM_SCRIPT: &str = include_str!("../python/bench_vllm_decode.py");
const TORCH_SCRIPT: &str = include_str!("../python/bench_torch_step.py");

/// A script's time limit: vLLM compiles the model on its first start (minutes on 2 busy
/// cores), torch's full step on SmolLM2 takes tens of seconds.
const TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// torch's runtime settings (each unless already set), both measured on this 2-core machine
/// shared with other work:
///
/// - glibc keeps freed memory mapped for reuse (`MALLOC_MMAP_MAX_=0`, a high trim
///   threshold). By default every allocation over 32 MiB is its own `mmap`, unmapped on free:
///   torch frees a step's activations and gradients and allocates them again next step,
///   page-faulting gigabytes per step — its SmolLM2 step took 20–47 s instead of 3.2 s. The
///   native components keep their buffers from one call to the next.
/// - OpenMP threads wait passively (`OMP_WAIT_POLICY=PASSIVE`). Spinning at every barrier is
///   the default; with one other busy process on the machine torch's step took 34–47 s
///   instead of 6.3 s (rayon's threads, the native side's, sleep when idle).
///
/// vLLM runs as it configures itself: the first setting changed its decode by no more than
/// noise (236 vs 245 tok/s at batch 64), and its worker runs one OpenMP thread here.
const TORCH_ENV: [(&str, &str); 3] = [
    ("MALLOC_MMAP_MAX_", "0"),
    ("MALLOC_TRIM_THRESHOLD_", "68719476736"),
    ("OMP_WAIT_POLICY", "PASSIVE"),
];

/// vLLM's decode figures.
#[derive(Debug, Clone)]
pub struct DecodeRef {
    /// vLLM's version.
    pub version: String,
    /// `(batch, tokens/s)`.
    pub decode: Vec<(usize, f64)>,
}

impl DecodeRef {
    /// tok/s at batch `b`, if measured.
    pub fn tokens_per_s(&self, b: usize) -> Option<f64> {
        self.decode.iter().find(|d| d.0 == b).map(|d| d.1)
    }
}

/// torch's train-step figures.
#[derive(Debug, Clone)]
pub struct StepRef {
    /// torch's version.
    pub version: String,
    /// Median seconds per timed step.
    pub median_s: f64,
    /// Loss of the warm-up (first, on-policy) step.
    pub first_loss: f64,
    /// Gradient norm (before clipping) of the warm-up step.
    pub first_grad_norm: f64,
}

/// vLLM's offline decode of `prompts[..b]` for each `b` in `batches`, `new_tokens` each.
pub fn vllm_decode(
    scratch: &Path,
    model: &Path,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    batches: &[usize],
    reps: usize,
) -> Result<DecodeRef, String> {
    eprintln!("vLLM: loading and compiling the model (minutes, not timed)");
    let request = json!({
        "model": model,
        "prompts": prompts,
        "new_tokens": new_tokens,
        "batches": batches,
        "reps": reps,
    });
    let v = run_script(scratch, "bench_vllm_decode.py", VLLM_SCRIPT, &request, &[])?;
    let decode = v["decode"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| Some((d["batch"].as_u64()? as usize, d["tokens_per_s"].as_f64()?)))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if decode.len() != batches.len() {
        return Err(format!("bench_vllm_decode.py answered {v}"));
    }
    Ok(DecodeRef {
        version: v["vllm"].as_str().unwrap_or("?").to_owned(),
        decode,
    })
}

/// torch's median step time on `batch` (tokens, prompt length, advantages and loss settings
/// as JSON), full fine-tuning or LoRA.
pub fn torch_step(
    scratch: &Path,
    model: &Path,
    batch: &Value,
    lora: bool,
    steps: usize,
    threads: usize,
) -> Result<StepRef, String> {
    Ok(torch_step_answer(scratch, model, batch, lora, steps, threads)?.0)
}

/// [`torch_step`] and the script's whole answer.
fn torch_step_answer(
    scratch: &Path,
    model: &Path,
    batch: &Value,
    lora: bool,
    steps: usize,
    threads: usize,
) -> Result<(StepRef, Value), String> {
    eprintln!(
        "torch: the same step ({}), warm-up + {steps} timed",
        if lora { "lora" } else { "full" }
    );
    let mut request = batch.clone();
    request["model"] = json!(model);
    request["steps"] = json!(steps);
    request["threads"] = json!(threads);
    request["lora"] = if lora {
        json!({"rank": super::native::LORA_RANK, "alpha": super::native::LORA_ALPHA})
    } else {
        Value::Null
    };
    let v = run_script(
        scratch,
        "bench_torch_step.py",
        TORCH_SCRIPT,
        &request,
        &TORCH_ENV,
    )?;
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("bench_torch_step.py answered {v}"))
    };
    let step = StepRef {
        version: v["torch"].as_str().unwrap_or("?").to_owned(),
        median_s: num("median_s")?,
        first_loss: num("first_loss")?,
        first_grad_norm: num("first_grad_norm")?,
    };
    Ok((step, v))
}

/// torch's RL-shaped step figures: the step's, and its peak memory.
#[derive(Debug, Clone)]
pub struct RlStepRef {
    /// Time and first-step figures.
    pub step: StepRef,
    /// Peak resident set minus the resident set before the model was loaded, bytes.
    pub peak_rise_bytes: f64,
    /// Peak resident set, bytes.
    pub peak_bytes: f64,
}

/// torch's RL-shaped step (`batch`: token rows, `prompt_lens`, advantages, loss settings,
/// `micro_batch`, `completion_only`), full fine-tuning or LoRA, with its peak memory.
pub fn torch_rl_step(
    scratch: &Path,
    model: &Path,
    batch: &Value,
    lora: bool,
    steps: usize,
    threads: usize,
) -> Result<RlStepRef, String> {
    let (step, v) = torch_step_answer(scratch, model, batch, lora, steps, threads)?;
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("bench_torch_step.py answered {v} (no {k})"))
    };
    Ok(RlStepRef {
        step,
        peak_rise_bytes: num("peak_rise_bytes")?,
        peak_bytes: num("peak_bytes")?,
    })
}

/// Writes `source` as `scratch/name`, runs it on a request file (with `env` where unset) and
/// returns the JSON object on the last line of its stdout; any failure is the reason as one
/// line.
fn run_script(
    scratch: &Path,
    name: &str,
    source: &str,
    request: &Value,
    env: &[(&str, &str)],
) -> Result<Value, String> {
    let script = scratch.join(name);
    let req = scratch.join(format!("{name}.request.json"));
    std::fs::write(&script, source).map_err(|e| format!("writing {}: {e}", script.display()))?;
    std::fs::write(&req, request.to_string())
        .map_err(|e| format!("writing {}: {e}", req.display()))?;
    let python = tandem_model::fetch::python();
    let mut cmd = Command::new(&python);
    for &(k, v) in env {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .arg(&script)
        .arg(&req)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run {} ({e}); set TANDEM_PYTHON or run scripts/setup-python.sh",
                python.display()
            )
        })?;
    let mut stdout = child.stdout.take();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let tail = Arc::new(Mutex::new(Vec::<String>::new()));
    let err_reader = child.stderr.take().map(|e| {
        let tail = Arc::clone(&tail);
        std::thread::spawn(move || {
            for line in BufReader::new(e).lines().map_while(Result::ok) {
                if let Some(p) = line.strip_prefix("tandem-bench: ") {
                    eprintln!("{p}");
                } else if !line.trim().is_empty() {
                    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                    t.push(line);
                    let n = t.len();
                    t.drain(..n.saturating_sub(20));
                }
            }
        })
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() > TIMEOUT => {
                break Err(format!("{name} ran past {} s", TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => break Err(format!("waiting for {name}: {e}")),
        }
    };
    // The whole group: vLLM's engine core and worker outlive a killed parent otherwise. After
    // a normal exit the group's id stays reserved while any member lives, and pids are handed
    // out in sequence, so the signal reaches this script's processes only.
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let stdout = out_reader.join().unwrap_or_default();
    if let Some(r) = err_reader {
        let _ = r.join();
    }
    let last = stdout.lines().rev().find_map(|l| {
        serde_json::from_str::<Value>(l.trim())
            .ok()
            .filter(Value::is_object)
    });
    let status = status?;
    if let Some(why) = last.as_ref().and_then(|v| v["unavailable"].as_str()) {
        return Err(format!("{} ({}): {why}", python.display(), name));
    }
    match last {
        Some(v) if status.success() => Ok(v),
        _ => {
            let t = tail.lock().unwrap_or_else(|p| p.into_inner());
            let line = t.last().map_or("no output", String::as_str);
            Err(format!("{name} failed ({status}): {line}"))
        }
    }
}
