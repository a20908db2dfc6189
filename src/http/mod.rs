//! The work strip: a web page on loopback where the people beside the agent see, follow
//! and stop its work (`bgwork ui`, `bgwork daemon --http ADDR`).
//!
//! A front end like the CLI and the MCP server: every answer it gives comes from a
//! `wire::Request` served by the daemon through the [`Backend`] the daemon hands it
//! (this module knows no daemon type); it adds only the transport (HTTP,
//! Server-Sent Events), its guard (`guard.rs`: loopback `Host`, the token, `Origin`)
//! and the page itself (`page/`, compiled into the binary). `stream.rs` turns the
//! daemon's wake-ups (a record changed, an item's output grew) into events, reading
//! what they announce through the same requests.

mod guard;
mod routes;
mod stream;

use crate::wire::{Envelope, UiReply, WireError};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;

/// What the strip needs of the daemon that serves it: the daemon implements it and
/// hands itself over, so that the strip, like every front end, reaches the daemon
/// only through `wire::Request`s and its wake-up signals.
pub trait Backend: Send + Sync + 'static {
    /// Serves a request as a socket client's is, to its reply line (whatever notices
    /// the reply claims are delivered with it).
    fn ask(self: Arc<Self>, envelope: Envelope) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;
    /// Changes whenever a record or a notice changes.
    fn changes(&self) -> watch::Receiver<u64>;
    /// Changes when the output of `session`'s item `id` grows.
    fn output_changes(&self, session: &str, id: &str) -> Result<watch::Receiver<()>, WireError>;
    /// Turns true when the daemon shuts down.
    fn shutdown_signal(&self) -> watch::Receiver<bool>;
    /// The daemon's home (where the strip keeps its port and token).
    fn home(&self) -> &Path;
    /// The strip as this daemon serves it, once it does.
    fn serving(&self) -> &tokio::sync::Mutex<Option<Serving>>;
}

/// An item as the page names it: the session that owns it and its id there.
#[derive(Deserialize)]
pub(crate) struct Target {
    pub session: String,
    pub id: String,
}

/// A reply line as an HTTP answer: 200 with the reply, or 400 with `{"error":…}`.
pub(crate) fn json(line: Vec<u8>) -> Response {
    let status = match line.starts_with(b"{\"error\"") {
        true => StatusCode::BAD_REQUEST,
        false => StatusCode::OK,
    };
    (status, [(header::CONTENT_TYPE, "application/json")], line).into_response()
}

/// The file in the home that says which port a daemon served the strip on, so that a
/// restarted daemon serves it again where an open page looks for it.
const SERVED_FILE: &str = "http.port";
/// The file in the home holding the token every request must carry (0600).
const TOKEN_FILE: &str = "http.token";

/// The most connections the strip serves at once (a page holds two or three); more wait
/// in the kernel's queue, so that nobody who can reach loopback takes the daemon's files.
const MAX_CONNECTIONS: usize = 64;

/// The strip as one daemon serves it.
pub struct Serving {
    port: u16,
    token: String,
    /// The port an earlier daemon served on, which was taken (so the token is new).
    moved_from: Option<u16>,
}

/// What every handler shares.
pub(crate) struct Web {
    daemon: Arc<dyn Backend>,
    port: u16,
    token: String,
}

/// Makes sure the daemon serves the strip (on `port`, else where it served it last,
/// else on a free port) and answers its address with the token.
pub(crate) async fn ensure(
    daemon: &Arc<dyn Backend>,
    port: Option<u16>,
) -> Result<UiReply, WireError> {
    let mut serving = daemon.serving().lock().await;
    if let Some(serving) = serving.as_ref() {
        if port.is_some_and(|p| p != 0 && p != serving.port) {
            return Err(WireError::bad_request(format!(
                "the work strip is already served on port {}: open it there (`bgwork ui` \
                 prints its address), or restart the daemon with `bgwork daemon --http \
                 127.0.0.1:{}`",
                serving.port,
                port.unwrap_or_default()
            )));
        }
        return Ok(reply(serving, true));
    }
    let home = daemon.home().to_path_buf();
    let wanted = port.or_else(|| served_port(&home)).unwrap_or(0);
    let mut moved_from = None;
    let listener = match bind(wanted) {
        // The port of an earlier daemon may be taken by now: any free one will do,
        // unless the caller asked for that one.
        Err(_) if port.is_none() && wanted != 0 => {
            moved_from = Some(wanted);
            bind(0)
        }
        bound => bound,
    }
    .map_err(|e| {
        WireError::bad_request(format!(
            "cannot serve the work strip on 127.0.0.1:{wanted}: {e}; choose another port \
             with `bgwork ui --port N`, or leave it out for a free one"
        ))
    })?;
    // A page left open on the old port sends its token there, maybe to another user's
    // server by now: the new port comes with a new token.
    let token = match moved_from {
        Some(_) => guard::fresh_token(&home.join(TOKEN_FILE)),
        None => guard::token(&home.join(TOKEN_FILE)),
    }
    .map_err(|e| {
        WireError::internal(format!(
            "cannot keep the work strip's token in {}: {e}",
            home.join(TOKEN_FILE).display()
        ))
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| WireError::internal(e.to_string()))?
        .port();
    let web = Arc::new(Web {
        daemon: daemon.clone(),
        port,
        token: token.clone(),
    });
    let mut shutdown = daemon.shutdown_signal();
    let app = routes::router(web);
    let listener = Capped {
        listener,
        slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
    };
    tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|going| *going).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            crate::note!("bgwork daemon: the work strip stopped serving: {e}");
        }
    });
    let _ = std::fs::write(home.join(SERVED_FILE), port.to_string());
    let made = Serving {
        port,
        token,
        moved_from,
    };
    let answer = reply(&made, false);
    *serving = Some(made);
    Ok(answer)
}

/// At the daemon's start: serves the strip again when an earlier daemon of this home
/// served it (or `addr` asks for it).
pub(crate) async fn resume(daemon: &Arc<dyn Backend>, addr: Option<u16>) {
    if addr.is_none() && served_port(daemon.home()).is_none() {
        return;
    }
    match ensure(daemon, addr).await {
        Ok(reply) => match reply.moved_from {
            Some(old) => crate::note!(
                "bgwork daemon: port {old} of the work strip was taken: it is served at {} \
                 with a new token (`bgwork ui` prints the new address)",
                reply.address
            ),
            None => crate::note!(
                "bgwork daemon: the work strip is served at {}",
                reply.address
            ),
        },
        Err(e) => crate::note!("bgwork daemon: {}", e.message),
    }
}

/// The port in `--http ADDR`: `PORT`, `127.0.0.1:PORT` or `localhost:PORT` (the strip
/// listens on loopback only).
pub fn parse_addr(text: &str) -> Result<u16, String> {
    let port = match text.rsplit_once(':') {
        None => text,
        Some(("127.0.0.1" | "localhost", port)) => port,
        Some((host, _)) => {
            return Err(format!(
                "the work strip listens on loopback only, not on {host}: give \
                 127.0.0.1:PORT or a port"
            ))
        }
    };
    port.parse::<u16>()
        .map_err(|_| format!("{text} is no port: give 127.0.0.1:PORT or a port (0 for a free one)"))
}

fn reply(serving: &Serving, already: bool) -> UiReply {
    let address = format!("http://127.0.0.1:{}/", serving.port);
    UiReply {
        url: format!("{address}?token={}", serving.token),
        address,
        port: serving.port,
        already_serving: already,
        moved_from: serving.moved_from,
    }
}

fn bind(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let listener =
        std::net::TcpListener::bind(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)))?;
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// The port an earlier daemon served on (read as outside input: no link followed, no
/// FIFO waited on).
fn served_port(home: &Path) -> Option<u16> {
    let text = crate::paths::read_untrusted(&home.join(SERVED_FILE), 16).ok()?;
    String::from_utf8_lossy(&text).trim().parse().ok()
}

/// A listener that accepts a connection only when one of [`MAX_CONNECTIONS`] slots is
/// free; the slot goes with the connection.
struct Capped {
    listener: tokio::net::TcpListener,
    slots: Arc<tokio::sync::Semaphore>,
}

impl axum::serve::Listener for Capped {
    type Io = Held;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Held, SocketAddr) {
        let slot = loop {
            if let Ok(slot) = self.slots.clone().acquire_owned().await {
                break slot;
            }
        };
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    // Every user of this machine reaches loopback: like the daemon's
                    // socket, the strip serves only its own user, and another's
                    // connection is closed at once, before it can hold a slot.
                    if !peer_is_ours(&stream) {
                        continue;
                    }
                    return (
                        Held {
                            stream,
                            _slot: slot,
                        },
                        addr,
                    );
                }
                // Out of descriptors, say: the connection stays queued; retrying at
                // once would spin.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Whether the process at the other end of a loopback connection runs as this user: the
/// kernel's tables of TCP sockets name the owner of the peer's end (as `SO_PEERCRED` does
/// for the Unix socket); a client on an IPv6 socket is listed in `tcp6` under the mapped
/// addresses (`::ffff:127.0.0.1`). Without the tables (no `/proc`) the token alone guards.
fn peer_is_ours(stream: &tokio::net::TcpStream) -> bool {
    let (Ok(SocketAddr::V4(ours)), Ok(SocketAddr::V4(theirs))) =
        (stream.local_addr(), stream.peer_addr())
    else {
        return false;
    };
    // A table writes an address as the hex of its bytes read as native integers.
    let hex = |octets: &[u8], port: u16| {
        let words: String = octets
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        format!("{words}:{port:04X}")
    };
    let v4 = |a: SocketAddrV4| hex(&a.ip().octets(), a.port());
    let v6 = |a: SocketAddrV4| hex(&a.ip().to_ipv6_mapped().octets(), a.port());
    let me = nix::unistd::geteuid().as_raw().to_string();
    let mut readable = false;
    for (table, theirs, ours) in [
        ("/proc/net/tcp", v4(theirs), v4(ours)),
        ("/proc/net/tcp6", v6(theirs), v6(ours)),
    ] {
        let Ok(table) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        let found = table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 7 && fields[1] == theirs && fields[2] == ours).then(|| fields[7] == me)
        });
        if let Some(ours) = found {
            return ours;
        }
    }
    !readable
}

/// A connection with its slot.
struct Held {
    stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl tokio::io::AsyncRead for Held {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Held {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
