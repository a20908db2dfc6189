//! The boundary between the daemon and "where a job runs".
//!
//! The daemon asks an executor to start a job, to reattach to one after a restart, and
//! sends it commands (stop, signal, input) through a [`JobHandle`]; the executor reports
//! what happens as [`ExecEvent`]s on one channel. Output is never carried as events: it
//! lies in the job's log file, read by offset ([`crate::output`]). Today the one executor
//! is [`local::LocalExecutor`] (a supervisor process per job on this machine); a cluster
//! executor is a second implementation of the same calls and events.

pub mod local;
pub mod slurm;

use crate::wire::control::{ExitStatus, ToSupervisor};
use tokio::sync::{mpsc, oneshot};

/// What happens to a running job, as the executor sees it.
#[derive(Debug)]
pub enum ExecEvent {
    /// The job's process started.
    Spawned { row: i64, pid: i32 },
    /// The job could not start.
    SpawnFailed { row: i64, message: String },
    /// The job's output grew.
    Output {
        row: i64,
        log_len: u64,
        dropped: u64,
        unwritten: u64,
        unwritten_at: u64,
    },
    /// The job no longer reads its input.
    InputClosed { row: i64 },
    /// The job ended with this status.
    Ended { row: i64, status: ExitStatus },
    /// The connection to the job's supervisor was lost without an end.
    Detached { row: i64 },
}

/// Commands to one running job.
#[derive(Clone, Debug)]
pub struct JobHandle {
    commands: mpsc::UnboundedSender<Command>,
    /// Bytes of input sent to the supervisor and not answered yet.
    unanswered: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// The most input that may wait for a supervisor's answer: past it (a supervisor that
/// is stopped, say) writes are refused, so nothing piles up in the daemon.
const MAX_UNANSWERED: u64 = 8 << 20;

/// What the daemon asks of a job's connection.
#[derive(Debug)]
pub enum Command {
    /// A command that needs no answer.
    Send(ToSupervisor),
    /// Bytes for the job's stdin; answered with the bytes now waiting, or why not.
    Write {
        data: Vec<u8>,
        answer: oneshot::Sender<Result<u64, WriteRefused>>,
    },
}

/// Why input was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteRefused {
    /// The job has not read what waits yet: the same bytes may be taken later.
    Full(String),
    /// The job's stdin is closed: no input will ever be taken.
    Closed,
    /// The supervisor's connection is gone or did not answer: try again.
    Unreachable(String),
}

impl std::fmt::Display for WriteRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteRefused::Full(reason) | WriteRefused::Unreachable(reason) => f.write_str(reason),
            WriteRefused::Closed => f.write_str("its stdin is closed"),
        }
    }
}

impl JobHandle {
    pub fn new(
        commands: mpsc::UnboundedSender<Command>,
        unanswered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> JobHandle {
        JobHandle {
            commands,
            unanswered,
        }
    }

    /// Sends a command; false when the job's connection is gone.
    pub fn send(&self, command: ToSupervisor) -> bool {
        self.commands.send(Command::Send(command)).is_ok()
    }

    /// Writes to the job's stdin and waits until its supervisor has taken the bytes:
    /// `Ok(waiting)` with the bytes not yet read by the job, or why they were refused.
    pub async fn write(&self, data: Vec<u8>) -> Result<u64, WriteRefused> {
        use std::sync::atomic::Ordering;
        let len = data.len() as u64;
        // Counted until the supervisor answers (the relay takes it off), even when this
        // caller stops waiting.
        let before = self.unanswered.fetch_add(len, Ordering::SeqCst);
        if before > 0 && before + len > MAX_UNANSWERED {
            self.unanswered.fetch_sub(len, Ordering::SeqCst);
            return Err(WriteRefused::Unreachable(format!(
                "its supervisor has not answered for {before} bytes sent earlier (it may be \
                 stopped): nothing of this input was sent; try again later"
            )));
        }
        let (answer, answered) = oneshot::channel();
        if self.commands.send(Command::Write { data, answer }).is_err() {
            return Err(WriteRefused::Unreachable(
                "its supervisor is not connected: try again in a moment".into(),
            ));
        }
        answered.await.unwrap_or_else(|_| {
            Err(WriteRefused::Unreachable(
                "the connection to its supervisor closed before it answered: try again".into(),
            ))
        })
    }
}

/// A job that still runs, as `reattach` found it (the log's length is the file's own).
#[derive(Debug)]
pub struct Running {
    pub pid: i32,
    pub dropped: u64,
    pub unwritten: u64,
    pub unwritten_at: u64,
    pub handle: JobHandle,
}

/// What reattaching to a job found.
#[derive(Debug)]
pub enum Reattach {
    Running(Running),
    Ended(ExitStatus),
    Lost(String),
}

/// Input written to a supervisor, each write answered by its `seq`. A write is one
/// message, taken or refused whole (a `send` is at most a request frame, a run's stdin
/// comes in 64 KiB frames): no write is ever half taken.
#[derive(Default)]
pub(crate) struct Writes {
    pub next_seq: u64,
    pub waiting: std::collections::HashMap<u64, Waiting>,
    /// Bytes sent and not answered yet (shared with the job's handle).
    pub unanswered: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

pub(crate) struct Waiting {
    answer: tokio::sync::oneshot::Sender<Result<u64, WriteRefused>>,
    len: u64,
    sent: std::time::Instant,
}

impl Writes {
    /// The control line that carries `data`.
    pub fn ask(
        &mut self,
        data: Vec<u8>,
        answer: tokio::sync::oneshot::Sender<Result<u64, WriteRefused>>,
    ) -> Vec<Vec<u8>> {
        self.next_seq += 1;
        let len = data.len() as u64;
        let sent = std::time::Instant::now();
        self.waiting
            .insert(self.next_seq, Waiting { answer, len, sent });
        vec![crate::wire::control::encode(&ToSupervisor::Write {
            seq: self.next_seq,
            data,
        })]
    }

    pub fn answer(&mut self, seq: u64, result: Result<u64, WriteRefused>) {
        if let Some(waiting) = self.waiting.remove(&seq) {
            self.unanswered
                .fetch_sub(waiting.len, std::sync::atomic::Ordering::SeqCst);
            let _ = waiting.answer.send(result);
        }
    }

    /// Answers the writes sent longer than `patience` ago as unanswered.
    pub fn expire(&mut self, patience: std::time::Duration) {
        let overdue: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.sent.elapsed() >= patience)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in overdue {
            self.answer(
                seq,
                Err(WriteRefused::Unreachable(format!(
                    "its supervisor did not take the input within {} s: it may still \
                     reach the job",
                    patience.as_secs()
                ))),
            );
        }
    }
}
