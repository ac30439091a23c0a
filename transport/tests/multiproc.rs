//! Multi-process tests: every rank is a real child process (this test binary re-run with
//! `child_entry` and a role), linked by real shared memory or real TCP sockets.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use common::{check, pattern, run_ok, spawn};
use std::time::Duration;
use tandem_transport::store::StoreClient;
use tandem_transport::{CommConfig, Communicator, TransportError};

#[test]
#[ignore = "child entry point: run by the other tests in a child process"]
fn child_entry() {
    tandem_transport::bench::child_main_if_requested();
    let Ok(role) = std::env::var(common::ROLE) else {
        eprintln!("child_entry only runs as a child of the multi-process tests");
        return;
    };
    tandem_transport::local::die_with_parent();
    let code = match run_role(&role) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("child role {role} failed: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run_role(role: &str) -> Result<(), String> {
    let mut cfg = CommConfig::from_env().map_err(|e| e.to_string())?;
    // Ranks listed in TT_RING_ONLY run with the single-copy path disabled.
    if let Ok(list) = std::env::var("TT_RING_ONLY")
        && list.split(',').any(|r| r == cfg.rank.to_string())
    {
        cfg.shm.single_copy = tandem_transport::SingleCopy::Off;
    }
    let world = Communicator::init(&cfg).map_err(|e| e.to_string())?;
    let s = |e: TransportError| e.to_string();
    match role {
        "basic" => basic(&world).map_err(s),
        "big" => big(&world).map_err(s),
        "mismatch" => mismatch(&world),
        "kill" => kill(&world, &cfg),
        "silent" => silent(&world),
        "colocated" => colocated(&world).map_err(s),
        "paths" => paths(&world),
        "eperm" => eperm(&world),
        "late" => late(&world),
        other => Err(format!("unknown role {other}")),
    }
}

/// p2p ring exchange, out-of-order tags, isend/irecv, broadcast from every root, all_gather,
/// barrier, and a sub-group.
fn basic(w: &Communicator) -> Result<(), TransportError> {
    let (me, n) = (w.rank(), w.world_size());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    for &len in &[0usize, 1, 4096, 5 << 20, 9 << 20] {
        let out = pattern((me * 1000 + len) as u64, len);
        let h = w.isend(next, out, 3);
        let mut got = vec![0u8; len];
        w.recv(prev, &mut got, 3)?;
        check(&got, &pattern((prev * 1000 + len) as u64, len), "p2p ring");
        h.wait()?;
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
    for root in 0..n {
        for &len in &[7usize, 6 << 20] {
            let mut buf = if me == root {
                pattern(root as u64 + 77, len)
            } else {
                vec![0; len]
            };
            w.broadcast(root, &mut buf)?;
            check(&buf, &pattern(root as u64 + 77, len), "broadcast");
        }
    }
    for &len in &[1usize, 3 << 20] {
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
    w.barrier()?;
    // Sub-group of the even ranks, in reverse order.
    let evens: Vec<usize> = (0..n).filter(|r| r % 2 == 0).rev().collect();
    if me % 2 == 0 {
        let g = w.subgroup(&evens)?;
        let mut buf = if g.rank() == 0 {
            pattern(99, 1234)
        } else {
            vec![0; 1234]
        };
        g.broadcast(0, &mut buf)?;
        check(&buf, &pattern(99, 1234), "subgroup broadcast");
        let mut all = vec![0u8; g.world_size()];
        g.all_gather(&[g.global_rank() as u8], &mut all)?;
        assert_eq!(all, evens.iter().map(|&r| r as u8).collect::<Vec<_>>());
    }
    w.barrier()
}

/// The seed topology in a few lines: trainer-only group, engine i -> trainer i pairs.
fn colocated(world: &Communicator) -> Result<(), TransportError> {
    use tandem_transport::topology::{Colocated, Role};
    let topo = Colocated::new(world.world_size() / 2);
    let groups = world.groups(&topo.groups_of(world.rank()))?;
    let len = 2 << 20;
    match topo.role(world.rank()) {
        Some(Role::Engine(i)) => {
            let pair = &groups[&format!("pair{i}")];
            pair.send(1, &pattern(i as u64, len), 0)?; // pair rank 0 = engine, 1 = trainer
        }
        Some(Role::Trainer(i)) => {
            let pair = &groups[&format!("pair{i}")];
            let mut shard = vec![0u8; len];
            pair.recv(0, &mut shard, 0)?;
            check(&shard, &pattern(i as u64, len), "hidden-state shard");
            let trainers = &groups["trainers"];
            let mut all = vec![0u8; trainers.world_size()];
            trainers.all_gather(&[i as u8], &mut all)?;
            assert_eq!(all, (0..trainers.world_size() as u8).collect::<Vec<_>>());
        }
        None => unreachable!("rank out of range"),
    }
    // Step metadata from trainer 0 to everyone (the control group).
    let mut step = if world.rank() == 0 {
        [7u8; 16]
    } else {
        [0u8; 16]
    };
    groups["world"].broadcast(0, &mut step)?;
    assert_eq!(step, [7u8; 16]);
    Ok(())
}

/// One 1 GiB message from rank 0 to rank 1, checked byte for byte.
fn big(w: &Communicator) -> Result<(), TransportError> {
    let len = 1usize << 30;
    if w.rank() == 0 {
        w.send(1, &pattern(42, len), 0)?;
        let mut ack = [0u8; 1];
        w.recv(1, &mut ack, 1)?;
        assert_eq!(ack[0], 1);
    } else {
        let mut got = vec![0u8; len];
        w.recv(0, &mut got, 0)?;
        check(&got, &pattern(42, len), "1 GiB message");
        w.send(0, &[1], 1)?;
    }
    Ok(())
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
/// read from a withdrawn buffer.
fn late(w: &Communicator) -> Result<(), String> {
    let len = 1 << 20;
    if w.rank() == 0 {
        match w.send(1, &pattern(1, len), 0) {
            Err(TransportError::Timeout { rank: 1, what, .. }) if what.contains("single-copy") => {}
            other => {
                return Err(format!(
                    "expected a single-copy Timeout naming rank 1, got {other:?}"
                ));
            }
        }
        std::thread::sleep(Duration::from_secs(3)); // stay alive while rank 1 receives
        return Ok(());
    }
    std::thread::sleep(Duration::from_millis(2500));
    let mut buf = vec![0u8; len];
    match w.recv(0, &mut buf, 0) {
        Err(TransportError::Protocol { msg, .. }) if msg.contains("withdrew") => Ok(()),
        other => Err(format!(
            "expected the withdrawn message to fail, got {other:?}"
        )),
    }
}

/// Rank 1 stays alive but never sends; rank 0's receive times out naming rank 1.
fn silent(w: &Communicator) -> Result<(), String> {
    if w.rank() == 1 {
        std::thread::sleep(Duration::from_secs(4));
        return Ok(());
    }
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 8];
    match w.recv(1, &mut b, 0) {
        Err(TransportError::Timeout {
            rank: 1, ref addr, ..
        }) if !addr.is_empty() => {
            println!("timed out after {:?}", t0.elapsed());
            Ok(())
        }
        other => Err(format!("expected Timeout naming rank 1, got {other:?}")),
    }
}

#[test]
fn shm_two_ranks() {
    run_ok(2, "shm", "basic", &[]);
}

#[test]
fn shm_four_ranks() {
    run_ok(4, "shm", "basic", &[]);
}

#[test]
fn tcp_two_ranks() {
    run_ok(2, "tcp", "basic", &[]);
}

#[test]
fn tcp_four_ranks() {
    run_ok(4, "tcp", "basic", &[]);
}

#[test]
fn colocated_topology_four_ranks() {
    run_ok(4, "auto", "colocated", &[]);
}

#[test]
fn communicator_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Communicator>();
    check::<tandem_transport::Pending<Vec<u8>>>();
    check::<tandem_transport::store::StoreClient>();
}

#[test]
fn shm_one_gib_message() {
    run_ok(2, "shm", "big", &[]);
}

#[test]
fn tcp_one_gib_message() {
    run_ok(2, "tcp", "big", &[]);
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
    let w = spawn(2, "shm", "late", Duration::from_secs(1), &[]);
    assert_eq!(w.wait(Duration::from_secs(30)), vec![Some(0), Some(0)]);
}

#[test]
fn silent_peer_times_out_naming_it() {
    let w = spawn(2, "shm", "silent", Duration::from_secs(1), &[]);
    assert_eq!(w.wait(Duration::from_secs(30)), vec![Some(0), Some(0)]);
}

#[test]
fn missing_rank_fails_rendezvous_naming_the_key() {
    let server = tandem_transport::store::StoreServer::start("127.0.0.1:0", "t").unwrap();
    let mut cfg = CommConfig::new(&server.addr().to_string(), "t", 0, 2);
    cfg.timeout = Duration::from_millis(500);
    match Communicator::init(&cfg) {
        Err(TransportError::StoreTimeout { missing, .. }) => {
            assert_eq!(missing, vec!["world/place/1"])
        }
        other => panic!("expected StoreTimeout, got {other:?}"),
    }
}

#[test]
fn bench_reports_every_case_beside_a_limit() {
    let opts = tandem_transport::bench::BenchOptions {
        min_bytes: 4096,
        max_bytes: 65536,
        broadcast_ranks: 3,
        latency_iters: 50,
        child_args: ["child_entry", "--exact", "--ignored", "--nocapture"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let ms = tandem_transport::bench::bench(&opts).unwrap();
    let cases: Vec<&str> = ms.iter().map(|m| m.case.as_str()).collect();
    for want in [
        "latency shm round trip 8 B",
        "p2p shm 4 KiB",
        "p2p shm 64 KiB",
        "broadcast shm x3 16 KiB",
        "latency tcp round trip 8 B",
        "p2p tcp 16 KiB",
        "broadcast tcp x3 64 KiB",
    ] {
        assert!(cases.contains(&want), "missing {want} in {cases:?}");
    }
    assert!(cases.contains(&"shm single-copy kernel copy 8 MiB"));
    assert_eq!(ms.len(), 2 * (1 + 3 + 3) + 1);
    for m in &ms {
        assert!(m.value.is_finite() && m.value > 0.0, "{m:?}");
        assert!(m.limit.is_finite() && m.limit > 0.0, "{m:?}");
    }
}
