//! Network namespaces as "hosts" for `tandem bench transport --across-netns`: the checks
//! before entering one (the name, that it exists, that we are root), its peer's IPv4 address
//! (`ip -n NS`), and this side's address on the route to it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tandem_cli::error::CliError;

/// Where `ip netns add` puts its namespaces.
pub(super) const NETNS_DIR: &str = "/run/netns";
/// The peer's interface on the bridge.
pub(super) const PEER_IFACE: &str = "eth0";
/// How to make the namespaces.
pub(super) const HELP: &str =
    "run scripts/cluster/netns-up.sh as root to make tnd-n1 and tnd-n2, and this bench as root";

/// The namespace file, after checking the name, that it exists and that we are root.
pub(super) fn preflight(netns: &str, dir: &Path, euid: u32) -> Result<PathBuf, CliError> {
    if netns.is_empty() || netns.contains('/') || netns == "." || netns == ".." {
        return Err(CliError::usage(format!(
            "--across-netns {netns:?} is not a network namespace name (as `ip netns list` \
             prints them, e.g. tnd-n2)"
        )));
    }
    let path = dir.join(netns);
    if !path.exists() {
        return Err(CliError::usage(format!(
            "network namespace {netns} does not exist (no {})",
            path.display()
        ))
        .with_help(HELP));
    }
    if euid != 0 {
        return Err(CliError::usage(format!(
            "entering network namespace {netns} needs root (nsenter --net); this process runs \
             as uid {euid}"
        ))
        .with_help(HELP));
    }
    Ok(path)
}

/// This process's effective uid, from `/proc/self/status`.
pub(super) fn effective_uid() -> Result<u32, CliError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(CliError::io("reading /proc/self/status"))?;
    parse_euid(&status)
        .ok_or_else(|| CliError::failed("/proc/self/status has no readable Uid line"))
}

/// The effective uid from a `/proc/PID/status` text (`Uid:` real, effective, saved, fs).
fn parse_euid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The IPv4 address of the namespace's [`PEER_IFACE`], from `ip -n NS -4 -o addr show`.
pub(super) fn namespace_ipv4(netns: &str) -> Result<Ipv4Addr, CliError> {
    let out = Command::new("ip")
        .args(["-n", netns, "-4", "-o", "addr", "show", "dev", PEER_IFACE])
        .stdin(Stdio::null())
        .output()
        .map_err(CliError::io(format!(
            "running `ip -n {netns} -4 -o addr show dev {PEER_IFACE}` (is iproute2 installed?)"
        )))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match parse_ipv4(&text) {
        Some(ip) if out.status.success() => Ok(ip),
        _ => Err(CliError::usage(format!(
            "network namespace {netns} has no IPv4 address on {PEER_IFACE} (`ip -n {netns} -4 -o \
             addr show dev {PEER_IFACE}`: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
        .with_help(HELP)),
    }
}

/// The first `inet A.B.C.D/N` address of `ip -4 -o addr show` output.
fn parse_ipv4(text: &str) -> Option<Ipv4Addr> {
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "inet" {
            let addr = words.next()?;
            return addr.split('/').next()?.parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_parsed_from_ip_addr_output() {
        let out = "2: eth0    inet 10.77.1.2/24 scope global eth0\\       valid_lft forever \
                   preferred_lft forever\n";
        assert_eq!(parse_ipv4(out), Some(Ipv4Addr::new(10, 77, 1, 2)));
        assert_eq!(parse_ipv4(""), None);
        assert_eq!(parse_ipv4("2: eth0 inet6 fe80::1/64 scope link"), None);
        assert_eq!(parse_ipv4("inet nonsense/24"), None);
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        let status = "Name:\ttandem\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(parse_euid(status), Some(0));
        assert_eq!(parse_euid("Name:\ttandem\n"), None);
    }

    #[test]
    fn missing_namespace_and_non_root_are_one_usage_line_with_the_fix() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let Err(e) = preflight("tnd-n9", dir.path(), 0) else {
            panic!("a missing namespace passed")
        };
        assert_eq!(e.exit_code(), 2);
        let lines = e.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("tnd-n9 does not exist"), "{lines:?}");
        assert!(
            lines[0].contains("scripts/cluster/netns-up.sh"),
            "{lines:?}"
        );

        std::fs::write(dir.path().join("tnd-n2"), "").expect("a stand-in namespace file");
        let Err(e) = preflight("tnd-n2", dir.path(), 1000) else {
            panic!("a non-root uid passed")
        };
        assert_eq!(e.exit_code(), 2);
        assert!(e.lines()[0].contains("needs root"), "{:?}", e.lines());
        assert!(e.lines()[0].contains("netns-up.sh"), "{:?}", e.lines());

        assert_eq!(
            preflight("tnd-n2", dir.path(), 0).expect("root and the namespace pass"),
            dir.path().join("tnd-n2")
        );
        assert!(preflight("../etc", dir.path(), 0).is_err());
        assert!(preflight("", dir.path(), 0).is_err());
    }
}
