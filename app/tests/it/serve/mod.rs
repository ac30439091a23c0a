//! `tandem serve` through the real binary: a tiny model (`tandem model init`), a server on
//! `--port 0` (its first stdout line parsed), HTTP with `ureq`. States are reached by
//! polling the server's own `/v1/loads` (a request is known to wait before the next call),
//! never by sleeping.

#![allow(clippy::unwrap_used)]

use crate::common;

mod control;
mod native;
mod openai;

pub use crate::common::serve::*;

#[test]
fn serve_exits_cleanly_on_sigterm() {
    let mut srv = Srv::start(&[]);
    assert_eq!(srv.get("/health").0, 200);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(srv.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = srv.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// `tandem serve` serves an engine that declares it can: naming one that does not say so (a
/// plugin that does not describe its options) is one line, exit 2, naming why.
#[test]
fn an_engine_that_does_not_declare_it_serves_is_refused() {
    let plugins = common::plugin_dir(&[(
        &common::cdylib("fixture_alpha"),
        "libtandem_fixture_alpha.so",
    )]);
    let o = common::run(
        common::tandem()
            .arg("serve")
            .arg(&models().0)
            .args(["--port", "0", "--engine", "fixture-alpha", "--plugin-dir"])
            .arg(plugins.path()),
    );
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    let err = common::stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("`fixture-alpha`") && err.contains("serves"),
        "{err}"
    );
}

#[test]
fn non_loopback_host_needs_a_key() {
    let o = common::run(
        common::tandem()
            .arg("serve")
            .arg(&models().0)
            .args(["--host", "0.0.0.0", "--port", "0"])
            .env_remove("TANDEM_SERVE_API_KEY"),
    );
    assert_eq!(o.status.code(), Some(2));
    let err = common::stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--api-key"), "{err}");
}
