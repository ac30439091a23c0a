//! Multi-process tests of a healthy world: every rank is a real child process (this test
//! binary re-run with `child_entry` and a role), linked by real shared memory or real TCP
//! sockets. Collectives on 2 and 4 ranks, the colocated topology, a 1 GiB message, the
//! rendezvous naming a missing rank (the transport bench's own test is in `bench/cli`).
//! Failures are in `peer_failures.rs`, the shm single-copy paths in `single_copy.rs`, the
//! broadcast paths (shared segment, chain) and their failures in `broadcast.rs`.

#![allow(clippy::unwrap_used)] // tests may unwrap

use crate::common;

use common::{check, pattern, run_ok};
use std::time::Duration;
use tandem_transport::{CommConfig, Communicator, TransportError};

child_roles! {
    "basic" => |w, _| basic(w).map_err(text),
    "big" => |w, _| big(w).map_err(text),
    "colocated" => |w, _| colocated(w).map_err(text),
}

fn text(e: TransportError) -> String {
    e.to_string()
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
