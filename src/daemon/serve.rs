//! Starting the daemon (lock, file descriptor limit, socket, store, reconcile) and its
//! accept loop, which hands each connection to `clients.rs`.
//!
//! Accept errors (out of file descriptors) back off and are logged once per burst.

use super::clients::hand_over;
use super::{Config, Daemon};
use crate::paths::{Paths, SocketPath};
use crate::store::Store;
use crate::supervisor::tree;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;

/// Client connections served at once, unless the file descriptor limit is lower.
const MAX_CONNECTIONS: usize = 512;
/// File descriptors left for everything but clients (jobs, the store, logs).
const FD_RESERVE: u64 = 64;
/// The longest pause between two attempts to accept while accepting fails.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(100);

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
    // What promoted runs' callers had sent reaches their jobs before the daemon goes
    // (each connection is shut, so its caller sends the rest to the next daemon).
    let mut passing = daemon.passing.subscribe();
    let _ = tokio::time::timeout(PASS_ON_AT_SHUTDOWN, passing.wait_for(|n| *n == 0)).await;
    match daemon.stopping_work() {
        true => crate::note!("bgwork daemon: shut down; its running work was stopped"),
        false => {
            crate::note!("bgwork daemon: shut down; running work goes on under its supervisors")
        }
    }
}

/// How long a daemon that shuts down waits for promoted runs' stdin, sent before it
/// shut their connections, to reach their jobs (a job that reads none of it holds it).
const PASS_ON_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);

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
