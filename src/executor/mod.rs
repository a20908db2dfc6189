//! The boundary between the daemon and "where a job runs".
//!
//! Every executor implements [`Executor`]: it starts a job, reattaches to one after a
//! daemon restart, carries the daemon's commands (stop, signal, input, resize) through
//! a [`JobHandle`] (refusing at once, with the reason, what it cannot carry out), says
//! what `list` shows of a job ([`View`]) and whether a job's supervisor may still live,
//! and reports what happens as [`ExecEvent`]s on one channel. Output is never carried
//! as events: it lies in the job's log file, read by offset ([`crate::output`]).
//! [`Executors`] holds every executor of a daemon and is the one place that picks one:
//! by [`On`] for a new job, by the job's folder for a known one. Two implement it
//! today: [`local::LocalExecutor`] (a supervisor process per job on this machine),
//! [`slurm::SlurmExecutor`] (the same supervisor, on a node of a Slurm cluster) and
//! [`ssh::SshExecutor`] (a job of bgwork's own daemon on a host reached with ssh).

pub mod local;
pub mod slurm;
pub mod ssh;

use crate::wire::control::{ExitStatus, JobSpec, ToSupervisor};
use crate::wire::SlurmArgs;
use std::future::Future;
use std::path::Path;
use tokio::sync::{mpsc, oneshot};

/// Where a new job is to run, as `start --on` chose it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum On {
    /// This machine.
    #[default]
    Local,
    /// A Slurm cluster, with what the job asks of it.
    Slurm(SlurmArgs),
    /// A host reached with ssh (`ssh:HOST`).
    Ssh(String),
}

impl On {
    /// Where a start asks to run.
    pub fn of(args: &crate::wire::StartArgs) -> On {
        match (&args.slurm, &args.ssh) {
            (Some(slurm), _) => On::Slurm(slurm.clone()),
            (None, Some(host)) => On::Ssh(host.clone()),
            (None, None) => On::Local,
        }
    }

    /// Which executor runs it.
    pub fn which(&self) -> Which {
        match self {
            On::Local => Which::Local,
            On::Slurm(_) => Which::Slurm,
            On::Ssh(_) => Which::Ssh,
        }
    }

    /// The Slurm request of a start (none elsewhere), as `StartArgs` carries it.
    pub fn slurm_args(self) -> Option<SlurmArgs> {
        match self {
            On::Slurm(args) => Some(args),
            On::Local | On::Ssh(_) => None,
        }
    }

    /// The host of a start on one (none elsewhere), as `StartArgs` carries it.
    pub fn ssh_host(&self) -> Option<String> {
        match self {
            On::Ssh(host) => Some(host.clone()),
            On::Local | On::Slurm(_) => None,
        }
    }
}

/// Which executor runs a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Which {
    #[default]
    Local,
    Slurm,
    Ssh,
}

impl Which {
    /// Whether the job's processes run on this machine (its limits are this machine's:
    /// `max_running`; a cluster's jobs count against a limit of their own).
    pub fn is_local(self) -> bool {
        self == Which::Local
    }

    /// Whether a job started here waits in a scheduler's queue before it runs: `start`
    /// then answers at once (the job is `queued`), whatever its window.
    pub fn queues(self) -> bool {
        self == Which::Slurm
    }

    /// Whether a job run there has a cgroup of bgwork's (a cluster's allocation has
    /// the scheduler's own).
    pub fn own_cgroup(self) -> bool {
        self == Which::Local
    }

    /// Why a request that only this machine (or an ssh host, for a foreground `run`)
    /// can serve is refused there; none where it is served.
    pub fn refuses_here_only(self, what: HereOnly) -> Option<&'static str> {
        match (self, what) {
            (Which::Local, _) => None,
            (Which::Slurm, HereOnly::Run) => Some(
                "`run` runs in the foreground on this machine or an ssh host (--on ssh:HOST): \
                 `start --on slurm` sends work to Slurm",
            ),
            (Which::Slurm, HereOnly::SubAgent) => {
                Some("a sub-agent runs on this machine: start it without slurm")
            }
            // Streamed from the job's mirror here, promoted as a job there.
            (Which::Ssh, HereOnly::Run) => None,
            (Which::Ssh, HereOnly::SubAgent) => {
                Some("a sub-agent runs on this machine: start it without ssh:HOST")
            }
        }
    }
}

/// Requests that only this machine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HereOnly {
    /// A foreground `run`, streamed on the caller's connection.
    Run,
    /// A sub-agent, with its session and report file on this machine.
    SubAgent,
}

/// What `list` shows of a job, as its executor sees it.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub which: Which,
    /// The scheduler's reason while the job waits in its queue.
    pub queue_reason: Option<String>,
    /// The job's id in Slurm.
    pub slurm_job_id: Option<String>,
    /// The ssh host it runs on.
    pub host: Option<String>,
    /// "host H unreachable since T: …" while its link is down.
    pub unreachable: Option<String>,
    /// "on H: its jobs die when …": the job will not outlive a logout on its host.
    pub logout: Option<String>,
}

impl View {
    /// The executor's name as an item shows it (none for this machine).
    pub fn executor_name(&self) -> Option<&'static str> {
        match self.which {
            Which::Local => None,
            Which::Slurm => Some("slurm"),
            Which::Ssh => Some("ssh"),
        }
    }

    /// Whether a `lost` end's detail is the executor's own word (the node failed,
    /// Slurm forgot the job), which the report then gives as the reason.
    pub fn tells_loss(&self) -> bool {
        !self.which.is_local()
    }
}

/// What every executor does for the daemon. The daemon calls it through
/// [`Executors`], never knowing which one runs a job.
pub trait Executor {
    /// Hands a job to its supervisor and returns at once with its handle; `Spawned` (or
    /// `SpawnFailed`), `Output` and `Ended` follow as events. `Err`: nothing was
    /// started, with the reason.
    fn start(
        &self,
        row: i64,
        spec: &JobSpec,
        on: &On,
    ) -> impl Future<Output = Result<JobHandle, String>> + Send;

    /// Finds a job again after a daemon restart: still running (with a new handle),
    /// ended (its status), or lost (why). Never starts it again.
    fn reattach(
        &self,
        row: i64,
        job_dir: &Path,
        owner: &str,
    ) -> impl Future<Output = Reattach> + Send;

    /// What `list` shows of a job of this executor's; `None`: not one of its jobs.
    fn view(&self, row: i64, job_dir: &str) -> Option<View>;

    /// Whether a job's supervisor may still live although it does not answer (then
    /// the job is not lost: it is asked again).
    fn supervisor_alive(&self, job_dir: &Path) -> bool;

    /// Kills what is left of a job whose supervisor is gone (`key`: its `BGWORK_JOB`
    /// marker); returns how many processes it killed.
    fn sweep(&self, key: &str, job_dir: &Path) -> usize;

    /// Makes ready ahead of need what the next start takes (a warm supervisor).
    fn warm_up(&self) {}

    /// Takes `row` as its own from the moment its record exists, before the job has a
    /// folder to say so: every count of the daemon's limits then puts it under this
    /// executor, even while its start is still being handed over.
    fn claim(&self, _row: i64) {}
}

/// Every executor of a daemon: the one place that picks which one serves a job.
pub struct Executors {
    pub local: local::LocalExecutor,
    pub slurm: slurm::SlurmExecutor,
    pub ssh: ssh::SshExecutor,
}

/// Applies an [`ExecEvent::Output`] at once, on the task that read it: output progress,
/// the most frequent event by far, then wakes its item's waiters without passing
/// through the task that applies the other events (one wake of a task less per report).
/// Other events keep their queue, in order; a report applied this way is applied before
/// any event its executor sends after it (an end comes after its last output), and
/// applying it needs none sent before it (it updates a live item's figures and wakes
/// its watchers).
pub type OutputSink = std::sync::Arc<dyn Fn(ExecEvent) + Send + Sync>;

impl Executors {
    pub fn new(
        events: mpsc::UnboundedSender<ExecEvent>,
        output: OutputSink,
        home: &Path,
        cgroups: bool,
    ) -> Executors {
        Executors {
            slurm: slurm::SlurmExecutor::new(events.clone(), home),
            ssh: ssh::SshExecutor::new(events.clone(), home),
            local: local::LocalExecutor::new(events, output, cgroups),
        }
    }

    /// Starts a job where `on` says.
    pub async fn start(&self, row: i64, spec: &JobSpec, on: &On) -> Result<JobHandle, String> {
        match on.which() {
            Which::Local => self.local.start(row, spec, on).await,
            Which::Slurm => self.slurm.start(row, spec, on).await,
            Which::Ssh => self.ssh.start(row, spec, on).await,
        }
    }

    /// Finds a known job again, through the executor that ran it.
    pub async fn reattach(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        match self.which(row, &job_dir.display().to_string()) {
            Which::Local => self.local.reattach(row, job_dir, owner).await,
            Which::Slurm => self.slurm.reattach(row, job_dir, owner).await,
            Which::Ssh => self.ssh.reattach(row, job_dir, owner).await,
        }
    }

    /// Takes a new record as the job of the executor `on` names (see
    /// [`Executor::claim`]).
    pub fn claim(&self, row: i64, on: &On) {
        match on.which() {
            Which::Local => self.local.claim(row),
            Which::Slurm => self.slurm.claim(row),
            Which::Ssh => self.ssh.claim(row),
        }
    }

    /// What `list` shows of a job (a job no other executor claims is this machine's).
    pub fn view(&self, row: i64, job_dir: &str) -> View {
        self.slurm
            .view(row, job_dir)
            .or_else(|| self.ssh.view(row, job_dir))
            .or_else(|| self.local.view(row, job_dir))
            .unwrap_or_default()
    }

    /// Which executor runs (or ran) a job.
    pub fn which(&self, row: i64, job_dir: &str) -> Which {
        self.view(row, job_dir).which
    }

    /// Where a job ran, with what it asked of it: where its restart goes.
    pub fn on_of(&self, row: i64, job_dir: &str) -> On {
        match self.which(row, job_dir) {
            Which::Local => On::Local,
            Which::Slurm => slurm::args_of(Path::new(job_dir)).map_or(On::Local, On::Slurm),
            Which::Ssh => ssh::host_of(Path::new(job_dir)).map_or(On::Local, On::Ssh),
        }
    }

    pub fn supervisor_alive(&self, row: i64, job_dir: &Path) -> bool {
        match self.which(row, &job_dir.display().to_string()) {
            Which::Local => self.local.supervisor_alive(job_dir),
            Which::Slurm => self.slurm.supervisor_alive(job_dir),
            Which::Ssh => self.ssh.supervisor_alive(job_dir),
        }
    }

    pub fn sweep(&self, row: i64, key: &str, job_dir: &Path) -> usize {
        match self.which(row, &job_dir.display().to_string()) {
            Which::Local => self.local.sweep(key, job_dir),
            Which::Slurm => self.slurm.sweep(key, job_dir),
            Which::Ssh => self.ssh.sweep(key, job_dir),
        }
    }

    pub fn warm_up(&self) {
        self.local.warm_up();
        self.slurm.warm_up();
    }
}

/// What happens to a running job, as the executor sees it.
#[derive(Debug)]
pub enum ExecEvent {
    /// The job's process started.
    Spawned { row: i64, pid: i32 },
    /// The pid of a job taken back, learned after it was taken back (a job on an ssh
    /// host whose daemon was killed before it heard the pid).
    Pid { row: i64, pid: i32 },
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
    /// A run of a job with a restart policy ended; its supervisor waits to start it
    /// again (or for a stop).
    RunEnded {
        row: i64,
        between: crate::wire::control::BetweenRuns,
    },
    /// The connection to the job's supervisor was lost without an end.
    Detached { row: i64 },
}

/// Commands to one running job.
#[derive(Clone, Debug)]
pub struct JobHandle {
    commands: mpsc::UnboundedSender<Command>,
    /// Bytes of input sent to the supervisor and not answered yet.
    unanswered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// What its executor cannot carry out, and why (checked before anything is sent).
    refuses: fn(&ToSupervisor) -> Option<&'static str>,
}

/// Why a command did not go to a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The job's connection is gone (it ended, or its supervisor is being reconnected).
    Gone,
    /// Its executor cannot carry this command out: the reason, for the caller.
    Cannot(&'static str),
}

/// An executor that carries out every command.
pub fn carries_all(_: &ToSupervisor) -> Option<&'static str> {
    None
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
    /// A handle whose commands go to `commands`; `refuses` says which its executor
    /// cannot carry out ([`carries_all`]: none).
    pub fn new(
        commands: mpsc::UnboundedSender<Command>,
        unanswered: std::sync::Arc<std::sync::atomic::AtomicU64>,
        refuses: fn(&ToSupervisor) -> Option<&'static str>,
    ) -> JobHandle {
        JobHandle {
            commands,
            unanswered,
            refuses,
        }
    }

    /// Sends a command that needs no answer: refused at once when its executor cannot
    /// carry it out, or when the job's connection is gone.
    pub fn send(&self, command: ToSupervisor) -> Result<(), Refused> {
        if let Some(reason) = (self.refuses)(&command) {
            return Err(Refused::Cannot(reason));
        }
        self.commands
            .send(Command::Send(command))
            .map_err(|_| Refused::Gone)
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
    /// A run that ended while no daemon listened, whose job waits to start again.
    pub between: Option<crate::wire::control::BetweenRuns>,
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
