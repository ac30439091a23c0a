//! Joining a world: publish this rank's placement, compute the plan, then open one link per
//! peer. The lower rank of each pair connects (tcp: `TcpStream::connect`; shm: Unix socket +
//! memfd); the higher rank accepts. Every rank connects before it accepts and connections
//! complete in the kernel backlog, so the order cannot deadlock.

use super::config::CommConfig;
use super::peer::Peer;
use crate::error::{Result, TransportError};
use crate::link::shm::ShmLink;
use crate::link::tcp::TcpLink;
use crate::link::{Link, PeerInfo, handshake};
use crate::plan::{BackendKind, Plan, plan};
use crate::store::StoreClient;
use crate::topology::Placement;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Result of joining: store connection, plan, one peer per other rank.
pub(crate) struct Joined {
    pub store: StoreClient,
    pub plan: Plan,
    pub placements: Vec<Placement>,
    pub peers: Vec<Option<Peer>>,
}

/// True when this build can use NCCL on this machine: built with the `cuda` feature, and
/// libcuda and libnccl load. cudarc (the CUDA binding) opens `libnccl.so` (or `.so.12`,
/// `.11`, ...) but never `libnccl.so.2`, the only name NCCL packages and the
/// `nvidia-nccl-cu12`/`-cu13` wheels install, so with those this is false until a
/// `libnccl.so -> libnccl.so.2` symlink sits in a directory on `LD_LIBRARY_PATH`; when that is
/// the cause, the first call logs (tracing `warn`) the exact `ln -s` to run.
pub fn cuda_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::link::nccl::available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

pub(crate) fn join(cfg: &CommConfig) -> Result<Joined> {
    let (me, n) = (cfg.rank, cfg.world_size);
    if n == 0 || me >= n {
        return Err(TransportError::Invalid(format!(
            "rank {me} is not in a world of {n} ranks; ranks run from 0 to world_size - 1"
        )));
    }
    let store = StoreClient::connect(&cfg.store_addr, &cfg.token, cfg.timeout)?;
    let key = |what: &str, r: usize| format!("{}/{what}/{r}", cfg.name);
    store.set(&key("place", me), cfg.placement.encode().as_bytes())?;
    let keys: Vec<String> = (0..n).map(|r| key("place", r)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait(&refs, cfg.timeout)?;
    let mut placements = Vec::with_capacity(n);
    for k in &keys {
        let v = store.get(k)?;
        let p = std::str::from_utf8(&v)
            .ok()
            .and_then(Placement::decode)
            .ok_or_else(|| TransportError::Store {
                addr: store.addr().into(),
                msg: format!("key {k} does not hold a placement"),
            })?;
        placements.push(p);
    }
    let plan = plan(&placements, cfg.transport, cuda_available())?;
    let has_peer = |kind| (0..n).any(|r| r != me && plan.backend(me, r) == kind);

    let info = |rank, addr: String| PeerInfo {
        rank,
        addr,
        timeout: cfg.timeout,
    };
    let mut peers: Vec<Option<Peer>> = (0..n).map(|_| None).collect();

    // Listeners, published before connecting to anyone.
    let shm_listener = if has_peer(BackendKind::Shm) {
        if cfg.shm.single_copy != crate::link::shm::SingleCopy::Off
            && !crate::link::shm::allow_peer_reads()
        {
            tracing::warn!(
                "tandem-transport: prctl(PR_SET_PTRACER) failed; peers may fall back to the \
                 two-copy shm ring"
            );
        }
        // Hash the world name: abstract socket names are limited to 107 bytes.
        let name = format!(
            "tandem/{:08x}/{}/{me}/{:x}",
            super::group_id_of_name(&cfg.name),
            std::process::id(),
            nonce()
        );
        let addr = UnixAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| TransportError::io("naming the shm socket", e))?;
        let l = UnixListener::bind_addr(&addr)
            .map_err(|e| TransportError::io(format!("binding shm socket @{name}"), e))?;
        l.set_nonblocking(true)
            .map_err(|e| TransportError::io("shm listener", e))?;
        store.set(&key("shm", me), name.as_bytes())?;
        Some(l)
    } else {
        None
    };
    let tcp_listener = if has_peer(BackendKind::Tcp) {
        let ip = match cfg.tcp_ip {
            Some(ip) => ip,
            None => store.local_ip()?,
        };
        let l = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| TransportError::io(format!("binding the tcp listener on {ip}"), e))?;
        let addr = l
            .local_addr()
            .map_err(|e| TransportError::io("tcp listener address", e))?;
        l.set_nonblocking(true)
            .map_err(|e| TransportError::io("tcp listener", e))?;
        store.set(&key("tcp", me), addr.to_string().as_bytes())?;
        Some(l)
    } else {
        None
    };

    // Connect to higher ranks.
    let hello = handshake::hello(me, &cfg.token);
    for (r, slot) in peers.iter_mut().enumerate().skip(me + 1) {
        let link: Box<dyn Link> = match plan.backend(me, r) {
            BackendKind::Shm => {
                let name = String::from_utf8_lossy(&store.get(&key("shm", r))?).into_owned();
                let addr = UnixAddr::from_abstract_name(name.as_bytes())
                    .map_err(|e| TransportError::io("naming the peer's shm socket", e))?;
                let sock = UnixStream::connect_addr(&addr).map_err(|e| {
                    TransportError::io(format!("connecting to rank {r} at shm socket @{name}"), e)
                })?;
                let link =
                    ShmLink::create(sock, &hello, &cfg.shm, info(r, format!("shm @{name}")))?;
                Box::new(link)
            }
            BackendKind::Tcp => {
                let a = String::from_utf8_lossy(&store.get(&key("tcp", r))?).into_owned();
                let sa: SocketAddr = a.parse().map_err(|_| TransportError::Store {
                    addr: store.addr().into(),
                    msg: format!("rank {r} published a bad tcp address {a:?}"),
                })?;
                let mut s = connect_tcp(&sa, cfg.timeout).map_err(|e| {
                    TransportError::io(format!("connecting to rank {r} at tcp {a}"), e)
                })?;
                handshake::send_hello(&mut s, me, &cfg.token)?;
                Box::new(TcpLink::new(s, info(r, format!("tcp {a}")))?)
            }
            BackendKind::Nccl => continue,
        };
        *slot = Some(Peer::new(link, me));
    }

    // Accept lower ranks.
    let mut waiting: Vec<usize> = (0..me)
        .filter(|&r| plan.backend(me, r) != BackendKind::Nccl)
        .collect();
    let deadline = Instant::now() + cfg.timeout;
    while !waiting.is_empty() {
        let mut progressed = false;
        if let Some(l) = &tcp_listener {
            match l.accept() {
                Ok((mut s, from)) => {
                    progressed = true;
                    s.set_nonblocking(false)
                        .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(10))))
                        .map_err(|e| TransportError::io("accepted tcp link", e))?;
                    let r = handshake::read_hello(&mut s, &cfg.token, &format!("tcp {from}"))?;
                    check_expected(&mut waiting, r, &plan, me, BackendKind::Tcp)?;
                    let link = TcpLink::new(s, info(r, format!("tcp {from}")))?;
                    peers[r] = Some(Peer::new(Box::new(link), me));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(TransportError::io("accepting a tcp link", e)),
            }
        }
        if let Some(l) = &shm_listener {
            match l.accept() {
                Ok((s, _)) => {
                    progressed = true;
                    s.set_nonblocking(false)
                        .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(10))))
                        .map_err(|e| TransportError::io("accepted shm socket", e))?;
                    let read = |rd: &mut dyn std::io::Read| {
                        handshake::read_hello(&mut &mut *rd, &cfg.token, "shm socket")
                    };
                    let link =
                        ShmLink::accept(s, &read, &cfg.shm, info(usize::MAX, String::new()))?;
                    let r = link.peer().rank;
                    check_expected(&mut waiting, r, &plan, me, BackendKind::Shm)?;
                    let mut link = link;
                    link.set_peer(info(r, format!("shm (rank {r} connected to rank {me})")));
                    peers[r] = Some(Peer::new(Box::new(link), me));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(TransportError::io("accepting a shm link", e)),
            }
        }
        if !progressed {
            if Instant::now() >= deadline {
                let r = waiting[0];
                return Err(TransportError::Timeout {
                    rank: r,
                    addr: format!("{} link, never connected", plan.backend(me, r)),
                    what: format!("connection set-up (also missing: {:?})", &waiting[1..]),
                    timeout: cfg.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // NCCL pairs last: one worker per world joins their communicators in the global order of
    // (lower, higher) rank pairs, so the blocking NCCL inits cannot wait in a cycle.
    let nccl: Vec<usize> = (0..n)
        .filter(|&r| r != me && plan.backend(me, r) == BackendKind::Nccl)
        .collect();
    for (r, link) in nccl_links(cfg, &store, me, &nccl)? {
        peers[r] = Some(Peer::new(link, me));
    }
    Ok(Joined {
        store,
        plan,
        placements,
        peers,
    })
}

fn check_expected(
    waiting: &mut Vec<usize>,
    r: usize,
    plan: &Plan,
    me: usize,
    kind: BackendKind,
) -> Result<()> {
    match waiting.iter().position(|&w| w == r) {
        Some(i) if plan.backend(me, r) == kind => {
            waiting.remove(i);
            Ok(())
        }
        _ => Err(TransportError::Protocol {
            peer: format!("rank {r}"),
            msg: format!("unexpected {kind} connection to rank {me}"),
        }),
    }
}

fn connect_tcp(sa: &SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(sa, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A random-enough nonce for socket names (time + pid + address entropy).
fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let x = 0u8;
    t ^ ((&x as *const u8 as u64) << 7) ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(feature = "cuda")]
fn nccl_links(
    cfg: &CommConfig,
    store: &StoreClient,
    me: usize,
    peers: &[usize],
) -> Result<Vec<(usize, Box<dyn Link>)>> {
    Ok(crate::link::nccl::connect_all(cfg, store, me, peers)?
        .into_iter()
        .map(|(r, l)| (r, Box::new(l) as Box<dyn Link>))
        .collect())
}

#[cfg(not(feature = "cuda"))]
fn nccl_links(
    _: &CommConfig,
    _: &StoreClient,
    me: usize,
    peers: &[usize],
) -> Result<Vec<(usize, Box<dyn Link>)>> {
    match peers.first() {
        None => Ok(Vec::new()),
        Some(r) => Err(TransportError::Unsupported(format!(
            "ranks {me} and {r} were planned on NCCL but this build has no `cuda` feature; \
             rebuild with --features cuda or set transport = \"auto\""
        ))),
    }
}
