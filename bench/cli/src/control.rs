//! Control-plane benchmark (for `tandem bench control`): a call's round trip and the
//! throughput of a large `generate` reply through [`Channel`], each beside raw loopback TCP
//! doing the same exchange in the same run (the limit).
//!
//! The worker end is a thread in this process speaking the real protocol on a real loopback
//! socket (frames, MessagePack, the reader thread and the reply routing are all exercised);
//! only the plugin call is left out, so the figures are the control plane's own cost.

use crate::Figure;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tandem_cli::error::CliError;
use tandem_control::channel::Channel;
use tandem_control::frame::{self, MAX_FRAME_BYTES};
use tandem_control::protocol::{Call, EngineCall, EngineReply, Reply, ToController, ToWorker};
use tandem_plugin_api::{
    Completion, EngineHealth, FinishReason, GenerateRequest, GenerateResponse, RString, RVec,
    SamplingParams,
};

/// Sequences and tokens per sequence of the bulk case.
const BULK: (usize, u32) = (64, 1024);

fn err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("tandem bench control: {e}"))
}

/// A connected pair of loopback sockets.
fn pair() -> Result<(TcpStream, TcpStream), CliError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let a = TcpStream::connect(listener.local_addr().map_err(err)?).map_err(err)?;
    let (b, _) = listener.accept().map_err(err)?;
    for s in [&a, &b] {
        s.set_nodelay(true).map_err(err)?;
    }
    Ok((a, b))
}

/// A worker end answering `health` and `generate` (each prompt's completion is `max_tokens`
/// copies of its first token), until the connection closes.
fn fake_worker(mut s: TcpStream) {
    while let Ok(ToWorker::Call { id, call }) = frame::read(&mut s, MAX_FRAME_BYTES) {
        let reply = match call {
            Call::Engine(EngineCall::Generate { request: req }) => {
                let n = req.sampling.max_tokens as usize;
                let completions = req
                    .prompts
                    .iter()
                    .map(|p| {
                        let tokens = vec![p.first().copied().unwrap_or(0); n];
                        Completion::new(tokens, RVec::new(), FinishReason::Length)
                    })
                    .collect();
                Reply::Engine(EngineReply::Generate(GenerateResponse {
                    completions,
                    weight_version: 0,
                }))
            }
            _ => Reply::Engine(EngineReply::Health(EngineHealth {
                ready: true,
                weight_version: 0,
                detail: RString::new(),
            })),
        };
        let answer = ToController::Reply {
            id,
            result: Ok(reply),
        };
        if frame::write(&mut s, &answer).is_err() {
            return;
        }
    }
}

/// Median of per-iteration times, in seconds.
fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
}

fn time(iters: usize, mut f: impl FnMut() -> Result<(), CliError>) -> Result<f64, CliError> {
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

/// Raw TCP: `ask` bytes one way, `answer` bytes back, per iteration (median seconds).
fn raw(iters: usize, ask: usize, answer: usize) -> Result<f64, CliError> {
    let (mut a, mut b) = pair()?;
    let echo = std::thread::spawn(move || {
        let (mut q, r) = (vec![0u8; ask], vec![1u8; answer]);
        while b.read_exact(&mut q).is_ok() && b.write_all(&r).is_ok() {}
    });
    let (q, mut r) = (vec![0u8; ask], vec![0u8; answer]);
    let t = time(iters, || {
        a.write_all(&q).map_err(err)?;
        a.read_exact(&mut r).map_err(err)
    });
    drop(a);
    let _ = echo.join();
    t
}

/// Runs the benchmark; `quick` does fewer iterations.
pub fn run(quick: bool) -> Result<Vec<Figure>, CliError> {
    let (calls, bulks) = if quick { (300, 10) } else { (5000, 100) };
    let (a, b) = pair()?;
    let worker = std::thread::spawn(move || fake_worker(b));
    let channel = Channel::new(a, "bench worker".into(), None)?;
    let timeout = Duration::from_secs(60);
    let health = || Call::Engine(EngineCall::Health {});
    let call_rt = time(calls, || {
        channel
            .call(health(), timeout)
            .map(drop)
            .map_err(Into::into)
    })?;
    let ping_rt = raw(calls, 4, 4)?;

    let (seqs, len) = BULK;
    let request = GenerateRequest {
        prompts: (0..seqs as u32).map(|i| RVec::from(vec![i])).collect(),
        sampling: SamplingParams {
            max_tokens: len,
            ..SamplingParams::default()
        },
        adapter: None.into(),
    };
    let generate = || {
        let request = request.clone();
        Call::Engine(EngineCall::Generate { request })
    };
    let bulk_t = time(bulks, || {
        channel
            .call(generate(), timeout)
            .map(drop)
            .map_err(Into::into)
    })?;
    drop(channel);
    let _ = worker.join();
    let token_bytes = seqs * len as usize * 4;
    let raw_t = raw(bulks, 64, token_bytes)?;
    let mb = |secs: f64| token_bytes as f64 / secs / 1e6;
    Ok(vec![
        Figure::new(
            "control",
            "call round trip (health)",
            call_rt * 1e6,
            "us",
            ping_rt * 1e6,
        )
        .limit_name("raw TCP loopback ping-pong"),
        Figure::new(
            "control",
            &format!("generate reply {seqs}x{len} tokens"),
            mb(bulk_t),
            "MB/s",
            mb(raw_t),
        )
        .limit_name("raw TCP loopback, same bytes"),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn quick_run_yields_both_figures() {
        let figures = super::run(true).expect("bench runs");
        assert_eq!(figures.len(), 2);
        for f in figures {
            assert!(f.value.is_finite() && f.value > 0.0, "{f:?}");
            assert!(f.limit.is_finite() && f.limit > 0.0, "{f:?}");
        }
    }
}
