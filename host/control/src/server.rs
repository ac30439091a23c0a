//! The controller's listener and the hello handshake (both ends).
//!
//! [`ControlServer::bind`] listens (loopback by default), makes the run's random token, and
//! accepts connections on a thread: each peer has a few seconds to send a hello of at most
//! [`MAX_HELLO_BYTES`](super::frame::MAX_HELLO_BYTES) carrying the token; a peer without it is
//! answered `Rejected`, logged in one line, and dropped. Accepted workers wait in a table
//! keyed by (role, rank) until the launcher claims them with [`ControlServer::claim`]; a newer
//! connection for the same (role, rank) replaces an unclaimed older one.

use super::error::ControlError;
use super::frame::{self, MAX_HELLO_BYTES};
use super::protocol::{PROTOCOL_VERSION, Role, ToController, ToWorker};
use std::collections::HashMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an accepted peer has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker that passed the handshake.
#[derive(Debug)]
pub struct Accepted {
    /// The connection, past the hello.
    pub stream: TcpStream,
    /// The worker's process id, as it reported it.
    pub pid: u32,
    /// The launch it reported ([`ToController::Hello`]).
    pub launch: u64,
    /// Its host name, as it reported it.
    pub host: String,
    /// The address it connected from.
    pub peer: Option<SocketAddr>,
}

#[derive(Default)]
struct Table {
    accepted: HashMap<(Role, u32), Accepted>,
}

struct Shared {
    token: String,
    table: Mutex<Table>,
    arrived: Condvar,
    rejected: AtomicU64,
    stop: AtomicBool,
}

/// The controller end of the control plane: a listening socket and the run's token.
pub struct ControlServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `bind` (use `127.0.0.1:0` for loopback on a free port) with a fresh random
    /// token.
    pub fn bind(bind: SocketAddr) -> Result<ControlServer, ControlError> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| ControlError::io(format!("control plane: cannot listen on {bind}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ControlError::io("control plane: local address", e))?;
        let shared = Arc::new(Shared {
            token: random_token()?,
            table: Mutex::new(Table::default()),
            arrived: Condvar::new(),
            rejected: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("control-accept".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| ControlError::io("control plane: cannot start the accept thread", e))?;
        tracing::info!(%addr, "control plane listening");
        Ok(ControlServer {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address workers should connect to: the bound address, with an unspecified IP
    /// (`0.0.0.0`, `::`) replaced by loopback.
    pub fn connect_addr(&self) -> SocketAddr {
        let mut a = self.addr;
        if a.ip().is_unspecified() {
            a.set_ip(if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        a
    }

    /// The run's token (hex). Hand it to workers through the environment, never argv.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// How many peers were refused so far.
    pub fn rejected_peers(&self) -> u64 {
        self.shared.rejected.load(Ordering::SeqCst)
    }

    /// Takes the accepted worker (role, rank) if it arrives within `wait`.
    pub fn claim(&self, role: Role, rank: u32, wait: Duration) -> Option<Accepted> {
        let deadline = Instant::now() + wait;
        let mut table = self.shared.table.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(a) = table.accepted.remove(&(role, rank)) {
                return Some(a);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            table = match self.shared.arrived.wait_timeout(table, left) {
                Ok((t, _)) => t,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.connect_addr(), Duration::from_secs(1));
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("control plane: accept failed: {e}");
                continue;
            }
        };
        let s = shared.clone();
        // A thread per handshake: a silent peer cannot hold up the others.
        let spawned = std::thread::Builder::new()
            .name("control-hello".into())
            .spawn(move || handshake(stream, &s));
        if let Err(e) = spawned {
            tracing::warn!("control plane: cannot start a handshake thread: {e}");
        }
    }
}

fn handshake(mut stream: TcpStream, shared: &Shared) {
    let peer_addr = stream.peer_addr().ok();
    let peer = peer_addr.map_or_else(|| "unknown peer".to_string(), |a| a.to_string());
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let hello = frame::read::<ToController>(&mut stream, MAX_HELLO_BYTES);
    let refuse = |mut stream: TcpStream, why: String| {
        shared.rejected.fetch_add(1, Ordering::SeqCst);
        tracing::warn!("control plane: rejected peer {peer}: {why}");
        let _ = frame::write(&mut stream, &ToWorker::Rejected { reason: why });
    };
    let (role, rank, pid, launch, host) = match hello {
        Ok(ToController::Hello {
            protocol,
            token,
            role,
            rank,
            pid,
            launch,
            host,
        }) => {
            if !same_token(&token, &shared.token) {
                return refuse(stream, "wrong run token".into());
            }
            if protocol != PROTOCOL_VERSION {
                return refuse(
                    stream,
                    format!(
                        "protocol version {protocol}, expected {PROTOCOL_VERSION} (a worker of another build)"
                    ),
                );
            }
            (role, rank, pid, launch, host)
        }
        Ok(_) => return refuse(stream, "first message was not a hello".into()),
        Err(e) => return refuse(stream, format!("no valid hello within 5 s ({e})")),
    };
    let mut table = shared.table.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(old) = table.accepted.get(&(role, rank)) {
        // The newest process of a rank wins: an unclaimed older connection is a leftover
        // (e.g. of a worker that was given up on); the launcher checks the pid it claims.
        tracing::warn!(
            "control plane: {role} rank {rank} (pid {pid}) replaces an unclaimed connection of pid {}",
            old.pid
        );
    }
    if let Err(e) = frame::write(&mut stream, &ToWorker::Welcome) {
        tracing::warn!("control plane: {role} rank {rank} left during the handshake: {e}");
        return;
    }
    let _ = stream.set_read_timeout(None);
    tracing::debug!(
        "control plane: {role} rank {rank} (pid {pid} on {host}) connected from {peer}"
    );
    let accepted = Accepted {
        stream,
        pid,
        launch,
        host,
        peer: peer_addr,
    };
    table.accepted.insert((role, rank), accepted);
    shared.arrived.notify_all();
}

/// Worker side of the handshake: connects to `addr`, presents `token` (as `role` rank `rank`,
/// start `launch` of the rank), and returns the stream once the controller welcomed it.
pub fn connect(
    addr: SocketAddr,
    token: &str,
    role: Role,
    rank: u32,
    launch: u64,
    timeout: Duration,
) -> Result<TcpStream, ControlError> {
    let ctx = || format!("control plane: connecting to the controller at {addr}");
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| ControlError::Unreachable {
            addr: addr.to_string(),
            message: e.to_string(),
        })?;
    let _ = stream.set_nodelay(true);
    let hello = ToController::Hello {
        protocol: PROTOCOL_VERSION,
        token: token.to_string(),
        role,
        rank,
        pid: std::process::id(),
        launch,
        host: host_name(),
    };
    frame::write(&mut stream, &hello).map_err(|e| ControlError::io(ctx(), e))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| ControlError::io(ctx(), e))?;
    match frame::read::<ToWorker>(&mut stream, MAX_HELLO_BYTES) {
        Ok(ToWorker::Welcome) => {
            stream
                .set_read_timeout(None)
                .map_err(|e| ControlError::io(ctx(), e))?;
            Ok(stream)
        }
        Ok(ToWorker::Rejected { reason }) => Err(ControlError::Rejected {
            addr: addr.to_string(),
            reason,
        }),
        Ok(other) => Err(ControlError::Protocol {
            peer: format!("controller at {addr}"),
            message: format!("expected a welcome, got {other:?}"),
        }),
        Err(e) => Err(ControlError::io(ctx(), e)),
    }
}

/// Constant-time comparison (the time taken does not depend on where the tokens differ).
fn same_token(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 random bytes from the kernel, as 64 hex digits.
fn random_token() -> Result<String, ControlError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| {
            ControlError::io("control plane: reading /dev/urandom for the run token", e)
        })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// This machine's host name (`/proc/sys/kernel/hostname`: the UTS namespace's, as `hostname`
/// prints it), or `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;
    use std::io::{Read, Write};

    fn server() -> ControlServer {
        ControlServer::bind("127.0.0.1:0".parse().unwrap()).unwrap()
    }

    #[test]
    fn tokens_are_random_and_compared_exactly() {
        let (a, b) = (server(), server());
        assert_eq!(a.token().len(), 64);
        assert_ne!(a.token(), b.token());
        assert!(same_token(a.token(), a.token()));
        assert!(!same_token(a.token(), b.token()));
        assert!(!same_token(a.token(), &a.token()[..63]));
    }

    #[test]
    fn good_hello_is_claimed_and_bad_ones_are_refused() {
        let s = server();
        let addr = s.connect_addr();
        let t = Duration::from_secs(5);
        let wrong = connect(addr, "not-the-token", Role::Engine, 0, 0, t).unwrap_err();
        assert!(
            matches!(&wrong, ControlError::Rejected { reason, .. } if reason == "wrong run token"),
            "{wrong}"
        );
        // Garbage instead of a hello: refused, counted, and nothing is registered.
        let mut junk = TcpStream::connect(addr).unwrap();
        junk.write_all(&[0, 0, 0, 2, 0xc1, 0xc1]).unwrap();
        let reply: Result<ToWorker, _> = frame::read(&mut junk, MAX_HELLO_BYTES);
        assert!(matches!(reply, Ok(ToWorker::Rejected { .. })), "{reply:?}");
        let mut first = connect(addr, s.token(), Role::Trainer, 3, 0, t).unwrap();
        let _second = connect(addr, s.token(), Role::Trainer, 3, 0, t).unwrap();
        assert!(
            s.claim(Role::Engine, 0, Duration::from_millis(50))
                .is_none()
        );
        let got = s.claim(Role::Trainer, 3, t).expect("trainer 3 accepted");
        assert_eq!(got.pid, std::process::id());
        // The newer connection replaced the older one, which the server dropped (EOF).
        assert!(
            s.claim(Role::Trainer, 3, Duration::from_millis(50))
                .is_none()
        );
        first.set_read_timeout(Some(t)).unwrap();
        assert_eq!(first.read(&mut [0u8; 1]).unwrap(), 0);
        assert_eq!(s.rejected_peers(), 2);
    }
}
