//! Starting the daemon (lock, file descriptor limit, socket, store, reconcile) and
//! serving client connections.
//!
//! A request is read with a hard bound ([`wire::MAX_FRAME`]) before any parsing; a peer of
//! another uid is refused; a malformed request gets a `bad_request` reply and the
//! connection goes on. `notices --follow` and `wait` watch the client's side of the
//! connection, so a client that goes away ends them and leaves everything else as it was.
//!
//! Bounds: at most `max_connections` clients at once (at the cap the oldest idle
//! connection is closed for the next one, which gets a refusal line only when none is
//! idle); a connection with no request in flight is closed after `idle_timeout`; a
//! reply is written in chunks, and a client that takes no byte of it for `write_stall`
//! is dropped. Accept errors (out of file descriptors) back off and are logged once
//! per burst.

use super::connection::{write_reply, FrameReader};
use super::{Config, Daemon};
use crate::paths::{Paths, SocketPath};
use crate::store::Store;
use crate::supervisor::tree;
use crate::wire::{self, Envelope, ErrorCode, Request, WireError};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};

/// Client connections served at once, unless the file descriptor limit is lower.
const MAX_CONNECTIONS: usize = 512;
/// File descriptors left for everything but clients (jobs, the store, logs).
const FD_RESERVE: u64 = 64;
/// The longest pause between two attempts to accept while accepting fails.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(100);
/// How long a connection at the cap waits for the idle one that gives way to close.
const GIVE_WAY_WAIT: Duration = Duration::from_secs(2);
/// A burst of accept failures is over when none happened for this long.
const ACCEPT_QUIET: Duration = Duration::from_secs(2);

/// How long a starting daemon waits for the home's lock before refusing.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The allocator keeps the memory of a freed reply for the next one. A `read` of a
/// megabyte builds its reply in a buffer of that size, which glibc otherwise maps fresh
/// and unmaps at every read: a page fault for each of its pages, half the daemon's CPU
/// time for such a read. Buffers up to 4 MiB come from the heap, and up to 4 MiB of
/// free heap stays mapped in each of at most two arenas (more kept the memory of ended
/// panes' screens, which the daemon must give back) (without that bound every
/// thread that builds a reply may have an arena of its own, each keeping as much);
/// bigger replies (at most 16 MiB) are mapped and unmapped as before.
fn keep_reply_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets three of the allocator's parameters, under its own lock; it
    // is called before the daemon starts a thread.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 2);
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 4 << 20);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}

/// `bgwork daemon`: takes the home's lock, binds the socket and serves until shutdown
/// (and the work strip on loopback port `http`, or where an earlier daemon served it).
pub fn main(http: Option<u16>) -> anyhow::Result<()> {
    keep_reply_memory();
    // Nothing a client left open reaches the daemon, its supervisors or their jobs.
    close_inherited_descriptors();
    // A daemon started from inside a job is no part of that job.
    crate::supervisor::cgroup::leave_job_cgroups();
    let paths = Paths::from_env();
    // Refuses a home or socket folder that another user made or may write in.
    paths.create_dirs()?;
    // One daemon per home (the lock lives in the home, whatever socket folder each
    // daemon was started with), and one per socket folder (two homes that share one
    // must not take the socket from each other).
    let home_lock = take_lock(&paths.lock, &paths.home)?;
    let socket_lock = match paths.socket_dir().join("daemon.lock") {
        lock if lock != paths.lock => Some(take_lock(&lock, &paths.socket)?),
        _ => None,
    };
    let fd_limit = raise_fd_limit();
    // New rows (and so job folders) start above every folder there is, even when the
    // database was lost.
    let floor = paths
        .job_folders()
        .iter()
        .map(|(row, _)| *row)
        .filter(|&row| row < crate::job_dir::MAX_JOB_FOLDER)
        .max()
        .unwrap_or(0);
    let mut store = Store::open(&paths.db, floor)?;
    crate::store::checkpoint_apart(&paths.db);
    // Claims of notices live only while the daemon that made them does.
    store.release_all_claims()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = bind(&paths)?;
        let mut config = Config::from_env();
        let fd_cap = fd_limit.saturating_sub(FD_RESERVE).max(16) as usize;
        config.max_connections = Some(
            config
                .max_connections
                .unwrap_or(MAX_CONNECTIONS.min(fd_cap)),
        );
        for refused in &config.refused {
            crate::note!("bgwork daemon: setting {refused}");
        }
        let (daemon, events) = Daemon::new(paths.clone(), config, store);
        daemon.bound();
        crate::note!(
            "bgwork daemon {} serving {} (pid {})",
            env!("CARGO_PKG_VERSION"),
            paths.socket.display(),
            std::process::id()
        );
        let shutdown = daemon.shutdown_signal();
        run(daemon.clone(), events, listener, shutdown, http).await;
        daemon.remove_socket();
        anyhow::Ok(())
    })?;
    drop(socket_lock);
    drop(home_lock);
    Ok(())
}

/// Another daemon holds the lock of the home (or of its socket folder).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AlreadyServed(String);

/// Takes the lock file at `path` for serving `what`, and writes this daemon's pid in it.
fn take_lock(path: &std::path::Path, what: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    // A daemon that was just killed holds the lock until its last thread is gone: give
    // it a moment before deciding that another daemon serves this home. One that is
    // alive serves it: this one gives up at once (waiting, it would take the home over
    // when that one is shut down, and serve a home nobody uses any more).
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    while lock.try_lock().is_err() && std::time::Instant::now() < deadline {
        if holder_alive(path) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if lock.try_lock().is_err() {
        let holder = std::fs::read_to_string(path).unwrap_or_default();
        return Err(AlreadyServed(format!(
            "another bgwork daemon (pid {}) already serves {}: use it, or `bgwork shutdown` first",
            holder.trim(),
            what.display()
        ))
        .into());
    }
    lock.set_len(0)?;
    write!(lock, "{}", std::process::id())?;
    Ok(lock)
}

/// Whether the daemon whose pid the lock file names is alive: not gone, and not a
/// zombie (the leader of a killed daemon is one while its last threads let go).
fn holder_alive(path: &std::path::Path) -> bool {
    crate::client::read_pid(path)
        .is_some_and(|pid| pid != std::process::id() as i32 && tree::running(pid))
}

/// Closes every descriptor above stderr that the process that started this daemon left
/// open without close-on-exec.
fn close_inherited_descriptors() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: nothing in this process owns these descriptors yet (this runs first
        // in `main`, before any file, socket or thread exists); the one read_dir used
        // to list them is closed by then or fails harmlessly with EBADF.
        unsafe { nix::libc::close(fd) };
    }
}

/// Raises the soft limit on open files to the hard limit (a daemon serves many clients;
/// it should not inherit the limit of whichever client started it). Returns the limit.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft >= hard {
        return soft;
    }
    // An unlimited hard limit cannot be the soft one: the kernel's ceiling is nr_open.
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    let target = hard.min(ceiling);
    match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        Ok(()) => target,
        Err(e) => {
            crate::note!(
                "bgwork daemon: could not raise the open-file limit from {soft} to {target}: {e}"
            );
            soft
        }
    }
}

/// Binds the socket under a restrictive umask and makes it 0600.
fn bind(paths: &Paths) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(&paths.socket);
    let short = SocketPath::new(&paths.socket)?;
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(&short.path);
    nix::sys::stat::umask(old);
    let listener = listener?;
    std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves `listener` (and the work strip, when asked) until `shutdown` turns true.
pub async fn run(
    daemon: Arc<Daemon>,
    events: tokio::sync::mpsc::UnboundedReceiver<crate::executor::ExecEvent>,
    listener: UnixListener,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    http: Option<u16>,
) {
    daemon.adopt_orphans();
    daemon.reconcile().await;
    tokio::spawn(daemon.clone().apply_events(events));
    daemon.resume_monitors();
    daemon.resume_waiting();
    daemon.executors.warm_up();
    tokio::spawn(end_when_home_goes(daemon.clone()));
    // Once records are reconciled (a page would show them half done).
    crate::http::resume(&daemon.backend(), http).await;
    if let Err(e) = daemon.gc() {
        crate::note!("bgwork daemon: gc at start failed: {}", e.message);
    }
    let me = nix::unistd::geteuid().as_raw();
    let cap = daemon.config.max_connections.unwrap_or(MAX_CONNECTIONS);
    let mut failing = AcceptFailures::default();
    let mut idle = IdleExit::new(daemon.config.exit_when_idle);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    failing.accepted();
                    hand_over(&daemon, stream, me, cap);
                }
                Err(e) => {
                    // Out of file descriptors, say: the connection stays queued, so
                    // retrying at once would spin.
                    let pause = failing.failed(&e);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => break,
                    }
                }
            },
            _ = shutdown.changed() => break,
            () = idle.tick() => {
                // A client that connects as the idle time runs out is served.
                if let Some(Ok((stream, _))) = futures_util::FutureExt::now_or_never(listener.accept()) {
                    idle.reset();
                    hand_over(&daemon, stream, me, cap);
                } else if idle.over(&daemon) {
                    crate::note!(
                        "bgwork daemon: no work and no client for {} ms: ending (BGWORK_EXIT_WHEN_IDLE_MS)",
                        idle.after.map_or(0, |d| d.as_millis())
                    );
                    daemon.request_shutdown();
                    break;
                }
            }
        }
    }
    crate::note!("bgwork daemon: shut down; running work goes on under its supervisors");
}

/// How often the daemon looks whether its home is still there.
const HOME_LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Ends the daemon, and the work it runs, once its home folder is removed (or another
/// folder took its place): nothing of that work could be read or told any more, and a
/// daemon serving no home would live on for nobody.
async fn end_when_home_goes(daemon: Arc<Daemon>) {
    use std::os::unix::fs::MetadataExt;
    let identity = |m: std::fs::Metadata| (m.dev(), m.ino());
    let Ok(home) = std::fs::metadata(&daemon.paths.home).map(identity) else {
        return;
    };
    loop {
        tokio::time::sleep(HOME_LOOK_EVERY).await;
        match std::fs::metadata(&daemon.paths.home).map(identity) {
            Ok(now) if now == home => continue,
            // Not known to be gone (a folder it may not look into, say).
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => continue,
            _ => {}
        }
        crate::note!(
            "bgwork daemon: its home {} was removed: stopping its work and ending",
            daemon.paths.home.display()
        );
        let _ = daemon.shutdown(true).await;
        return;
    }
}

/// Serves a connection just accepted, in a task of its own.
fn hand_over(daemon: &Arc<Daemon>, stream: UnixStream, me: u32, cap: usize) {
    let daemon = daemon.clone();
    match Slot::take(&daemon, cap) {
        Some(slot) => {
            tokio::spawn(async move { serve_client(daemon, stream, me, slot).await });
        }
        // At the cap the oldest idle connection gives way, so that idle connections (one
        // client's hundreds) never lock others out.
        None => {
            tokio::spawn(async move {
                match Slot::make_room(&daemon, cap, GIVE_WAY_WAIT).await {
                    Some(slot) => serve_client(daemon, stream, me, slot).await,
                    None => refuse(stream, cap).await,
                }
            });
        }
    }
}

/// `BGWORK_EXIT_WHEN_IDLE_MS`: since when the daemon has had no unsettled item (a job,
/// pane, monitor, waiting or restarting item keeps it) and no client connection.
struct IdleExit {
    after: Option<Duration>,
    since: Option<tokio::time::Instant>,
    every: Option<tokio::time::Interval>,
}

impl IdleExit {
    fn new(after: Option<Duration>) -> IdleExit {
        let every = after.map(|after| {
            let mut every = tokio::time::interval(
                (after / 4).clamp(Duration::from_millis(25), Duration::from_secs(1)),
            );
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every
        });
        IdleExit {
            after,
            since: None,
            every,
        }
    }

    /// The next look (never, when the daemon is not to end on its own).
    async fn tick(&mut self) {
        match self.every.as_mut() {
            Some(every) => {
                every.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    fn reset(&mut self) {
        self.since = None;
    }

    /// Whether it has been idle for its whole time now.
    fn over(&mut self, daemon: &Daemon) -> bool {
        let Some(after) = self.after else {
            return false;
        };
        let clients = daemon.connections.load(Ordering::Acquire);
        let work = daemon
            .lock()
            .store
            .unsettled()
            .map_or(true, |unsettled| !unsettled.is_empty());
        if clients > 0 || work {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        since.elapsed() >= after
    }
}

/// A burst of failing accepts: logged when it starts and once it is over (no failure
/// for [`ACCEPT_QUIET`]), with a growing pause between attempts.
#[derive(Default)]
struct AcceptFailures {
    /// Failures in the current burst, and when the last one happened.
    count: u64,
    last: Option<std::time::Instant>,
    pause: Duration,
}

impl AcceptFailures {
    /// Counts a failure; returns how long to wait before the next attempt.
    fn failed(&mut self, error: &std::io::Error) -> Duration {
        if self.last.is_none() {
            crate::note!(
                "bgwork daemon: accept failed: {error}; retrying with a pause (not logged again until accepting works for {} s)",
                ACCEPT_QUIET.as_secs()
            );
        }
        self.count += 1;
        self.last = Some(std::time::Instant::now());
        self.pause = (self.pause * 2).clamp(Duration::from_millis(1), ACCEPT_BACKOFF_MAX);
        self.pause
    }

    fn accepted(&mut self) {
        if self.last.is_some_and(|last| last.elapsed() >= ACCEPT_QUIET) {
            crate::note!(
                "bgwork daemon: accepting again; {} failed in that burst",
                crate::history::plural(self.count as usize, "attempt")
            );
            *self = AcceptFailures::default();
        } else if self.last.is_some() {
            self.pause = Duration::ZERO;
        }
    }
}

/// One of the `max_connections` places; given back when the connection ends.
struct Slot(Arc<Daemon>);

impl Slot {
    fn take(daemon: &Arc<Daemon>, cap: usize) -> Option<Slot> {
        let taken = daemon
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            });
        taken.ok().map(|_| Slot(daemon.clone()))
    }
}

impl Slot {
    /// A slot at the cap: the oldest idle connection is asked to give way, and hands its
    /// slot over to this one (so that no other caller waiting at the cap takes it); a
    /// connection just accepted may not wait for its request yet, so asking goes on
    /// until one is idle. None after `patience` (every connection is busy).
    async fn make_room(daemon: &Arc<Daemon>, cap: usize, patience: Duration) -> Option<Slot> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(slot) = Slot::take(daemon, cap) {
                return Some(slot);
            }
            if let Some(handed) = daemon.idle.close_oldest() {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if let Ok(Ok(slot)) = tokio::time::timeout(left, handed).await {
                    return Some(slot);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Where an idle connection told to give way sends its slot.
type Handover = tokio::sync::oneshot::Sender<Slot>;

/// The connections that wait for a request (no request in flight, no claim held), by
/// when they began to wait: at the connection cap the oldest is closed for a new one.
#[derive(Default)]
pub(crate) struct IdleConnections {
    waiting: std::sync::Mutex<(
        u64,
        std::collections::BTreeMap<u64, tokio::sync::oneshot::Sender<Handover>>,
    )>,
}

impl IdleConnections {
    /// Registers a connection that begins to wait; it is idle while the guard lives.
    fn begin(&self) -> IdleGuard<'_> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let seq = waiting.0;
        waiting.0 += 1;
        let (tell, told) = tokio::sync::oneshot::channel();
        waiting.1.insert(seq, tell);
        IdleGuard {
            list: self,
            seq,
            told: Some(told),
        }
    }

    /// Tells the oldest idle connection to close and hand its slot over: the slot
    /// comes on the receiver; none when no connection is idle.
    fn close_oldest(&self) -> Option<tokio::sync::oneshot::Receiver<Slot>> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((_, tell)) = waiting.1.pop_first() {
            let (handover, handed) = tokio::sync::oneshot::channel();
            if tell.send(handover).is_ok() {
                return Some(handed);
            }
        }
        None
    }
}

struct IdleGuard<'a> {
    list: &'a IdleConnections,
    seq: u64,
    told: Option<tokio::sync::oneshot::Receiver<Handover>>,
}

impl IdleGuard<'_> {
    /// Resolves, with where its slot goes, when this connection must give way.
    async fn told_to_close(&mut self) -> Handover {
        match self.told.as_mut() {
            Some(told) => match told.await {
                Ok(handover) => handover,
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

impl Drop for IdleGuard<'_> {
    fn drop(&mut self) {
        let mut waiting = self.list.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.1.remove(&self.seq);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The claims of one connection: whatever it still holds when it ends is released.
struct Claims {
    daemon: Arc<Daemon>,
    token: i64,
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.daemon.release_connection(self.token);
    }
}

/// Tells a client past the connection cap why it is refused, and closes.
async fn refuse(stream: UnixStream, cap: usize) {
    let (_, mut writer) = stream.into_split();
    let refusal = WireError::new(
        ErrorCode::Unavailable,
        format!(
            "refused: the daemon already serves {cap} connections, its cap; try again when \
             some close (idle ones close after a while; each `notices --follow`, `wait` and \
             MCP server holds one)"
        ),
    );
    let line = wire::encode_result::<()>(&Err(refusal));
    let _ = write_reply(&mut writer, &line, Duration::from_secs(1)).await;
}

async fn serve_client(daemon: Arc<Daemon>, stream: UnixStream, me: u32, slot: Slot) {
    let mut slot = Some(slot);
    let peer = stream.peer_cred().map(|c| c.uid());
    let (read_half, mut writer) = stream.into_split();
    let stall = daemon.config.write_stall;
    if peer.ok() != Some(me) {
        // Not a usage error of the caller's (exit 2): this daemon is not theirs to use.
        let refusal = WireError::new(
            ErrorCode::Unavailable,
            "refused: this daemon serves only its own user",
        );
        let _ = write_reply(
            &mut writer,
            &wire::encode_result::<()>(&Err(refusal)),
            stall,
        )
        .await;
        return;
    }
    let claims = Claims {
        daemon: daemon.clone(),
        token: daemon.new_token(),
    };
    let token = claims.token;
    let mut reader = FrameReader::new(read_half);
    loop {
        // Idle: no request in flight. A connection that holds notices awaiting its
        // `ack` (an MCP server between two calls) is not idle.
        let frame = if daemon.holds_claims(token) {
            reader.next().await
        } else {
            let mut idle = daemon.idle.begin();
            tokio::select! {
                waited = tokio::time::timeout(daemon.config.idle_timeout, reader.next()) => {
                    match waited {
                        Ok(frame) => frame,
                        Err(_) => return,
                    }
                }
                // The cap is reached and this is the oldest idle connection: its slot
                // goes to the new one.
                handover = idle.told_to_close() => {
                    if let Some(slot) = slot.take() {
                        let _ = handover.send(slot);
                    }
                    return;
                }
            }
        };
        let line = match frame {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error) => {
                let _ =
                    write_reply(&mut writer, &wire::encode_result::<()>(&Err(error)), stall).await;
                return;
            }
        };
        let envelope: Envelope = match serde_json::from_slice(&line) {
            Ok(envelope) => envelope,
            Err(e) => {
                let error = WireError::bad_request(format!(
                    "malformed request: {e}; send one JSON object per line with \"session\" and \"op\""
                ));
                let line = wire::encode_result::<()>(&Err(error));
                if write_reply(&mut writer, &line, stall).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let answer = match envelope.request {
            Request::Notices {
                peek, follow: true, ..
            } => {
                let session = envelope.session.clone();
                if let Err(error) = daemon.check_session(&session) {
                    let line = wire::encode_result::<()>(&Err(error));
                    let _ = write_reply(&mut writer, &line, stall).await;
                    return;
                }
                daemon
                    .follow_notices(&session, peek, token, &mut reader, &mut writer)
                    .await;
                return;
            }
            Request::Run(args) => {
                // The connection is the run's: its output, and the caller's stdin.
                let forward = args.stdin == wire::RunStdin::Forward;
                let mut shown = super::Shown::new(&daemon);
                let result = match daemon.check_session(&envelope.session) {
                    Ok(()) => {
                        let caller = super::requests::run::Caller {
                            reader: &mut reader,
                            writer: &mut writer,
                        };
                        daemon
                            .run(&envelope.session, args, caller, &mut shown)
                            .await
                    }
                    Err(e) => Err(e),
                };
                // A reply that shows the end delivers its notice, once written.
                let deliver = daemon.claim_shown_ends(&envelope.session, token, &shown.rows);
                drop(shown);
                let line = wire::encode_result(&result);
                if write_reply(&mut writer, &line, stall).await.is_err() {
                    daemon.release(token, &deliver);
                    return;
                }
                daemon.deliver(token, &deliver);
                if forward {
                    // What the caller sends after the reply is the rest of its stdin.
                    return;
                }
                continue;
            }
            Request::Wait(_)
            | Request::Notices {
                wait_s: Some(_), ..
            } => {
                tokio::select! {
                    answer = daemon.dispatch(envelope, token) => answer,
                    _ = reader.closed() => return,
                }
            }
            _ => daemon.dispatch(envelope, token).await,
        };
        let written = write_reply(&mut writer, &answer.line, stall).await;
        // The reply is out (or its client dropped): room for another big one.
        drop(answer.permit);
        if written.is_err() {
            daemon.release(token, &answer.deliver);
            return;
        }
        daemon.deliver(token, &answer.deliver);
    }
}
