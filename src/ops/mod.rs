//! The operations listener (`broker.operations`): `GET /health` and `GET /metrics` for
//! the gateway's supervisor and monitoring, over loopback TCP and/or a Unix socket.
//!
//! It runs on the broker's own executor rather than tiny_http's thread pool: tiny_http
//! spawns a thread per busy connection with no upper bound, where here every request
//! is one bounded read (8 KiB head, `REQUEST_TIMEOUT`) on the thread that already owns
//! the state it reports, so nothing is shared across threads and nothing grows.

mod metrics;

use std::cell::RefCell;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future;
use smol::LocalExecutor;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::server::Shared;

/// The most a request head may take.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how the operations listener serves.
#[derive(Debug, Clone)]
pub struct OpsSettings {
    /// TCP addresses (loopback unless the door authenticates).
    pub tcp: Vec<std::net::SocketAddr>,
    /// A Unix socket path and its mode.
    pub unix: Option<(PathBuf, u32)>,
    /// The least time between two computations of `/metrics`.
    pub min_scrape_interval: Duration,
}

/// A bound Unix socket and the lock that keeps a second broker off it.
#[derive(Debug)]
pub struct UnixDoor {
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    _lock: std::fs::File,
}

impl UnixDoor {
    /// The socket's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// A second handle on the listening socket, for the reactor.
    ///
    /// # Errors
    /// The descriptor could not be duplicated.
    pub fn listener(&self) -> io::Result<std::os::unix::net::UnixListener> {
        self.listener.try_clone()
    }
}

impl Drop for UnixDoor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the Unix socket at `path`: `<path>.lock` is taken first, so a leftover socket
/// from a broker that died is replaced and one held by a running broker is refused.
///
/// # Errors
/// The lock is held, or the socket cannot be made; the message names the path.
pub fn bind_unix(path: &std::path::Path, mode: u32) -> io::Result<UnixDoor> {
    use std::os::unix::fs::PermissionsExt;
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    lock.try_lock().map_err(|_| {
        io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} is held by another running broker (lock {})",
                path.display(),
                lock_path.display()
            ),
        )
    })?;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {}: {e}", path.display()),
        )
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(UnixDoor {
        listener,
        path: path.to_path_buf(),
        _lock: lock,
    })
}

/// The cached `/metrics` answer.
#[derive(Debug, Default)]
struct Scrape {
    at: Option<Instant>,
    body: Rc<str>,
}

/// Starts serving on the given doors, on `executor`.
pub(crate) fn spawn(
    executor: &Rc<LocalExecutor<'static>>,
    shared: &Rc<Shared>,
    settings: &OpsSettings,
    tcp: Vec<std::net::TcpListener>,
    unix: Option<UnixDoor>,
) -> io::Result<()> {
    let scrape = Rc::new(RefCell::new(Scrape::default()));
    let interval = settings.min_scrape_interval;
    for listener in tcp {
        let listener = smol::net::TcpListener::try_from(listener)?;
        log::info!("operations listening on http://{}", listener.local_addr()?);
        let (ex, shared, scrape) = (executor.clone(), shared.clone(), scrape.clone());
        executor
            .spawn(async move {
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        let (shared, scrape) = (shared.clone(), scrape.clone());
                        ex.spawn(async move { answer(stream, &shared, &scrape, interval).await })
                            .detach();
                    }
                }
            })
            .detach();
    }
    if let Some(door) = unix {
        let listener = smol::Async::new(door.listener.try_clone()?)?;
        let path = door.path.clone();
        log::info!("operations listening on {}", path.display());
        let (ex, shared, scrape) = (executor.clone(), shared.clone(), scrape);
        executor
            .spawn(async move {
                let _door = door;
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        let (shared, scrape) = (shared.clone(), scrape.clone());
                        ex.spawn(async move { answer(stream, &shared, &scrape, interval).await })
                            .detach();
                    }
                }
            })
            .detach();
    }
    Ok(())
}

/// Reads one request and writes one answer, then closes.
async fn answer(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    shared: &Shared,
    scrape: &RefCell<Scrape>,
    interval: Duration,
) {
    let head = future::or(read_head(&mut stream), async {
        smol::Timer::after(REQUEST_TIMEOUT).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "request head too slow",
        ))
    })
    .await;
    let response = match head {
        Ok(head) => route(&head, shared, scrape, interval).await,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            response(400, "text/plain", "bad request\n")
        }
        Err(_) => return,
    };
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.flush().await
    };
    let _ = future::or(write, async {
        smol::Timer::after(shared.settings.write_timeout.unwrap_or(REQUEST_TIMEOUT)).await;
        Ok(())
    })
    .await;
}

async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before the request head",
            ));
        }
        head.extend_from_slice(&chunk[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head over 8 KiB",
            ));
        }
    }
}

async fn route(
    head: &[u8],
    shared: &Shared,
    scrape: &RefCell<Scrape>,
    interval: Duration,
) -> String {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return response(400, "text/plain", "bad request\n"),
    }
    if request.method != Some("GET") {
        return response(405, "text/plain", "only GET is served here\n");
    }
    match request.path.map(|p| p.split('?').next().unwrap_or(p)) {
        Some("/health") => {
            let (healthy, body) = metrics::health(shared);
            response(if healthy { 200 } else { 503 }, "application/json", &body)
        }
        Some("/metrics") => {
            let fresh = scrape.borrow().at.is_some_and(|at| at.elapsed() < interval);
            if !fresh {
                // A scrape sooner than min_scrape_interval gets the previous answer.
                let channels = metrics::channel_stats(shared).await;
                let body = Rc::from(metrics::render(shared, &channels));
                *scrape.borrow_mut() = Scrape {
                    at: Some(Instant::now()),
                    body,
                };
            }
            let body = scrape.borrow().body.clone();
            response(200, "text/plain; version=0.0.4", &body)
        }
        _ => response(404, "text/plain", "not found: try /health or /metrics\n"),
    }
}

fn response(status: u16, content_type: &str, body: &str) -> String {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
