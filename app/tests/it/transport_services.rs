//! Plugins reach the transport only through the `HostServices` handle: two real worker-like
//! processes join a world through a rendezvous store, attach their groups to `Services`, and
//! exchange bytes through the ABI handle's send / recv / broadcast.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;
use tandem_plugin_api::{ErrorCode, HostBox, RResult};
use tandem_services::Services;
use tandem_transport::local::{self, LocalSpec};
use tandem_transport::topology::GroupSpec;
use tandem_transport::{CommConfig, Communicator};

const ROLE: &str = "TANDEM_SERVICES_TEST_ROLE";

fn handle_from_env() -> (HostBox, usize) {
    let cfg = CommConfig::from_env().expect("child comm config");
    let rank = cfg.rank;
    let world = Communicator::init(&cfg).expect("join world");
    let groups = world
        .groups(&[
            GroupSpec {
                name: "world".into(),
                ranks: vec![0, 1],
            },
            GroupSpec {
                name: "pair0".into(),
                ranks: vec![1, 0],
            },
        ])
        .expect("groups");
    (Services::new().with_transport(groups).handle(), rank)
}

fn ok<T>(r: RResult<T, tandem_plugin_api::PluginError>) -> T {
    match r {
        RResult::ROk(v) => v,
        RResult::RErr(e) => panic!("host service failed: {e}"),
    }
}

/// Child body; run only as a child of `services_move_bytes_between_processes`.
#[test]
#[ignore = "child process entry point of services_move_bytes_between_processes"]
fn child_entry() {
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    let (host, rank) = handle_from_env();
    let payload: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    if rank == 0 {
        ok(host.send("world".into(), 1, payload.as_slice().into(), 5));
    } else {
        let mut buf = vec![0u8; payload.len()];
        ok(host.recv("world".into(), 0, buf.as_mut_slice().into(), 5));
        assert!(buf == payload, "received bytes differ");
    }
    // `pair0` lists world rank 1 first: group rank 0 is world rank 1.
    let mut b = if rank == 1 {
        b"from-rank-one".to_vec()
    } else {
        vec![0u8; 13]
    };
    ok(host.broadcast("pair0".into(), 0, b.as_mut_slice().into()));
    assert_eq!(&b, b"from-rank-one");
    // Errors are ABI errors with a code, never a panic.
    let mut small = [0u8; 4];
    match host.recv("trainers".into(), 0, small.as_mut_slice().into(), 1) {
        RResult::RErr(e) => {
            assert_eq!(e.code, ErrorCode::InvalidInput);
            assert!(
                e.message
                    .contains("not a member of transport group `trainers`")
            );
            assert!(e.help.contains("pair0, world"), "{}", e.help);
        }
        RResult::ROk(()) => panic!("unknown group must fail"),
    }
    match host.send("world".into(), 9, [1u8].as_slice().into(), 1) {
        RResult::RErr(e) => assert!(e.message.contains("rank 9 is outside")),
        RResult::ROk(()) => panic!("bad rank must fail"),
    }
}

#[test]
fn services_move_bytes_between_processes() {
    let _serial = crate::common::process_lock();
    let configs = (0..2)
        .map(|r| {
            let mut c = CommConfig::new("", "", r, 2);
            c.timeout = Duration::from_secs(30);
            c.name = "services-test".into();
            c
        })
        .collect();
    let spec = LocalSpec {
        program: std::env::current_exe().unwrap(),
        args: [
            "transport_services::child_entry",
            "--exact",
            "--ignored",
            "--nocapture",
        ]
        .map(String::from)
        .to_vec(),
        env: vec![(ROLE.into(), "1".into())],
        configs,
    };
    let world = local::spawn(&spec, "services-test-token").unwrap();
    let codes = world.wait(Duration::from_secs(120));
    assert_eq!(codes, vec![Some(0), Some(0)], "child exit codes");
}

#[test]
fn without_transport_attached_calls_say_not_available() {
    let _serial = crate::common::process_lock();
    let host = Services::new().handle();
    match host.send("world".into(), 0, [0u8].as_slice().into(), 0) {
        RResult::RErr(e) => {
            assert_eq!(e.code, ErrorCode::NotAvailable);
            assert!(e.message.contains("transport"));
        }
        RResult::ROk(()) => panic!("must fail"),
    }
}
