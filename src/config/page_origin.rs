//! A page origin (`scheme://host[:port]`), as a ws door's `allowed_origins` lists it
//! and a browser's `Origin` header sends it: one parser for both, so an entry the
//! configuration accepts is one the door compares (B-166).

/// A page origin as a browser sends it: `scheme://host[:port]`, compared with the
/// default port made explicit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageOrigin {
    scheme: String,
    host: String,
    port: u16,
}

impl PageOrigin {
    /// Reads `scheme://host[:port]`; `None` for anything else (`null` included).
    pub fn parse(text: &str) -> Option<PageOrigin> {
        let (scheme, rest) = text.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" | "ws" => 80,
            "https" | "wss" => 443,
            _ => return None,
        };
        let (host, port) = split_host_port(rest, default_port)?;
        Some(PageOrigin { scheme, host, port })
    }

    fn secure(&self) -> bool {
        matches!(self.scheme.as_str(), "https" | "wss")
    }

    /// Whether this is the origin of a page served from `host:port`, over TLS or not.
    pub fn is_of(&self, tls: bool, host: &str, port: u16) -> bool {
        self.secure() == tls && self.host == host && self.port == port
    }
}

/// `host[:port]` or `[v6][:port]`, lower-cased, the port defaulted.
pub fn split_host_port(text: &str, default_port: u16) -> Option<(String, u16)> {
    if text.is_empty() || text.contains(['/', '?', '#', '@']) {
        return None;
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after.strip_prefix(':') {
            Some(port) => (format!("[{host}]"), port.parse().ok()?),
            None if after.is_empty() => (format!("[{host}]"), default_port),
            None => return None,
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().ok()?),
            None => (text.to_string(), default_port),
        }
    };
    (!host.is_empty()).then(|| (host.to_ascii_lowercase(), port))
}
