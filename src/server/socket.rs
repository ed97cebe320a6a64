//! The kinds of socket an MQTT door hands a connection, behind one type, so the
//! connection code is written once.

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use smol::Async;
use smol::io::{AsyncRead, AsyncWrite};

use crate::auth::Gate;

/// A connected client socket.
#[derive(Debug)]
pub enum Socket {
    /// A TCP connection.
    Tcp(Async<TcpStream>),
    /// A Unix-socket connection.
    Unix(Async<UnixStream>),
    /// A TCP connection carrying TLS, past its handshake. Boxed: rustls's state is
    /// large, and only a TLS door's connections should pay for it.
    Tls(Box<futures_rustls::server::TlsStream<Async<TcpStream>>>),
    /// MQTT over WebSocket, over a TCP or TLS socket, past its upgrade.
    Ws(Box<super::ws::WsSocket>),
    /// A bridge's own connection to its peer over TLS (`crate::bridge::link`).
    TlsClient(Box<futures_rustls::client::TlsStream<Async<TcpStream>>>),
}

impl Socket {
    /// Closes our sending half, so the peer reads the end of the stream after what was
    /// written.
    pub fn close_write(&mut self) {
        let _ = match self {
            Socket::Tcp(s) => s.get_ref().shutdown(std::net::Shutdown::Write),
            Socket::Unix(s) => s.get_ref().shutdown(std::net::Shutdown::Write),
            Socket::Tls(s) => {
                let (io, conn) = s.get_mut();
                super::tls::close_notify(io, &mut **conn);
                io.get_ref().shutdown(std::net::Shutdown::Write)
            }
            Socket::TlsClient(s) => {
                let (io, conn) = s.get_mut();
                super::tls::close_notify(io, &mut **conn);
                io.get_ref().shutdown(std::net::Shutdown::Write)
            }
            Socket::Ws(s) => {
                s.inner().close_write();
                Ok(())
            }
        };
    }

    /// Writes what the kernel takes at once, without waiting. `None` for a socket
    /// whose writes go through TLS or WebSocket framing: only an awaited write does
    /// those.
    pub fn write_now(&self, bufs: &[std::io::IoSlice<'_>]) -> Option<io::Result<usize>> {
        use std::io::Write;
        match self {
            Socket::Tcp(s) => Some((&mut s.get_ref()).write_vectored(bufs)),
            Socket::Unix(s) => Some((&mut s.get_ref()).write_vectored(bufs)),
            Socket::Tls(_) | Socket::Ws(_) | Socket::TlsClient(_) => None,
        }
    }

    /// Ready when there is something to read; waits holding no buffer meanwhile:
    /// this is how an idle connection costs nothing but its task.
    pub fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            // `poll_readable`, not `readable()`: its interest outlives the wait, so a
            // connection woken by something else and waiting again costs no epoll_ctl.
            Socket::Tcp(s) => s.poll_readable(cx),
            Socket::Unix(s) => s.poll_readable(cx),
            Socket::Tls(s) => {
                let (io, conn) = s.get_mut();
                if super::tls::has_plaintext(&mut **conn) {
                    return Poll::Ready(Ok(()));
                }
                io.poll_readable(cx)
            }
            Socket::TlsClient(s) => {
                let (io, conn) = s.get_mut();
                if super::tls::has_plaintext(&mut **conn) {
                    return Poll::Ready(Ok(()));
                }
                io.poll_readable(cx)
            }
            // tungstenite may hold a whole message already read off the socket: a
            // WebSocket connection waits in its read, with its buffer, instead.
            Socket::Ws(_) => Poll::Ready(Ok(())),
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Socket::Tcp($s) => $e,
            Socket::Unix($s) => $e,
            Socket::Tls($s) => $e,
            Socket::Ws($s) => $e,
            Socket::TlsClient($s) => $e,
        }
    };
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_close(cx))
    }
}

/// A bound MQTT door, with the gate its connections pass (`crate::auth`).
#[derive(Debug)]
pub enum Door {
    /// A TCP listener.
    Tcp(Async<std::net::TcpListener>, Rc<Gate>),
    /// A Unix-socket listener, with the lock that keeps a second broker off its path.
    Unix(
        Async<std::os::unix::net::UnixListener>,
        crate::ops::UnixDoor,
        Rc<Gate>,
    ),
    /// A TCP listener speaking MQTT over WebSocket, with the pages it admits.
    Ws(
        Async<std::net::TcpListener>,
        Rc<Gate>,
        Rc<super::ws::OriginPolicy>,
    ),
}

impl Door {
    /// Takes the next connection, with a label for the logs.
    pub async fn accept(&self) -> io::Result<(Socket, String)> {
        match self {
            Door::Tcp(listener, _) | Door::Ws(listener, _, _) => {
                let (stream, peer) = listener.accept().await?;
                let _ = stream.get_ref().set_nodelay(true);
                // A dual-stack door sees IPv4 peers as ::ffff:a.b.c.d.
                let peer = std::net::SocketAddr::new(peer.ip().to_canonical(), peer.port());
                Ok((Socket::Tcp(stream), peer.to_string()))
            }
            Door::Unix(listener, door, _) => {
                let (stream, _) = listener.accept().await?;
                Ok((Socket::Unix(stream), door.path().display().to_string()))
            }
        }
    }

    /// Where it listens.
    pub fn describe(&self) -> String {
        match self {
            Door::Tcp(listener, _) => listener
                .get_ref()
                .local_addr()
                .map_or_else(|e| e.to_string(), |a| a.to_string()),
            Door::Ws(listener, _, _) => listener
                .get_ref()
                .local_addr()
                .map_or_else(|e| e.to_string(), |a| format!("ws://{a}")),
            Door::Unix(_, door, _) => door.path().display().to_string(),
        }
    }

    /// What its connections must pass to be admitted.
    pub fn gate(&self) -> &Rc<Gate> {
        match self {
            Door::Tcp(_, gate) | Door::Unix(_, _, gate) | Door::Ws(_, gate, _) => gate,
        }
    }

    /// The pages a WebSocket door admits; `None` on a door that is not one.
    pub fn websocket(&self) -> Option<&Rc<super::ws::OriginPolicy>> {
        match self {
            Door::Ws(_, _, policy) => Some(policy),
            _ => None,
        }
    }
}
