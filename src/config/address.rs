//! Where a door listens: `host:port` as Go's net.Listen reads it, and the
//! clash rules that compare doors across the MQTT and operations listeners.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};

use super::listen::{Bind, DoorLine};
use super::node::Node;
use super::walk::Ctx;

/// A `host:port` address a TCP-speaking door binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddress {
    /// The host as written: empty for every interface, an IP literal (IPv6
    /// without brackets, zone kept) or a host name.
    pub host: String,
    /// The port, 0 for one the kernel chooses.
    pub port: u16,
    /// The address exactly as written in the file.
    pub written: String,
}

impl ListenAddress {
    /// The socket address to bind, when the host is empty (`[::]`, which
    /// `server::bind` opens to IPv4 and IPv6 alike, as `net.Listen` and
    /// mosquitto do) or an IP literal; `None` for a host name, which
    /// [`ListenAddress::bind_string`] resolves at bind time.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        if self.host.is_empty() {
            return Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                self.port,
            ));
        }
        let (host, zone) = match self.host.split_once('%') {
            Some((host, zone)) => (host, Some(zone)),
            None => (self.host.as_str(), None),
        };
        match host.parse::<IpAddr>().ok()? {
            // A link-local address binds only on the interface its zone names.
            IpAddr::V6(ip) => {
                let scope = zone.map_or(0, scope_id);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, self.port, 0, scope)))
            }
            ip => Some(SocketAddr::new(ip, self.port)),
        }
    }

    /// `host:port` as `std::net::ToSocketAddrs` reads it (`[::]` for an empty host).
    pub fn bind_string(&self) -> String {
        if self.host.is_empty() {
            format!("[::]:{}", self.port)
        } else if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The interface index a zone names: a number as it is, an interface name as the
/// kernel numbers it (`/sys/class/net/<name>/ifindex`), 0 for a name no interface
/// has, which the bind then refuses naming the address.
fn scope_id(zone: &str) -> u32 {
    zone.parse().ok().unwrap_or_else(|| {
        if zone.is_empty() || zone.contains('/') || zone.starts_with('.') {
            return 0;
        }
        let index = std::path::Path::new("/sys/class/net")
            .join(zone)
            .join("ifindex");
        std::fs::read_to_string(index)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// Parses `host:port` as Go's net.Listen reads it.
pub(crate) fn address(ctx: &mut Ctx, node: &Node, key: &str) -> Option<ListenAddress> {
    let Some(text) = node.scalar_text() else {
        ctx.bad(
            node,
            key,
            "is not an address; write host:port, such as 0.0.0.0:1883",
        );
        return None;
    };
    match parse_address(&text) {
        Ok(a) => Some(a),
        Err(e) => {
            ctx.bad(node, key, e);
            None
        }
    }
}

pub(crate) fn parse_address(text: &str) -> Result<ListenAddress, String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((h, p)) = rest.split_once("]:") else {
            return Err("is not host:port; write an IPv6 address in brackets with a port, such as [::1]:1883".into());
        };
        if h.contains('%')
            || h.parse::<std::net::Ipv6Addr>().is_ok()
            || h.split('%')
                .next()
                .is_some_and(|x| x.parse::<std::net::Ipv6Addr>().is_ok())
        {
            (h.to_string(), p)
        } else {
            return Err("holds something in brackets that is not an IPv6 address; write one such as [::1]:1883".into());
        }
    } else {
        let Some((h, p)) = text.rsplit_once(':') else {
            return Err(format!(
                "has no port; write host:port, such as {text}:1883, or :1883 for every interface"
            ));
        };
        if h.contains(':') {
            return Err("is an IPv6 address without brackets; write it as [addr]:port".into());
        }
        (h.to_string(), p)
    };
    let port = parse_port(port)?;
    check_host(&host)?;
    Ok(ListenAddress {
        host,
        port,
        written: text.to_string(),
    })
}

fn parse_port(p: &str) -> Result<u16, String> {
    let digits = p.strip_prefix('+').unwrap_or(p);
    if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) {
        let trimmed = digits.trim_start_matches('0');
        return match trimmed.parse::<u32>() {
            _ if trimmed.is_empty() => Ok(0),
            Ok(n) if n <= 65_535 => Ok(n as u16),
            _ => Err("has a port above 65535; write a port from 0 to 65535".into()),
        };
    }
    service_port(p).ok_or_else(|| format!("has a port {p:?} that is neither a number nor a service /etc/services knows; write a port from 0 to 65535"))
}

fn service_port(name: &str) -> Option<u16> {
    if name.is_empty() {
        return None;
    }
    let text = std::fs::read_to_string("/etc/services").ok()?;
    text.lines().find_map(|line| {
        let line = line.split('#').next()?;
        let mut words = line.split_whitespace();
        let service = words.next()?;
        let (port, proto) = words.next()?.split_once('/')?;
        let aliases: Vec<&str> = words.collect();
        ((service == name || aliases.contains(&name)) && proto == "tcp")
            .then(|| port.parse().ok())
            .flatten()
    })
}

fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Ok(());
    }
    let (ip, zone) = match host.split_once('%') {
        Some((ip, zone)) => (ip, Some(zone)),
        None => (host, None),
    };
    if let Ok(addr) = ip.parse::<IpAddr>() {
        if zone == Some("") {
            return Err(
                "has an empty zone after %; write the interface name, or drop the %".into(),
            );
        }
        if let IpAddr::V6(v6) = addr {
            if v6.is_multicast() {
                return Err("is an IPv6 multicast address, which cannot be listened on; write a unicast address".into());
            }
            if (v6.segments()[0] & 0xffc0) == 0xfe80 && zone.is_none() {
                return Err("is a link-local address without a zone; write it with %interface, such as [fe80::1%eth0]:1883".into());
            }
        }
        return Ok(());
    }
    if zone.is_some() {
        return Err(
            "has a zone on something that is not an IP address; write an IP literal or a host name"
                .into(),
        );
    }
    let valid = host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if valid {
        Ok(())
    } else {
        Err("has a host that is neither an IP address nor a host name; write one, or leave it empty for every interface".into())
    }
}

/// Two doors on one port (hosts equal or either a wildcard), or two Unix doors
/// on one path, across the MQTT and operations listeners together.
pub(crate) fn check_binds(ctx: &mut Ctx, doors: &[DoorLine]) {
    for (i, b) in doors.iter().enumerate() {
        for a in &doors[..i] {
            let clash = match (&a.bind, &b.bind) {
                (Some(Bind::Tcp(x)), Some(Bind::Tcp(y))) => {
                    x.port != 0 && x.port == y.port && hosts_overlap(&x.host, &y.host)
                }
                (Some(Bind::Unix(x)), Some(Bind::Unix(y))) => {
                    super::storage::clean(x) == super::storage::clean(y)
                }
                _ => false,
            };
            if clash {
                let (what, key) = match &b.bind {
                    Some(Bind::Tcp(addr)) => {
                        (format!("port {}", addr.port), format!("{}.address", b.path))
                    }
                    _ => ("socket path".to_string(), format!("{}.path", b.path)),
                };
                // A door written nowhere (the default :1883) has no line to name.
                let written = match a.bind_line {
                    0 => String::new(),
                    line => format!(" ({} line {line})", a.file),
                };
                let text = format!(
                    "is on the same {what} as {}{written}; give each door its own",
                    a.path
                );
                let saved = std::mem::replace(&mut ctx.file, b.file.clone());
                ctx.say(b.bind_line, &key, None, text);
                ctx.file = saved;
                break;
            }
        }
    }
}

fn hosts_overlap(a: &str, b: &str) -> bool {
    // Every spelling of "every interface": `::0`, `0::` and `::ffff:0.0.0.0` too.
    let wildcard = |h: &str| {
        h.is_empty()
            || h.parse::<IpAddr>().is_ok_and(|ip| match ip {
                IpAddr::V6(v6) => {
                    v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified())
                }
                ip => ip.is_unspecified(),
            })
    };
    if wildcard(a) || wildcard(b) {
        return true;
    }
    norm_host(a) == norm_host(b)
}

fn norm_host(h: &str) -> String {
    let (ip, zone) = match h.split_once('%') {
        Some((ip, z)) => (ip, Some(z)),
        None => (h, None),
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4.to_string();
            }
            let link_local = (v6.segments()[0] & 0xffc0) == 0xfe80;
            match (link_local, zone) {
                (true, Some(z)) => format!("{v6}%{z}"),
                _ => v6.to_string(),
            }
        }
        Ok(ip) => ip.to_string(),
        Err(_) => h.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B-183: a zoned link-local address binds on the interface its zone names: a
    /// number as it is, a name as the kernel numbers it (`lo` is 1 on Linux).
    #[test]
    fn a_zone_is_the_scope_id_bound() {
        let scope = |written: &str| match parse_address(written).unwrap().socket_addr() {
            Some(SocketAddr::V6(a)) => a.scope_id(),
            other => panic!("{other:?}"),
        };
        assert_eq!(scope("[fe80::1%3]:1883"), 3);
        assert_eq!(scope("[fe80::1%lo]:1883"), 1);
        assert_eq!(scope("[fe80::1%no-such-if]:1883"), 0);
        assert_eq!(scope("[::1]:1883"), 0);
    }

    #[test]
    fn addresses_read_as_net_listen_reads_them() {
        assert_eq!(parse_address(":1883").unwrap().port, 1883);
        assert_eq!(parse_address("0.0.0.0:032010").unwrap().port, 32010);
        assert_eq!(parse_address("0.0.0.0:+32010").unwrap().port, 32010);
        assert_eq!(parse_address("[::1]:1883").unwrap().host, "::1");
        assert!(parse_address("0.0.0.0:70000").is_err());
        assert!(parse_address("::1:1883").is_err());
        assert!(parse_address("[ff02::1]:1883").is_err());
        assert!(parse_address("[fe80::1]:1883").is_err());
        assert!(parse_address("[fe80::1%eth0]:1883").is_ok());
        assert!(parse_address("bad_host:1883").is_err());
        assert_eq!(
            parse_address(":1883").unwrap().socket_addr(),
            Some("[::]:1883".parse().unwrap())
        );
    }
}
