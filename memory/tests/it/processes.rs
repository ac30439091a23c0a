//! Multi-process behaviour with real processes: a child (this test binary re-executed) maps a
//! region by fd received over a Unix socket, sees the owner's writes, sees zeros while the owner
//! has it paused and the data again after resume; and the device ledger's totals match the live
//! regions of two processes.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use tandem_memory::{
    BackupPolicy, DType, DeviceLedger, ManagerConfig, MemoryManager, ProcessReport, RegionKey,
    RegionSpec, Tag, recv_region, send_region,
};

const SOCK_ENV: &str = "TANDEM_MEMORY_TEST_SOCK";
const SIZE: usize = 16 << 20;

fn line(r: &mut impl BufRead) -> String {
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    s.trim().to_string()
}

#[test]
fn a_second_process_maps_by_fd_and_follows_pause_and_resume() {
    let path = std::env::temp_dir().join(format!("tandem-mem-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = common::spawn_child(
        "processes::child_maps_region",
        &[(SOCK_ENV, path.to_string_lossy().into_owned())],
    );

    let mgr = MemoryManager::new(ManagerConfig::cpu("owner"));
    let mut w = mgr
        .alloc(RegionSpec::new(Tag::Weights, SIZE, DType::U64))
        .unwrap();
    common::fill(&mut w.view_mut::<u64>().unwrap(), 1);
    let (sock, _) = listener.accept().unwrap();
    send_region(&sock, &w).unwrap();
    let mut rd = BufReader::new(sock.try_clone().unwrap());
    let mut wr = sock;

    assert_eq!(line(&mut rd), "saw-1");
    // the child wrote a marker into the last word: the owner sees it
    assert_eq!(*w.view::<u64>().unwrap().last().unwrap(), 0xC41D);
    common::fill(&mut w.view_mut::<u64>().unwrap(), 2);
    writeln!(wr, "wrote-2").unwrap();
    assert_eq!(line(&mut rd), "saw-2");

    mgr.pause(&[Tag::Weights]).unwrap();
    writeln!(wr, "paused").unwrap();
    assert_eq!(line(&mut rd), "saw-freed");
    mgr.resume(&[Tag::Weights]).unwrap();
    writeln!(wr, "resumed").unwrap();
    assert_eq!(line(&mut rd), "saw-2-again");
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(&path);
}

#[test]
#[ignore = "child-process entry point, run by a_second_process_maps_by_fd_and_follows_pause_and_resume"]
fn child_maps_region() {
    let path = std::env::var(SOCK_ENV).expect("run by the parent test");
    let sock = UnixStream::connect(path).unwrap();
    let (info, m) = recv_region(&sock).unwrap();
    assert_eq!(
        (info.tag, info.dtype, info.len),
        (Tag::Weights, DType::U64, SIZE)
    );
    let mut rd = BufReader::new(sock.try_clone().unwrap());
    let mut wr = sock;
    let mut buf = vec![0u8; SIZE];

    m.read_at(0, &mut buf).unwrap();
    assert!(
        common::bytes_match(&buf, 1),
        "child must see the owner's data"
    );
    m.write_at(SIZE - 8, &0xC41Du64.to_le_bytes()).unwrap();
    writeln!(wr, "saw-1").unwrap();

    assert_eq!(line(&mut rd), "wrote-2");
    m.read_at(0, &mut buf).unwrap();
    assert!(
        common::bytes_match(&buf, 2),
        "child must see the owner's new writes"
    );
    writeln!(wr, "saw-2").unwrap();

    assert_eq!(line(&mut rd), "paused");
    assert_eq!(
        m.allocated_bytes().unwrap(),
        0,
        "the shared memfd holds no pages while paused"
    );
    let mut head = [0xFFu8; 64];
    m.read_at(0, &mut head).unwrap();
    assert_eq!(head, [0u8; 64], "a paused region reads as zeros");
    writeln!(wr, "saw-freed").unwrap();

    assert_eq!(line(&mut rd), "resumed");
    m.read_at(0, &mut buf).unwrap();
    assert!(
        common::bytes_match(&buf, 2),
        "data is back after the owner resumes"
    );
    writeln!(wr, "saw-2-again").unwrap();
}

/// The regions the ledger child allocates: (tag, size, policy, paused at report time).
type Planned = (Tag, usize, BackupPolicy, bool);

const CHILD_PLAN: [Planned; 2] = [
    (Tag::Weights, 3 << 20, BackupPolicy::Cpu, false),
    (Tag::KvCache, 2 << 20, BackupPolicy::Discard, true),
];

fn allocate_plan(mgr: &MemoryManager, plan: &[Planned]) -> Vec<tandem_memory::Region> {
    let mut regions = Vec::new();
    for (tag, size, policy, _) in plan {
        let mut r = mgr
            .alloc(RegionSpec::new(tag.clone(), *size, DType::U8).with_backup(*policy))
            .unwrap();
        r.view_mut::<u8>().unwrap().fill(0xAB);
        regions.push(r);
    }
    for (tag, _, _, paused) in plan {
        if *paused {
            mgr.pause(std::slice::from_ref(tag)).unwrap();
        }
    }
    regions
}

#[test]
fn ledger_totals_match_live_regions_across_two_processes() {
    let mut child = common::spawn_child(
        "processes::child_reports_ledger",
        &[(SOCK_ENV, "ledger".into())],
    );
    let parent_plan = [
        (Tag::Weights, 4 << 20, BackupPolicy::Cpu, true),
        (Tag::Optimizer, 1 << 20, BackupPolicy::Cpu, false),
    ];
    let mgr = MemoryManager::new(ManagerConfig::cpu("trainer-0"));
    let _regions = allocate_plan(&mgr, &parent_plan);

    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let json = out
        .lines()
        .find_map(|l| l.split_once("REPORT ").map(|(_, j)| j))
        .unwrap_or_else(|| panic!("no REPORT line in child output: {out}"));
    let child_report: ProcessReport = serde_json::from_str(json).unwrap();
    assert_ne!(
        child_report.pid,
        std::process::id(),
        "the report comes from another process"
    );

    let mut ledger = DeviceLedger::new("cpu", None);
    ledger.update(mgr.report()).unwrap();
    ledger.update(child_report).unwrap();

    let all: Vec<_> = parent_plan.iter().chain(CHILD_PLAN.iter()).collect();
    let sum = |f: &dyn Fn(&Planned) -> usize| all.iter().map(|r| f(r) as u64).sum::<u64>();
    let t = ledger.totals();
    assert_eq!(t.regions, 4);
    assert_eq!(t.size_bytes, sum(&|r| r.1));
    assert_eq!(t.resident_bytes, sum(&|r| if r.3 { 0 } else { r.1 }));
    assert_eq!(t.paused_bytes, sum(&|r| if r.3 { r.1 } else { 0 }));
    assert_eq!(
        t.backup_bytes,
        sum(&|r| if r.3 && r.2 == BackupPolicy::Cpu {
            r.1
        } else {
            0
        })
    );
    // measured: the memfds hold exactly the resident bytes (sizes are whole pages, all written)
    assert_eq!(t.allocated_bytes, t.resident_bytes);
    assert_eq!(ledger.peak_resident_bytes, t.resident_bytes);

    let by_tag = ledger.by_tag();
    assert_eq!(by_tag[&Tag::Weights].size_bytes, 7 << 20);
    assert_eq!(by_tag[&Tag::Weights].paused_bytes, 4 << 20);
    assert_eq!(by_tag[&Tag::KvCache].paused_bytes, 2 << 20);
    let by_proc = ledger.by_process();
    assert_eq!(by_proc.len(), 2);
    assert_eq!(
        by_proc.values().map(|p| p.size_bytes).sum::<u64>(),
        t.size_bytes
    );

    // a report for another device is refused
    let mut gpu = DeviceLedger::new("cuda:0", None);
    let e = gpu.update(mgr.report()).unwrap_err().to_string();
    assert!(e.contains("is for device `cpu`, not `cuda:0`"), "{e}");
}

#[test]
#[ignore = "child-process entry point, run by ledger_totals_match_live_regions_across_two_processes"]
fn child_reports_ledger() {
    assert_eq!(
        std::env::var(SOCK_ENV).as_deref(),
        Ok("ledger"),
        "run by the parent test"
    );
    let mgr = MemoryManager::new(ManagerConfig::cpu("engine-0"));
    let _regions = allocate_plan(&mgr, &CHILD_PLAN);
    println!("REPORT {}", serde_json::to_string(&mgr.report()).unwrap());
}

#[test]
fn a_region_key_resolves_to_the_same_memory_until_the_region_is_freed() {
    let mgr = MemoryManager::new(ManagerConfig::cpu("owner"));
    let mut w = mgr
        .alloc(RegionSpec::new(Tag::Weights, 1 << 20, DType::U64))
        .unwrap();
    common::fill(&mut w.view_mut::<u64>().unwrap(), 5);
    let key = RegionKey::of(&w).unwrap();
    assert_eq!(key.to_string().parse::<RegionKey>().unwrap(), key);
    let m = key.attach().unwrap();
    assert_ne!(m.as_ptr(), w.as_ptr(), "a second mapping of the same memfd");
    let mut buf = vec![0u8; 1 << 20];
    m.read_at(0, &mut buf).unwrap();
    assert!(common::bytes_match(&buf, 5));
    drop(m);

    // the fd number can be reused once the region is gone: the inode check catches it
    drop(w);
    let reuse = std::fs::File::open("/proc/self/status").unwrap();
    let e = key.attach().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("cannot attach region `{key}`")) && e.contains("freed"),
        "{e}"
    );
    drop(reuse);
}
