//! Multi-process tests of `broadcast` between real child processes (see `multiproc.rs`): the
//! shared-segment broadcast of all-shm groups (2, 3 and 4 ranks, every root, sizes around the
//! chunk and the segment, 0 and 1 bytes, long runs that wrap the segment many times, a size
//! mismatch, sub-groups), the chain of tcp and mixed groups, and failures: a member killed
//! mid-broadcast and a member that never joins must end in errors naming it, never a hang.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common;

use common::{check, pattern, run_ok, spawn};
use std::time::Duration;
use tandem_transport::store::StoreClient;
use tandem_transport::{CommConfig, Communicator, TransportError};

child_roles! {
    "sizes" => |w, c| sizes(w, c).map_err(text),
    "stream" => |w, c| stream(w, c).map_err(text),
    "mixed" => |w, _| mixed(w).map_err(text),
    "bcast_kill" => kill,
    "absent" => absent,
}

fn text(e: TransportError) -> String {
    e.to_string()
}

/// True when this world's broadcasts must go through the shared segment.
fn expect_shared(cfg: &CommConfig) -> bool {
    cfg.transport.to_string() == "shm" && std::env::var("TT_BCAST_BYTES").map_or(true, |b| b != "0")
}

/// One broadcast from `root` of `len` pattern bytes, checked on every member.
fn one(w: &Communicator, root: usize, len: usize, seed: u64) -> Result<(), TransportError> {
    let want = pattern(seed, len);
    let mut buf = if w.rank() == root {
        want.clone()
    } else {
        vec![0xA5; len]
    };
    w.broadcast(root, &mut buf)?;
    check(
        &buf,
        &want,
        &format!("broadcast of {len} bytes from {root}"),
    );
    Ok(())
}

/// Every root, sizes from 0 bytes to past the segment (not multiples of the chunk), a size
/// mismatch that leaves the group usable, and a non-blocking broadcast; then checks which path
/// the bytes took.
fn sizes(w: &Communicator, cfg: &CommConfig) -> Result<(), TransportError> {
    let n = w.world_size();
    let lens = [
        0usize,
        1,
        63,
        4096,
        (256 << 10) + 13,
        (3 << 20) + 5,
        (9 << 20) + 1,
    ];
    let mut count = 0u64;
    for root in 0..n {
        for (i, &len) in lens.iter().enumerate() {
            one(w, root, len, (root * 100 + i) as u64)?;
            count += 1;
        }
    }
    // A receiver posting the wrong size gets both sizes; the next broadcast works everywhere.
    let root = n - 1;
    let odd = (root + 1) % n;
    let mut buf = vec![0u8; if w.rank() == odd { 1000 } else { 1234 }];
    if w.rank() == root {
        buf.copy_from_slice(&pattern(5, 1234));
    }
    match w.broadcast(root, &mut buf) {
        Ok(()) if w.rank() != odd => check(&buf, &pattern(5, 1234), "before mismatch"),
        Err(TransportError::SizeMismatch {
            sent: 1234,
            expected: 1000,
            ..
        }) if w.rank() == odd => {}
        other => panic!("rank {}: unexpected result {other:?}", w.rank()),
    }
    count += u64::from(w.rank() != odd);
    one(w, root, 777, 6)?;
    let got = w
        .ibroadcast(
            0,
            if w.rank() == 0 {
                pattern(8, 5000)
            } else {
                vec![0; 5000]
            },
        )
        .wait()?;
    check(&got, &pattern(8, 5000), "ibroadcast");
    count += 2;
    let st = w.shm_stats();
    let want = if expect_shared(cfg) { count } else { 0 };
    assert_eq!(st.shared_broadcasts, want, "shared broadcasts: {st:?}");
    w.barrier()
}

/// 300 broadcasts in a row from rotating roots and of varying sizes (the root runs ahead of
/// the receivers, ring bytes are reused many times), then a sub-group in another order.
fn stream(w: &Communicator, cfg: &CommConfig) -> Result<(), TransportError> {
    let n = w.world_size();
    let mut bytes = 0u64;
    for i in 0..300usize {
        let root = (i / 7) % n;
        let len = (i * 7919) % (600 << 10);
        one(w, root, len, i as u64)?;
        bytes += len as u64;
    }
    let st = w.shm_stats();
    if expect_shared(cfg) {
        assert_eq!(
            (st.shared_broadcasts, st.shared_broadcast_bytes),
            (300, bytes)
        );
        assert_eq!(
            st.ring_bytes_sent, 0,
            "no broadcast byte may cross a link: {st:?}"
        );
    }
    // Sub-group: every rank but 0, in reverse order; its group rank 1 is the root.
    if w.rank() != 0 {
        let ranks: Vec<usize> = (1..n).rev().collect();
        let g = w.subgroup(&ranks)?;
        for i in 0..20 {
            one(&g, 1 % g.world_size(), 100_000 + i, 1000 + i as u64)?;
        }
        let shared = g.shm_stats().shared_broadcasts;
        let want = if expect_shared(cfg) && g.world_size() > 1 {
            20
        } else {
            0
        };
        assert_eq!(shared, want, "sub-group shared broadcasts");
    }
    w.barrier()
}

/// Rank 3 lives on "another host": the world broadcasts by the chain, the sub-group of ranks
/// 0..3 (all shm) through its segment.
fn mixed(w: &Communicator) -> Result<(), TransportError> {
    for root in 0..w.world_size() {
        one(w, root, (5 << 20) + 3, root as u64)?;
    }
    assert_eq!(
        w.shm_stats().shared_broadcasts,
        0,
        "mixed world used a segment"
    );
    if w.rank() < 3 {
        let g = w.subgroup(&[0, 1, 2])?;
        for root in [2, 0] {
            one(&g, root, (5 << 20) + 3, 50 + root as u64)?;
        }
        assert_eq!(
            g.shm_stats().shared_broadcasts,
            2,
            "shm sub-group used the chain"
        );
    }
    w.barrier()
}

/// Group rank `TT_ROOT` broadcasts 16 MiB (twice the segment) until the parent kills rank
/// `TT_VICTIM`; every survivor must get `PeerDied` or `Broken` naming the victim.
fn kill(w: &Communicator, cfg: &CommConfig) -> Result<(), String> {
    let len = 16 << 20;
    let root: usize = std::env::var("TT_ROOT").unwrap().parse().unwrap();
    let victim: usize = std::env::var("TT_VICTIM").unwrap().parse().unwrap();
    let store = StoreClient::connect(&cfg.store_addr, &cfg.token, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let mut buf = pattern(9, len);
    let mut first = true;
    loop {
        match w.broadcast(root, &mut buf) {
            Ok(()) => {
                if std::mem::take(&mut first) {
                    if w.shm_stats().shared_broadcasts != 1 {
                        return Err("the broadcast did not use the shared segment".into());
                    }
                    store
                        .set(&format!("kill/ready/{}", w.rank()), b"1")
                        .map_err(|e| e.to_string())?;
                }
            }
            Err(
                e @ (TransportError::PeerDied { rank, .. } | TransportError::Broken { rank, .. }),
            ) if rank == victim => {
                println!("rank {} got: {e}", w.rank());
                return Ok(());
            }
            Err(e) => {
                return Err(format!(
                    "expected PeerDied/Broken naming rank {victim}, got {e}"
                ));
            }
        }
    }
}

/// Rank 2 never broadcasts (it waits in the store until the others are done, then leaves).
/// Whichever of ranks 0 and 1 times out first names rank 2 (rank 1 learns from the segment
/// that the root waits for it); the other is told that the broadcast was abandoned because of
/// rank 2.
fn absent(w: &Communicator, cfg: &CommConfig) -> Result<(), String> {
    let store = StoreClient::connect(&cfg.store_addr, &cfg.token, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    if w.rank() == 2 {
        return store
            .wait(
                &["absent/done/0", "absent/done/1"],
                Duration::from_secs(120),
            )
            .map_err(|e| e.to_string());
    }
    let mut buf = pattern(3, 16 << 20);
    let first = w.broadcast(0, &mut buf);
    // The group stays broken: the next call fails at once.
    let second = w.broadcast(0, &mut buf);
    store
        .set(&format!("absent/done/{}", w.rank()), b"1")
        .map_err(|e| e.to_string())?;
    match first {
        Err(TransportError::Timeout { rank: 2, .. } | TransportError::Broken { rank: 2, .. }) => {}
        other => return Err(format!("rank {}: unexpected {other:?}", w.rank())),
    }
    match second {
        Err(TransportError::Broken { .. }) => Ok(()),
        other => Err(format!("second broadcast: expected Broken, got {other:?}")),
    }
}

#[test]
fn shm_shared_broadcast_two_three_four_ranks() {
    for n in [2, 3, 4] {
        run_ok(n, "shm", "sizes", &[]);
    }
}

#[test]
fn shm_shared_broadcast_streams_through_a_small_segment() {
    // 64 KiB of segment: every broadcast above it waits for the slowest receiver.
    run_ok(
        4,
        "shm",
        "stream",
        &[("TT_BCAST_BYTES", (64 << 10).to_string())],
    );
    run_ok(3, "shm", "stream", &[]);
}

#[test]
fn chain_broadcast_without_segment() {
    run_ok(3, "tcp", "sizes", &[]);
    run_ok(4, "shm", "stream", &[("TT_BCAST_BYTES", "0".into())]);
}

#[test]
fn mixed_group_uses_the_chain_and_its_shm_subgroup_the_segment() {
    run_ok(4, "auto", "mixed", &[("TT_OTHER_HOST", "3".into())]);
}

fn kill_mid_broadcast(root: usize, victim: usize) {
    let n = 4;
    let w = spawn(
        n,
        "shm",
        "bcast_kill",
        Duration::from_secs(30),
        &[
            ("TT_ROOT", root.to_string()),
            ("TT_VICTIM", victim.to_string()),
        ],
    );
    let store = StoreClient::connect(
        &w.store.addr().to_string(),
        common::TOKEN,
        Duration::from_secs(5),
    )
    .unwrap();
    let keys: Vec<String> = (0..n).map(|r| format!("kill/ready/{r}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait(&refs, Duration::from_secs(60)).unwrap();
    let mut w = w;
    w.children[victim].kill().unwrap();
    let codes = w.wait(Duration::from_secs(90));
    for (r, c) in codes.iter().enumerate() {
        if r != victim {
            assert_eq!(
                *c,
                Some(0),
                "survivor {r} must report the dead rank {victim} (root {root}): codes {codes:?}"
            );
        }
    }
}

#[test]
fn shm_receiver_killed_mid_broadcast() {
    kill_mid_broadcast(1, 2);
}

#[test]
fn shm_root_killed_mid_broadcast() {
    kill_mid_broadcast(1, 1);
}

#[test]
fn shm_absent_member_times_out_naming_it() {
    let w = spawn(3, "shm", "absent", Duration::from_secs(1), &[]);
    assert_eq!(
        w.wait(Duration::from_secs(60)),
        vec![Some(0), Some(0), Some(0)]
    );
}
