//! Protected mode: the cluster's trust boundary, enforced where a node starts.
//!
//! After bootstrap (which is authenticated with the cluster secret) nothing on the wire is
//! authenticated or encrypted: UCX has no such layer, and on RDMA the remote keys are the only
//! guard, sent in clear to every peer. The front ends speak memcached and Redis in clear, the
//! metrics are plain HTTP, and so is etcd unless reached over TLS. So every host of a cluster,
//! its etcd and its clients must share a private network, and a node refuses to start (as
//! Redis's protected mode refuses outside connections) when it would listen on, or talk to
//! etcd at, an address that is neither loopback, private nor link-local (etcd over `https://`
//! with a client certificate excepted: TLS guards it), unless `cluster.protected_mode = false`
//! says that the operator has put another boundary around it (`docs/cluster.md`, "Trust
//! boundary").
//!
//! Invariant **TB1**: with protected mode on, every socket a node listens on and every fabric
//! interface UCX may use carries only addresses [`Reach::is_inside`] accepts. The check runs
//! before the node binds or registers anything, so a refused node has exposed nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

use crate::config::{ClusterConfig, Transport};

/// Where an address can be reached from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// This host only (127.0.0.0/8, ::1).
    Loopback,
    /// A private network: RFC 1918 (10/8, 172.16/12, 192.168/16) and IPv6 unique local
    /// (fc00::/7). Not RFC 6598's 100.64/10: a provider shares it among its customers.
    Private,
    /// One link (169.254/16, fe80::/10): never routed.
    LinkLocal,
    /// Every interface of the host (0.0.0.0, ::), whatever they face.
    Unspecified,
    /// Anything else: possibly the Internet.
    Public,
}

impl Reach {
    pub fn of(ip: IpAddr) -> Reach {
        match ip {
            IpAddr::V4(v4) => Self::of_v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::of_v4(v4),
                None => Self::of_v6(v6),
            },
        }
    }

    fn of_v4(ip: Ipv4Addr) -> Reach {
        if ip.is_loopback() {
            Reach::Loopback
        } else if ip.is_unspecified() {
            Reach::Unspecified
        } else if ip.is_private() {
            Reach::Private
        } else if ip.is_link_local() {
            Reach::LinkLocal
        } else {
            Reach::Public
        }
    }

    fn of_v6(ip: Ipv6Addr) -> Reach {
        let first = ip.segments()[0];
        if ip.is_loopback() {
            Reach::Loopback
        } else if ip.is_unspecified() {
            Reach::Unspecified
        } else if first & 0xfe00 == 0xfc00 {
            Reach::Private
        } else if first & 0xffc0 == 0xfe80 {
            Reach::LinkLocal
        } else {
            Reach::Public
        }
    }

    /// Whether protected mode lets a node expose itself there.
    pub fn is_inside(self) -> bool {
        matches!(self, Reach::Loopback | Reach::Private | Reach::LinkLocal)
    }

    fn describe(self) -> &'static str {
        match self {
            Reach::Unspecified => "every interface of the host",
            Reach::Public => "neither loopback, private nor link-local",
            _ => "inside",
        }
    }
}

/// What protected mode refused, naming the service, the address and the way out.
#[derive(Debug, thiserror::Error)]
pub enum Exposed {
    #[error(
        "protected mode: node {node} would expose its {what} on {addr}, which is {why}; Nessie's \
         traffic after bootstrap is neither authenticated nor encrypted, so cluster hosts and \
         their clients must share a private network. {fix}, or set cluster.protected_mode = \
         false if another boundary (a firewall, a VPN) guards it (docs/cluster.md, \"Trust \
         boundary\")"
    )]
    Address {
        node: u16,
        what: String,
        addr: IpAddr,
        why: &'static str,
        fix: &'static str,
    },
    #[error("protected mode: cannot list this host's network interfaces: {0}")]
    Interfaces(#[source] std::io::Error),
    #[error(
        "protected mode: cluster.net_devices names {0:?}, which selects no network interface of \
         this host that is up (name an interface, a glob such as \"eth*\", or an RDMA port \
         DEVICE:PORT)"
    )]
    NoSuchDevice(String),
    #[error("protected mode: cannot resolve etcd's host {host:?}: {err}")]
    Resolve {
        host: String,
        #[source]
        err: std::io::Error,
    },
}

/// Refuse to start node `id` if, with protected mode on, anything it would expose lies outside
/// the private network (TB1). Reads the host's interfaces (for the fabric) and resolves etcd's
/// host name.
pub fn check(cfg: &ClusterConfig, id: u16) -> Result<(), Exposed> {
    if !cfg.cluster.protected_mode {
        return Ok(());
    }
    let refuse = |what: String, addr: IpAddr, fix: &'static str| -> Result<(), Exposed> {
        let reach = Reach::of(addr);
        if reach.is_inside() {
            return Ok(());
        }
        Err(Exposed::Address {
            node: id,
            what,
            addr,
            why: reach.describe(),
            fix,
        })
    };
    if let Some(n) = cfg.node.iter().find(|n| n.id == id) {
        refuse(
            "bootstrap server".into(),
            n.bootstrap.ip(),
            "Give the node a private bootstrap address in its [[node]] entry",
        )?;
    }
    if let Some(f) = &cfg.frontends {
        if let Ok(ip) = f.bind.parse::<IpAddr>() {
            for (what, port) in [
                ("memcached front end", f.memcached_port),
                ("Redis front end", f.resp_port),
                ("metrics", f.metrics_port),
            ] {
                if port.is_some() {
                    refuse(
                        what.into(),
                        ip,
                        "Set [frontends] bind (nessie up --bind) to a loopback or private address",
                    )?;
                }
            }
        }
    }
    for (dev, ip) in fabric_interfaces(cfg)? {
        refuse(
            format!("fabric (UCX over interface {dev})"),
            ip,
            "Set cluster.net_devices to the interfaces of the private network",
        )?;
    }
    // etcd over TLS with a client certificate is encrypted, and both ends authenticated:
    // it may be reached at any address (the fabric's own ports are checked above).
    let guarded = |m: &crate::config::MembershipSection| {
        m.etcd.starts_with("https://") && m.etcd_cert.is_some()
    };
    if let Some(m) = cfg.membership.as_ref().filter(|m| !guarded(m)) {
        for ip in etcd_addresses(&m.etcd)? {
            refuse(
                format!("membership traffic (etcd at {})", m.etcd),
                ip,
                "Run etcd on a loopback or private address",
            )?;
        }
    }
    Ok(())
}

/// The addresses of the network interfaces UCX may use for this cluster's fabric: none over
/// shared memory; otherwise those `net_devices` selects, read as UCX reads `UCX_NET_DEVICES`
/// (a comma-separated allow-list of names or glob patterns, `all`, or a list after `^` to
/// exclude), every interface when unset. An RDMA port (`mlx5_0:1`) counts as the network
/// interfaces its device carries (RoCE runs over their addresses). Fails closed: an entry
/// that selects nothing on this host is refused, since UCX would pick what it finds.
fn fabric_interfaces(cfg: &ClusterConfig) -> Result<Vec<(String, IpAddr)>, Exposed> {
    if cfg.cluster.transport == Transport::Shm {
        return Ok(vec![]);
    }
    let all = host_interfaces().map_err(Exposed::Interfaces)?;
    let spec = cfg.cluster.net_devices.as_deref().unwrap_or("all").trim();
    if spec.is_empty() || spec == "all" {
        return Ok(all);
    }
    let (negate, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let entries: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    // A label (`eth0:pub`, as getifaddrs names an IPv4 alias) belongs to its interface.
    let base = |name: &str| name.split(':').next().unwrap_or(name).to_string();
    let mut chosen: Vec<String> = Vec::new();
    for e in &entries {
        if let Some(nets) = rdma_netdevs(e) {
            chosen.extend(nets);
            continue;
        }
        let hits: Vec<String> = all
            .iter()
            .map(|(n, _)| base(n))
            .filter(|n| glob(e, n))
            .collect();
        if hits.is_empty() && !negate {
            return Err(Exposed::NoSuchDevice(e.to_string()));
        }
        chosen.extend(hits);
    }
    Ok(all
        .into_iter()
        .filter(|(n, _)| chosen.contains(&base(n)) != negate)
        .collect())
}

/// Whether interface `name` matches UCX device pattern `pattern` (fnmatch, as UCX does).
fn glob(pattern: &str, name: &str) -> bool {
    let (Ok(p), Ok(n)) = (
        std::ffi::CString::new(pattern),
        std::ffi::CString::new(name),
    ) else {
        return false;
    };
    // SAFETY: both are NUL-terminated strings that outlive the call.
    unsafe { libc::fnmatch(p.as_ptr(), n.as_ptr(), 0) == 0 }
}

/// The network interfaces an RDMA port `DEVICE:PORT` carries (`None` if `entry` names no
/// RDMA device of this host).
fn rdma_netdevs(entry: &str) -> Option<Vec<String>> {
    let (dev, _port) = entry.split_once(':')?;
    if dev.is_empty() || dev.contains('/') || dev.starts_with('.') {
        return None;
    }
    let dir = std::path::Path::new("/sys/class/infiniband").join(dev);
    if !dir.exists() {
        return None;
    }
    let nets = std::fs::read_dir(dir.join("device/net"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    Some(nets)
}

/// Every IPv4 and IPv6 address of every interface that is up, with the interface's name.
pub fn host_interfaces() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null, and its family says which sockaddr it is.
        let ip = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sa.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        out.push((name, ip));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The addresses etcd's URL (`http(s)://HOST:PORT`, already validated) names.
fn etcd_addresses(url: &str) -> Result<Vec<IpAddr>, Exposed> {
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Ok(vec![]);
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let port: u16 = port.parse().unwrap_or(0);
    let resolved = (host, port)
        .to_socket_addrs()
        .map_err(|err| Exposed::Resolve {
            host: host.to_string(),
            err,
        })?;
    Ok(resolved.map(|a| a.ip()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(s: &str) -> Reach {
        Reach::of(s.parse().unwrap())
    }

    #[test]
    fn addresses_are_classified_by_where_they_reach() {
        for s in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(reach(s), Reach::Loopback, "{s}");
        }
        for s in [
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "fd00::2",
            "fc12::1",
        ] {
            assert_eq!(reach(s), Reach::Private, "{s}");
        }
        for s in ["169.254.1.1", "fe80::1"] {
            assert_eq!(reach(s), Reach::LinkLocal, "{s}");
        }
        for s in ["0.0.0.0", "::"] {
            assert_eq!(reach(s), Reach::Unspecified, "{s}");
        }
        // Neighbours of the private ranges are outside them.
        for s in [
            "8.8.8.8",
            "172.32.0.1",
            "172.15.255.255",
            "192.169.0.1",
            "100.64.0.1",
            "100.128.0.1",
            "192.0.2.2",
            "203.0.113.7",
            "2001:db8::1",
            "fe00::1",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(reach(s), Reach::Public, "{s}");
            assert!(!reach(s).is_inside());
        }
    }

    fn cfg() -> ClusterConfig {
        ClusterConfig::local(
            "exposure",
            2,
            Transport::Shm,
            7400,
            nessie_store::Geometry::default(),
        )
    }

    #[test]
    fn a_public_bootstrap_address_is_refused_unless_protected_mode_is_off() {
        let mut c = cfg();
        check(&c, 0).unwrap();
        c.node[1].bootstrap = "203.0.113.7:7401".parse().unwrap();
        check(&c, 0).unwrap(); // node 0 exposes nothing outside
        let err = check(&c, 1).unwrap_err().to_string();
        assert!(
            err.contains("node 1 would expose its bootstrap server on 203.0.113.7"),
            "{err}"
        );
        assert!(err.contains("protected_mode = false"), "{err}");
        c.cluster.protected_mode = false;
        check(&c, 1).unwrap();
    }

    #[test]
    fn front_ends_on_every_interface_are_refused() {
        let mut c = cfg();
        c.frontends = Some(crate::config::FrontendsSection {
            memcached_port: None,
            resp_port: Some(16_379),
            resp_password: None,
            metrics_port: None,
            bind: "0.0.0.0".into(),
            max_connections: 16,
            threads: 1,
            inflight: 1,
        });
        let err = check(&c, 0).unwrap_err().to_string();
        assert!(
            err.contains("Redis front end on 0.0.0.0, which is every interface"),
            "{err}"
        );
        c.frontends.as_mut().unwrap().bind = "10.1.2.3".into();
        check(&c, 0).unwrap();
    }

    #[test]
    fn etcd_hosts_are_resolved_and_checked() {
        assert_eq!(
            etcd_addresses("http://127.0.0.1:2379").unwrap(),
            vec![IpAddr::from([127, 0, 0, 1])]
        );
        assert_eq!(
            etcd_addresses("http://[::1]:2379/").unwrap(),
            vec![IpAddr::V6(Ipv6Addr::LOCALHOST)]
        );
        assert_eq!(
            etcd_addresses("https://10.1.2.3:2379").unwrap(),
            vec![IpAddr::from([10, 1, 2, 3])]
        );
        assert!(etcd_addresses("http://localhost:2379")
            .unwrap()
            .iter()
            .all(|ip| ip.is_loopback()));
        let mut c = cfg();
        c.membership = Some(crate::config::MembershipSection {
            etcd: "http://198.51.100.4:2379".into(),
            lease_ttl_s: 3,
            replace_after_s: 60,
            rebalance: true,
            etcd_user: None,
            etcd_password: None,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
        });
        let err = check(&c, 0).unwrap_err().to_string();
        assert!(err.contains("etcd at http://198.51.100.4:2379"), "{err}");
        // Over TLS with a client certificate, etcd may be public; with TLS alone it may not.
        let m = c.membership.as_mut().unwrap();
        m.etcd = "https://198.51.100.4:2379".into();
        m.etcd_ca = Some("/ca.pem".into());
        let err = check(&c, 0).unwrap_err().to_string();
        assert!(err.contains("etcd at https://198.51.100.4:2379"), "{err}");
        let m = c.membership.as_mut().unwrap();
        m.etcd_cert = Some("/c.pem".into());
        m.etcd_key = Some("/c.key".into());
        check(&c, 0).unwrap();
    }

    #[test]
    fn net_devices_select_interfaces_as_ucx_reads_them() {
        let mut c = cfg();
        c.cluster.transport = Transport::Tcp;
        let names = |c: &ClusterConfig| -> Vec<String> {
            fabric_interfaces(c)
                .unwrap()
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        c.cluster.net_devices = Some("lo".into());
        assert!(names(&c).iter().all(|n| n == "lo") && !names(&c).is_empty());
        c.cluster.net_devices = Some(" l* ".into());
        assert!(names(&c).contains(&"lo".to_string()), "a glob selects");
        c.cluster.net_devices = Some("^lo".into());
        assert!(!names(&c).contains(&"lo".to_string()), "^ excludes");
        let everything = {
            c.cluster.net_devices = None;
            names(&c)
        };
        c.cluster.net_devices = Some("all".into());
        assert_eq!(names(&c), everything);
        c.cluster.net_devices = Some("lo,nonesuch0".into());
        let err = fabric_interfaces(&c).unwrap_err().to_string();
        assert!(
            err.contains("\"nonesuch0\", which selects no network interface"),
            "{err}"
        );
        assert!(glob("eth*", "eth0") && !glob("eth*", "veth0") && glob("lo", "lo"));
    }

    #[test]
    fn the_host_has_a_loopback_interface() {
        let all = host_interfaces().unwrap();
        assert!(all.iter().any(|(_, ip)| ip.is_loopback()), "{all:?}");
    }
}
