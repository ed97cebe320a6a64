//! The kinds of socket an MQTT door hands a connection, behind one type, so the
//! connection code is written once.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use smol::Async;
use smol::io::{AsyncRead, AsyncWrite};

/// A connected client socket.
#[derive(Debug)]
pub enum Socket {
    /// A TCP connection.
    Tcp(Async<TcpStream>),
    /// A Unix-socket connection.
    Unix(Async<UnixStream>),
}

impl Socket {
    /// Closes our sending half, so the peer reads the end of the stream after what was
    /// written.
    pub fn close_write(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.get_ref().shutdown(std::net::Shutdown::Write),
            Socket::Unix(s) => s.get_ref().shutdown(std::net::Shutdown::Write),
        };
    }

    /// Reads what the kernel already holds, without waiting: `Ok(None)` when nothing
    /// is there.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        use std::io::Read;
        let read = match self {
            Socket::Tcp(s) => (&*s.get_ref()).read(buf),
            Socket::Unix(s) => (&*s.get_ref()).read(buf),
        };
        match read {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits until there is something to read, holding no buffer meanwhile: this is
    /// how an idle connection costs nothing but its task.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.readable().await,
            Socket::Unix(s) => s.readable().await,
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Socket::Tcp($s) => $e,
            Socket::Unix($s) => $e,
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

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_close(cx))
    }
}

/// A bound MQTT door.
#[derive(Debug)]
pub enum Door {
    /// A TCP listener.
    Tcp(Async<std::net::TcpListener>),
    /// A Unix-socket listener, with the lock that keeps a second broker off its path.
    Unix(
        Async<std::os::unix::net::UnixListener>,
        crate::ops::UnixDoor,
    ),
}

impl Door {
    /// Takes the next connection, with a label for the logs.
    pub async fn accept(&self) -> io::Result<(Socket, String)> {
        match self {
            Door::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                let _ = stream.get_ref().set_nodelay(true);
                Ok((Socket::Tcp(stream), peer.to_string()))
            }
            Door::Unix(listener, door) => {
                let (stream, _) = listener.accept().await?;
                Ok((Socket::Unix(stream), door.path().display().to_string()))
            }
        }
    }

    /// Where it listens.
    pub fn describe(&self) -> String {
        match self {
            Door::Tcp(listener) => listener
                .get_ref()
                .local_addr()
                .map_or_else(|e| e.to_string(), |a| a.to_string()),
            Door::Unix(_, door) => door.path().display().to_string(),
        }
    }
}
