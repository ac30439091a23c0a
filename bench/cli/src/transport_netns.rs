//! `tandem bench transport --across-netns NS`: tcp point-to-point bandwidth between two "hosts"
//! — this process (the login node, on the bridge) and a peer process in the Linux network
//! namespace `NS` (`scripts/cluster/netns-up.sh` makes `tnd-n1` and `tnd-n2`) — beside a plain
//! socket copy over the same veth measured in the same trials: a raw `TcpStream` write loop of
//! the same bytes to the same peer, read fully and acknowledged.
//!
//! Target: tcp transport >= 0.7x the plain socket copy.
//!
//! The peer is this executable re-run as the hidden subcommand [`PEER_COMMAND`] under
//! `nsenter --net=/run/netns/NS`. The peer's address comes from the namespace (the IPv4 address
//! of its `eth0`, read with `ip -n NS`; see `netns.rs`); this side's is the one that routes to
//! it. This process hosts the rendezvous store; the two ranks join a two-rank `tandem_transport`
//! world forced onto tcp, and the peer publishes its plain listener in the same store.

use super::Figure;
use super::netns::{HELP, NETNS_DIR, PEER_IFACE, effective_uid, namespace_ipv4, preflight};
use crate::transport::world::human;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tandem_cli::error::CliError;
use tandem_transport::store::{StoreClient, StoreServer};
use tandem_transport::{BackendKind, CommConfig, Communicator, TransportOverride};

/// The hidden subcommand the peer runs as.
pub const PEER_COMMAND: &str = "bench-netns-peer";
/// Carries the store token to the peer (kept off its command line).
const TOKEN_ENV: &str = "TANDEM_BENCH_NETNS_TOKEN";
/// The target on the ratio.
pub const TARGET: &str = ">= 0.7";
/// Longest wait without progress, on both sides.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Message tag of the payload and of the acknowledgement.
const TAG_DATA: u32 = 1;
const TAG_ACK: u32 = 2;

/// What to measure: message sizes with their repetitions per trial, and timed trials (after
/// one warm-up trial); the best trial counts, for the figure and its limit alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `(message bytes, messages per trial)`.
    pub cases: Vec<(usize, usize)>,
    /// Timed trials per case.
    pub trials: usize,
}

impl Plan {
    /// Full runs: 64 MiB x4 and 256 MiB x2 per trial, 3 trials; `quick`: 64 MiB x2, 2 trials.
    pub fn new(quick: bool) -> Self {
        if quick {
            Plan {
                cases: vec![(64 << 20, 2)],
                trials: 2,
            }
        } else {
            Plan {
                cases: vec![(64 << 20, 4), (256 << 20, 2)],
                trials: 3,
            }
        }
    }
}

/// Arguments of the peer (started by the bench, not by hand).
#[derive(Debug, clap::Args)]
pub struct PeerArgs {
    /// The bench's rendezvous store, `host:port`.
    #[arg(long)]
    pub store: String,
    /// The world name (key namespace in the store).
    #[arg(long)]
    pub name: String,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', required = true)]
    pub sizes: Vec<usize>,
    /// Messages per trial, one per size.
    #[arg(long, value_delimiter = ',', required = true)]
    pub reps: Vec<usize>,
    /// Timed trials per size.
    #[arg(long)]
    pub trials: usize,
}

/// Runs the cross-namespace case against a peer in `netns`.
pub fn run(netns: &str, quick: bool) -> Result<Vec<Figure>, CliError> {
    let ns_path = preflight(netns, Path::new(NETNS_DIR), effective_uid()?)?;
    let peer_ip = namespace_ipv4(netns)?;
    let host_ip = tandem_runtime::launch::route_toward(peer_ip.into()).map_err(|e| {
        CliError::failed(format!(
            "no route from this namespace to {peer_ip} ({netns}'s {PEER_IFACE}): {e}"
        ))
        .with_help(HELP)
    })?;
    let plan = Plan::new(quick);
    let fail = |e: &dyn std::fmt::Display| {
        CliError::failed(format!(
            "tandem bench transport --across-netns {netns}: {e}"
        ))
    };

    let token = format!(
        "bench-netns-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let name = format!("bench-netns-{}", std::process::id());
    let server = StoreServer::start(&format!("{host_ip}:0"), &token).map_err(|e| fail(&e))?;
    let store_addr = server.addr().to_string();
    let exe = std::env::current_exe().map_err(CliError::io("finding the current executable"))?;
    let join = |v: Vec<usize>| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let child = Command::new("nsenter")
        .arg(format!("--net={}", ns_path.display()))
        .arg(&exe)
        .args([PEER_COMMAND, "--store", &store_addr, "--name", &name])
        .args(["--sizes", &join(plan.cases.iter().map(|c| c.0).collect())])
        .args(["--reps", &join(plan.cases.iter().map(|c| c.1).collect())])
        .args(["--trials", &plan.trials.to_string()])
        .env(TOKEN_ENV, &token)
        .stdin(Stdio::null())
        .spawn()
        .map_err(CliError::io(format!(
            "starting `nsenter --net={} {}`",
            ns_path.display(),
            exe.display()
        )))?;
    let mut peer = PeerGuard(child);

    // The peer publishes its plain listener first; watch it while waiting, so a peer that
    // failed to start is reported at once rather than after the timeout.
    let store = StoreClient::connect(&store_addr, &token, TIMEOUT).map_err(|e| fail(&e))?;
    let plain_key = format!("{name}/plain");
    let deadline = Instant::now() + TIMEOUT;
    while store
        .wait(&[&plain_key], Duration::from_millis(200))
        .is_err()
    {
        if let Some(status) = peer
            .0
            .try_wait()
            .map_err(CliError::io("watching the peer"))?
        {
            return Err(fail(&format!(
                "the peer in {netns} exited ({status}) before it was ready; its error is above"
            )));
        }
        if Instant::now() >= deadline {
            return Err(fail(&format!(
                "the peer in {netns} did not report ready within {TIMEOUT:?}"
            )));
        }
    }
    let plain_addr =
        String::from_utf8_lossy(&store.get(&plain_key).map_err(|e| fail(&e))?).into_owned();
    let plain_addr: SocketAddr = plain_addr
        .parse()
        .map_err(|_| fail(&format!("the peer published a bad address {plain_addr:?}")))?;
    let mut plain = TcpStream::connect_timeout(&plain_addr, TIMEOUT)
        .and_then(|s| plain_socket(s, TIMEOUT))
        .map_err(CliError::io(format!(
            "connecting to the peer at {plain_addr}"
        )))?;

    let mut cfg = CommConfig::new(&store_addr, &token, 0, 2);
    cfg.name = name;
    cfg.transport = TransportOverride::Force(BackendKind::Tcp);
    cfg.timeout = TIMEOUT;
    cfg.tcp_ip = Some(host_ip);
    cfg.placement.host = "login".into();
    let world = Communicator::init(&cfg).map_err(|e| fail(&e))?;

    let plain_err = |e| CliError::io("plain socket copy to the peer")(e);
    let mut figures = Vec::new();
    for &(size, reps) in &plan.cases {
        let buf = vec![7u8; size];
        let (mut best_tcp, mut best_plain) = (f64::MAX, f64::MAX);
        for trial in 0..=plan.trials {
            let (a, b) = if transport_first(trial) {
                let a = send_transport(&world, &buf, reps).map_err(|e| fail(&e))?;
                (a, send_plain(&mut plain, &buf, reps).map_err(plain_err)?)
            } else {
                let b = send_plain(&mut plain, &buf, reps).map_err(plain_err)?;
                (send_transport(&world, &buf, reps).map_err(|e| fail(&e))?, b)
            };
            // Trial 0 is the warm-up (pages faulted in, windows grown on both sides).
            if trial > 0 {
                best_tcp = best_tcp.min(a);
                best_plain = best_plain.min(b);
            }
        }
        let gb = (size * reps) as f64 / 1e9;
        figures.push(figure(netns, size, gb / best_tcp, gb / best_plain));
    }
    drop(world);
    drop(plain);
    peer.finish(netns)?;
    drop(server);
    Ok(figures)
}

/// The figure of one message size: tcp transport GB/s beside the plain socket copy's.
pub fn figure(netns: &str, size: usize, tcp_gbps: f64, plain_gbps: f64) -> Figure {
    let case = format!("p2p tcp across netns {netns} {}", human(size));
    Figure::new("transport", &case, tcp_gbps, "GB/s", plain_gbps)
        .limit_name("plain socket copy")
        .target(TARGET)
}

/// Which half of a trial goes first: they alternate, so neither always runs on a warmer path.
fn transport_first(trial: usize) -> bool {
    trial.is_multiple_of(2)
}

/// The peer: join the world from inside the namespace, publish a plain listener, then receive
/// what [`run`] sends, in the same order.
pub fn peer(args: PeerArgs) -> Result<(), CliError> {
    tandem_transport::local::die_with_parent();
    let fail = |e: &dyn std::fmt::Display| CliError::failed(format!("{PEER_COMMAND}: {e}"));
    if args.sizes.len() != args.reps.len() {
        return Err(CliError::usage(format!(
            "{PEER_COMMAND}: {} sizes but {} reps; give one rep count per size",
            args.sizes.len(),
            args.reps.len()
        )));
    }
    let token = std::env::var(TOKEN_ENV)
        .map_err(|_| CliError::usage(format!("{PEER_COMMAND}: {TOKEN_ENV} is not set")))?;
    let store = StoreClient::connect(&args.store, &token, TIMEOUT).map_err(|e| fail(&e))?;
    let ip = store.local_ip().map_err(|e| fail(&e))?;
    let listener =
        TcpListener::bind((ip, 0)).map_err(CliError::io(format!("binding a listener on {ip}")))?;
    let addr = listener
        .local_addr()
        .map_err(CliError::io("reading the listener's address"))?;
    store
        .set(&format!("{}/plain", args.name), addr.to_string().as_bytes())
        .map_err(|e| fail(&e))?;
    // The bench connects the plain socket before joining; it waits in the backlog.
    let mut cfg = CommConfig::new(&args.store, &token, 1, 2);
    cfg.name = args.name.clone();
    cfg.transport = TransportOverride::Force(BackendKind::Tcp);
    cfg.timeout = TIMEOUT;
    cfg.placement.host = format!("netns:{ip}");
    let world = Communicator::init(&cfg).map_err(|e| fail(&e))?;
    listener
        .set_nonblocking(true)
        .map_err(CliError::io("configuring the listener"))?;
    let deadline = Instant::now() + TIMEOUT;
    let plain = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(CliError::io("accepting the plain socket")(e)),
        }
    };
    let mut plain = plain_socket(plain, TIMEOUT).map_err(CliError::io("the plain socket"))?;

    for (&size, &reps) in args.sizes.iter().zip(&args.reps) {
        let mut buf = vec![0u8; size];
        for trial in 0..=args.trials {
            if transport_first(trial) {
                recv_transport(&world, &mut buf, reps).map_err(|e| fail(&e))?;
            }
            recv_plain(&mut plain, &mut buf, reps)
                .map_err(CliError::io("plain socket copy from the bench"))?;
            if !transport_first(trial) {
                recv_transport(&world, &mut buf, reps).map_err(|e| fail(&e))?;
            }
        }
    }
    Ok(())
}

/// Seconds to send `reps` copies of `buf` through the transport and get the peer's ack.
fn send_transport(world: &Communicator, buf: &[u8], reps: usize) -> tandem_transport::Result<f64> {
    let t = Instant::now();
    for _ in 0..reps {
        world.send(1, buf, TAG_DATA)?;
    }
    world.recv(1, &mut [0u8; 1], TAG_ACK)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds to write `reps` copies of `buf` on the plain socket and read the peer's ack.
fn send_plain(s: &mut TcpStream, buf: &[u8], reps: usize) -> std::io::Result<f64> {
    let t = Instant::now();
    for _ in 0..reps {
        s.write_all(buf)?;
    }
    s.read_exact(&mut [0u8; 1])?;
    Ok(t.elapsed().as_secs_f64())
}

/// The peer's half of [`send_transport`].
fn recv_transport(
    world: &Communicator,
    buf: &mut [u8],
    reps: usize,
) -> tandem_transport::Result<()> {
    for _ in 0..reps {
        world.recv(0, buf, TAG_DATA)?;
    }
    world.send(0, &[1], TAG_ACK)
}

/// The peer's half of [`send_plain`]: every byte read, then one byte back.
fn recv_plain(s: &mut TcpStream, buf: &mut [u8], reps: usize) -> std::io::Result<()> {
    for _ in 0..reps {
        s.read_exact(buf)?;
    }
    s.write_all(&[1])
}

/// Blocking, no Nagle (as the transport's links), bounded waits.
fn plain_socket(s: TcpStream, timeout: Duration) -> std::io::Result<TcpStream> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// Kills the peer if the bench returns early.
struct PeerGuard(Child);

impl PeerGuard {
    /// Waits for the peer to exit after the last trial; a failure is the bench's failure.
    fn finish(&mut self, netns: &str) -> Result<(), CliError> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self
                .0
                .try_wait()
                .map_err(CliError::io("waiting for the peer"))?
            {
                return if status.success() {
                    Ok(())
                } else {
                    Err(CliError::failed(format!(
                        "the bench peer in {netns} failed ({status}); its error is above"
                    )))
                };
            }
            if Instant::now() >= deadline {
                return Err(CliError::failed(format!(
                    "the bench peer in {netns} did not exit within {TIMEOUT:?} after the last trial"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_is_beside_the_target() {
        let f = figure("tnd-n2", 64 << 20, 2.8, 4.0);
        assert_eq!(f.case, "p2p tcp across netns tnd-n2 64 MiB");
        assert!((f.ratio - 0.7).abs() < 1e-12);
        assert_eq!(f.target, ">= 0.7");
        assert_eq!(f.limit_name, "plain socket copy");
        assert_eq!(f.unit, "GB/s");
    }

    #[test]
    fn quick_plan_is_smaller() {
        let (q, f) = (Plan::new(true), Plan::new(false));
        let bytes = |p: &Plan| p.cases.iter().map(|c| c.0 * c.1).sum::<usize>() * (p.trials + 1);
        assert!(bytes(&q) < bytes(&f));
        assert!(f.cases.iter().any(|c| c.0 == 256 << 20));
    }
}
