//! `CommConfig`: everything a rank needs to join a world, buildable in code or from
//! `TANDEM_TRANSPORT_*` environment variables (how local launchers hand it to children).

use crate::error::{Result, TransportError};
use crate::link::shm::ShmOptions;
use crate::plan::TransportOverride;
use crate::topology::{Device, Placement};
use std::net::IpAddr;
use std::time::Duration;

/// Environment variable names read by [`CommConfig::from_env`].
pub mod env {
    /// Store address `host:port` (required).
    pub const STORE: &str = "TANDEM_TRANSPORT_STORE";
    /// Run token (required).
    pub const TOKEN: &str = "TANDEM_TRANSPORT_TOKEN";
    /// World name: key namespace in the store (default `world`).
    pub const NAME: &str = "TANDEM_TRANSPORT_NAME";
    /// This rank (required).
    pub const RANK: &str = "TANDEM_TRANSPORT_RANK";
    /// World size (required).
    pub const WORLD_SIZE: &str = "TANDEM_TRANSPORT_WORLD_SIZE";
    /// Host id override (default: detected).
    pub const HOST: &str = "TANDEM_TRANSPORT_HOST";
    /// Device, `cpu` or `cuda:N` (default `cpu`).
    pub const DEVICE: &str = "TANDEM_TRANSPORT_DEVICE";
    /// `auto`, `shm`, `tcp` or `nccl` (default `auto`).
    pub const BACKEND: &str = "TANDEM_TRANSPORT_BACKEND";
    /// Timeout in milliseconds (default 60000).
    pub const TIMEOUT_MS: &str = "TANDEM_TRANSPORT_TIMEOUT_MS";
    /// Bytes per direction of each shm ring (default 4 MiB).
    pub const SHM_RING_BYTES: &str = "TANDEM_TRANSPORT_SHM_RING_BYTES";
    /// Producer publish chunk of shm rings (default 0 = automatic).
    pub const SHM_CHUNK_BYTES: &str = "TANDEM_TRANSPORT_SHM_CHUNK_BYTES";
    /// Spin before sleeping, in microseconds (default 50).
    pub const SHM_SPIN_US: &str = "TANDEM_TRANSPORT_SHM_SPIN_US";
    /// Single-copy path for large shm messages: `auto`, `on` or `off` (default `auto`).
    pub const SHM_SINGLE_COPY: &str = "TANDEM_TRANSPORT_SHM_SINGLE_COPY";
    /// Smallest message sent by single copy, in bytes (default 262144).
    pub const SHM_SINGLE_COPY_MIN: &str = "TANDEM_TRANSPORT_SHM_SINGLE_COPY_MIN";
    /// Ring bytes of a group's shared broadcast segment (default 8 MiB; 0 = broadcasts take
    /// the chain over the links).
    pub const SHM_BROADCAST_BYTES: &str = "TANDEM_TRANSPORT_SHM_BROADCAST_BYTES";
    /// IP address to listen on and advertise for tcp links (default: the interface that
    /// routes to the store).
    pub const TCP_IP: &str = "TANDEM_TRANSPORT_TCP_IP";
}

/// How to join a world.
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Rendezvous store address, `host:port`.
    pub store_addr: String,
    /// The run's token (authenticates store and link connections).
    pub token: String,
    /// Key namespace in the store; use a fresh name per job incarnation so stale keys from a
    /// previous attempt are never read.
    pub name: String,
    /// This rank in the world.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Where this rank runs.
    pub placement: Placement,
    /// The job file's transport choice.
    pub transport: TransportOverride,
    /// Longest time any operation may wait without progress from its peer; also bounds the
    /// rendezvous at start-up.
    pub timeout: Duration,
    /// Address for tcp links (default: the local address of the store connection).
    pub tcp_ip: Option<IpAddr>,
    /// Shared-memory ring tuning.
    pub shm: ShmOptions,
}

impl CommConfig {
    /// A config with defaults: CPU placement on this host, `auto`, 60 s timeout.
    pub fn new(store_addr: &str, token: &str, rank: usize, world_size: usize) -> Self {
        CommConfig {
            store_addr: store_addr.into(),
            token: token.into(),
            name: "world".into(),
            rank,
            world_size,
            placement: Placement::this_host_cpu(),
            transport: TransportOverride::Auto,
            timeout: Duration::from_secs(60),
            tcp_ip: None,
            shm: ShmOptions::default(),
        }
    }

    /// Reads `TANDEM_TRANSPORT_*` (see [`env`](mod@env)).
    pub fn from_env() -> Result<Self> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let need = |k: &str| {
            get(k).ok_or_else(|| {
                TransportError::Invalid(format!("environment variable {k} is not set"))
            })
        };
        let num = |k: &str, v: String| {
            v.parse::<usize>().map_err(|_| {
                TransportError::Invalid(format!("{k}={v:?} is not a non-negative integer"))
            })
        };
        let mut c = CommConfig::new(
            &need(env::STORE)?,
            &need(env::TOKEN)?,
            num(env::RANK, need(env::RANK)?)?,
            num(env::WORLD_SIZE, need(env::WORLD_SIZE)?)?,
        );
        if let Some(n) = get(env::NAME) {
            c.name = n;
        }
        if let Some(h) = get(env::HOST) {
            c.placement.host = h;
        }
        if let Some(d) = get(env::DEVICE) {
            c.placement.device = d.parse::<Device>()?;
        }
        if let Some(b) = get(env::BACKEND) {
            c.transport = b.parse()?;
        }
        if let Some(t) = get(env::TIMEOUT_MS) {
            c.timeout = Duration::from_millis(num(env::TIMEOUT_MS, t)? as u64);
        }
        if let Some(b) = get(env::SHM_RING_BYTES) {
            c.shm.ring_bytes = num(env::SHM_RING_BYTES, b)?;
        }
        if let Some(b) = get(env::SHM_CHUNK_BYTES) {
            c.shm.chunk_bytes = num(env::SHM_CHUNK_BYTES, b)?;
        }
        if let Some(b) = get(env::SHM_SINGLE_COPY) {
            c.shm.single_copy = b.parse().map_err(|_| {
                TransportError::Invalid(format!(
                    "{}={b:?} must be auto, on or off",
                    env::SHM_SINGLE_COPY
                ))
            })?;
        }
        if let Some(b) = get(env::SHM_SINGLE_COPY_MIN) {
            c.shm.single_copy_min_bytes = num(env::SHM_SINGLE_COPY_MIN, b)?;
        }
        if let Some(b) = get(env::SHM_BROADCAST_BYTES) {
            c.shm.broadcast_bytes = num(env::SHM_BROADCAST_BYTES, b)?;
        }
        if let Some(b) = get(env::SHM_SPIN_US) {
            c.shm.spin = Duration::from_micros(num(env::SHM_SPIN_US, b)? as u64);
        }
        if let Some(ip) = get(env::TCP_IP) {
            c.tcp_ip = Some(ip.parse().map_err(|_| {
                TransportError::Invalid(format!("{}={ip:?} is not an IP address", env::TCP_IP))
            })?);
        }
        Ok(c)
    }

    /// The environment that makes [`from_env`](Self::from_env) rebuild this config.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            (env::STORE, self.store_addr.clone()),
            (env::TOKEN, self.token.clone()),
            (env::NAME, self.name.clone()),
            (env::RANK, self.rank.to_string()),
            (env::WORLD_SIZE, self.world_size.to_string()),
            (env::HOST, self.placement.host.clone()),
            (env::DEVICE, self.placement.device.to_string()),
            (env::BACKEND, self.transport.to_string()),
            (env::TIMEOUT_MS, self.timeout.as_millis().to_string()),
            (env::SHM_RING_BYTES, self.shm.ring_bytes.to_string()),
            (env::SHM_CHUNK_BYTES, self.shm.chunk_bytes.to_string()),
            (env::SHM_SPIN_US, self.shm.spin.as_micros().to_string()),
            (env::SHM_SINGLE_COPY, self.shm.single_copy.to_string()),
            (
                env::SHM_SINGLE_COPY_MIN,
                self.shm.single_copy_min_bytes.to_string(),
            ),
            (
                env::SHM_BROADCAST_BYTES,
                self.shm.broadcast_bytes.to_string(),
            ),
        ];
        if let Some(ip) = self.tcp_ip {
            v.push((env::TCP_IP, ip.to_string()));
        }
        v
    }
}
