//! The operations listener (`broker.operations`): `GET /health` and `GET /metrics` for
//! the gateway's supervisor and monitoring, over every tcp door (TLS where the door
//! carries a `tls` block) and every Unix socket the configuration names.
//!
//! It runs on the broker's own executor rather than tiny_http's thread pool: tiny_http
//! spawns a thread per busy connection with no upper bound, where here every request
//! is one bounded read (8 KiB head; the TLS handshake and the head together within
//! `REQUEST_TIMEOUT`) on the thread that already owns the state it reports, so
//! nothing is shared across threads and nothing grows.
//!
//! Who may read is each door's [`Gate`], the same type the MQTT doors use and re-read
//! by the same SIGUSR1 `Reloader` (B-228, B-188): a verified client certificate's name
//! is the operator, else the `Authorization: Basic` header is checked against the
//! door's password file (its own, else the block's, B-363); a request that neither
//! admits is answered 401 with `WWW-Authenticate: Basic realm="saguin"`, whatever it
//! asked for. A door with neither file nor required certificate admits every reader:
//! the configuration allows that only on loopback and on the Unix socket (B-361).

mod inspect;
mod metrics;

use std::cell::{Cell, RefCell};
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::server::executor::LocalExecutor;
use futures_lite::future;
use smol::io::AsyncWriteExt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::auth::{Gate, Identity, Refusal};
use crate::server::{Door, Shared, Socket, admit};

/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The most requests answered at once on one door. A scraper asks one at a time; a
/// door on a routable address must not let whoever reaches it hold a task, a TLS
/// state and a head buffer per socket without bound. Past it a socket is closed at
/// once with nothing written. Counted per door, so whoever holds one door's places
/// cannot starve another's - the supervisor's `/health` on the local socket.
const MAX_IN_FLIGHT: usize = 32;

/// The operations listener's bound doors, each with its gate.
#[derive(Debug)]
pub struct OpsDoors {
    /// Every tcp and unix door `broker.operations.listen` names.
    pub doors: Vec<Door>,
    /// The least time between two computations of `/metrics`.
    pub min_scrape_interval: Duration,
}

/// A bound Unix socket and the lock that keeps a second broker off it.
#[derive(Debug)]
pub struct UnixDoor {
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    /// `None` for an abstract name, which the kernel frees with the process (B-529).
    lock: Option<std::fs::File>,
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
        // The socket goes before its lock is released; the lock file stays (B-528).
        if self.lock.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds the Unix socket at `path`: `<path>.lock` is taken first, so a leftover socket
/// from a broker that died is replaced and one held by a running broker is refused.
/// Anything at `path` that is not a socket is refused and left as it is (B-527). A
/// path beginning `@` is an abstract name: no file, so no lock (B-529).
///
/// # Errors
/// The lock is held, something other than a socket is in the way, or the socket
/// cannot be made; the message names the path.
pub fn bind_unix(path: &std::path::Path, mode: u32) -> io::Result<UnixDoor> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let cannot_listen = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {}: {e}", path.display()),
        )
    };
    if let Some(name) = path.to_str().and_then(|p| p.strip_prefix('@')) {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(cannot_listen)?;
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr).map_err(cannot_listen)?;
        return Ok(UnixDoor {
            listener,
            path: path.to_path_buf(),
            lock: None,
        });
    }
    let is_socket = match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; it is left as it is: move it away or choose another path",
                    path.display()
                ),
            ));
        }
        Ok(_) => true,
        Err(_) => false,
    };
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
    if is_socket {
        // A leftover of a broker that died: its lock was free (B-525).
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(cannot_listen(e)),
            _ => {}
        }
    }
    let listener = bind_within_mode(path, mode).map_err(cannot_listen)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(UnixDoor {
        listener,
        path: path.to_path_buf(),
        lock: Some(lock),
    })
}

/// Binds a Unix socket at `path` giving nothing `mode` does not, from the moment it
/// exists: with a chmod alone, the moment between the bind and the chmod let anyone
/// the umask did not stop connect (every user, under umask 0). The process's own
/// umask applies too, so the chmod that follows gives exactly `mode`.
fn bind_within_mode(
    path: &std::path::Path,
    mode: u32,
) -> io::Result<std::os::unix::net::UnixListener> {
    use rustix::fs::Mode;
    use rustix::process::umask;
    // Everything is masked while the old mask is read: a file another thread made
    // meanwhile would never be given more than it would have been (none does: the
    // doors are bound before the serving thread starts its work).
    let old = umask(Mode::from_bits_truncate(0o777));
    umask(old | Mode::from_bits_truncate(!mode & 0o777));
    let bound = std::os::unix::net::UnixListener::bind(path);
    umask(old);
    bound
}

/// The cached `/metrics` answer.
#[derive(Debug, Default)]
struct Scrape {
    at: Option<Instant>,
    body: Rc<str>,
}

/// Starts serving every door, on `executor`, until the tasks it returns are
/// dropped: a door dropped removes its Unix socket (B-528). They answer through
/// the stop, `/health` saying 503.
pub(crate) fn spawn(
    executor: &Rc<LocalExecutor>,
    shared: &Rc<Shared>,
    ops: OpsDoors,
) -> Vec<smol::Task<()>> {
    let scrape = Rc::new(RefCell::new(Scrape::default()));
    let interval = ops.min_scrape_interval;
    let mut serving = Vec::with_capacity(ops.doors.len());
    for door in ops.doors {
        log_door(&door);
        let (ex, shared, scrape) = (executor.clone(), shared.clone(), scrape.clone());
        let in_flight = Rc::new(Cell::new(0));
        serving.push(executor.spawn(async move {
                let mut accepted: u32 = 0;
                loop {
                    // As the MQTT doors do: a full accept queue never makes `accept`
                    // wait, and a flood of connections must not keep the one thread.
                    accepted = accepted.wrapping_add(1);
                    if accepted.is_multiple_of(crate::server::ACCEPTS_PER_TURN) {
                        futures_lite::future::yield_now().await;
                    }
                    let (stream, peer) = match door.accept().await {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of descriptors and the like: back off rather than spin.
                            log::warn!("operations accept failed: {e}");
                            smol::Timer::after(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let Some(slot) = InFlight::take(&in_flight) else {
                        log::debug!(
                            "{peer}: operations request closed at once: {MAX_IN_FLIGHT} are being answered"
                        );
                        continue;
                    };
                    let (gate, shared, scrape) =
                        (door.gate().clone(), shared.clone(), scrape.clone());
                    ex.spawn(async move {
                        answer(stream, &peer, &gate, &shared, &scrape, interval).await;
                        drop(slot);
                    })
                    .detach();
                }
        }));
    }
    serving
}

/// One request being answered, counted against [`MAX_IN_FLIGHT`] while it lives.
struct InFlight(Rc<Cell<usize>>);

impl InFlight {
    /// A place among the requests being answered, if one is free.
    fn take(count: &Rc<Cell<usize>>) -> Option<InFlight> {
        if count.get() >= MAX_IN_FLIGHT {
            return None;
        }
        count.set(count.get() + 1);
        Some(InFlight(count.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Says where a door listens and who it admits.
fn log_door(door: &Door) {
    let gate = door.gate();
    match door {
        Door::Tcp(..) if gate.tls.is_some() => {
            log::info!("operations listening on https://{}", door.describe())
        }
        Door::Tcp(..) => log::info!("operations listening on http://{}", door.describe()),
        // Operations doors are bound as tcp and unix doors only.
        Door::Unix(..) | Door::Ws(..) => {
            log::info!("operations listening on {}", door.describe())
        }
    }
    let certificates = gate.tls.as_ref().is_some_and(|t| t.verifies_clients());
    let who = match (&gate.passwords, certificates) {
        (Some(file), false) => format!("operators in {}", file.borrow().path().display()),
        (Some(file), true) => format!(
            "operators in {} or named by a client certificate",
            file.borrow().path().display()
        ),
        (None, true) if !gate.anonymous => "operators named by a client certificate".into(),
        (None, true) => "every reader; a client certificate names its operator".into(),
        (None, false) => "every reader (nothing here authenticates)".into(),
    };
    log::info!("{}: admits {who}", gate.door);
}

/// Reads one request and writes one answer, then closes.
async fn answer(
    stream: Socket,
    peer: &str,
    gate: &Gate,
    shared: &Shared,
    scrape: &RefCell<Scrape>,
    interval: Duration,
) {
    // One deadline for the PROXY header or the TLS handshake, and the request head.
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut peer = peer.to_string();
    let Some((mut stream, certificate)) = admit(gate, stream, deadline, &mut peer, shared).await
    else {
        return;
    };
    let peer = peer.as_str();
    let head = future::or(crate::server::http::read_request_head(&mut stream), async {
        smol::Timer::at(deadline).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "request head too slow",
        ))
    })
    .await;
    let response = match head {
        // A GET carries no body; whatever followed the head is not read.
        Ok((head, _)) => {
            let asker = Asker {
                peer,
                gate,
                certificate: certificate.as_deref(),
            };
            route(&head, &asker, shared, scrape, interval).await
        }
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
    // A TLS reader is told the answer is whole (close_notify), not cut off.
    stream.close_write();
}

/// Who sent a request: where from, on which door, with which verified certificate.
struct Asker<'a> {
    peer: &'a str,
    gate: &'a Gate,
    certificate: Option<&'a str>,
}

async fn route(
    head: &[u8],
    asker: &Asker<'_>,
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
    // Who asks before what is asked: a reader the door does not admit learns
    // nothing, not even which paths exist.
    if !admitted(request.headers, asker) {
        return unauthorized();
    }
    if request.method != Some("GET") {
        return response(405, "text/plain", "only GET is served here\n");
    }
    let (path, query) = request
        .path
        .map_or(("", ""), |p| p.split_once('?').unwrap_or((p, "")));
    let json = |(status, body): inspect::Answer| response(status, "application/json", &body);
    match path {
        "/health" => {
            let (healthy, body) = metrics::health(shared);
            response(if healthy { 200 } else { 503 }, "application/json", &body)
        }
        "/metrics" => {
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
        "/v1/operations/subscriptions" => json(inspect::subscriptions(shared, query)),
        "/v1/operations/acl" => json(inspect::acl(shared, query)),
        "/v1/operations/users" => json(inspect::users(shared)),
        _ => response(
            404,
            "text/plain",
            "not found: try /health, /metrics, /v1/operations/users, \
             /v1/operations/subscriptions?client=ID or /v1/operations/acl?user=NAME\n",
        ),
    }
}

/// Whether the door admits this request: its verified certificate's name, else its
/// `Authorization: Basic` credentials against the door's password file, else
/// nobody's, as [`Gate::admit`] decides for an MQTT CONNECT. The log says why a
/// request was refused; the answer never does.
fn admitted(headers: &[httparse::Header<'_>], asker: &Asker<'_>) -> bool {
    let (peer, door) = (asker.peer, &asker.gate.door);
    let credentials = basic_credentials(headers).unwrap_or_else(|why| {
        log::info!("{peer}: on {door} the Authorization header {why}; taken as no credentials");
        None
    });
    let (user, password) = match &credentials {
        Some((user, password)) => (Some(user.as_str()), Some(password.as_slice())),
        None => (None, None),
    };
    match asker.gate.admit(user, password, asker.certificate) {
        Ok(Identity::Anonymous) => true,
        Ok(Identity::User(name) | Identity::Certificate(name)) => {
            log::debug!("{peer}: operations request on {door} from {name:?}");
            true
        }
        Err(Refusal::Missing) => {
            log::info!(
                "{peer}: operations request refused on {door}: no credentials, and this door \
                 admits only the operators its password file or client certificates name"
            );
            false
        }
        Err(refusal @ Refusal::ControlCharacter) => {
            log::warn!("{peer}: operations request refused on {door}: {refusal}");
            false
        }
        Err(refusal) => {
            log::info!("{peer}: operations request refused on {door}: {refusal}");
            false
        }
    }
}

/// The user name and password of an `Authorization: Basic` header (RFC 7617), or
/// `None` without one.
///
/// # Errors
/// What is wrong with the header, to finish the sentence "the Authorization header …".
fn basic_credentials(
    headers: &[httparse::Header<'_>],
) -> Result<Option<(String, Vec<u8>)>, &'static str> {
    let Some(header) = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("authorization"))
    else {
        return Ok(None);
    };
    let value = std::str::from_utf8(header.value).map_err(|_| "is not text")?;
    let (scheme, encoded) = value
        .trim()
        .split_once(' ')
        .ok_or("is not `Basic <base64>`")?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err("is not Basic, the only scheme served here");
    }
    let decoded = STANDARD
        .decode(encoded.trim())
        .map_err(|_| "is not base64")?;
    let colon = decoded
        .iter()
        .position(|&b| b == b':')
        .ok_or("holds no `user:password`")?;
    let user =
        std::str::from_utf8(&decoded[..colon]).map_err(|_| "names a user that is not UTF-8")?;
    Ok(Some((user.to_string(), decoded[colon + 1..].to_vec())))
}

/// 401, with the challenge that makes a browser or curl ask for a password.
fn unauthorized() -> String {
    respond(
        401,
        "WWW-Authenticate: Basic realm=\"saguin\"\r\n",
        "text/plain",
        "unauthorized: give the credentials of an operator this door's password file names (HTTP Basic), or its client certificate\n",
    )
}

fn response(status: u16, content_type: &str, body: &str) -> String {
    respond(status, "", content_type, body)
}

/// A whole answer: the status line, `headers` (each ending in CRLF), the body.
fn respond(status: u16, headers: &str, content_type: &str, body: &str) -> String {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\n{headers}Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The socket never has more than `mode` before the chmod `bind_unix` follows
    /// it with, under any umask (0777 less the umask, 0755 under the usual 022, was
    /// what it had).
    #[test]
    fn a_unix_socket_is_made_within_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("saguin-umask-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ops.sock");
        let _listener = bind_within_mode(&path, 0o600).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777 & !0o600, 0, "{mode:o} gives more than 0600");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn authorization(value: &str) -> Result<Option<(String, Vec<u8>)>, &'static str> {
        let headers = [httparse::Header {
            name: "Authorization",
            value: value.as_bytes(),
        }];
        basic_credentials(&headers)
    }

    /// RFC 7617: `Basic base64(user:password)`; the password may hold a colon.
    #[test]
    fn basic_credentials_are_user_and_password() {
        let encoded = STANDARD.encode("alice:se:cret");
        assert_eq!(
            authorization(&format!("Basic {encoded}")),
            Ok(Some(("alice".into(), b"se:cret".to_vec())))
        );
        assert_eq!(
            authorization(&format!("basic  {encoded} ")),
            Ok(Some(("alice".into(), b"se:cret".to_vec())))
        );
        assert_eq!(basic_credentials(&[]), Ok(None));
    }

    #[test]
    fn an_unreadable_authorization_header_says_why() {
        assert!(authorization("Bearer abc").is_err());
        assert!(authorization("Basic").is_err());
        assert!(authorization("Basic !!!").is_err());
        assert!(authorization(&format!("Basic {}", STANDARD.encode("nocolon"))).is_err());
        assert!(authorization(&format!("Basic {}", STANDARD.encode(b"\xff:x"))).is_err());
    }
}
