//! Shared helpers of the multi-process tests: spawning a world of real child processes that
//! re-run this test binary's `child_entry` test with a role, the body of that `child_entry`,
//! and a fast byte pattern.

#![allow(dead_code)]

use std::time::Duration;
use tandem_transport::local::{self, LocalSpec, LocalWorld};
use tandem_transport::{CommConfig, Communicator};

/// Env var selecting the child role.
pub const ROLE: &str = "TT_CHILD_ROLE";
/// Token used by the tests.
pub const TOKEN: &str = "test-run-token";

/// What a child runs: its role, in the world it joined, with the config it joined with.
pub type Role = fn(&str, &Communicator, &CommConfig) -> Result<(), String>;

/// Defines a module's `child_role`: its role table, `"name" => f` with `f(world, config) ->
/// Result<(), String>`, answering `None` for a role of another module (the binary's one
/// `child_entry` test, which [`spawn`] runs in each child, asks every module's table in turn).
/// Needs `#[macro_use] mod common;`.
#[allow(unused_macros)]
macro_rules! child_roles {
    ($($name:literal => $run:expr),* $(,)?) => {
        pub(crate) fn child_role(
            role: &str,
            world: &tandem_transport::Communicator,
            cfg: &tandem_transport::CommConfig,
        ) -> Option<Result<(), String>> {
            Some(match role {
                $($name => $run(world, cfg),)*
                _ => return None,
            })
        }
    };
}

/// The body of a test binary's `child_entry` test. A test child (role in [`ROLE`]) joins the
/// world its environment describes (ranks listed in `TT_RING_ONLY` with the single-copy path
/// off, those in `TT_OTHER_HOST` on another host id, every rank with `TT_BCAST_BYTES` of shared
/// broadcast segment when set, every rank on the GPU `TT_ONE_GPU` names, as its own NCCL host,
/// when set), runs `run` and exits 0, or 1 naming the failure. Run directly (no role), it says so and returns.
pub fn child_main(run: Role) {
    let Ok(role) = std::env::var(ROLE) else {
        eprintln!("child_entry only runs as a child of the multi-process tests");
        return;
    };
    local::die_with_parent();
    let code = match join_and_run(&role, run) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("child role {role} failed: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn join_and_run(role: &str, run: Role) -> Result<(), String> {
    let mut cfg = CommConfig::from_env().map_err(|e| e.to_string())?;
    // Ranks listed in TT_RING_ONLY run with the single-copy path disabled.
    if let Ok(list) = std::env::var("TT_RING_ONLY")
        && list.split(',').any(|r| r == cfg.rank.to_string())
    {
        cfg.shm.single_copy = tandem_transport::SingleCopy::Off;
    }
    // TT_BCAST_BYTES sets the shared broadcast segment size of every rank.
    if let Ok(b) = std::env::var("TT_BCAST_BYTES") {
        cfg.shm.broadcast_bytes = b.parse().map_err(|_| format!("TT_BCAST_BYTES={b}"))?;
    }
    // Ranks listed in TT_OTHER_HOST claim another host (their pairs plan on tcp under auto).
    if let Ok(list) = std::env::var("TT_OTHER_HOST")
        && list.split(',').any(|r| r == cfg.rank.to_string())
    {
        cfg.placement.host = format!("{}-elsewhere", cfg.placement.host);
    }
    // TT_ONE_GPU=cuda:N puts every rank on that device, each on its own host id, and gives
    // NCCL a distinct NCCL_HOSTID per rank: NCCL then treats the ranks as separate hosts (its
    // network transport over TCP) instead of refusing two ranks on one GPU ("Duplicate GPU
    // detected"). Lets the NCCL link run between processes sharing the one GPU of a test
    // machine; see tests/it/nccl.rs.
    if let Ok(dev) = std::env::var("TT_ONE_GPU") {
        cfg.placement.device = dev.parse().map_err(|e| format!("TT_ONE_GPU={dev}: {e}"))?;
        cfg.placement.host = format!("{}-gpu-rank{}", cfg.placement.host, cfg.rank);
        // SAFETY: set before anything in this child started another thread or read NCCL_HOSTID
        // (NCCL reads it when the first communicator is created, inside Communicator::init).
        unsafe { std::env::set_var("NCCL_HOSTID", format!("tandem-test-rank{}", cfg.rank)) };
    }
    if std::env::var_os("TT_ONE_GPU").is_some() {
        eprintln!("[rank {}] joining as host {}", cfg.rank, cfg.placement.host);
    }
    let t = std::time::Instant::now();
    let world = Communicator::init(&cfg).map_err(|e| e.to_string())?;
    if std::env::var_os("TT_ONE_GPU").is_some() {
        eprintln!(
            "[rank {}] Communicator::init took {:.2} s",
            cfg.rank,
            t.elapsed().as_secs_f64()
        );
    }
    run(role, &world, &cfg)
}

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

/// The environment variable naming the directory where a world's ranks leave [`signal`]s.
pub const SYNC_DIR: &str = "TT_SYNC_DIR";

/// A fresh directory for [`signal`] / [`wait_for`], as the `(name, value)` pair [`spawn`]
/// passes to every rank; the caller keeps the directory alive until the world is done.
pub fn sync_dir() -> (tempfile::TempDir, (&'static str, String)) {
    let dir = tempfile::tempdir().unwrap();
    let value = dir.path().display().to_string();
    (dir, (SYNC_DIR, value))
}

/// Marks `name` as reached for the other ranks of this world (a file in [`SYNC_DIR`]).
pub fn signal(name: &str) {
    let dir = std::env::var(SYNC_DIR).expect("the test passes common::sync_dir() to spawn");
    std::fs::write(std::path::Path::new(&dir).join(name), b"").unwrap();
}

/// Waits until another rank [`signal`]ed `name` (polled; the world's own wait bounds the test,
/// this deadline only keeps a rank from outliving it).
pub fn wait_for(name: &str) {
    let dir = std::env::var(SYNC_DIR).expect("the test passes common::sync_dir() to spawn");
    let path = std::path::Path::new(&dir).join(name);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{name} was never signalled"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
