//! MQTT over WebSocket (a `ws` door): the HTTP/1.1 upgrade with its origin checks
//! (RFC 0002 "ws listener: same_origin and allowed_origins", B-160..B-168), and a
//! byte stream over binary messages so the connection code is the same as on TCP.
//!
//! The upgrade is read here (httparse, a bounded head, one deadline) so that every
//! refusal gets its HTTP answer and releases its slot first; the framing is
//! async-tungstenite's, configured for a gateway: a small read buffer, messages
//! bounded by `max_message_size`, nothing buffered for writing beyond what the
//! connection itself bounds.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use async_tungstenite::WebSocketStream;
use async_tungstenite::tungstenite::handshake::derive_accept_key;
use async_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use async_tungstenite::tungstenite::{Bytes, Message};
use futures_lite::{Stream, future};
use futures_sink::Sink;
use smol::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::slots::Slot;
use super::socket::Socket;
use crate::config::page_origin::{PageOrigin, split_host_port};

/// Subprotocols a client may ask for, best first: `mqtt` (MQTT 5 and 3.1.1) and the
/// name older 3.1 clients use.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Bytes a WebSocket message may carry beyond one MQTT packet's worth (a client may
/// put a packet and the start of the next in one message).
const MESSAGE_SLACK: usize = 64 * 1024;

/// The most bytes one written message carries; within the write buffer bound of
/// `MESSAGE_SLACK` beyond `max_message_size`.
const WRITE_CHUNK: usize = MESSAGE_SLACK;

/// Messages that bring no bytes (pings, empty binaries) read in one poll before the
/// connection lets other tasks run.
const EMPTY_RUN: usize = 16;

/// The least time between two warnings of refused upgrades: a browser page retrying
/// from a foreign origin must not fill the log (B-167).
const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

thread_local! {
    /// When a refused upgrade was last logged, and how many went unlogged since.
    static REFUSALS_LOGGED: std::cell::Cell<(Option<Instant>, u64)> =
        const { std::cell::Cell::new((None, 0)) };
}

/// Logs a refused upgrade at `warn`, at most once per [`REFUSAL_LOG_EVERY`], saying
/// how many were refused unlogged since the last line (B-021, B-167).
fn warn_refused(line: impl FnOnce() -> String) {
    let now = Instant::now();
    let (last, unlogged) = REFUSALS_LOGGED.get();
    if last.is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_EVERY) {
        REFUSALS_LOGGED.set((last, unlogged + 1));
        return;
    }
    let more = match unlogged {
        0 => String::new(),
        n => format!(" ({n} more refused since the last such line)"),
    };
    log::warn!("{}{more}", line());
    REFUSALS_LOGGED.set((Some(now), 0));
}

/// Which pages a ws door admits; re-read on SIGUSR1 (B-168).
#[derive(Debug)]
pub struct OriginPolicy {
    /// The door's name as the configuration gives it (`name:`, or `ws`).
    name: String,
    /// The door's name for log lines (`broker.mqtt.listen.ws[name]`).
    pub door: String,
    /// Whether the door carries TLS: a same-origin page is then `https`.
    tls: bool,
    rules: RefCell<OriginRules>,
}

#[derive(Debug, Clone)]
struct OriginRules {
    same_origin: bool,
    allowed: Vec<PageOrigin>,
}

impl OriginPolicy {
    /// The policy of the door `name` (`door` in log lines).
    pub fn new(
        name: &str,
        door: String,
        tls: bool,
        same_origin: bool,
        allowed_origins: &[String],
    ) -> OriginPolicy {
        OriginPolicy {
            name: name.to_string(),
            door,
            tls,
            rules: RefCell::new(OriginRules::new(same_origin, allowed_origins)),
        }
    }

    /// The door's name in the configuration.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Replaces the rules with those of a re-read configuration.
    pub fn replace(&self, same_origin: bool, allowed_origins: &[String]) {
        *self.rules.borrow_mut() = OriginRules::new(same_origin, allowed_origins);
    }

    /// Whether a request with these `Origin` and `Host` headers is admitted; the
    /// reason when it is not.
    fn check(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), String> {
        // A request carrying no Origin is no browser page: admitted (B-164).
        let Some(origin_text) = origin else {
            return Ok(());
        };
        let rules = self.rules.borrow();
        let origin = PageOrigin::parse(origin_text);
        if rules.same_origin {
            let scheme_port = if self.tls { 443 } else { 80 };
            let same = match (&origin, host.and_then(|h| split_host_port(h, scheme_port))) {
                (Some(o), Some((host, port))) => o.is_of(self.tls, &host, port),
                _ => false,
            };
            if !same {
                return Err(format!(
                    "origin {origin_text:?} is not this door's own (same_origin)"
                ));
            }
        }
        if !rules.allowed.is_empty() && !origin.is_some_and(|o| rules.allowed.contains(&o)) {
            return Err(format!("origin {origin_text:?} is not in allowed_origins"));
        }
        Ok(())
    }
}

impl OriginRules {
    fn new(same_origin: bool, allowed_origins: &[String]) -> OriginRules {
        OriginRules {
            same_origin,
            // The configuration refuses an entry that does not parse (B-166), so
            // none is dropped here.
            allowed: allowed_origins
                .iter()
                .filter_map(|o| PageOrigin::parse(o))
                .collect(),
        }
    }
}

/// Why an upgrade request is answered without upgrading.
struct Refused {
    status: u16,
    reason: &'static str,
    why: String,
    /// A header line the answer carries besides the usual ones.
    header: &'static str,
}

impl Refused {
    fn new(status: u16, reason: &'static str, why: impl Into<String>) -> Refused {
        Refused {
            status,
            reason,
            why: why.into(),
            header: "",
        }
    }
}

/// Upgrades `stream` to WebSocket by `deadline`. A request refused (not an upgrade,
/// not HTTP/1.1, an origin not admitted) gives its `slot` back before the HTTP answer
/// is written (B-061); `None` then, and on any failure.
pub async fn upgrade(
    mut stream: Socket,
    slot: Slot,
    policy: &OriginPolicy,
    max_message_size: usize,
    deadline: Instant,
    peer: &str,
) -> Option<(Socket, Slot)> {
    let read = future::or(super::http::read_request_head(&mut stream), async {
        smol::Timer::at(deadline).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no upgrade request within connect_timeout",
        ))
    });
    let (head, rest) = match read.await {
        Ok(read) => read,
        Err(e) => {
            log::debug!("{peer}: WebSocket upgrade on {}: {e}", policy.door);
            return None;
        }
    };
    let answer = match accept(&head, policy) {
        Ok(answer) => answer,
        Err(refused) => {
            warn_refused(|| {
                format!(
                    "{peer}: WebSocket upgrade on {} refused {}: {}",
                    policy.door, refused.status, refused.why
                )
            });
            drop(slot);
            let body = format!("{}\n", refused.why);
            let answer = format!(
                "HTTP/1.1 {} {}\r\n{}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                refused.status,
                refused.reason,
                refused.header,
                body.len()
            );
            write_by(&mut stream, answer.as_bytes(), deadline).await;
            stream.close_write();
            return None;
        }
    };
    if !write_by(&mut stream, answer.as_bytes(), deadline).await {
        return None;
    }
    let config = bounded_config(max_message_size);
    let ws = WebSocketStream::from_partially_read(stream, rest, Role::Server, Some(config)).await;
    Some((
        Socket::Ws(Box::new(WsSocket {
            ws,
            unread: Bytes::new(),
        })),
        slot,
    ))
}

/// Writes `bytes` by `deadline`; whether they all went.
async fn write_by(stream: &mut Socket, bytes: &[u8], deadline: Instant) -> bool {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    let written = future::or(async { Some(write.await) }, async {
        smol::Timer::at(deadline).await;
        None
    })
    .await;
    matches!(written, Some(Ok(())))
}

/// The `101 Switching Protocols` answer to an admissible upgrade request.
fn accept(head: &[u8], policy: &OriginPolicy) -> Result<String, Refused> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(Refused::new(400, "Bad Request", "not an HTTP request")),
    }
    if request.version != Some(1) {
        return Err(Refused::new(
            505,
            "HTTP Version Not Supported",
            "WebSocket here is HTTP/1.1 only",
        ));
    }
    if request.method != Some("GET") {
        return Err(Refused::new(
            405,
            "Method Not Allowed",
            "a WebSocket upgrade is a GET",
        ));
    }
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    let has_token = |name: &str, token: &str| {
        header(name).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Err(Refused::new(
            400,
            "Bad Request",
            "this is an MQTT over WebSocket door: send a WebSocket upgrade",
        ));
    }
    if header("sec-websocket-version") != Some("13") {
        return Err(Refused {
            header: "Sec-WebSocket-Version: 13\r\n",
            ..Refused::new(426, "Upgrade Required", "WebSocket version 13 only")
        });
    }
    let Some(key) = header("sec-websocket-key") else {
        return Err(Refused::new(400, "Bad Request", "no Sec-WebSocket-Key"));
    };
    if let Err(why) = policy.check(header("origin"), header("host")) {
        return Err(Refused::new(403, "Forbidden", why));
    }
    let offered = header("sec-websocket-protocol").unwrap_or("");
    let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
    let protocol = SUBPROTOCOLS
        .iter()
        .find(|p| offered.contains(p))
        .map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n"))
        .unwrap_or_default();
    Ok(format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n{protocol}\r\n",
        derive_accept_key(key.trim().as_bytes())
    ))
}

/// An upgraded connection as a byte stream: binary messages in, one binary message
/// out per write. MQTT over WebSocket is binary only (MQTT-6.0.0-1): a text message
/// ends the connection.
#[derive(Debug)]
pub struct WsSocket {
    ws: WebSocketStream<Socket>,
    /// What is left of the last message read.
    unread: Bytes,
}

/// The WebSocket configuration every ws connection reads and writes with: one
/// message at most `max_message_size` and the slack of a frame's header.
fn bounded_config(max_message_size: usize) -> WebSocketConfig {
    let bound = max_message_size.saturating_add(MESSAGE_SLACK);
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .max_write_buffer_size(bound)
        .max_message_size(Some(bound))
        .max_frame_size(Some(bound))
}

/// Opens MQTT over WebSocket as a client, on `stream` (TCP or TLS, already
/// connected): the upgrade to `url` asking for the `mqtt` subprotocol, which the
/// server must answer with. For a bridge dialling a ws:// or wss:// peer.
///
/// # Errors
/// The upgrade failed or the server did not agree to `mqtt`, said for the log.
pub async fn dial(url: &str, stream: Socket, max_message_size: usize) -> Result<Socket, String> {
    use async_tungstenite::tungstenite::client::IntoClientRequest;
    use async_tungstenite::tungstenite::http::HeaderValue;
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("{url} is not a WebSocket address: {e}"))?;
    request
        .headers_mut()
        .insert("sec-websocket-protocol", HeaderValue::from_static("mqtt"));
    let config = bounded_config(max_message_size);
    let (ws, response) = async_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|e| format!("WebSocket upgrade failed: {e}"))?;
    if response
        .headers()
        .get("sec-websocket-protocol")
        .is_none_or(|p| p != "mqtt")
    {
        return Err("the WebSocket upgrade was not answered with the mqtt subprotocol".into());
    }
    Ok(Socket::Ws(Box::new(WsSocket {
        ws,
        unread: Bytes::new(),
    })))
}

impl WsSocket {
    /// The socket under the WebSocket.
    pub fn inner(&mut self) -> &mut Socket {
        self.ws.get_mut()
    }

    /// Whether bytes of a message already read wait to be taken.
    pub fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }
}

fn ws_error(e: async_tungstenite::tungstenite::Error) -> io::Error {
    match e {
        async_tungstenite::tungstenite::Error::Io(e) => e,
        // A message or frame past the bound holds a packet past max_message_size: the
        // connection answers it as it answers one over TCP (0x95).
        async_tungstenite::tungstenite::Error::Capacity(e) => {
            io::Error::new(io::ErrorKind::FileTooLarge, e.to_string())
        }
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

impl AsyncRead for WsSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut empty = 0;
        loop {
            if empty == EMPTY_RUN {
                // Pings and empty messages bring no bytes: a peer streaming them must
                // not keep the thread (and the connect deadline) from anything else.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if !this.unread.is_empty() {
                let n = this.unread.len().min(buf.len());
                buf[..n].copy_from_slice(&this.unread.split_to(n));
                return Poll::Ready(Ok(n));
            }
            match Pin::new(&mut this.ws).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) | Poll::Ready(Some(Ok(Message::Close(_)))) => {
                    return Poll::Ready(Ok(0));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(ws_error(e))),
                Poll::Ready(Some(Ok(Message::Binary(data)))) => {
                    empty += usize::from(data.is_empty());
                    this.unread = data;
                }
                Poll::Ready(Some(Ok(Message::Text(_)))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a text WebSocket message: MQTT travels in binary messages",
                    )));
                }
                // Pings are answered by tungstenite itself.
                Poll::Ready(Some(Ok(_))) => empty += 1,
            }
        }
    }
}

impl AsyncWrite for WsSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut ws = Pin::new(&mut self.get_mut().ws);
        match ws.as_mut().poll_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(ws_error(e))),
            Poll::Ready(Ok(())) => {}
        }
        // One message of at most WRITE_CHUNK: a backlog of small packets written at
        // once would otherwise be one message past tungstenite's write buffer bound,
        // which ends the connection. MQTT packets may span messages.
        let part = &buf[..buf.len().min(WRITE_CHUNK)];
        ws.start_send(Message::binary(part.to_vec()))
            .map_err(ws_error)?;
        Poll::Ready(Ok(part.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_flush(cx)
            .map_err(ws_error)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_close(cx)
            .map_err(ws_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_with_the_default_port_explicit() {
        let a = PageOrigin::parse("https://Gateway.example").expect("parses");
        assert_eq!(Some(a), PageOrigin::parse("https://gateway.example:443"));
        assert_ne!(
            PageOrigin::parse("https://gateway.example:8443"),
            PageOrigin::parse("https://gateway.example")
        );
        assert_eq!(PageOrigin::parse("null"), None);
        assert_eq!(PageOrigin::parse("https://a.example/path"), None);
    }

    #[test]
    fn same_origin_wants_the_host_the_browser_connected_to_and_the_door_scheme() {
        let plain = OriginPolicy::new("ws", "ws".into(), false, true, &[]);
        assert!(plain.check(None, Some("gw:9001")).is_ok(), "B-164");
        assert!(plain.check(Some("http://gw:9001"), Some("gw:9001")).is_ok());
        assert!(
            plain
                .check(Some("http://gw:9002"), Some("gw:9001"))
                .is_err()
        );
        assert!(
            plain
                .check(Some("https://gw:9001"), Some("gw:9001"))
                .is_err()
        );
        assert!(plain.check(Some("http://gw"), Some("gw:80")).is_ok());
        assert!(plain.check(Some("null"), Some("gw:9001")).is_err());
        let tls = OriginPolicy::new("ws", "ws".into(), true, true, &[]);
        assert!(tls.check(Some("https://gw:9001"), Some("gw:9001")).is_ok());
        assert!(tls.check(Some("http://gw:9001"), Some("gw:9001")).is_err());
    }

    #[test]
    fn allowed_origins_and_same_origin_must_both_pass() {
        let both = OriginPolicy::new(
            "ws",
            "ws".into(),
            false,
            true,
            &["http://gw:9001".to_string(), "http://other:1".to_string()],
        );
        assert!(both.check(Some("http://gw:9001"), Some("gw:9001")).is_ok());
        assert!(both.check(Some("http://other:1"), Some("gw:9001")).is_err());
        let list_only = OriginPolicy::new(
            "ws",
            "ws".into(),
            false,
            false,
            &["http://other:1".to_string()],
        );
        assert!(
            list_only
                .check(Some("http://other:1"), Some("gw:9001"))
                .is_ok()
        );
        assert!(
            list_only
                .check(Some("http://gw:9001"), Some("gw:9001"))
                .is_err()
        );
        let open = OriginPolicy::new("ws", "ws".into(), false, false, &[]);
        assert!(open.check(Some("null"), Some("gw:9001")).is_ok(), "B-162");
    }
}
