//! The CUDA VMM backend (feature `cuda`) on a real GPU: a region written, paused (its physical
//! memory returned to the driver: checked with `cuMemGetInfo`), resumed at the same device
//! address with its bytes back bit-exact; the `discard` policy; many regions at once; and the
//! exported POSIX fd imported by a second process (this test binary re-executed), which sees
//! the owner's bytes, writes bytes the owner sees, and keeps the physical memory alive while
//! the owner is paused.
//!
//! Every test here needs a CUDA device, so all are `#[ignore]`d (a machine without one would
//! otherwise report a skip as a pass). On a GPU machine:
//! `cargo test -p tandem-memory --features cuda --test it -- --ignored --test-threads=1 cuda_vmm::`.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

use tandem_memory::cuda::{CudaVmm, VmmRegion};
use tandem_memory::{BackupPolicy, recv_fds, send_fds};

const MIB: usize = 1 << 20;
const SOCK_ENV: &str = "TANDEM_MEMORY_CUDA_TEST_SOCK";
const IPC_SIZE: usize = 64 * MIB;

/// The 1 MiB block at `chunk` for `seed`: the common word pattern, chunk index stamped in the
/// first word so a misplaced block is caught too.
fn block(seed: u64, chunk: usize) -> Vec<u8> {
    let mut words = vec![0u64; MIB / 8];
    common::fill(&mut words, seed);
    words[0] = (chunk as u64) ^ (seed << 40);
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Writes the pattern for `seed` over `from..from+len` (whole MiBs) of a region.
fn write_pattern(w: impl Fn(usize, &[u8]), from: usize, len: usize, seed: u64) {
    let mut b = block(seed, 0);
    for c in (from / MIB)..((from + len) / MIB) {
        b[..8].copy_from_slice(&((c as u64) ^ (seed << 40)).to_le_bytes());
        w(c * MIB, &b);
    }
}

/// Reads `from..from+len` back and panics at the first MiB that differs from `seed`'s pattern.
fn check_pattern(r: impl Fn(usize, &mut [u8]), from: usize, len: usize, seed: u64, what: &str) {
    let mut want = block(seed, 0);
    let mut got = vec![0u8; MIB];
    for c in (from / MIB)..((from + len) / MIB) {
        want[..8].copy_from_slice(&((c as u64) ^ (seed << 40)).to_le_bytes());
        r(c * MIB, &mut got);
        if got != want {
            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
            panic!(
                "{what}: byte {} differs: got {:#04x} want {:#04x}",
                c * MIB + i,
                got[i],
                want[i]
            );
        }
    }
}

fn fill(r: &VmmRegion, seed: u64) {
    write_pattern(|o, b| r.write(o, b).unwrap(), 0, r.len(), seed);
}

fn verify(r: &VmmRegion, seed: u64, what: &str) {
    check_pattern(|o, b| r.read(o, b).unwrap(), 0, r.len(), seed, what);
}

fn free_bytes(vmm: &CudaVmm) -> i128 {
    vmm.mem_info().unwrap().0 as i128
}

fn gbs(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pause_returns_device_memory_and_resume_is_bit_exact_at_the_same_address() {
    let vmm = CudaVmm::new(0).unwrap();
    let (free, total) = vmm.mem_info().unwrap();
    println!(
        "device 0: granularity {} bytes, free {} MiB of {} MiB",
        vmm.granularity(),
        free / MIB,
        total / MIB
    );
    for size in [vmm.granularity().max(MIB), 256 * MIB, 2048 * MIB] {
        let mut r = vmm.alloc(size, BackupPolicy::Cpu).unwrap();
        assert_eq!(r.len() % vmm.granularity(), 0);
        assert!(r.len() >= size);
        let addr = r.device_ptr();
        fill(&r, 7);
        for cycle in 0..2 {
            let f0 = free_bytes(&vmm);
            let t = Instant::now();
            r.pause().unwrap();
            let pause_s = t.elapsed().as_secs_f64();
            let f1 = free_bytes(&vmm);
            assert!(r.is_paused());
            assert!(
                r.read(0, &mut [0u8; 8]).is_err(),
                "a paused region cannot be read"
            );
            assert!(r.export_fd().is_err(), "a paused region cannot be exported");
            let t = Instant::now();
            r.resume().unwrap();
            let resume_s = t.elapsed().as_secs_f64();
            let f2 = free_bytes(&vmm);
            println!(
                "VMM {} MiB cycle {cycle}: pause {:.3} ms ({:.2} GB/s), resume {:.3} ms ({:.2} \
                 GB/s); free +{} MiB after pause, -{} MiB after resume; address {:#x} kept",
                r.len() / MIB,
                pause_s * 1e3,
                gbs(r.len(), pause_s),
                resume_s * 1e3,
                gbs(r.len(), resume_s),
                (f1 - f0) / MIB as i128,
                (f1 - f2) / MIB as i128,
                addr
            );
            let len = r.len() as i128;
            assert!(
                f1 - f0 >= len,
                "pause must return the {len} bytes to the driver; free grew by {}",
                f1 - f0
            );
            assert!(
                f1 - f2 >= len,
                "resume takes {len} bytes again; free fell by {}",
                f1 - f2
            );
            assert_eq!(r.device_ptr(), addr, "the address survives pause/resume");
            assert!(!r.is_paused());
            verify(&r, 7, &format!("{} MiB after cycle {cycle}", r.len() / MIB));
        }
        let f_alive = free_bytes(&vmm);
        let len = r.len() as i128;
        drop(r);
        assert!(free_bytes(&vmm) - f_alive >= len, "drop frees the region");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn discard_regions_pause_without_a_backup_and_come_back_usable() {
    let vmm = CudaVmm::new(0).unwrap();
    let mut r = vmm.alloc(128 * MIB, BackupPolicy::Discard).unwrap();
    let addr = r.device_ptr();
    fill(&r, 3);
    let f0 = free_bytes(&vmm);
    let t = Instant::now();
    r.pause().unwrap();
    let pause_s = t.elapsed().as_secs_f64();
    let f1 = free_bytes(&vmm);
    assert!(f1 - f0 >= r.len() as i128, "freed {} bytes", f1 - f0);
    let t = Instant::now();
    r.resume().unwrap();
    let resume_s = t.elapsed().as_secs_f64();
    assert_eq!(r.device_ptr(), addr);
    println!(
        "VMM discard {} MiB: pause {:.3} ms, resume {:.3} ms (no copies)",
        r.len() / MIB,
        pause_s * 1e3,
        resume_s * 1e3
    );
    fill(&r, 4);
    verify(&r, 4, "discard region written after resume");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn many_regions_pause_together_and_resume_in_reverse_order_intact() {
    let vmm = CudaVmm::new(0).unwrap();
    let mut regions: Vec<VmmRegion> = (0..8)
        .map(|_| vmm.alloc(64 * MIB, BackupPolicy::Cpu).unwrap())
        .collect();
    let addrs: Vec<u64> = regions.iter().map(VmmRegion::device_ptr).collect();
    for (i, r) in regions.iter().enumerate() {
        fill(r, 100 + i as u64);
    }
    let total: usize = regions.iter().map(VmmRegion::len).sum();
    let f0 = free_bytes(&vmm);
    for r in &mut regions {
        r.pause().unwrap();
    }
    let f1 = free_bytes(&vmm);
    assert!(
        f1 - f0 >= total as i128,
        "8 pauses freed {} of {total} bytes",
        f1 - f0
    );
    for r in regions.iter_mut().rev() {
        r.resume().unwrap();
    }
    let f2 = free_bytes(&vmm);
    println!(
        "VMM 8 x 64 MiB: free +{} MiB after pausing all, -{} MiB after resuming all",
        (f1 - f0) / MIB as i128,
        (f1 - f2) / MIB as i128
    );
    for (i, r) in regions.iter().enumerate() {
        assert_eq!(r.device_ptr(), addrs[i]);
        verify(r, 100 + i as u64, &format!("region {i}"));
    }
}

fn line(r: &mut impl BufRead) -> String {
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    s.trim().to_string()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_second_process_imports_the_exported_fd_and_shares_the_bytes() {
    let path = std::env::temp_dir().join(format!("tandem-cuda-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let vmm = CudaVmm::new(0).unwrap();
    let mut r = vmm.alloc(IPC_SIZE, BackupPolicy::Cpu).unwrap();
    let len = r.len();
    fill(&r, 1);
    let mut child = common::spawn_child(
        "cuda_vmm::child_imports_the_fd",
        &[(SOCK_ENV, path.to_string_lossy().into_owned())],
    );
    let (sock, _) = listener.accept().unwrap();
    let fd = r.export_fd().unwrap();
    send_fds(&sock, &[fd.as_fd()], format!("{len}\n").as_bytes()).unwrap();
    drop(fd);
    let mut rd = BufReader::new(sock.try_clone().unwrap());
    let mut wr = sock;

    // The child checked the owner's bytes and wrote seed 2 over the second half.
    assert_eq!(line(&mut rd), "saw-1-wrote-2");
    check_pattern(
        |o, b| r.read(o, b).unwrap(),
        0,
        len / 2,
        1,
        "owner, first half",
    );
    check_pattern(
        |o, b| r.read(o, b).unwrap(),
        len / 2,
        len / 2,
        2,
        "owner, child's half",
    );

    // Pausing while the child maps the memory: the owner's mapping goes, the memory stays.
    let f0 = free_bytes(&vmm);
    r.pause().unwrap();
    let f1 = free_bytes(&vmm);
    writeln!(wr, "paused").unwrap();
    assert_eq!(line(&mut rd), "still-mapped");
    r.resume().unwrap();
    let f2 = free_bytes(&vmm);
    // Resume maps new memory: the owner has its bytes back, the child keeps the old memory.
    check_pattern(
        |o, b| r.read(o, b).unwrap(),
        len / 2,
        len / 2,
        2,
        "owner after resume",
    );
    write_pattern(|o, b| r.write(o, b).unwrap(), 0, MIB, 9);
    writeln!(wr, "resumed").unwrap();
    assert_eq!(line(&mut rd), "dropped");
    let f3 = free_bytes(&vmm);
    writeln!(wr, "bye").unwrap();
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(&path);
    let mib = |d: i128| d / MIB as i128;
    println!(
        "VMM IPC {} MiB: free +{} MiB when the owner paused with a peer mapping, -{} MiB at \
         resume, +{} MiB when the peer unmapped",
        len / MIB,
        mib(f1 - f0),
        mib(f1 - f2),
        mib(f3 - f2)
    );
    assert!(
        f1 - f0 < len as i128 / 2,
        "the peer's mapping keeps the memory alive: pause freed {} bytes",
        f1 - f0
    );
    assert!(f1 - f2 >= len as i128, "resume allocates new memory");
    assert!(
        f3 - f2 >= len as i128,
        "the old memory goes when the peer unmaps"
    );
}

#[test]
#[ignore = "child-process entry point, run by a_second_process_imports_the_exported_fd_and_shares_the_bytes"]
fn child_imports_the_fd() {
    let Ok(path) = std::env::var(SOCK_ENV) else {
        eprintln!("child_imports_the_fd only runs as a child of the IPC test");
        return;
    };
    let sock = UnixStream::connect(path).unwrap();
    let vmm = CudaVmm::new(0).unwrap();
    let (msg, fds) = recv_fds(&sock, 64).unwrap();
    let len: usize = String::from_utf8(msg).unwrap().trim().parse().unwrap();
    assert_eq!(fds.len(), 1);
    let m = vmm.import_fd(fds[0].as_fd(), len).unwrap();
    drop(fds);
    assert_eq!(m.len(), len);
    let mut rd = BufReader::new(sock.try_clone().unwrap());
    let mut wr = sock;
    check_pattern(
        |o, b| m.read(o, b).unwrap(),
        0,
        len,
        1,
        "child sees the owner's bytes",
    );
    write_pattern(|o, b| m.write(o, b).unwrap(), len / 2, len / 2, 2);
    writeln!(wr, "saw-1-wrote-2").unwrap();

    assert_eq!(line(&mut rd), "paused");
    check_pattern(
        |o, b| m.read(o, b).unwrap(),
        0,
        len / 2,
        1,
        "child while owner paused",
    );
    writeln!(wr, "still-mapped").unwrap();

    assert_eq!(line(&mut rd), "resumed");
    // The owner's resume mapped new memory: its write of seed 9 is not seen here.
    check_pattern(
        |o, b| m.read(o, b).unwrap(),
        0,
        MIB,
        1,
        "child after owner's resume",
    );
    drop(m);
    writeln!(wr, "dropped").unwrap();
    assert_eq!(line(&mut rd), "bye");
}
