//! `Client`: connects to the home's daemon (starting one when none answers) and sends
//! requests of [`crate::wire`]. Every front end (CLI, MCP server, hook) goes through it.
//!
//! Nothing is sent before two checks (SPEC §8): the socket's folder is this user's own
//! and no one else may write in it, and the process listening on the socket runs as
//! this user (`SO_PEERCRED`). A folder in `/tmp` can be made first by another user who
//! then listens there; such a client would otherwise hand over its requests, environment
//! values included.

use crate::paths::{check_private_dir, Paths, SocketPath};
use crate::wire::{self, Envelope, ErrorCode, WireError};
use serde::de::DeserializeOwned;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a client waits for a daemon it started to answer.
const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many daemons a client starts at most while waiting for one to answer.
const MAX_DAEMON_STARTS: u32 = 5;

pub struct Client {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    /// Connects, starting the daemon first when none answers on the socket.
    pub fn connect(paths: &Paths) -> Result<Client, WireError> {
        match Client::connect_existing(paths) {
            Ok(client) => return Ok(client),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(WireError::new(ErrorCode::Unavailable, e.to_string()))
            }
            Err(_) => {}
        }
        let mut daemon = spawn_daemon(paths)?;
        let mut starts = 1;
        let deadline = Instant::now() + DAEMON_START_TIMEOUT;
        loop {
            match Client::connect_existing(paths) {
                Ok(client) => {
                    // Reap it whenever it ends (this client may live long: an MCP server).
                    std::thread::spawn(move || daemon.wait());
                    return Ok(client);
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return Err(WireError::new(ErrorCode::Unavailable, e.to_string()))
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "the daemon did not start ({e}); see {}",
                            paths.daemon_log.display()
                        ),
                    ))
                }
                Err(_) => {
                    // A daemon that ended before it answered (killed while starting, or
                    // it found another one still letting go of the home): start another.
                    if starts < MAX_DAEMON_STARTS && matches!(daemon.try_wait(), Ok(Some(_))) {
                        daemon = spawn_daemon(paths)?;
                        starts += 1;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Connects to a running daemon only. Errors of kind `PermissionDenied` (whose
    /// message says why and what to do) when the socket's folder or the process that
    /// listens on it is not this user's: nothing has been sent then.
    pub fn connect_existing(paths: &Paths) -> std::io::Result<Client> {
        check_private_dir(paths.socket_dir())?;
        let short = SocketPath::new(&paths.socket)?;
        let stream = UnixStream::connect(&short.path)?;
        check_server(&stream, &paths.socket)?;
        Ok(Client {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one request and reads its one reply.
    pub fn call<T: DeserializeOwned>(&mut self, envelope: &Envelope) -> Result<T, WireError> {
        if let Err(error) = self.send(envelope) {
            // A daemon that refuses a client may close before the request is written:
            // its refusal is still there to read.
            return match self.next_line() {
                Ok(Some(line)) => wire::decode_reply(&line),
                _ => Err(error),
            };
        }
        let line = self.next_line()?.ok_or_else(|| {
            WireError::new(ErrorCode::Unavailable, "the daemon closed the connection")
        })?;
        wire::decode_reply(&line)
    }

    pub fn send(&mut self, envelope: &Envelope) -> Result<(), WireError> {
        let line = wire::encode_line(envelope);
        self.writer
            .write_all(&line)
            .map_err(|e| WireError::new(ErrorCode::Unavailable, format!("daemon unreachable: {e}")))
    }

    /// The next reply line (for streams such as `notices --follow`).
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        let mut line = Vec::new();
        match self.reader.read_until(b'\n', &mut line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line)),
            Err(e) => Err(WireError::new(
                ErrorCode::Unavailable,
                format!("daemon connection failed: {e}"),
            )),
        }
    }
}

/// Checks that the process listening on `socket` runs as this user.
fn check_server(stream: &UnixStream, socket: &std::path::Path) -> std::io::Result<()> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let me = nix::unistd::geteuid().as_raw();
    let server = getsockopt(stream, PeerCredentials).map_err(std::io::Error::from)?;
    if server.uid() != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "refusing to talk to {}: the process listening there runs as uid {}, not as \
                 you (uid {me}); nothing was sent. Another user may be listening in your \
                 place: remove the socket, or set BGWORK_HOME to a folder of your own",
                socket.display(),
                server.uid()
            ),
        ));
    }
    Ok(())
}

/// Starts `bgwork daemon` detached, in a session of its own, logging to `daemon.log`.
fn spawn_daemon(paths: &Paths) -> Result<std::process::Child, WireError> {
    let unavailable = |what: &str, e: std::io::Error| {
        WireError::new(ErrorCode::Unavailable, format!("could not {what}: {e}"))
    };
    paths
        .create_dirs()
        .map_err(|e| unavailable(&format!("create {}", paths.home.display()), e))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&paths.daemon_log)
        .map_err(|e| unavailable("open the daemon log", e))?;
    let exe = std::env::current_exe().map_err(|e| unavailable("find the bgwork binary", e))?;
    let mut command = Command::new(exe);
    command
        .arg("daemon")
        .env_remove("BGWORK_JOB")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(|e| unavailable("open the daemon log", e))?,
        )
        .stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    command
        .spawn()
        .map_err(|e| unavailable("start the daemon", e))
}
