//! Spawning a local world: a [`StoreServer`] in this process and N child processes of a
//! command, each given its rank through `TANDEM_TRANSPORT_*` variables (see
//! [`CommConfig::from_env`]). Children get `PR_SET_PDEATHSIG` semantics by calling
//! [`die_with_parent`] first thing.

use crate::comm::config::CommConfig;
use crate::error::{Result, TransportError};
use crate::store::StoreServer;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A local world of child processes.
pub struct LocalWorld {
    /// The store the children rendezvous through.
    pub store: StoreServer,
    /// The children, index = rank.
    pub children: Vec<Child>,
}

/// What to spawn.
#[derive(Debug, Clone)]
pub struct LocalSpec {
    /// Program (e.g. `std::env::current_exe()`).
    pub program: PathBuf,
    /// Arguments for every child.
    pub args: Vec<String>,
    /// Extra environment for every child.
    pub env: Vec<(String, String)>,
    /// One config per rank (`store_addr` and `token` are filled in by [`spawn`]).
    pub configs: Vec<CommConfig>,
}

/// Starts a store on 127.0.0.1 and the children.
pub fn spawn(spec: &LocalSpec, token: &str) -> Result<LocalWorld> {
    let store = StoreServer::start("127.0.0.1:0", token)?;
    let mut children = Vec::new();
    for cfg in &spec.configs {
        let mut cfg = cfg.clone();
        cfg.store_addr = store.addr().to_string();
        cfg.token = token.into();
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args);
        cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.envs(cfg.to_env());
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(TransportError::io(
                    format!("spawning {}", spec.program.display()),
                    e,
                ));
            }
        }
    }
    Ok(LocalWorld { store, children })
}

impl LocalWorld {
    /// Waits for every child up to `timeout`; kills the rest after it. Returns each child's
    /// exit code (`None` = killed by a signal or by the timeout).
    pub fn wait(mut self, timeout: Duration) -> Vec<Option<i32>> {
        let deadline = Instant::now() + timeout;
        let mut codes: Vec<Option<Option<i32>>> = vec![None; self.children.len()];
        while codes.iter().any(Option::is_none) {
            for (i, c) in self.children.iter_mut().enumerate() {
                if codes[i].is_none()
                    && let Ok(Some(st)) = c.try_wait()
                {
                    codes[i] = Some(st.code());
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for (i, c) in self.children.iter_mut().enumerate() {
            if codes[i].is_none() {
                let _ = c.kill();
                let _ = c.wait();
                codes[i] = Some(None);
            }
        }
        self.children.clear();
        codes.into_iter().map(Option::flatten).collect()
    }
}

impl Drop for LocalWorld {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Asks the kernel to SIGKILL this process when its parent dies, so a crashed launcher
/// leaves no orphan ranks behind.
pub fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}
