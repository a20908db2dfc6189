//! `Client`: connects to the home's daemon (starting one when none answers) and sends
//! requests of [`crate::wire`]. Every front end (CLI, MCP server, hook) goes through it.
//!
//! Nothing is sent before two checks (contract §8): the socket's folder is this user's own
//! and no one else may write in it, and the process listening on the socket runs as
//! this user (`SO_PEERCRED`). A folder in `/tmp` can be made first by another user who
//! then listens there; such a client would otherwise hand over its requests, environment
//! values included.
//!
//! No call waits for ever on a daemon that does not answer (stopped, hung, overloaded):
//! the connection, the request and the first answer each have a deadline — a fixed
//! patience plus the time the call itself may take (a `wait`'s timeout, a `stop`'s
//! grace) — and missing it is an error that names the home and the daemon's pid. A
//! `notices --follow` stream, which may rightly stay silent for hours, checks after each
//! quiet spell that the daemon still answers on a second connection.

use crate::paths::{check_private_dir, Paths, SocketPath};
use crate::wire::frame::SyncLines;
use crate::wire::{self, Envelope, ErrorCode, Request, WireError};
use serde::de::DeserializeOwned;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the error of a request that acts says when its daemon read it and went away
/// before answering (it may have been carried out).
pub const WENT_AWAY_WITH_REQUEST: &str = "the daemon went away with the request";
/// How long a client waits for a daemon it started to answer.
const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many daemons a client starts at most while waiting for one to answer.
const MAX_DAEMON_STARTS: u32 = 5;
/// The longest reply line taken from a daemon: a 16 MiB read in JSON, where each byte
/// may take up to six, and more; a daemon that sends more is broken.
const MAX_REPLY_LINE: usize = 256 << 20;
/// The exit code of a daemon that will not serve its home as it is (a broken
/// database): starting another would not help, its reason is the client's error.
pub const DAEMON_REFUSED: u8 = 3;
/// How long a daemon may take to answer beyond what the call itself may take
/// (`BGWORK_ANSWER_TIMEOUT_MS` changes it). Generous: a loaded machine is slow, and a
/// call given up on may still be carried out.
const DEFAULT_PATIENCE: Duration = Duration::from_secs(30);
/// How long a `notices --follow` stream stays quiet before it checks the daemon (at most
/// the patience).
const FOLLOW_QUIET: Duration = Duration::from_secs(10);

pub struct Client {
    writer: UnixStream,
    reader: SyncLines<UnixStream>,
    paths: Paths,
    /// The deadline for each answer of the request in flight.
    patience: Duration,
    /// The request in flight is a `notices --follow` stream.
    following: bool,
    /// The request in flight may change state (said when its answer is given up on).
    acts: bool,
    /// The session of the request in flight.
    session: String,
    /// Whether a reply line came on this connection.
    answered: bool,
    /// Whether the last call found the connection reset or closed by the daemon.
    dropped: bool,
    /// Whether the last request never reached the daemon whole: its connection was
    /// reset before any reply, which a daemon's close does only to a connection it
    /// left bytes unread on (one request a connection: the request's own). It was not
    /// carried out, so asking it again cannot do it twice.
    unread: bool,
    /// Set by a [`Closer`] that ended the connection from here (not the daemon's doing).
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Client {
    /// Connects, starting the daemon first when none answers on the socket.
    pub fn connect(paths: &Paths) -> Result<Client, WireError> {
        match Client::connect_existing(paths) {
            Ok(client) => return Ok(client),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(WireError::new(ErrorCode::Unavailable, e.to_string()))
            }
            // Someone listens but accepts nothing: a daemon that is stuck, not absent.
            Err(e) if is_timeout(&e) => {
                return Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "the daemon of {} ({}) did not answer: {e}",
                        paths.home.display(),
                        describe_daemon(paths)
                    ),
                ))
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
                    let ended = daemon.try_wait().ok().flatten();
                    if ended.and_then(|status| status.code()) == Some(DAEMON_REFUSED.into()) {
                        return Err(WireError::new(
                            ErrorCode::Unavailable,
                            last_line(&paths.daemon_log)
                                .unwrap_or_else(|| "the daemon refused to start".into()),
                        ));
                    }
                    // A daemon that ended before it answered (killed while starting, or
                    // it found another one still letting go of the home): start another.
                    if starts < MAX_DAEMON_STARTS && ended.is_some() {
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
        let stream = connect_within(&short.path, patience())?;
        check_server(&stream, &paths.socket)?;
        Ok(Client {
            reader: SyncLines::new(stream.try_clone()?, MAX_REPLY_LINE),
            writer: stream,
            paths: paths.clone(),
            patience: patience(),
            following: false,
            acts: false,
            session: String::new(),
            answered: false,
            dropped: false,
            unread: false,
            closed: Default::default(),
        })
    }

    /// A handle that ends this connection when dropped, from any thread: a blocked
    /// call returns at once and the daemon sees its client gone (an MCP call that was
    /// cancelled).
    pub fn closer(&self) -> std::io::Result<Closer> {
        Ok(Closer(self.writer.try_clone()?, self.closed.clone()))
    }

    /// Sends one request and reads its one reply.
    ///
    /// A daemon killed (`kill -9`) with this connection still in its queue resets it,
    /// or closes it, before any reply: that daemon is dead, as when none is there. A
    /// request that changes nothing (`list`, `read`, `wait`, `notices`, `status`) is
    /// then asked again of a daemon started as [`Client::connect`] starts one; one that
    /// acts is not (it may have been carried out): its error says so.
    pub fn call<T: DeserializeOwned>(&mut self, envelope: &Envelope) -> Result<T, WireError> {
        let fresh = !self.answered;
        self.dropped = false;
        self.unread = false;
        let result = self.call_once(envelope);
        let closed_here = self.closed.load(std::sync::atomic::Ordering::SeqCst);
        if result.is_ok() || !fresh || !self.dropped || closed_here {
            return result;
        }
        if matches!(envelope.request, Request::Status | Request::Ping) {
            // `status` looks and never starts a daemon: a daemon still there answers.
            return match Client::connect_existing(&self.paths) {
                Ok(client) => {
                    *self = client;
                    self.call_once(envelope)
                }
                Err(_) => Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "no daemon is running for {}: the one there went away as it was \
                         asked (`bgwork list` starts one)",
                        self.paths.home.display()
                    ),
                )),
            };
        }
        if self.acts {
            return result.map_err(|mut e| {
                e.message.push_str(" (");
                e.message.push_str(WENT_AWAY_WITH_REQUEST);
                e.message
                    .push_str(": see `bgwork list` whether it was carried out)");
                e
            });
        }
        *self = Client::connect(&self.paths)?;
        self.call_once(envelope)
    }

    fn call_once<T: DeserializeOwned>(&mut self, envelope: &Envelope) -> Result<T, WireError> {
        if let Err(error) = self.send(envelope) {
            // A daemon that refuses a client may close before the request is written:
            // its refusal is still there to read.
            return match self.next_line() {
                Ok(Some(line)) => wire::decode_reply(&line),
                _ => Err(error),
            };
        }
        // A run names its job first (when asked to): a daemon that goes away during its
        // wait leaves a job that goes on, which the error names.
        let mut started: Option<String> = None;
        loop {
            let line = match (self.next_line(), &started) {
                (Ok(Some(line)), _) => line,
                (Ok(None) | Err(_), Some(id)) => {
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "the daemon went away during the run of {id}, which goes on: \
                             `bgwork wait {id}` for its end, `bgwork read {id}` for its output"
                        ),
                    ))
                }
                (Ok(None), None) => {
                    self.dropped = true;
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        "the daemon closed the connection",
                    ));
                }
                (Err(e), None) => return Err(e),
            };
            if matches!(envelope.request, Request::Run(_)) {
                if let Ok(first) = serde_json::from_slice::<wire::RunStarted>(&line) {
                    started = Some(first.started).filter(|id| !id.is_empty());
                    continue;
                }
            }
            return wire::decode_reply(&line);
        }
    }

    /// Sends a request; its answers are awaited with the deadline it deserves.
    pub fn send(&mut self, envelope: &Envelope) -> Result<(), WireError> {
        let request = &envelope.request;
        self.session.clone_from(&envelope.session);
        // Long waits are followed like a stream: quiet spells are fine while the daemon
        // answers a second connection, so `wait --timeout none` never waits on a stopped
        // daemon for ever.
        self.following = matches!(
            request,
            Request::Notices { follow: true, .. }
                | Request::Notices {
                    wait_s: Some(_),
                    ..
                }
                | Request::Wait(_)
        );
        self.acts = !matches!(
            request,
            Request::List { .. }
                | Request::Read(_)
                | Request::Wait(_)
                | Request::Notices { .. }
                | Request::Status
                | Request::Ping
        );
        self.patience = if self.following {
            FOLLOW_QUIET.min(patience())
        } else {
            patience() + own_time(request)
        };
        let _ = self.writer.set_write_timeout(Some(self.patience));
        let _ = self.reader.get_ref().set_read_timeout(Some(self.patience));
        let line = wire::encode_line(envelope);
        self.writer.write_all(&line).map_err(|e| {
            if is_timeout(&e) {
                self.not_answering()
            } else {
                self.dropped |= is_dropped(&e);
                self.unread |= is_reset(&e);
                WireError::new(ErrorCode::Unavailable, format!("daemon unreachable: {e}"))
            }
        })
    }

    /// A second handle on the connection, for writing while replies are read (a `run`
    /// that passes its caller's stdin on).
    pub fn writer(&self) -> Result<UnixStream, WireError> {
        self.writer.try_clone().map_err(|e| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("daemon connection failed: {e}"),
            )
        })
    }

    /// Whether bytes of a reply have arrived that [`Client::next_line`] has not returned.
    pub fn has_buffered(&self) -> bool {
        self.reader.has_pending()
    }

    /// The connection, to wait on it (`poll`) together with something else.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.writer)
    }

    /// The next reply line (for streams such as `notices --follow`).
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        loop {
            match self.reader.next_line() {
                Ok(line) => {
                    self.answered |= line.is_some();
                    return Ok(line);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A quiet stream is fine while the daemon answers a second connection.
                Err(e) if is_timeout(&e) && self.following => self.check_alive()?,
                Err(e) if is_timeout(&e) => return Err(self.not_answering()),
                Err(e) => {
                    self.dropped |= is_dropped(&e);
                    self.unread |= !self.answered && is_reset(&e);
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!("daemon connection failed: {e}"),
                    ));
                }
            }
        }
    }

    /// The `n` bytes that follow the last reply line (a read's output frame).
    pub fn read_frame(&mut self, n: u64) -> Result<Vec<u8>, WireError> {
        if n > MAX_REPLY_LINE as u64 {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!("the daemon announced {n} bytes of output, past any reply's size"),
            ));
        }
        self.reader.read_bytes(n as usize).map_err(|e| {
            if is_timeout(&e) {
                self.not_answering()
            } else {
                WireError::new(
                    ErrorCode::Unavailable,
                    format!("daemon connection failed while reading output: {e}"),
                )
            }
        })
    }

    /// How long a stream (`notices --follow`) may stay quiet before the daemon is
    /// checked with [`Client::check_alive`].
    pub fn quiet_period(&self) -> Duration {
        self.patience
    }

    /// Whether the last request never reached the daemon whole (see `unread`): not
    /// carried out, it may be asked again.
    pub fn unread(&self) -> bool {
        self.unread
    }

    /// Whether the daemon answers on a connection of its own, in time. The probe is a
    /// `ping`, which looks at nothing: fifty quiet waits checking every few seconds
    /// must not cost the daemon a look at every job's processes each (as `status`
    /// takes).
    pub fn check_alive(&self) -> Result<(), WireError> {
        let probe = Envelope {
            session: self.session.clone(),
            request: Request::Ping,
        };
        let mut client = Client::connect_existing(&self.paths).map_err(|e| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("the daemon of {} is gone: {e}", self.paths.home.display()),
            )
        })?;
        client.call::<wire::Ack>(&probe).map(|_| ())
    }

    /// The error for a daemon that let a deadline pass.
    fn not_answering(&self) -> WireError {
        let seconds = self.patience.as_secs_f64();
        let mut message = format!(
            "the daemon of {} ({}) did not answer within {seconds:.0} s",
            self.paths.home.display(),
            describe_daemon(&self.paths)
        );
        if self.acts {
            message.push_str(
                "; the request may still be carried out when it answers (see `bgwork list`)",
            );
        }
        WireError::new(ErrorCode::Unavailable, message)
    }
}

/// Ends a client's connection when dropped (see [`Client::closer`]).
pub struct Closer(UnixStream, std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Closer {
    fn drop(&mut self) {
        // The call sees its end as this side's, not a daemon gone: it is not asked again.
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// The patience of every call: `BGWORK_ANSWER_TIMEOUT_MS`, else [`DEFAULT_PATIENCE`].
fn patience() -> Duration {
    std::env::var("BGWORK_ANSWER_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(DEFAULT_PATIENCE, Duration::from_millis)
}

/// How long the daemon may rightly take over a request before it answers.
fn own_time(request: &Request) -> Duration {
    let seconds = |s: Option<f64>, default: f64| {
        let s = s.unwrap_or(default);
        // The daemon refuses what is not a duration; never let it make this one panic.
        Duration::try_from_secs_f64(s.min(1e9)).unwrap_or_default()
    };
    match request {
        Request::Wait(args) => seconds(args.timeout_s, 50.0),
        Request::Notices { wait_s, .. } => seconds(*wait_s, 0.0),
        // A run past its deadline with no room to be promoted is stopped: grace and all.
        Request::Run(args) => seconds(args.timeout_s, 60.0) + Duration::from_secs(7),
        Request::Start(args) | Request::AgentStart(args) => {
            Duration::from_millis(args.window_ms.unwrap_or(1000).min(1 << 40))
        }
        Request::Stop(args) => seconds(args.grace_s, 5.0),
        // A running item is stopped first (default grace and slack), then started.
        Request::Restart(args) => {
            Duration::from_secs(7)
                + Duration::from_millis(args.window_ms.unwrap_or(1000).min(1 << 40))
        }
        Request::Shutdown { stop_work: true } => Duration::from_secs(10),
        // A search reads a whole log (up to the cap), after the searches and big reads
        // ahead of it.
        Request::Read(args) if args.grep.is_some() => Duration::from_secs(60),
        _ => Duration::ZERO,
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// "pid N", with what can be seen of it: the pid is the one in the home's lock file.
pub fn describe_daemon(paths: &Paths) -> String {
    let pid = read_pid(&paths.lock);
    let Some(pid) = pid else {
        return "pid unknown".to_string();
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or("").trim_start();
    if state.starts_with('T') {
        format!("pid {pid}, which is stopped: `kill -CONT {pid}` resumes it")
    } else if stat.is_empty() {
        format!("pid {pid}, which is gone")
    } else {
        format!(
            "pid {pid}: it may be hung or overloaded; `kill {pid}` and a new call starts \
             another, and running work survives"
        )
    }
}

/// The pid a lock file holds (read without blocking, a few bytes at most).
pub(crate) fn read_pid(lock: &std::path::Path) -> Option<i32> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW)
        .open(lock)
        .ok()?;
    let mut text = String::new();
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse::<i32>().ok().filter(|&pid| pid > 0)
}

/// Connects to a Unix socket, waiting at most `patience` for room in a listener's queue
/// (a daemon that stopped accepting leaves a blocking `connect` hanging for ever).
fn connect_within(path: &std::path::Path, patience: Duration) -> std::io::Result<UnixStream> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let address = UnixAddr::new(path).map_err(std::io::Error::from)?;
    let deadline = Instant::now() + patience;
    loop {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        match nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &address) {
            Ok(()) => {
                let stream = UnixStream::from(fd);
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "its socket accepts no connection (its queue stayed full for {} s)",
                        patience.as_secs()
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether an error is the daemon's end of the connection: reset, or closed under a
/// write.
/// A connection the daemon closed with bytes of it unread (or before taking it).
fn is_reset(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
    )
}

fn is_dropped(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::UnexpectedEof
    )
}

/// The last line of a log file.
fn last_line(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().last().map(str::to_string)
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
                "refused to talk to {}: the process listening there runs as uid {}, not as \
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
        .args(["daemon", "--on-demand"])
        .env_remove("BGWORK_JOB")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(|e| unavailable("open the daemon log", e))?,
        )
        .stderr(log);
    if std::env::var_os("BGWORK_HOME").is_some_and(|h| !h.is_empty()) {
        // The home as this client resolved it: the daemon runs in `/`.
        command.env("BGWORK_HOME", &paths.home);
    }
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
