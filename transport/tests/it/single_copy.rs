//! Multi-process tests of the shm single-copy path (`process_vm_readv`) between real child
//! processes (see `multiproc.rs`): which path large messages take, checked with the
//! communicator's counters (single copy, ring only, a receiver's fallback, a read the kernel
//! refuses), and a single-copy send that timed out being withdrawn.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common;

use common::{check, pattern, run_ok, spawn};
use std::time::Duration;
use tandem_transport::{Communicator, TransportError};

child_roles! {
    "paths" => |w, _| paths(w),
    "eperm" => |w, _| eperm(w),
    "late" => |w, _| late(w),
}

/// Which path large shm messages take (`TT_EXPECT`: `single`, `ring` or `fallback`), checked
/// with the communicator's counters; bytes checked both ways, including an `isend` of an
/// owned buffer, a message below the threshold and a size mismatch on a large message.
fn paths(w: &Communicator) -> Result<(), String> {
    let expect = std::env::var("TT_EXPECT").unwrap();
    let e = |e: TransportError| e.to_string();
    let sizes = [64usize << 20, 1 << 20, 4 << 20];
    let small = 100 << 10; // below the 256 KiB threshold: always the ring
    if w.rank() == 0 {
        for (i, &len) in sizes.iter().enumerate() {
            w.send(1, &pattern(i as u64, len), i as u32).map_err(e)?;
        }
        let h = w.isend(1, pattern(9, 8 << 20), 9);
        w.send(1, &pattern(10, small), 10).map_err(e)?;
        h.wait().map_err(e)?;
        w.send(1, &pattern(11, 2 << 20), 11).map_err(e)?; // received with a wrong size
        w.send(1, &pattern(12, 3 << 20), 12).map_err(e)?;
    } else {
        for (i, &len) in sizes.iter().enumerate() {
            let mut got = vec![0u8; len];
            w.recv(0, &mut got, i as u32).map_err(e)?;
            check(&got, &pattern(i as u64, len), "large message");
        }
        // Tag 10 arrives after tag 9 is posted for: the large frame is stashed or read first.
        let mut r10 = vec![0u8; small];
        let r9 = w.irecv(0, vec![0u8; 8 << 20], 9).wait().map_err(e)?;
        w.recv(0, &mut r10, 10).map_err(e)?;
        check(&r9, &pattern(9, 8 << 20), "isend buffer");
        check(&r10, &pattern(10, small), "small message");
        let mut wrong = vec![0u8; 1 << 20];
        match w.recv(0, &mut wrong, 11) {
            Err(TransportError::SizeMismatch {
                sent, expected: e2, ..
            }) if sent == 2 << 20 && e2 == 1 << 20 => {}
            other => return Err(format!("expected a size mismatch, got {other:?}")),
        }
        let mut ok = vec![0u8; 3 << 20];
        w.recv(0, &mut ok, 12).map_err(e)?;
        check(&ok, &pattern(12, 3 << 20), "after a large mismatch");
    }
    w.barrier().map_err(e)?;
    let st = w.shm_stats();
    let large: u64 = sizes.iter().map(|&l| l as u64).sum::<u64>() + (8 << 20) + (5 << 20);
    let msgs = sizes.len() as u64 + 3;
    let ok = match (expect.as_str(), w.rank()) {
        // Only headers, descriptors and the small messages cross the ring.
        ("single", 0) => st.single_copy_sent == msgs && st.ring_bytes_sent < 1 << 20,
        ("single", _) => {
            // The mismatched message is dropped without being copied.
            st.single_copy_received == msgs - 1
                && st.single_copy_bytes_received == large - (2 << 20)
                && st.ring_bytes_received < 1 << 20
                && st.fallbacks == 0
        }
        ("ring", 0) => st.single_copy_sent == 0 && st.ring_bytes_sent >= large,
        ("ring", _) => st.single_copy_received == 0 && st.fallbacks == 0,
        // The receiver answers the first descriptor with a fallback; the sender then stops
        // posting descriptors on this link.
        ("fallback", 0) => st.single_copy_sent == 0 && st.ring_bytes_sent >= large,
        ("fallback", _) => {
            st.single_copy_received == 0
                && st.fallbacks == 1
                && st.ring_bytes_received >= large - (2 << 20)
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "rank {} expected path {expect}, counters {st:?}",
            w.rank()
        ))
    }
}

/// The kernel refuses the single-copy read (rank 0 is not dumpable; rank 1 drops root if it
/// has it, losing CAP_SYS_PTRACE): the receiver falls back to the ring by itself and the data
/// arrives intact. The other direction (rank 0 reads rank 1) still goes by single copy.
fn eperm(w: &Communicator) -> Result<(), String> {
    let e = |e: TransportError| e.to_string();
    if w.rank() == 0 {
        nix::sys::prctl::set_dumpable(false).map_err(|e| e.to_string())?;
    } else {
        // SAFETY: geteuid/setuid take and return integers; this child drops root (if it has
        // it) for the rest of its life, which is what the test wants.
        let failed = unsafe { libc::geteuid() == 0 && libc::setuid(65534) != 0 };
        if failed {
            return Err("setuid(65534) failed".into());
        }
    }
    w.barrier().map_err(e)?;
    let len = 4 << 20;
    if w.rank() == 0 {
        for i in 0..3 {
            w.send(1, &pattern(i, len), 0).map_err(e)?;
        }
        let mut back = vec![0u8; len];
        w.recv(1, &mut back, 1).map_err(e)?;
        check(&back, &pattern(7, len), "reverse direction");
    } else {
        for i in 0..3 {
            let mut got = vec![0u8; len];
            w.recv(0, &mut got, 0).map_err(e)?;
            check(&got, &pattern(i, len), "after fallback");
        }
        w.send(0, &pattern(7, len), 1).map_err(e)?;
    }
    w.barrier().map_err(e)?;
    let st = w.shm_stats();
    let ok = if w.rank() == 0 {
        st.single_copy_sent == 0 && st.single_copy_received == 1
    } else {
        st.fallbacks == 1 && st.single_copy_received == 0 && st.single_copy_sent == 1
    };
    if ok {
        Ok(())
    } else {
        Err(format!("rank {}: unexpected counters {st:?}", w.rank()))
    }
}

/// Rank 1 posts its receive only after rank 0's single-copy send timed out: the sender gets
/// `Timeout` naming rank 1 (and may reuse its buffer), the receiver an error instead of bytes
/// read from a withdrawn buffer. The ranks order this by signals, not by sleeping.
fn late(w: &Communicator) -> Result<(), String> {
    let len = 1 << 20;
    if w.rank() == 0 {
        let sent = w.send(1, &pattern(1, len), 0);
        common::signal("send-timed-out");
        match sent {
            Err(TransportError::Timeout { rank: 1, what, .. }) if what.contains("single-copy") => {}
            other => {
                return Err(format!(
                    "expected a single-copy Timeout naming rank 1, got {other:?}"
                ));
            }
        }
        common::wait_for("received"); // stay alive while rank 1 receives
        return Ok(());
    }
    common::wait_for("send-timed-out");
    let mut buf = vec![0u8; len];
    let got = w.recv(0, &mut buf, 0);
    common::signal("received");
    match got {
        Err(TransportError::Protocol { msg, .. }) if msg.contains("withdrew") => Ok(()),
        other => Err(format!(
            "expected the withdrawn message to fail, got {other:?}"
        )),
    }
}

#[test]
fn shm_large_messages_go_by_single_copy() {
    run_ok(2, "shm", "paths", &[("TT_EXPECT", "single".into())]);
}

#[test]
fn shm_single_copy_disabled_uses_the_ring() {
    run_ok(
        2,
        "shm",
        "paths",
        &[("TT_EXPECT", "ring".into()), ("TT_RING_ONLY", "0,1".into())],
    );
}

#[test]
fn shm_receiver_without_single_copy_gets_a_ring_fallback() {
    run_ok(
        2,
        "shm",
        "paths",
        &[
            ("TT_EXPECT", "fallback".into()),
            ("TT_RING_ONLY", "1".into()),
        ],
    );
}

#[test]
fn shm_refused_single_copy_read_falls_back_to_the_ring() {
    run_ok(2, "shm", "eperm", &[]);
}

#[test]
fn single_copy_send_that_timed_out_is_withdrawn() {
    let (_dir, sync) = common::sync_dir();
    let w = spawn(2, "shm", "late", Duration::from_secs(1), &[sync]);
    assert_eq!(w.wait(Duration::from_secs(60)), vec![Some(0), Some(0)]);
}
