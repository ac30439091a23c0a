//! `tandem-transport`'s integration tests, one module per area: worlds of real child
//! processes (this binary re-run as `child_entry` with a role), the plan, the store; `nccl`
//! with the `cuda` feature only; `netns` ignored (needs root and network namespaces).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

#[macro_use]
mod common;

mod broadcast;
mod multiproc;
#[cfg(feature = "cuda")]
mod nccl;
mod netns;
mod peer_failures;
mod plan;
mod single_copy;
mod store;

/// The one child entry point: [`common::spawn`] re-runs this binary with `--exact child_entry`
/// and a role ([`common::ROLE`]), which each module's `child_roles!` table answers (role
/// names are unique across the modules).
#[test]
#[ignore = "child entry point: run by the other tests in a child process"]
fn child_entry() {
    common::child_main(|role, world, cfg| {
        let found = broadcast::child_role(role, world, cfg)
            .or_else(|| multiproc::child_role(role, world, cfg))
            .or_else(|| peer_failures::child_role(role, world, cfg))
            .or_else(|| single_copy::child_role(role, world, cfg));
        #[cfg(feature = "cuda")]
        let found = found.or_else(|| nccl::child_role(role, world, cfg));
        found.unwrap_or_else(|| Err(format!("unknown role {role}")))
    });
}
