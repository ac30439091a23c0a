//! The host's memory services as a plugin sees them: through the ABI handle of
//! `Services::with_memory`, calling the `HostServices` trait methods. Regions are real memfds;
//! sharing is tested with a real second process (this test binary re-executed).
#![allow(clippy::unwrap_used)]

use crate::common::metric_value;
use std::process::Command;

use tandem_memory::{ManagerConfig, MemoryManager};
use tandem_plugin_api::abi_stable::std_types::{RResult, RString, RVec};
use tandem_plugin_api::{DType, ErrorCode, HostBox, PluginError, RegionInfo, RegionRequest};
use tandem_services::{ATTACHED_ID_BASE, Services};

const KEY_ENV: &str = "TANDEM_MEMORY_SERVICES_KEY";
const SIZE: usize = 4 << 20;

fn host() -> HostBox {
    Services::with_memory(MemoryManager::new(ManagerConfig::cpu("test"))).handle()
}

fn ok<T>(r: RResult<T, PluginError>) -> T {
    match r {
        RResult::ROk(v) => v,
        RResult::RErr(e) => panic!("host call failed: {e}"),
    }
}

fn err<T: std::fmt::Debug>(r: RResult<T, PluginError>) -> PluginError {
    match r {
        RResult::ROk(v) => panic!("expected an error, got {v:?}"),
        RResult::RErr(e) => e,
    }
}

fn request(tag: &str, name: &str, bytes: u64, backup: bool) -> RegionRequest {
    RegionRequest {
        tag: RString::from(tag),
        name: RString::from(name),
        bytes,
        dtype: DType::U8,
        backup,
    }
}

fn tags(t: &[&str]) -> RVec<RString> {
    t.iter().map(|s| RString::from(*s)).collect()
}

fn pattern(i: usize, salt: u8) -> u8 {
    (i.wrapping_mul(131) >> 3) as u8 ^ salt
}

/// The region's bytes, as a plugin computing on `[addr, addr + len)` sees them.
fn bytes(info: &RegionInfo) -> &'static mut [u8] {
    // SAFETY: the host granted this mapping of `len` bytes at `addr`; it stays mapped until the
    // region is freed, which these tests do only after their last access, and each test touches
    // it from one thread while it is resident.
    unsafe { std::slice::from_raw_parts_mut(info.addr as *mut u8, info.len as usize) }
}

#[test]
fn a_plugin_allocates_pauses_and_resumes_a_region_bit_exact() {
    let _serial = crate::common::process_lock();
    let h = host();
    let w = ok(h.alloc_region(request("weights", "w", SIZE as u64, true)));
    assert_eq!(w.len, SIZE as u64);
    for (i, b) in bytes(&w).iter_mut().enumerate() {
        *b = pattern(i, 7);
    }
    let kv = ok(h.alloc_region(request("kv_cache", "kv", SIZE as u64, false)));
    bytes(&kv).fill(0xAB);

    ok(h.pause_tags(tags(&["weights", "kv_cache"])));
    let s = ok(h.memory_stats());
    assert_eq!(metric_value(&s, "paused_bytes.weights"), SIZE as f64);
    assert_eq!(metric_value(&s, "paused_bytes.kv_cache"), SIZE as f64);
    assert_eq!(metric_value(&s, "backup_bytes.weights"), SIZE as f64);
    assert_eq!(metric_value(&s, "backup_bytes.kv_cache"), 0.0);
    assert_eq!(metric_value(&s, "resident_bytes"), 0.0);
    assert!(
        metric_value(&s, "allocated_bytes") < (SIZE / 100) as f64,
        "{s:?}"
    );
    let e = err(h.pause_tags(tags(&["weights"])));
    assert_eq!(e.code, ErrorCode::InvalidState, "{e}");
    assert!(e.message.contains("already paused"), "{e}");

    ok(h.resume_tags(tags(&["weights", "kv_cache"])));
    let s = ok(h.memory_stats());
    assert_eq!(metric_value(&s, "resident_bytes.weights"), SIZE as f64);
    assert_eq!(metric_value(&s, "paused_bytes"), 0.0);
    let back = bytes(&w);
    assert!(back.iter().enumerate().all(|(i, &b)| b == pattern(i, 7)));
    assert!(
        bytes(&kv).iter().all(|&b| b == 0),
        "discard regions come back zeroed"
    );
    let e = err(h.resume_tags(tags(&["weights"])));
    assert_eq!(e.code, ErrorCode::InvalidState, "{e}");

    ok(h.free_region(w.id));
    ok(h.free_region(kv.id));
    let s = ok(h.memory_stats());
    assert_eq!(metric_value(&s, "regions"), 0.0);
    let e = err(h.free_region(w.id));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
}

#[test]
fn snapshots_round_trip_through_the_handle() {
    let _serial = crate::common::process_lock();
    let h = host();
    let w = ok(h.alloc_region(request("weights", "w", 1 << 20, true)));
    bytes(&w).fill(1);
    ok(h.snapshot(RString::from("actor"), tags(&["weights"])));
    bytes(&w).fill(2);
    ok(h.restore(RString::from("actor")));
    assert!(bytes(&w).iter().all(|&b| b == 1));
    ok(h.drop_snapshot(RString::from("actor")));
    let e = err(h.restore(RString::from("actor")));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
    assert!(e.message.contains("unknown snapshot `actor`"), "{e}");
}

#[test]
fn bad_requests_are_clear_errors_not_panics() {
    let _serial = crate::common::process_lock();
    let h = host();
    let e = err(h.alloc_region(request("Not A Tag", "x", 4096, true)));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
    assert!(e.message.contains("invalid tag `Not A Tag`"), "{e}");
    assert!(e.help.contains("kv_cache"), "{e}");
    let e = err(h.pause_tags(tags(&["weights", "BAD"])));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
    let e = err(h.alloc_region(request("weights", "x", 0, true)));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
    let mut odd = request("grads", "g", 6, true);
    odd.dtype = DType::F32;
    let e = err(h.alloc_region(odd));
    assert!(e.message.contains("not a multiple"), "{e}");
    ok(h.alloc_region(request("weights", "same", 4096, true)));
    let e = err(h.alloc_region(request("grads", "same", 4096, true)));
    assert!(e.message.contains("`same` already exists"), "{e}");
    let e = err(h.attach_region(RString::from("memfd:nonsense")));
    assert_eq!(e.code, ErrorCode::InvalidInput, "{e}");
    let e = err(h.attach_region(RString::from("memfd:999999999:3:4096:1")));
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
}

#[test]
fn without_a_manager_memory_calls_are_not_available() {
    let _serial = crate::common::process_lock();
    let h = Services::new().handle();
    let e = err(h.alloc_region(request("weights", "w", 4096, true)));
    assert_eq!(e.code, ErrorCode::NotAvailable, "{e}");
    let e = err(h.memory_stats());
    assert_eq!(e.code, ErrorCode::NotAvailable, "{e}");
}

#[test]
fn another_process_attaches_by_key_and_sees_the_owners_writes() {
    let _serial = crate::common::process_lock();
    let h = host();
    let w = ok(h.alloc_region(request("weights", "shared", SIZE as u64, true)));
    for (i, b) in bytes(&w).iter_mut().enumerate() {
        *b = pattern(i, 3);
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "memory_services::child_attaches_by_key",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(KEY_ENV, w.key.as_str())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child-saw-owner-bytes"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the child's write through its mapping is visible here
    assert_eq!(bytes(&w)[SIZE - 1], 0xC4);

    // attaching in the owner's own process works too, and freeing the attachment unmaps it
    let again = ok(h.attach_region(w.key.clone()));
    assert!(again.id >= ATTACHED_ID_BASE && again.addr != w.addr);
    assert_eq!(bytes(&again)[0], pattern(0, 3));
    assert_eq!(
        metric_value(&ok(h.memory_stats()), "attached_bytes"),
        SIZE as f64
    );
    ok(h.free_region(again.id));
    assert_eq!(metric_value(&ok(h.memory_stats()), "attached_regions"), 0.0);

    // once the owner frees it, the key no longer resolves
    let key = w.key.clone();
    ok(h.free_region(w.id));
    let e = err(h.attach_region(key));
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
}

/// Child half of the test above: run only by re-executing this binary.
#[test]
#[ignore = "child-process entry point, run by another_process_attaches_by_key_and_sees_the_owners_writes"]
fn child_attaches_by_key() {
    let key = std::env::var(KEY_ENV).unwrap();
    let h = host();
    let r = ok(h.attach_region(RString::from(key.as_str())));
    assert_eq!(r.len, SIZE as u64);
    assert!(r.id >= ATTACHED_ID_BASE);
    let b = bytes(&r);
    assert!(
        b[..SIZE - 1]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern(i, 3))
    );
    b[SIZE - 1] = 0xC4;
    assert_eq!(metric_value(&ok(h.memory_stats()), "attached_regions"), 1.0);
    ok(h.free_region(r.id));
    println!("child-saw-owner-bytes");
}
