//! Helpers shared by the integration tests: a cross-process lock for tests that measure
//! system-wide memory, a deterministic fill pattern, and re-exec of the test binary as a child.
#![allow(dead_code, clippy::unwrap_used)]

use std::fs::File;
use std::process::{Child, Command, Stdio};

use nix::fcntl::{Flock, FlockArg};

/// Held by tests that allocate or measure large amounts of memory, across test processes (so it
/// also works under cargo-nextest, which runs each test in its own process).
pub fn big_memory_lock() -> Flock<File> {
    let path = std::env::temp_dir().join("tandem-memory-big-tests.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    Flock::lock(f, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap()
}

/// Pattern word `i` for `seed`.
pub fn word(seed: u64, i: usize) -> u64 {
    (i as u64 ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed
}

/// Fills `words` with the pattern for `seed`.
pub fn fill(words: &mut [u64], seed: u64) {
    for (i, w) in words.iter_mut().enumerate() {
        *w = word(seed, i);
    }
}

/// Index of the first word that differs from the pattern, if any.
pub fn first_mismatch(words: &[u64], seed: u64) -> Option<usize> {
    words
        .iter()
        .enumerate()
        .position(|(i, w)| *w != word(seed, i))
}

/// Same check over raw bytes (little-endian words).
pub fn bytes_match(bytes: &[u8], seed: u64) -> bool {
    bytes
        .chunks_exact(8)
        .enumerate()
        .all(|(i, c)| c == word(seed, i).to_le_bytes())
}

/// Runs this test binary's ignored test `entry` as a child process with `env` set.
pub fn spawn_child(entry: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        entry,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}
