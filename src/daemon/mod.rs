//! The daemon: owns the records, the live registry of running items, sessions, limits,
//! notices and waits, and serves the newline-delimited JSON protocol of [`crate::wire`]
//! on a Unix socket.
//!
//! How it works: one accept loop, one task per client connection, and one event task
//! that applies what executors report ([`ExecEvent`]) to the store. A change of records
//! or notices (a start, an end, a new notice) moves one `watch` counter
//! ([`Daemon::records_changed`]); output of an
//! item wakes only the watchers of that item, and its supervisor reports it promptly
//! only while someone waits on it ([`watchers`]). Waiters re-check their condition
//! when woken, so nothing polls. The store and the registry sit behind one mutex that
//! is never held across an `await`, nor while a reply is read from a log, encoded or
//! written.
//!
//! Delivery of notices (claim, deliver, acknowledge, release) is in [`delivery`]: a
//! reply that shows an end delivers its notice once written; clients that take notices
//! acknowledge what they showed (`ack`), and a connection that closes releases what it
//! still holds.

mod admission;
mod clients;
mod config;
mod connection;
mod delivery;
mod harness;
mod history;
mod jobs;
mod monitor;
mod output;
mod processes;
mod requests;
mod serve;
mod strip;

use admission::guard;
pub use config::Config;
use output::{pane, watchers};
pub use serve::{main, AlreadyServed};

use crate::executor::{ExecEvent, Executors, JobHandle};
use crate::paths::Paths;
use crate::store::{Store, StoreError};
use crate::wire::{Actor, Envelope, Request, State, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
pub(crate) use watchers::Pace;

/// Replies larger than [`BIG_REPLY`] bytes being built or written at once: with the
/// 16 MiB cap of `read`, this bounds what clients that do not read hold in memory.
pub(crate) const BIG_REPLIES: usize = 2;
/// What counts as a big reply (the size a read may reach).
pub(crate) const BIG_REPLY: usize = 1 << 20;

impl From<StoreError> for WireError {
    fn from(error: StoreError) -> Self {
        WireError::internal(error)
    }
}

/// A running item the daemon is connected to.
pub(crate) struct Live {
    pub handle: JobHandle,
    pub dropped: u64,
    pub input_closed: bool,
    /// Output bytes that could not be written (a full disk), and where they were lost.
    pub unwritten: u64,
    pub unwritten_at: u64,
}

impl Inner {
    /// Bytes the log cap has dropped from a record's log (live figure while it runs).
    pub fn dropped(&self, record: &crate::store::Record) -> u64 {
        self.live
            .get(&record.row)
            .map(|l| l.dropped)
            .unwrap_or(record.dropped)
    }

    /// Output bytes that could not be written to a record's log, and the log offset
    /// where the first was lost (live figures while it runs).
    pub fn unwritten(&self, record: &crate::store::Record) -> (u64, u64) {
        self.live
            .get(&record.row)
            .map(|l| (l.unwritten, l.unwritten_at))
            .unwrap_or((record.unwritten, record.unwritten_at))
    }
}

pub(crate) struct Inner {
    pub store: Store,
    pub live: HashMap<i64, Live>,
    /// Terminal emulators of running panes whose screen was read.
    pub screens: pane::Screens,
    /// Session names given out by `new_session` since this daemon started.
    pub claimed: std::collections::HashSet<String>,
    /// Recent starts of each root session (the start-rate guard).
    pub starts: guard::Starts,
    /// Jobs whose restart policy has a timer waiting for their next start.
    pub rerun_timers: std::collections::HashSet<i64>,
    /// Items a `restart` call is replacing now (a second call at once is refused), and
    /// those replaced a moment ago, with the id of their new item (a call that comes
    /// just after is refused too, naming it).
    pub restarting: std::collections::HashSet<i64>,
    pub replaced: HashMap<i64, (String, std::time::Instant)>,
    /// Runs waiting in the foreground, not yet promoted: none counts against another
    /// run's promotion (each may end, or be killed, first).
    pub foreground: std::collections::HashSet<i64>,
}

pub struct Daemon {
    pub paths: Paths,
    pub config: Config,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    /// Who waits on which item's output, and the pace of its supervisor (see
    /// [`watchers`]): output wakes only them, never the waiters of other items or
    /// of notices.
    output: watchers::OutputWatchers,
    /// Records whose end a reply in progress may show (a `start` in its window, a
    /// `wait`, a `run`), with how many replies: their end notices are left to those
    /// replies, not taken by a puller or a follower meanwhile.
    showing: Mutex<HashMap<i64, usize>>,
    /// Where jobs run: this machine, a Slurm cluster (`start --on slurm`).
    pub(crate) executors: Executors,
    shutdown: watch::Sender<bool>,
    /// A shutdown has begun: no new item is started.
    closing: std::sync::atomic::AtomicBool,
    /// The socket this daemon bound (device, inode): only that one is removed when it
    /// goes, never one a daemon of a new home at the same path bound since.
    socket_made: std::sync::OnceLock<(u64, u64)>,
    /// A shutdown with `--stop-work` has begun: an item that comes alive is stopped.
    stopping_all: std::sync::atomic::AtomicBool,
    /// The claim token of the next client connection.
    next_token: AtomicI64,
    /// Client connections being served.
    pub(crate) connections: AtomicUsize,
    /// The connections waiting for a request, oldest first (one gives way at the cap).
    pub(crate) idle: clients::IdleConnections,
    big_replies: Arc<Semaphore>,
    /// The work strip, once served (`ui`, `daemon --http`).
    pub(crate) http: tokio::sync::Mutex<Option<crate::http::Serving>>,
    /// What each waiting item waits for (`start --after`).
    pub(crate) waiting: jobs::after::Board,
    /// Promoted runs' connections whose rest of stdin is being passed on: a daemon
    /// that shuts down passes on what they sent before it goes.
    pub(crate) passing: watch::Sender<usize>,
    /// When a shutdown began (see [`Daemon::hand_over_by`]).
    shutdown_at: std::sync::OnceLock<tokio::time::Instant>,
}

impl Daemon {
    /// A daemon over an open store; returns it with the receiver of executor events.
    pub fn new(
        paths: Paths,
        config: Config,
        store: Store,
    ) -> (Arc<Daemon>, mpsc::UnboundedReceiver<ExecEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let daemon = Arc::new_cyclic(|me: &std::sync::Weak<Daemon>| {
            let me = me.clone();
            let output: crate::executor::OutputSink = Arc::new(move |event| {
                if let Some(daemon) = me.upgrade() {
                    daemon.apply_output(event);
                }
            });
            let executors = Executors::new(events, output, &paths.home, config.cgroups);
            Daemon::with_executors(paths, config, store, executors)
        });
        (daemon, receiver)
    }

    fn with_executors(paths: Paths, config: Config, store: Store, executors: Executors) -> Daemon {
        Daemon {
            paths,
            config,
            inner: Mutex::new(Inner {
                store,
                live: HashMap::new(),
                screens: pane::Screens::default(),
                claimed: Default::default(),
                starts: Default::default(),
                rerun_timers: Default::default(),
                restarting: Default::default(),
                replaced: Default::default(),
                foreground: Default::default(),
            }),
            changed: watch::channel(0).0,
            output: Default::default(),
            showing: Mutex::default(),
            executors,
            shutdown: watch::channel(false).0,
            closing: Default::default(),
            socket_made: Default::default(),
            stopping_all: Default::default(),
            next_token: AtomicI64::new(1),
            connections: AtomicUsize::new(0),
            idle: Default::default(),
            big_replies: Arc::new(Semaphore::new(BIG_REPLIES)),
            http: tokio::sync::Mutex::new(None),
            waiting: Default::default(),
            passing: watch::channel(0).0,
            shutdown_at: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the waiters of records and notices (it moves the one `watch` counter they
    /// listen to): an item started or ended, a notice came. Output does not (see
    /// [`Daemon::output_grew`]).
    pub(crate) fn records_changed(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// The records whose end a reply in progress may show (see [`Shown`]).
    pub(crate) fn showing_rows(&self) -> Vec<i64> {
        let showing = self.showing.lock().unwrap_or_else(|p| p.into_inner());
        showing.keys().copied().collect()
    }

    /// A receiver that changes when the output of any of `rows` grows; `pace` says how
    /// soon its holder needs to hear (see [`watchers`]).
    pub(crate) fn watch_output(&self, rows: &[i64], pace: Pace) -> watch::Receiver<()> {
        self.output.watch(rows, pace)
    }

    /// The output of `row` grew: wakes whoever watches it.
    pub(crate) fn output_grew(&self, row: i64) {
        self.output.grew(row);
    }

    /// Registers the connection to a running item's supervisor (which is told the
    /// pace its item's watchers need).
    pub(crate) fn go_live(&self, inner: &mut Inner, row: i64, live: Live) {
        self.output.attach(row, live.handle.clone());
        inner.live.insert(row, live);
        // Started (or taken back) while `shutdown --stop-work` stops everything.
        if self.stopping_all.load(Ordering::SeqCst) {
            self.stop_for_shutdown(inner, row);
        }
    }

    /// Forgets the connection to an item's supervisor (it ended, or is reconnected).
    pub(crate) fn end_live(&self, inner: &mut Inner, row: i64) {
        inner.live.remove(&row);
        self.output.detach(row);
    }

    /// Waits until `condition` holds or `timeout` passes, looking again when a record
    /// changes or the output of `row` grows; returns whether it held.
    pub(crate) async fn wait_for_item(
        &self,
        row: i64,
        timeout: Duration,
        mut condition: impl FnMut(&Daemon) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.changed.subscribe();
        let mut output = self.watch_output(&[row], Pace::Prompt);
        loop {
            if condition(self) {
                return true;
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = output.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return condition(self),
            }
        }
    }

    /// Waits until `condition` holds or `timeout` passes; returns whether it held.
    pub(crate) async fn wait_for(
        &self,
        timeout: Duration,
        mut condition: impl FnMut(&Daemon) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.changed.subscribe();
        loop {
            if condition(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return condition(self),
            }
        }
    }

    /// A receiver that changes when the output of `session`'s item `id` grows.
    pub(crate) fn output_changes(
        &self,
        session: &str,
        id: &str,
    ) -> Result<watch::Receiver<()>, WireError> {
        let row = Self::find(&self.lock(), session, id)?.row;
        Ok(self.watch_output(&[row], Pace::Prompt))
    }

    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Notes the socket this daemon serves (see [`Daemon::remove_socket`]).
    pub fn bound(&self) {
        if let Some(made) = crate::paths::identity(&self.paths.socket) {
            let _ = self.socket_made.set(made);
        }
    }

    /// Removes this daemon's socket, when the file at its path is still the one it
    /// bound.
    pub fn remove_socket(&self) {
        let ours = self.socket_made.get().copied();
        if ours.is_some() && crate::paths::identity(&self.paths.socket) == ours {
            let _ = std::fs::remove_file(&self.paths.socket);
        }
    }

    pub fn request_shutdown(&self) {
        // No new client may reach a daemon that is going: the next one starts another.
        self.remove_socket();
        let _ = self.shutdown_at.set(tokio::time::Instant::now());
        self.shutdown.send_replace(true);
    }

    /// Once a shutdown began: until when input waiting for a job that does not read is
    /// held here before it is given back to its caller (a promoted run's feeder, which
    /// sends it to the next daemon).
    pub(crate) fn hand_over_by(&self) -> Option<tokio::time::Instant> {
        self.shutdown_at.get().map(|at| *at + HAND_OVER)
    }

    /// Whether a `shutdown --stop-work` stops its work (said in the log as it ends).
    pub fn stopping_work(&self) -> bool {
        self.stopping_all.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// A fresh claim token for a client connection.
    pub(crate) fn new_token(&self) -> i64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    /// Waits for room to build a big reply (see [`BIG_REPLIES`]).
    pub(crate) async fn big_reply_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.big_replies.clone().acquire_owned().await.ok()
    }

    /// Serves one request whose reply is a single object, on the connection whose
    /// claim token is `token`.
    pub(crate) async fn dispatch(self: &Arc<Self>, envelope: Envelope, token: i64) -> Answer {
        use crate::wire::encode_result as reply;
        let session = envelope.session;
        if let Err(e) = self.check_session(&session) {
            return reply::<()>(&Err(e)).into();
        }
        // Records whose end the reply shows: the reply delivers their notices.
        let mut shown = Shown::new(self);
        let line = match envelope.request {
            Request::Start(args) if !args.after.is_empty() => {
                reply(&self.start_after(&session, args, &mut shown).await)
            }
            Request::Start(args) => reply(&self.start(&session, args, &mut shown).await),
            Request::List { all, all_sessions } => {
                reply(&self.list(&session, all, all_sessions).await)
            }
            Request::Read(args) if args.grep.is_some() => return self.grep(&session, args).await,
            Request::Read(args) if args.screen => {
                let screen = self.screen(&session, &args.id).await;
                if screen.as_ref().is_ok_and(|reply| !reply.running) {
                    // An ended pane's screen shows its end.
                    if let Ok(record) = Self::find(&self.lock(), &session, &args.id) {
                        shown.push(record.row);
                    }
                }
                reply(&screen)
            }
            Request::Read(args) => return self.read(&session, args, token).await,
            Request::Resize { id, cols, rows } => reply(&self.resize(&session, &id, cols, rows)),
            // A run needs its connection (streamed output, the caller's stdin): the
            // connection's server handles it.
            Request::Run(_) => reply::<()>(&Err(WireError::internal(
                "a run is served by its connection",
            ))),
            Request::Monitor(args) => reply(&match self.check_monitor_shows(&session, &args) {
                Ok(()) => self.monitor(&session, args).await,
                Err(e) => Err(e),
            }),
            Request::AgentStart(args) => reply(&self.agent_start(&session, args).await),
            Request::Send(args) => reply(&self.send(&session, &args).await),
            Request::Stop(args) => {
                let stopped = self.stop(&session, &args).await;
                // A reply that says the item ended shows its end, to the agent that asked
                // (a person's stop leaves the agent its notice).
                let ended = stopped
                    .as_ref()
                    .is_ok_and(|item| item.state == State::Ended);
                if ended && args.actor == Actor::Agent {
                    if let Ok(record) = Self::find(&self.lock(), &session, &args.id) {
                        shown.push(record.row);
                    }
                }
                reply(&stopped)
            }
            Request::Wait(args) => reply(&self.wait(&session, &args, &mut shown).await),
            Request::Notices {
                peek,
                wait_s,
                ack,
                limit,
                bind_harness,
                ..
            } => {
                // A hook's turn boundary binds and claims in one request.
                let unbound = bind_harness
                    .map(|harness| self.bind_harness(&session, &harness))
                    .and_then(|bound| bound.err().map(|e| e.message));
                return match self
                    .wait_notices(&session, peek, wait_s, limit, token)
                    .await
                {
                    Ok((mut notices, claimed)) => {
                        notices.unbound = unbound;
                        Answer {
                            line: reply(&Ok::<_, WireError>(notices)),
                            // Acknowledged: they stay claimed until `ack` or the close.
                            deliver: if ack { Vec::new() } else { claimed },
                            permit: None,
                        }
                    }
                    Err(e) => reply::<()>(&Err(e)).into(),
                };
            }
            Request::Ack { ids } => reply(&self.acknowledge(&session, token, &ids)),
            Request::Dismiss { id, ids } => {
                let ids: Vec<String> = id.into_iter().chain(ids).collect();
                reply(&self.dismiss(&session, &ids))
            }
            Request::Gc {
                older_than_s,
                all_ended,
            } => reply(&self.gc_with(older_than_s, all_ended)),
            Request::Restart(args) => reply(&self.restart(&session, args, &mut shown).await),
            Request::NewSession {
                base,
                harness,
                server,
            } => reply(&self.new_session(&base, harness.as_ref(), server.as_ref())),
            Request::BindHarness { harness } => reply(&self.bind_harness(&session, &harness)),
            Request::Status => reply(&self.status().await),
            Request::Ping => reply(&Ok::<_, WireError>(crate::wire::Ack {
                ok: true,
                message: format!("the daemon (pid {}) answers", std::process::id()),
            })),
            Request::Close { id } => reply(&self.close(&session, &id)),
            Request::Ui { port } => reply(&crate::http::ensure(&self.backend(), port).await),
            Request::Shutdown { stop_work } => reply(&self.shutdown(stop_work).await),
            Request::History { cwd, command } => reply(&self.history(&cwd, command.as_deref())),
        };
        Answer {
            line,
            deliver: self.claim_shown_ends(&session, token, &shown.rows),
            permit: None,
        }
    }
}

/// The ends a reply shows, so that it delivers their notices once written. While the
/// reply is in progress, the records it may show (`watch`) keep their end notices from
/// pullers and followers: a `start` whose job ends in its window, or a `wait` that
/// returns an end, is the one delivery of that notice.
pub(crate) struct Shown<'a> {
    daemon: &'a Daemon,
    watched: Vec<i64>,
    /// Records whose end the reply shows.
    pub rows: Vec<i64>,
}

impl<'a> Shown<'a> {
    pub(crate) fn new(daemon: &'a Daemon) -> Shown<'a> {
        Shown {
            daemon,
            watched: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// The reply may show the end of these records.
    pub(crate) fn watch(&mut self, rows: &[i64]) {
        let mut showing = self
            .daemon
            .showing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for &row in rows {
            *showing.entry(row).or_default() += 1;
            self.watched.push(row);
        }
    }

    /// The reply shows the end of `row`.
    pub(crate) fn push(&mut self, row: i64) {
        self.rows.push(row);
    }
}

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        if self.watched.is_empty() {
            return;
        }
        {
            let mut showing = self
                .daemon
                .showing
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for row in &self.watched {
                if let Some(count) = showing.get_mut(row) {
                    *count -= 1;
                    if *count == 0 {
                        showing.remove(row);
                    }
                }
            }
        }
        // Notices left to this reply that it did not show are anyone's again.
        self.daemon.records_changed();
    }
}

/// Resolves when the output an optional receiver of [`Daemon::watch_output`] watches
/// grows; never without one.
pub(crate) async fn output_changed(output: &mut Option<watch::Receiver<()>>) {
    let grew = match output {
        Some(receiver) => receiver.changed().await.is_ok(),
        None => false,
    };
    if !grew {
        std::future::pending::<()>().await;
    }
}

/// A reply line, and the notices it delivers once it has been written (claimed by its
/// connection; released if the write fails).
pub(crate) struct Answer {
    pub line: Vec<u8>,
    pub deliver: Vec<i64>,
    /// Held while a big reply is built and written.
    pub permit: Option<OwnedSemaphorePermit>,
}

impl From<Vec<u8>> for Answer {
    fn from(line: Vec<u8>) -> Self {
        Answer {
            line,
            deliver: Vec::new(),
            permit: None,
        }
    }
}

impl Daemon {
    /// A session name is 1 to [`MAX_SESSION`] bytes with no control character. `/` means
    /// nothing in a name a person gives (`proj/feature` is no sub-agent of `proj`:
    /// parenthood is stored, never read from a name), but the shape `…/sub-N` is kept
    /// for the sessions bgwork makes for sub-agents, so no one can take a sub-agent's
    /// name before it exists.
    pub(crate) fn check_session(&self, session: &str) -> Result<(), WireError> {
        if session.is_empty()
            || session.len() > MAX_SESSION
            || session.chars().any(char::is_control)
        {
            return Err(WireError::bad_request(format!(
                "the session name must be 1 to {MAX_SESSION} bytes with no control characters: \
                 set --session or BGWORK_SESSION"
            )));
        }
        let sub_agent_shape = session.rsplit_once('/').is_some_and(|(_, last)| {
            last.strip_prefix("sub-")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        if sub_agent_shape && !self.lock().store.is_sub_agent_session(session)? {
            return Err(WireError::bad_request(format!(
                "{session} has the shape of a sub-agent's session (SESSION/sub-N), which only \
                 `bgwork agent start` makes: choose a name that does not end in /sub-N"
            )));
        }
        Ok(())
    }
}

/// A command to `id` as its caller hears of it: one its executor cannot carry out is
/// the caller's error; a connection that is gone is not (the job ended or is being
/// reconnected, and its record says which).
pub(crate) fn sent(
    id: &str,
    result: Result<(), crate::executor::Refused>,
) -> Result<(), WireError> {
    match result {
        Err(crate::executor::Refused::Cannot(reason)) => {
            Err(WireError::refused(format!("{id}: {reason}")))
        }
        Ok(()) | Err(crate::executor::Refused::Gone) => Ok(()),
    }
}

/// The longest session name, in bytes.
pub(crate) const MAX_SESSION: usize = 256;

/// The id by which `viewer` addresses a record: its own id when the record is the
/// viewer's, else prefixed by the path of sub-agents from the viewer to its owner.
pub(crate) fn display_id(viewer: &str, record: &crate::store::Record) -> String {
    match record
        .session
        .strip_prefix(viewer)
        .and_then(|rest| rest.strip_prefix('/'))
    {
        Some(path) if record.session != viewer => format!("{path}/{}", record.id),
        _ => record.id.clone(),
    }
}

/// How long a daemon that shuts down tries to give a job input it does not read
/// before it gives the input back to its caller (within `serve.rs`'s wait for them).
const HAND_OVER: std::time::Duration = std::time::Duration::from_secs(3);
