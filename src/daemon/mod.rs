//! The daemon: owns the records, the live registry of running items, sessions, limits,
//! notices and waits, and serves the newline-delimited JSON protocol of [`crate::wire`]
//! on a Unix socket.
//!
//! How it works: one accept loop, one task per client connection, and one event task
//! that applies what executors report ([`ExecEvent`]) to the store. Every change that a
//! waiter may care about (an end, new output, a new notice) bumps one `watch` counter;
//! waiters re-check their condition when it moves, so nothing polls. The store and the
//! registry sit behind one mutex that is never held across an `await`.

mod config;
mod items;
mod jobs;
mod monitor;
mod notices;
mod pane;
mod read;
mod restart;
mod run;
mod serve;
mod settle;
mod wait;

pub use config::Config;
pub use serve::main;

use crate::executor::local::LocalExecutor;
use crate::executor::{ExecEvent, JobHandle};
use crate::paths::Paths;
use crate::store::{Store, StoreError};
use crate::wire::{Envelope, ErrorCode, Request, WireError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

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
    /// Terminal emulators of panes whose screen was read.
    pub screens: HashMap<i64, pane::Screen>,
    /// Session names given out by `new_session` since this daemon started.
    pub claimed: std::collections::HashSet<String>,
}

pub struct Daemon {
    pub paths: Paths,
    pub config: Config,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    pub(crate) executor: LocalExecutor,
    shutdown: watch::Sender<bool>,
}

impl Daemon {
    /// A daemon over an open store; returns it with the receiver of executor events.
    pub fn new(
        paths: Paths,
        config: Config,
        store: Store,
    ) -> (Arc<Daemon>, mpsc::UnboundedReceiver<ExecEvent>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let daemon = Daemon {
            paths,
            config,
            inner: Mutex::new(Inner {
                store,
                live: HashMap::new(),
                screens: HashMap::new(),
                claimed: Default::default(),
            }),
            changed: watch::channel(0).0,
            executor: LocalExecutor::new(events),
            shutdown: watch::channel(false).0,
        };
        (Arc::new(daemon), receiver)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes every waiter: something it may wait for happened.
    pub(crate) fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
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

    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn request_shutdown(&self) {
        // No new client may reach a daemon that is going: the next one starts another.
        let _ = std::fs::remove_file(&self.paths.socket);
        self.shutdown.send_replace(true);
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Serves one request whose reply is a single object.
    pub(crate) async fn dispatch(self: &Arc<Self>, envelope: Envelope) -> Answer {
        use crate::wire::encode_result as reply;
        let session = envelope.session;
        if let Err(e) = check_session(&session) {
            return reply::<()>(&Err(e)).into();
        }
        let line = match envelope.request {
            Request::Start(args) => reply(&self.start(&session, args).await),
            Request::List { all, all_sessions } => reply(&self.list(&session, all, all_sessions)),
            Request::Read(args) if args.screen => reply(&self.screen(&session, &args.id)),
            Request::Read(args) => reply(&self.read(&session, &args)),
            Request::Resize { id, cols, rows } => reply(&self.resize(&session, &id, cols, rows)),
            Request::Run(args) => reply(&self.run(&session, args).await),
            Request::Monitor(args) => reply(&self.monitor(&session, args).await),
            Request::AgentStart(args) => reply(&self.agent_start(&session, args).await),
            Request::Send(args) => reply(&self.send(&session, &args).await),
            Request::Stop(args) => reply(&self.stop(&session, &args).await),
            Request::Wait(args) => reply(&self.wait(&session, &args).await),
            Request::Notices { peek, wait_s, .. } => {
                return match self.wait_notices(&session, peek, wait_s).await {
                    Ok((notices, deliver)) => Answer {
                        line: reply(&Ok::<_, WireError>(notices)),
                        deliver,
                    },
                    Err(e) => reply::<()>(&Err(e)).into(),
                };
            }
            Request::Dismiss { id, ids } => {
                let ids: Vec<String> = id.into_iter().chain(ids).collect();
                reply(&self.dismiss(&session, &ids))
            }
            Request::Gc {
                older_than_s,
                all_ended,
            } => reply(&self.gc_with(older_than_s, all_ended)),
            Request::Restart(args) => reply(&self.restart(&session, args).await),
            Request::NewSession { base } => reply(&self.new_session(&base)),
            Request::Status => reply(&self.status()),
            Request::Shutdown { stop_work } => reply(&self.shutdown(stop_work).await),
        };
        line.into()
    }
}

/// A reply line, and the notices it delivers once it has been written.
pub(crate) struct Answer {
    pub line: Vec<u8>,
    pub deliver: Vec<i64>,
}

impl From<Vec<u8>> for Answer {
    fn from(line: Vec<u8>) -> Self {
        Answer {
            line,
            deliver: Vec::new(),
        }
    }
}

fn check_session(session: &str) -> Result<(), WireError> {
    if session.is_empty() || session.contains('\0') || session.len() > 256 {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            "the session name must be 1 to 256 bytes without NUL: set --session or BGWORK_SESSION",
        ));
    }
    Ok(())
}
