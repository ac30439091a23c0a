//! Multi-process tests of failures between real child processes (see `multiproc.rs`): a
//! receive of the wrong size, a peer killed mid-transfer, a peer that stays silent. Each must
//! end in an error naming the peer, never a hang.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common;

use common::{check, pattern, run_ok, spawn};
use std::time::Duration;
use tandem_transport::store::StoreClient;
use tandem_transport::{CommConfig, Communicator, TransportError};

child_roles! {
    "mismatch" => |w, _| mismatch(w),
    "kill" => kill,
    "silent" => |w, _| silent(w),
}

/// A receive posted with the wrong size fails naming both sizes; the link stays usable.
fn mismatch(w: &Communicator) -> Result<(), String> {
    if w.rank() == 0 {
        w.send(1, &pattern(3, 100), 7).map_err(|e| e.to_string())?;
        w.send(1, &pattern(4, 10), 8).map_err(|e| e.to_string())?;
    } else {
        let mut small = vec![0u8; 64];
        match w.recv(0, &mut small, 7) {
            Err(
                e @ TransportError::SizeMismatch {
                    sent: 100,
                    expected: 64,
                    src: 0,
                    dst: 1,
                    tag: 7,
                },
            ) => {
                let msg = e.to_string();
                if !(msg.contains("100") && msg.contains("64")) {
                    return Err(format!("message does not name both sizes: {msg}"));
                }
            }
            other => return Err(format!("expected a size mismatch, got {other:?}")),
        }
        let mut ok = vec![0u8; 10];
        w.recv(0, &mut ok, 8).map_err(|e| e.to_string())?;
        check(&ok, &pattern(4, 10), "after mismatch");
    }
    w.barrier().map_err(|e| e.to_string())
}

/// Rank 0 streams 64 MiB messages to rank 1 until the parent kills one of them (`TT_VICTIM`);
/// the survivor must get an error naming the victim instead of hanging.
fn kill(w: &Communicator, cfg: &CommConfig) -> Result<(), String> {
    let len = 64 << 20;
    let victim: usize = std::env::var("TT_VICTIM").unwrap().parse().unwrap();
    let store = StoreClient::connect(&cfg.store_addr, &cfg.token, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let data = pattern(5, len);
    let mut buf = vec![0u8; len];
    let mut first = true;
    loop {
        let r = if w.rank() == 0 {
            w.send(1, &data, 0)
        } else {
            w.recv(0, &mut buf, 0)
        };
        match r {
            Ok(()) => {
                let st = w.shm_stats();
                if first
                    && cfg.transport.to_string() == "shm"
                    && st.single_copy_sent + st.single_copy_received == 0
                {
                    return Err(format!(
                        "64 MiB shm message did not go by single copy: {st:?}"
                    ));
                }
                if first && w.rank() == 1 {
                    store.set("kill/ready", b"1").map_err(|e| e.to_string())?;
                }
                first = false;
            }
            Err(
                e @ (TransportError::PeerDied { rank, .. } | TransportError::Timeout { rank, .. }),
            ) if rank == victim => {
                println!("survivor got: {e}");
                return Ok(());
            }
            Err(e) => {
                return Err(format!(
                    "expected PeerDied/Timeout naming rank {victim}, got {e}"
                ));
            }
        }
    }
}

/// Rank 1 stays alive but never sends (until rank 0 is done with its receive); rank 0's
/// receive times out naming rank 1.
fn silent(w: &Communicator) -> Result<(), String> {
    if w.rank() == 1 {
        common::wait_for("rank0-done");
        return Ok(());
    }
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 8];
    match w.recv(1, &mut b, 0) {
        Err(TransportError::Timeout {
            rank: 1, ref addr, ..
        }) if !addr.is_empty() => {
            println!("timed out after {:?}", t0.elapsed());
            common::signal("rank0-done");
            Ok(())
        }
        other => {
            common::signal("rank0-done");
            Err(format!("expected Timeout naming rank 1, got {other:?}"))
        }
    }
}

#[test]
fn size_mismatch_is_an_error_naming_both_sizes() {
    run_ok(2, "shm", "mismatch", &[]);
    run_ok(2, "tcp", "mismatch", &[]);
}

fn kill_mid_transfer(backend: &str, victim: usize) {
    let w = spawn(
        2,
        backend,
        "kill",
        Duration::from_secs(20),
        &[("TT_VICTIM", victim.to_string())],
    );
    let store = StoreClient::connect(
        &w.store.addr().to_string(),
        common::TOKEN,
        Duration::from_secs(5),
    )
    .unwrap();
    store
        .wait(&["kill/ready"], Duration::from_secs(60))
        .unwrap();
    let mut w = w;
    w.children[victim].kill().unwrap();
    let t0 = std::time::Instant::now();
    let codes = w.wait(Duration::from_secs(60));
    assert_eq!(
        codes[1 - victim],
        Some(0),
        "survivor must report the dead peer ({backend}, victim {victim}), codes {codes:?}"
    );
    // Informational: how long the survivor took to notice.
    println!(
        "{backend}: survivor exited {:?} after the kill",
        t0.elapsed()
    );
}

#[test]
fn shm_peer_killed_mid_transfer() {
    kill_mid_transfer("shm", 0); // sender dies, receiver notices
    kill_mid_transfer("shm", 1); // receiver dies, sender notices
}

#[test]
fn tcp_peer_killed_mid_transfer() {
    kill_mid_transfer("tcp", 0);
    kill_mid_transfer("tcp", 1);
}

#[test]
fn silent_peer_times_out_naming_it() {
    let (_dir, sync) = common::sync_dir();
    let w = spawn(2, "shm", "silent", Duration::from_secs(1), &[sync]);
    assert_eq!(w.wait(Duration::from_secs(60)), vec![Some(0), Some(0)]);
}
