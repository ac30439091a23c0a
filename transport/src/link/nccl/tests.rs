//! The NCCL link's hub on a CPU: each "rank" is a thread with its own hub, and a pair's wire is
//! a channel per direction whose exchange blocks until the peer's message of the announced
//! length arrives, like a grouped ncclSend/ncclRecv. A wrong global order of rounds, a
//! length mismatch or a lost credit would hang or fail these tests.
#![allow(clippy::unwrap_used)]

use super::hub::{self, CHUNK, Stop, Wire};
use super::{FrameHeader, Link, NcclLink, PeerInfo};
use crate::error::TransportError;
use crate::link::MsgKey;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

struct ChanWire {
    tx: Vec<Option<Sender<Vec<u8>>>>,
    rx: Vec<Receiver<Vec<u8>>>,
}

impl Wire for ChanWire {
    fn exchange(&mut self, i: usize, out: &[u8], inb: &mut [u8]) -> Result<(), Stop> {
        let Some(tx) = &self.tx[i] else {
            return Err(Stop::Failed("retired".into()));
        };
        tx.send(out.to_vec())
            .map_err(|_| Stop::PeerDied("peer gone".into()))?;
        let got = self.rx[i]
            .recv_timeout(Duration::from_secs(20))
            .map_err(|e| Stop::PeerDied(format!("{e}")))?;
        assert_eq!(got.len(), inb.len(), "round lengths disagree");
        inb.copy_from_slice(&got);
        Ok(())
    }

    fn retire(&mut self, i: usize) {
        self.tx[i] = None;
    }
}

/// A world of `n` ranks whose every pair is a channel wire: per rank, its links by peer rank.
fn world(n: usize) -> Vec<Vec<(usize, NcclLink)>> {
    // wires[a][b]: the channel a -> b.
    let mut txs: Vec<Vec<Option<Sender<Vec<u8>>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut rxs: Vec<Vec<Option<Receiver<Vec<u8>>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for a in 0..n {
        for b in 0..n {
            if a != b {
                let (t, r) = channel();
                txs[a][b] = Some(t);
                rxs[b][a] = Some(r);
            }
        }
    }
    (0..n)
        .map(|me| {
            // Global pair order: (min, max).
            let mut order: Vec<usize> = (0..n).filter(|&r| r != me).collect();
            order.sort_by_key(|&r| (r.min(me), r.max(me)));
            let wire = ChanWire {
                tx: order.iter().map(|&r| txs[me][r].take()).collect(),
                rx: order.iter().map(|&r| rxs[me][r].take().unwrap()).collect(),
            };
            let (h, pairs) =
                hub::start(move || Ok(wire), order.len(), Duration::from_secs(5)).unwrap();
            order
                .into_iter()
                .zip(pairs)
                .map(|(r, pair)| {
                    let peer = PeerInfo {
                        rank: r,
                        addr: format!("test pair {me}-{r}"),
                        timeout: Duration::from_secs(10),
                    };
                    (
                        r,
                        NcclLink {
                            pair,
                            hub: Arc::clone(&h),
                            peer,
                        },
                    )
                })
                .collect()
        })
        .collect()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

fn hdr(tag: u32, len: usize) -> FrameHeader {
    FrameHeader {
        key: MsgKey {
            group: 1,
            kind: 0,
            tag,
        },
        len: len as u64,
    }
}

const IDLE: Duration = Duration::from_secs(10);

fn link(links: &[(usize, NcclLink)], r: usize) -> &NcclLink {
    &links.iter().find(|(p, _)| *p == r).unwrap().1
}

/// Every rank sends frames of `sizes` to the next rank while receiving from the previous one.
fn ring(n: usize, sizes: &[usize]) {
    let w = world(n);
    std::thread::scope(|s| {
        for (me, links) in w.iter().enumerate() {
            s.spawn(move || {
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                std::thread::scope(|s2| {
                    s2.spawn(|| {
                        for (t, &len) in sizes.iter().enumerate() {
                            let data = pattern((me * 100 + t) as u64, len);
                            link(links, next)
                                .send_frame(&hdr(t as u32, len), &data, IDLE)
                                .unwrap();
                        }
                    });
                    for (t, &len) in sizes.iter().enumerate() {
                        let l = link(links, prev);
                        let h = l.recv_header(IDLE).map_err(|(e, _)| e).unwrap();
                        assert_eq!(h, hdr(t as u32, len));
                        let mut got = vec![0u8; len];
                        l.recv_payload(&mut got, IDLE).unwrap();
                        assert!(
                            got == pattern((prev * 100 + t) as u64, len),
                            "frame {t} of {len} bytes"
                        );
                    }
                });
            });
        }
    });
}

#[test]
fn two_ranks_both_ways_across_chunks_and_credit() {
    // 3 chunks + 3 outruns both pipes: the sender waits for the reader's credit.
    ring(2, &[0, 1, 4096, 5 << 20, 3 * CHUNK + 3, 7]);
}

#[test]
fn three_ranks_full_mesh_ring_does_not_deadlock() {
    ring(3, &[1, 4096, CHUNK + 1, 64]);
}

#[test]
fn four_ranks_everyone_to_everyone() {
    let n = 4;
    let w = world(n);
    std::thread::scope(|s| {
        for (me, links) in w.iter().enumerate() {
            s.spawn(move || {
                std::thread::scope(|s2| {
                    s2.spawn(|| {
                        for (r, l) in links {
                            let d = pattern((me * 10 + r) as u64, 100_000 + r);
                            l.send_frame(&hdr(9, d.len()), &d, IDLE).unwrap();
                        }
                    });
                    for (r, l) in links.iter().rev() {
                        let h = l.recv_header(IDLE).map_err(|(e, _)| e).unwrap();
                        let mut got = vec![0u8; h.len as usize];
                        l.recv_payload(&mut got, IDLE).unwrap();
                        assert!(got == pattern((r * 10 + me) as u64, 100_000 + me));
                    }
                });
            });
        }
    });
}

#[test]
fn idle_receive_times_out_cleanly_then_works() {
    let mut w = world(2);
    let (b, a) = (w.pop().unwrap(), w.pop().unwrap());
    match link(&b, 0).recv_header(Duration::from_millis(50)) {
        Err((TransportError::Timeout { .. }, true)) => {}
        other => panic!(
            "expected a clean timeout, got {:?}",
            other.map_err(|(e, c)| (e.to_string(), c))
        ),
    }
    link(&a, 1).send_frame(&hdr(1, 3), b"abc", IDLE).unwrap();
    assert_eq!(
        link(&b, 0).recv_header(IDLE).map_err(|(e, _)| e).unwrap(),
        hdr(1, 3)
    );
    let mut got = [0u8; 3];
    link(&b, 0).recv_payload(&mut got, IDLE).unwrap();
    assert_eq!(&got, b"abc");
}

#[test]
fn dropped_world_delivers_what_it_sent_then_reads_as_peer_died() {
    let mut w = world(2);
    let (b, a) = (w.pop().unwrap(), w.pop().unwrap());
    let data = pattern(5, 2 * CHUNK + 11);
    link(&a, 1)
        .send_frame(&hdr(2, data.len()), &data, IDLE)
        .unwrap();
    let t = std::thread::spawn(move || drop(a));
    let h = link(&b, 0).recv_header(IDLE).map_err(|(e, _)| e).unwrap();
    let mut got = vec![0u8; h.len as usize];
    link(&b, 0).recv_payload(&mut got, IDLE).unwrap();
    assert!(got == data);
    t.join().unwrap();
    match link(&b, 0).recv_header(IDLE) {
        Err((TransportError::PeerDied { rank: 0, .. }, false)) => {}
        other => panic!(
            "expected PeerDied, got {:?}",
            other.map_err(|(e, c)| (e.to_string(), c))
        ),
    }
    assert!(matches!(
        link(&b, 0).send_frame(&hdr(3, 1), b"x", IDLE),
        Err(TransportError::PeerDied { .. })
    ));
}
