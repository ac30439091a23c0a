//! The command line and environment that start one worker: `tandem worker ...` itself, or
//! wrapped in the `srun` step or Ray driver that runs it on its node.

use super::ray::RayGroup;
use super::{LaunchOptions, TOKEN_ENV};
use crate::worker::WorkerSpec;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

/// What a worker's command is made of.
pub(super) struct Worker<'a> {
    pub opts: &'a LaunchOptions,
    pub ray: Option<&'a RayGroup>,
    pub exe: &'a Path,
    pub spec: &'a WorkerSpec,
    pub spec_path: &'a Path,
    pub control: SocketAddr,
    pub launch: u64,
    pub token: &'a str,
}

/// The command; where it runs the worker when that is elsewhere (`on node n1, srun `); what
/// it runs, for an error that it could not start.
pub(super) fn worker(w: Worker<'_>) -> (Command, Option<String>, String) {
    let (spec, exe) = (w.spec, w.exe);
    let (mut cmd, place, what) = match (&w.opts.slurm, &w.opts.ray, w.ray) {
        (Some(o), _, _) => {
            let node = o.node(spec.role, spec.rank).unwrap_or("any");
            (
                o.command(spec, exe),
                Some(format!("on node {node}, srun ")),
                format!("srun {} worker", exe.display()),
            )
        }
        (None, Some(o), Some(group)) => {
            let b = o.bundle(spec.role, spec.rank);
            let node = group.nodes.get(b).map_or("?", String::as_str);
            (
                o.command(group, spec, exe),
                Some(format!("in Ray bundle {b} on {node}, driver ")),
                format!("{} ray_driver.py run ...", o.python.display()),
            )
        }
        _ => (Command::new(exe), None, format!("{} worker", exe.display())),
    };
    cmd.arg("worker")
        .args([
            "--role",
            spec.role.as_str(),
            "--rank",
            &spec.rank.to_string(),
        ])
        .args(["--control", &w.control.to_string()])
        .args(["--launch", &w.launch.to_string()])
        .args(["--token-env", TOKEN_ENV, "--spec"])
        .arg(w.spec_path)
        .args((0..w.opts.worker_verbosity.min(3)).map(|_| "-v"))
        .env(TOKEN_ENV, w.token)
        .env("NO_COLOR", "1")
        // glibc gives each new thread that allocates its own malloc arena (up to 8 per
        // core) and never returns them; a worker serves every engine call on a fresh
        // thread, so without a cap its RSS creeps up for dozens of steps. Two arenas keep
        // it flat (plugin buffers are memory-layer regions, not malloc).
        .env(
            "MALLOC_ARENA_MAX",
            std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2".into()),
        )
        // A fixed mmap threshold: glibc otherwise raises it after the first large free,
        // so later large temporaries (checkpoint staging, digests) come from the heap and
        // stay resident — a one-off RSS jump whose timing depends on load.
        .env(
            "MALLOC_MMAP_THRESHOLD_",
            std::env::var("MALLOC_MMAP_THRESHOLD_").unwrap_or_else(|_| "1048576".into()),
        );
    (cmd, place, what)
}
