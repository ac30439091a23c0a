//! Which address of this machine workers on other hosts reach it at: the one the kernel
//! routes from toward them (for `advertise = "auto"`), and a node's name as an address.

use std::net::{IpAddr, SocketAddr};

/// The address of this machine the kernel routes from toward `ip`: what a worker there
/// dials when the job says `advertise = "auto"`.
pub fn route_toward(ip: IpAddr) -> Result<IpAddr, String> {
    // A connected UDP socket sends nothing; its local address is the one the kernel routes
    // from toward `ip`.
    let any = if ip.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let sock = std::net::UdpSocket::bind(any).map_err(|e| format!("finding the route: {e}"))?;
    sock.connect((ip, 9))
        .map_err(|e| format!("no route from this machine: {e}"))?;
    sock.local_addr()
        .map(|a| a.ip())
        .map_err(|e| format!("finding the route: {e}"))
}

/// `name` as an IP: itself when it is one, else its first resolved address.
pub fn resolve(name: &str) -> Option<IpAddr> {
    name.parse().ok().or_else(|| {
        std::net::ToSocketAddrs::to_socket_addrs(&(name, 0))
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip())
    })
}
