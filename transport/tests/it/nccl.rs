//! The NCCL link (feature `cuda`) on a real GPU: worlds of 2 and 3 child processes whose every
//! pair is planned on NCCL, running p2p (0 B to 64 MiB + 3, across the link's 8 MiB round chunk
//! and 16 MiB pipes; tags out of order; isend/irecv both ways at once), broadcast from every
//! root, all_gather and barrier, plus a 256 MiB transfer timed.
//!
//! A test machine has one GPU, and NCCL refuses two ranks of one communicator on one device
//! ("Duplicate GPU detected"). `TT_ONE_GPU` (tests/it/common) therefore gives every rank its own
//! host id and its own `NCCL_HOSTID`: the plan picks NCCL for "different hosts, GPUs" and NCCL
//! connects the ranks through its network (socket) transport, so the bytes still go
//! host -> device -> NCCL -> device -> host through the real link code. Run with
//! `NCCL_SOCKET_IFNAME=lo` where the machine has no other interface NCCL accepts.
//!
//! Needs a CUDA GPU and libnccl (as `libnccl.so` on the library path: cudarc never opens
//! `libnccl.so.2`, see `cuda_available`), so every test is `#[ignore]`d; on a GPU machine see
//! `scripts/gpu-tests.sh` and transport/ARCH-NOTES.md ("On a GPU", which also records how the
//! earlier link, two communicators per pair driven from the caller threads, hung here). Each
//! child prints a progress line per step, so a log shows where a run stopped.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common;

use common::{check, pattern};
use std::time::{Duration, Instant};
use tandem_transport::plan::BackendKind;
use tandem_transport::{Communicator, TransportError, cuda_available};

child_roles! {
    "nccl" => |w, _| nccl(w).map_err(|e: TransportError| e.to_string()),
}

const MIB: usize = 1 << 20;

/// Progress line on stderr (children inherit it), so a hang shows the step it stopped at.
fn stage(me: usize, t0: Instant, what: &str) {
    eprintln!("[rank {me} +{:.2}s] {what}", t0.elapsed().as_secs_f64());
}

fn nccl(w: &Communicator) -> Result<(), TransportError> {
    let (me, n) = (w.rank(), w.world_size());
    let t0 = Instant::now();
    stage(me, t0, "joined");
    for r in (0..n).filter(|&r| r != me) {
        let b = w.backend_to(r)?;
        if b != BackendKind::Nccl {
            return Err(TransportError::Invalid(format!(
                "rank {me} -> {r} planned on {b}, not nccl"
            )));
        }
    }
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    // 5 MiB and 64 MiB + 3 cross the link's 8 MiB round chunk and 16 MiB pipe credit.
    for &len in &[0usize, 1, 4096, 5 * MIB, 64 * MIB + 3] {
        let out = pattern((me * 1000 + len) as u64, len);
        let h = w.isend(next, out, 3);
        let mut got = vec![0u8; len];
        w.recv(prev, &mut got, 3)?;
        check(&got, &pattern((prev * 1000 + len) as u64, len), "p2p ring");
        h.wait()?;
        stage(me, t0, &format!("p2p ring {len} bytes"));
    }
    // Two tags sent in one order and received in the other (the first is stashed).
    let a = w.isend(next, pattern(1, 3000), 10);
    let b = w.isend(next, pattern(2, 5000), 11);
    a.wait()?;
    b.wait()?;
    let r11 = w.irecv(prev, vec![0; 5000], 11).wait()?;
    let mut r10 = vec![0; 3000];
    w.recv(prev, &mut r10, 10)?;
    check(&r10, &pattern(1, 3000), "tag 10");
    check(&r11, &pattern(2, 5000), "tag 11");
    stage(me, t0, "tags out of order");
    for root in 0..n {
        for &len in &[7usize, 6 * MIB + 5] {
            let mut buf = if me == root {
                pattern(root as u64 + 77, len)
            } else {
                vec![0; len]
            };
            w.broadcast(root, &mut buf)?;
            check(&buf, &pattern(root as u64 + 77, len), "broadcast");
            stage(me, t0, &format!("broadcast root {root} {len} bytes"));
        }
    }
    for &len in &[1usize, 3 * MIB] {
        let mut out = vec![0u8; n * len];
        w.all_gather(&pattern(me as u64 + 5, len), &mut out)?;
        for r in 0..n {
            check(
                &out[r * len..(r + 1) * len],
                &pattern(r as u64 + 5, len),
                "all_gather",
            );
        }
    }
    stage(me, t0, "all_gather");
    w.barrier()?;
    stage(me, t0, "barrier");
    // Timed: rank 0 sends 256 MiB to rank 1, three times; rank 1 reports.
    let len = 256 * MIB;
    if me == 0 {
        let data = pattern(42, len);
        for _ in 0..3 {
            w.send(1, &data, 20)?;
        }
    } else if me == 1 {
        let mut buf = vec![0u8; len];
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            w.recv(0, &mut buf, 20)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        check(&buf, &pattern(42, len), "timed 256 MiB");
        eprintln!(
            "NCCL link, world of {n}: 256 MiB rank 0 -> 1 best of 3 {:.1} ms = {:.2} GB/s \
             (host -> device -> NCCL socket transport -> device -> host)",
            best * 1e3,
            len as f64 / best / 1e9
        );
    }
    w.barrier()?;
    eprintln!("rank {me} of {n}: NCCL p2p, tags, broadcast, all_gather, barrier all passed");
    Ok(())
}

fn run(n: usize) {
    assert!(
        cuda_available(),
        "libcuda and libnccl must load: cudarc opens libnccl.so, never libnccl.so.2, so link \
         libnccl.so -> libnccl.so.2 in a directory on LD_LIBRARY_PATH"
    );
    let t = Instant::now();
    let w = common::spawn(
        n,
        "nccl",
        "nccl",
        Duration::from_secs(60),
        &[("TT_ONE_GPU", "cuda:0".into())],
    );
    let codes = w.wait(Duration::from_secs(90));
    println!(
        "NCCL world of {n} on one GPU: exit codes {codes:?} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "NCCL world of {n}: exit codes {codes:?}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl (see the module doc)"]
fn nccl_link_two_ranks_on_one_gpu() {
    run(2);
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl (see the module doc)"]
fn nccl_link_three_ranks_on_one_gpu() {
    run(3);
}
