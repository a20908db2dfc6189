//! `bgwork hook claude-code --rewake`: a Claude Code `Stop` hook run with
//! `asyncRewake: true`, which wakes an idle agent when its work ends.
//!
//! How it works: Claude Code starts the hook in the background at the end of each turn.
//! It waits (at most `--max-wait`) for the session's next notices, claimed for its
//! daemon connection (`notices` with `ack`), writes them on stderr and exits 2, which
//! Claude Code hands to the model as a notification that wakes it. The notices are
//! acknowledged only after stderr's reader has taken them, right before the exit: a
//! hook killed first (Escape, a timeout) closes its connection, and the daemon gives
//! them to the next puller with the same ids. It exits 0 with nothing on stderr when
//! the wait runs out, when the daemon does not answer a first look within the context
//! hooks' deadline, when the session has no work left that may fire a notice
//! (`Item::may_notify`: armed with `--notify`, a watch, `--quiet-after`, a restart
//! policy, a waiting item, a job with a usual time that may run long), or
//! when another rewake hook of the session is waiting already: one waiter per session
//! holds an `flock` on a file of the socket's folder, which the kernel releases with
//! the process, however it ends.

use crate::delivery::{max_notices_per_turn, show, Claimed, Delivery, OutKind};
use crate::paths::Paths;
use crate::wire::{Item, ListReply, Request, WireError};
use nix::fcntl::{Flock, FlockArg};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long the hook waits for its event on stdin (Claude Code writes it at once).
const EVENT_DEADLINE: Duration = Duration::from_secs(5);
/// How often a quiet wait checks that armed work is left and that stderr's reader is
/// still there.
const RECHECK: Duration = Duration::from_secs(5);

/// Waits for the session's next notices and hands them to Claude Code (exit 2), or
/// exits 0 in silence.
pub fn rewake(paths: &Paths, max_wait: Duration) -> ExitCode {
    let Some(event) = event_within(EVENT_DEADLINE) else {
        crate::note!(
            "bgwork hook --rewake: no JSON hook event on stdin within {} s; not waiting",
            EVENT_DEADLINE.as_secs()
        );
        return ExitCode::SUCCESS;
    };
    let session = super::session_of(&event);
    let Some(mut delivery) = answering(paths, &session) else {
        return ExitCode::SUCCESS;
    };
    let Some(lock) = Waiter::lock(paths, &session) else {
        return ExitCode::SUCCESS;
    };
    let told = wait_and_tell(&mut delivery, max_wait);
    drop(lock);
    match told {
        Ok(true) => ExitCode::from(2),
        Ok(false) => ExitCode::SUCCESS,
        Err(e) => {
            crate::note!("bgwork hook --rewake: {}", e.message);
            ExitCode::SUCCESS
        }
    }
}

/// A connection to a daemon that answered a first look (the session's list) within
/// the context hooks' deadline; `None`, after a note, when it did not: a stopped or
/// hung daemon is not waited on for the client's whole patience (`claude -p` waits for
/// its background hooks before it exits).
fn answering(paths: &Paths, session: &str) -> Option<Delivery> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let (worker_paths, session) = (paths.clone(), session.to_string());
    std::thread::spawn(move || {
        let looked = Delivery::connect(&worker_paths, &session).and_then(|mut delivery| {
            armed(&mut delivery)?;
            Ok(delivery)
        });
        let _ = sender.send(looked);
    });
    match receiver.recv_timeout(super::HOOK_DEADLINE) {
        Ok(Ok(delivery)) => Some(delivery),
        Ok(Err(e)) => {
            crate::note!("bgwork hook --rewake: {}", e.message);
            None
        }
        Err(_) => {
            crate::note!(
                "bgwork hook --rewake: no answer within {:.2} s from the daemon of {} ({}); not waiting: notices wait for the next turn",
                super::HOOK_DEADLINE.as_secs_f64(),
                paths.home.display(),
                crate::client::describe_daemon(paths)
            );
            None
        }
    }
}

/// The hook event, read on a thread so that a harness that never closes stdin cannot
/// hold the hook.
fn event_within(deadline: Duration) -> Option<serde_json::Value> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(super::read_event());
    });
    receiver.recv_timeout(deadline).ok().flatten()
}

/// Waits until notices come (writes them, acknowledges them: `true`), or until the wait
/// runs out, nothing armed is left or stderr's reader went away (`false`).
fn wait_and_tell(delivery: &mut Delivery, max_wait: Duration) -> Result<bool, WireError> {
    let deadline = Instant::now() + max_wait;
    // The first look does not wait: with nothing pending and nothing armed, the hook
    // ends at once.
    let mut wait = None;
    loop {
        // The daemon claims after its wait, even a wait that timed out: a notice that
        // arrives as the deadline passes is taken, not left behind.
        let claimed = delivery.claim(
            max_notices_per_turn(),
            wait.map(|w: Duration| w.as_secs_f64()),
        )?;
        if !claimed.is_empty() {
            return tell(delivery, &claimed);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || reader_gone() {
            return Ok(false);
        }
        if !armed(delivery)? {
            // An end records its notice with it: one more claim sees any notice of the
            // work that was armed a moment ago.
            let claimed = delivery.claim(max_notices_per_turn(), None)?;
            return if claimed.is_empty() {
                Ok(false)
            } else {
                tell(delivery, &claimed)
            };
        }
        wait = Some(left.min(RECHECK));
    }
}

/// Shows the notices on stderr; once its reader took them, acknowledges them.
fn tell(delivery: &mut Delivery, claimed: &Claimed) -> Result<bool, WireError> {
    let text = super::context(&claimed.notices, claimed.more);
    let stderr = std::io::stderr();
    let kind = OutKind::of(stderr.as_fd());
    if show(&mut stderr.lock(), kind, &text).is_err() {
        // Nobody read them: they stay pending (the connection's close releases them).
        return Ok(false);
    }
    delivery.acknowledge(&claimed.ids())?;
    Ok(true)
}

/// Whether the session has work that may still fire a notice ([`Item::may_notify`]:
/// armed with `--notify`, `--quiet-after`, a restart policy, a waiting item, a job
/// that may run long).
fn armed(delivery: &mut Delivery) -> Result<bool, WireError> {
    let request = delivery.envelope(Request::List {
        all: false,
        all_sessions: false,
    });
    let list: ListReply = delivery.client().call(&request)?;
    Ok(list.items.iter().any(Item::may_notify))
}

/// Whether stderr's reader went away (Claude Code ended): nobody would read a notice.
fn reader_gone() -> bool {
    let stderr = std::io::stderr();
    let mut fds = [PollFd::new(stderr.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0
        && fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)))
}

/// The one rewake waiter of a session: an exclusive `flock` on
/// `rewake-HASH.lock` in the socket's folder (checked private by the client).
struct Waiter {
    path: PathBuf,
    _lock: Flock<File>,
}

impl Waiter {
    /// The lock, or `None` when another waiter of the session holds it.
    fn lock(paths: &Paths, session: &str) -> Option<Waiter> {
        let path = paths
            .socket_dir()
            .join(format!("rewake-{:016x}.lock", fnv1a(session.as_bytes())));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .ok()?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()?;
        // The holder before us may have removed the file between our open and our lock:
        // only a lock on the file the path names now counts.
        let ours = lock.metadata().ok()?;
        let named = std::fs::symlink_metadata(&path).ok()?;
        (ours.ino() == named.ino() && ours.dev() == named.dev())
            .then_some(Waiter { path, _lock: lock })
    }
}

impl Drop for Waiter {
    /// Removed while still locked, so no file is left per session; a waiter killed
    /// leaves it, unlocked, for the next one.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// FNV-1a: a stable short name for a session of any length or characters.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
