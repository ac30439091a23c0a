//! Shared helpers of the multi-process tests: spawning a world of real child processes that
//! re-run this test binary's `child_entry` test with a role, and a fast byte pattern.

#![allow(dead_code)]

use std::time::Duration;
use tandem_transport::CommConfig;
use tandem_transport::local::{self, LocalSpec, LocalWorld};

/// Env var selecting the child role.
pub const ROLE: &str = "TT_CHILD_ROLE";
/// Token used by the tests.
pub const TOKEN: &str = "test-run-token";

/// Spawns `n` children running `role` with backend `backend` ("shm", "tcp", "auto").
pub fn spawn(
    n: usize,
    backend: &str,
    role: &str,
    timeout: Duration,
    env: &[(&str, String)],
) -> LocalWorld {
    let configs = (0..n)
        .map(|r| {
            let mut c = CommConfig::new("", "", r, n);
            c.transport = backend.parse().unwrap();
            c.timeout = timeout;
            c.name = format!("{role}-{backend}-{n}");
            c.shm.ring_bytes = 4 << 20;
            // Exercise the single-copy path on every host (Auto may measure it off).
            c.shm.single_copy = tandem_transport::SingleCopy::On;
            c
        })
        .collect();
    let mut e: Vec<(String, String)> = vec![(ROLE.into(), role.into())];
    e.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let spec = LocalSpec {
        program: std::env::current_exe().unwrap(),
        args: [
            "child_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
        env: e,
        configs,
    };
    local::spawn(&spec, TOKEN).unwrap()
}

/// Runs a world to completion and asserts every child exited 0.
pub fn run_ok(n: usize, backend: &str, role: &str, env: &[(&str, String)]) {
    let w = spawn(n, backend, role, Duration::from_secs(30), env);
    let codes = w.wait(Duration::from_secs(120));
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "role {role} on {backend} with {n} ranks: exit codes {codes:?}"
    );
}

/// Deterministic pattern of `len` bytes for `seed`: random 1 MiB block, copied per 4 KiB page
/// with the page index and seed stamped in, so misplaced pages and bytes are both detected.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut block = vec![0u8; 1 << 20];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for w in block.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    let mut out = vec![0u8; len];
    for (p, page) in out.chunks_mut(4096).enumerate() {
        let off = (p * 4096) % block.len();
        page.copy_from_slice(&block[off..off + page.len()]);
        let stamp = ((p as u64) ^ seed).to_le_bytes();
        let k = page.len().min(8);
        page[..k].copy_from_slice(&stamp[..k]);
    }
    out
}

/// Panics with the first differing offset if `got != want`.
pub fn check(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: first difference at byte {i}: got {} want {}",
            got[i], want[i]
        );
    }
}
