//! Rendezvous store: set/get/add/delete/wait, token authentication, timeouts naming keys.

#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;
use tandem_transport::TransportError;
use tandem_transport::store::{StoreClient, StoreServer};

fn client(s: &StoreServer, token: &str) -> Result<StoreClient, TransportError> {
    StoreClient::connect(&s.addr().to_string(), token, Duration::from_secs(2))
}

#[test]
fn set_get_add_delete() {
    let s = StoreServer::start("127.0.0.1:0", "tok").unwrap();
    let c = client(&s, "tok").unwrap();
    assert_eq!(c.try_get("a").unwrap(), None);
    c.set("a", b"1").unwrap();
    c.set("a", b"two").unwrap();
    assert_eq!(c.get("a").unwrap(), b"two");
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -7).unwrap(), -2);
    assert!(c.delete("a").unwrap());
    assert!(!c.delete("a").unwrap());
    assert_eq!(s.len(), 1);
    // Binary values survive.
    let v: Vec<u8> = (0..=255).collect();
    c.set("bin", &v).unwrap();
    assert_eq!(c.get("bin").unwrap(), v);
}

#[test]
fn wrong_token_is_rejected() {
    let s = StoreServer::start("127.0.0.1:0", "right").unwrap();
    match client(&s, "wrong") {
        Err(TransportError::Store { msg, .. }) => {
            assert!(msg.contains("authentication failed"), "{msg}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a client with the wrong token was accepted"),
    }
    assert!(s.is_empty());
}

#[test]
fn wait_wakes_when_another_client_sets_the_key() {
    let s = StoreServer::start("127.0.0.1:0", "t").unwrap();
    let waiter = client(&s, "t").unwrap();
    let setter = client(&s, "t").unwrap();
    let h = std::thread::spawn(move || waiter.wait(&["x", "y"], Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(50));
    setter.set("x", b"1").unwrap();
    setter.set("y", b"2").unwrap();
    h.join().unwrap().unwrap();
}

#[test]
fn wait_timeout_names_the_missing_keys() {
    let s = StoreServer::start("127.0.0.1:0", "t").unwrap();
    let c = client(&s, "t").unwrap();
    c.set("present", b"").unwrap();
    match c.wait(&["present", "absent"], Duration::from_millis(200)) {
        Err(TransportError::StoreTimeout { missing, .. }) => assert_eq!(missing, ["absent"]),
        other => panic!("expected StoreTimeout, got {other:?}"),
    }
}

#[test]
fn connect_to_nothing_fails_with_the_address() {
    // A port freed by closing a listener can be handed at once to a test running beside this
    // one (another store server binding port 0), which then accepts the connect: that is a
    // port in use, not a bug, so a few fresh ports are tried before failing.
    for _ in 0..5 {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        match StoreClient::connect(&addr, "t", Duration::from_millis(300)) {
            Err(e @ TransportError::Store { .. }) => {
                assert!(e.to_string().contains(&addr));
                return;
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => continue,
        }
    }
    panic!("every closed port tried accepted a connection");
}
