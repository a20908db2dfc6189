//! The per-job supervisor (`bgwork supervise`, hidden): the job's parent for its whole life.
//!
//! How it works: the daemon starts this process with a connected socket on its stdin
//! (fd 0) and writes the [`JobSpec`] to it. The supervisor leaves the daemon's session (`setsid`),
//! becomes a child subreaper, and runs `bash -c COMMAND` in a process group of its own
//! with stdout and stderr on one pipe (so they interleave in write order) and stdin on
//! another. One `poll` loop then serves the output pipe (copied into the [`OutputLog`]),
//! a signalfd for SIGCHLD (`waitpid` gives the real status), the control socket
//! `control.sock` in the job's folder (daemons reconnect there after a restart), and the
//! stop timer. When the job's main process has ended, leftover processes of the job get
//! TERM then KILL, the output is drained, and the status is written atomically (a temp
//! file written over room made at the start, then renamed; no fsync) before the daemon
//! is told: a daemon that was away reads it later.
//! The supervisor needs no daemon to do any of this: its life does not depend on one.

pub(crate) mod cgroup;
mod conn;
mod log;
mod spawn;
pub mod tree;

use crate::job_dir::JobDir;
use crate::paths::{now_ms, SocketPath};
use crate::redact::{Secrets, StreamMask};
use crate::wire::control::{
    self, BetweenRuns, ExitStatus, FromSupervisor, JobSpec, ToSupervisor, PROTOCOL,
};
use crate::wire::Actor;
use conn::Conn;
use log::OutputLog;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The descriptor on which the daemon hands a new supervisor its launch socket: its
/// stdin, so that the daemon can spawn it without a hook between fork and exec.
pub const LAUNCH_FD: i32 = 0;

/// The longest command line a supervisor takes, on a connection or from a file (input
/// is the longest command).
pub const MAX_COMMAND_LINE: usize = conn::MAX_LINE;

/// Output is read from the pipe in chunks of this size.
const READ_CHUNK: usize = 1 << 20;
/// Output progress goes to the daemon at most this often while output streams, when
/// it asked for a prompt pace or the log's dropped or unwritten bytes changed.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(2);
/// The slowest pace a daemon may ask for.
const SLOWEST_PACE: Duration = Duration::from_secs(1);
/// How long a supervisor whose job ended keeps trying to write the status file.
const STATUS_PATIENCE: Duration = Duration::from_secs(24 * 3600);
/// The room a status file is given when the job starts, so that it can be written
/// when the job ends even if the disk is full by then.
const STATUS_ROOM: usize = 4096;
/// Input accepted for a job that has not read it yet, at most.
const INPUT_QUEUE_MAX: usize = 8 << 20;
/// After the job's processes are gone, output still buffered is drained for this long.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How often a supervisor started from a spec file looks for commands.
const COMMANDS_EVERY: Duration = Duration::from_millis(100);

/// Commands that reach a supervisor other than on its control connections: a job that
/// a cluster's scheduler started has no daemon connected, and takes its commands from
/// files in its folder (the Slurm executor's `slurm::CommandFiles`).
pub trait CommandSource {
    /// The commands left for the job of `job_dir` since it last looked, in the order
    /// they were left.
    fn take(&mut self, job_dir: &Path) -> Vec<ToSupervisor>;
    /// Answers input that came this way (`InputTaken` or `InputRefused`, by its `seq`).
    fn answer(&mut self, job_dir: &Path, seq: u64, answer: &FromSupervisor);
}

/// Where a supervisor's job comes from.
pub enum Launch {
    /// The launch socket the daemon started this process with (its stdin); `cgroup`:
    /// the job's cgroup is made while the spec is awaited.
    Socket { cgroup: bool },
    /// A launch socket made here (a job that a cluster's scheduler started hands over
    /// no socket), once the signals are blocked (making it may start a thread), and
    /// where that job's commands come from instead of a daemon's connection.
    Made {
        make: Box<dyn FnOnce() -> std::io::Result<UnixStream>>,
        commands: Box<dyn CommandSource>,
    },
}

/// Runs one job to its end. Called by `bgwork supervise`; never returns to a caller.
pub fn run(launch: Launch) -> ! {
    // Before any thread is made (the spec file's reader): a signal the kernel gives a
    // thread that does not block it is lost to the signalfd, and a lost SIGCHLD would
    // leave the job's end unseen.
    if let Err(e) = handled_signals().thread_block() {
        crate::note!("bgwork supervise: could not block signals: {e}");
        std::process::exit(1);
    }
    let mut early_cgroup = false;
    let (launch, commands) = match launch {
        // SAFETY: the daemon starts every supervisor with its launch socket on LAUNCH_FD
        // and nothing else in this process owns that descriptor.
        Launch::Socket { cgroup } => {
            early_cgroup = cgroup;
            (unsafe { UnixStream::from_raw_fd(LAUNCH_FD) }, None)
        }
        Launch::Made { make, commands } => match make() {
            Ok(launch) => (launch, Some(commands)),
            Err(e) => {
                crate::note!("bgwork supervise: {e}");
                std::process::exit(1);
            }
        },
    };
    // First of all, leave the daemon's session: nothing that happens to it reaches us.
    let _ = nix::unistd::setsid();
    // The job must not inherit the daemon's connection.
    let _ = nix::fcntl::fcntl(
        &launch,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    // Moving into a cgroup takes milliseconds (the kernel waits for its readers): a
    // warm supervisor does it before its job is known, not while the caller waits.
    let cgroup = early_cgroup.then(job_cgroup).flatten();
    let code = match Supervisor::launch(launch, cgroup.clone()) {
        Ok(mut supervisor) => {
            supervisor.commands = commands;
            supervisor.serve();
            0
        }
        Err(e) => {
            if let Some(dir) = &cgroup {
                cgroup::leave(dir);
            }
            crate::note!("bgwork supervise: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// Makes this supervisor's job cgroup (`bgwork-PID-START`) and moves into it, where one
/// can be made.
fn job_cgroup() -> Option<PathBuf> {
    cgroup::remove_stale(|pid, start| tree::start_time(pid) == Some(start));
    let me = std::process::id() as i32;
    let start = tree::start_time(me)?;
    cgroup::enter(&format!("bgwork-{me}-{start}"))
}

/// The signals the supervisor takes through its signalfd.
fn handled_signals() -> SigSet {
    let mut mask = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        mask.add(signal);
    }
    mask
}

/// How the job's main process ended: its exit code, or the signal that ended it.
type MainEnd = (Option<i32>, Option<i32>);

/// Where the job is in its life; each phase carries what it needs.
///
/// `Running` → (a stop) `Stopping` → (the grace is over: KILL) `Running` until reaped;
/// reaped with processes left → `Lingering` → (KILL) `Draining`; reaped with none left
/// → `Draining`; drained and nothing left → the end is written.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The main process runs.
    Running,
    /// A stop sent TERM to the job's tree; KILL follows at `kill_at`, and the end then
    /// says the job was killed after `grace`.
    Stopping { kill_at: Instant, grace: Duration },
    /// The main process ended; what it left behind got TERM, and KILL at `kill_at`.
    Lingering { main: MainEnd, kill_at: Instant },
    /// The main process ended and nothing is left to signal: output still held open
    /// is read until `until`.
    Draining { main: MainEnd, until: Instant },
}

impl Phase {
    /// How the main process ended, once it has.
    fn main_end(&self) -> Option<MainEnd> {
        match *self {
            Phase::Running | Phase::Stopping { .. } => None,
            Phase::Lingering { main, .. } | Phase::Draining { main, .. } => Some(main),
        }
    }

    /// When the next KILL is due.
    fn kill_at(&self) -> Option<Instant> {
        match *self {
            Phase::Stopping { kill_at, .. } | Phase::Lingering { kill_at, .. } => Some(kill_at),
            Phase::Running | Phase::Draining { .. } => None,
        }
    }
}

struct Supervisor {
    spec: JobSpec,
    /// The job's status once it has ended (kept while it cannot be written).
    final_status: Option<ExitStatus>,
    me: i32,
    /// The job's cgroup, left and removed once every process of the job is gone.
    cgroup: Option<PathBuf>,
    pid: i32,
    log: OutputLog,
    output: Option<File>,
    stdin: Option<File>,
    /// The pane's terminal (for resizing), when the job runs on one.
    pty: Option<pty_process::blocking::Pty>,
    input_queue: Vec<u8>,
    /// End-of-input was asked for: stdin closes once the queued input is written.
    close_input: bool,
    listener: UnixListener,
    conns: Vec<Conn>,
    signals: SignalFd,
    phase: Phase,
    /// Output read into here when it cannot be spliced (one buffer for life).
    buffer: Vec<u8>,
    /// Whether output goes pipe → log by `splice` (never when it is masked).
    splicing: bool,
    /// The masking of the job's secrets, for a job that has any.
    mask: Option<StreamMask>,
    /// Masked output on its way to the log (one buffer for life).
    masked: Vec<u8>,
    /// The unmasked output (`--keep-raw-log` of a job with secrets).
    raw_log: Option<OutputLog>,
    progress_due: bool,
    last_progress: Instant,
    /// How often output progress may go to the daemon (it sets the pace).
    pace: Duration,
    /// The log's dropped and unwritten figures as last reported.
    reported: (u64, u64, u64),
    stop_actor: Option<Actor>,
    /// Set when a stop had to KILL the job: the grace its TERM got.
    killed_after_ms: Option<u64>,
    /// When the job has run past its `max_runtime_ms` and is stopped (none: no limit).
    limit_at: Option<Instant>,
    past_limit: bool,
    /// When the job's tree is next sampled for its memory, and the most it held.
    sample_at: Instant,
    sample_every: Duration,
    peak_rss: u64,
    /// Where commands come from besides the control connections (a supervisor under
    /// Slurm: files in its folder).
    commands: Option<Box<dyn CommandSource>>,
    commands_at: Instant,
    /// The figures last written to [`JobDir::FIGURES`]: dropped, unwritten, unwritten at.
    figures_written: (u64, u64, u64),
    /// The job's run (0 for the first; a restart policy starts more, see `rerun`).
    run: u32,
    /// While a run has ended and the job waits to be started again.
    between: Option<BetweenRuns>,
    /// The supervisor itself got TERM or INT: no run is started again.
    terminated: bool,
    /// Why the job could not be started again, when it could not.
    rerun_failed: Option<String>,
    /// The job's folder as it was made (device, inode), and when it is next looked at:
    /// a folder removed (its home deleted) or replaced (a new home's job of the same
    /// number) is no longer this job's, and nothing more is written in it.
    folder: Option<(u64, u64)>,
    folder_at: Instant,
    /// The folder was found removed or replaced.
    folder_gone: bool,
}

/// How often a supervisor looks whether its job's folder is still its own.
const FOLDER_EVERY: Duration = Duration::from_secs(1);
/// The grace of a job whose folder is gone (nothing can read it, or hear of its end).
const FOLDER_GONE_GRACE: Duration = Duration::from_secs(2);

/// The first samples of a job's memory come quickly (short jobs), then ever more
/// slowly, down to one every few seconds (a thousand idle jobs cost little).
const FIRST_SAMPLE: Duration = Duration::from_millis(50);
const SAMPLE_EVERY: Duration = Duration::from_secs(4);

impl Supervisor {
    /// Takes the job's spec from `launch` and starts it; `made`: the cgroup made for it
    /// already (left when the spec wants none).
    fn launch(launch: UnixStream, made: Option<PathBuf>) -> std::io::Result<Supervisor> {
        let mut reader = BufReader::new(launch.try_clone()?);
        let mut line = Vec::new();
        reader.read_until(b'\n', &mut line)?;
        let already_read = reader.buffer().to_vec();
        let mut spec: JobSpec = control::decode(&line).map_err(std::io::Error::other)?;
        let mut first = Conn::new(launch, already_read)?;
        if spec.protocol != PROTOCOL {
            let message = format!(
                "supervisor speaks protocol {PROTOCOL}, not {}",
                spec.protocol
            );
            first.send(&FromSupervisor::SpawnFailed { message });
            first.flush_blocking(Duration::from_secs(1));
            return Err(std::io::Error::other("protocol mismatch"));
        }
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let _ = std::env::set_current_dir("/");
        let mask = handled_signals();
        mask.thread_block()?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;

        let job_dir = PathBuf::from(&spec.job_dir);
        redirect_stderr(&JobDir(&job_dir).supervisor_log());
        reserve_status(&job_dir);
        let log_file = File::create(JobDir(&job_dir).log())?;
        let log = OutputLog::new(log_file, spec.log_cap, spec.log_head);
        // The values stay in this process's memory only, in the automaton.
        let mask = Secrets::new(&std::mem::take(&mut spec.secrets)).map(StreamMask::new);
        let raw_log = match mask.is_some() && spec.keep_raw_log {
            true => {
                let file = File::create(JobDir(&job_dir).raw_log())?;
                Some(OutputLog::new(file, spec.log_cap, spec.log_head))
            }
            false => None,
        };
        let socket_path = JobDir(&job_dir).control_socket();
        let _ = std::fs::remove_file(&socket_path);
        let short = SocketPath::new(&socket_path)?;
        let listener = UnixListener::bind(&short.path)?;
        listener.set_nonblocking(true)?;

        // The job's cgroup, where one can be made: every process of the job is born in it.
        let me = std::process::id() as i32;
        let my_start = tree::start_time(me);
        let cgroup = match (made, spec.no_cgroup) {
            (Some(dir), true) => {
                cgroup::leave(&dir);
                None
            }
            (Some(dir), false) => Some(dir),
            (None, true) => None,
            (None, false) => job_cgroup(),
        };
        let spawned = match spawn::spawn_job(&spec) {
            Ok(spawned) => spawned,
            Err(e) => {
                if let Some(dir) = &cgroup {
                    cgroup::leave(dir);
                }
                let message = spawn::spawn_message(&spec, &e);
                write_not_started(&job_dir, &spec.owner, &message)?;
                let _ = std::fs::remove_file(&socket_path);
                first.send(&FromSupervisor::SpawnFailed { message });
                first.flush_blocking(Duration::from_secs(1));
                return Err(e);
            }
        };
        let record = tree::TreeRecord {
            supervisor: my_start.map(|start| (me, start)),
            job: tree::start_time(spawned.pid).map(|start| (spawned.pid, start)),
            cgroup: cgroup.clone(),
        };
        if let Err(e) = record.write(&job_dir) {
            crate::note!("bgwork supervise: could not record the job's processes: {e}");
        }
        first.send(&FromSupervisor::Spawned { pid: spawned.pid });
        Ok(Supervisor {
            final_status: None,
            me,
            cgroup,
            pid: spawned.pid,
            log,
            output: Some(spawned.output),
            stdin: Some(spawned.input),
            pty: spawned.pty,
            input_queue: Vec::new(),
            close_input: false,
            listener,
            conns: vec![first],
            signals,
            phase: Phase::Running,
            buffer: vec![0u8; READ_CHUNK],
            splicing: mask.is_none(),
            mask,
            masked: Vec::new(),
            raw_log,
            progress_due: false,
            last_progress: Instant::now(),
            pace: spec.progress_every_ms.map_or(PROGRESS_INTERVAL, pace_of),
            reported: (0, 0, 0),
            stop_actor: None,
            killed_after_ms: None,
            limit_at: spec
                .max_runtime_ms
                .map(|ms| Instant::now() + Duration::from_millis(ms)),
            past_limit: false,
            sample_at: Instant::now() + FIRST_SAMPLE,
            sample_every: FIRST_SAMPLE,
            peak_rss: 0,
            commands: None,
            commands_at: Instant::now(),
            figures_written: (0, 0, 0),
            run: 0,
            between: None,
            terminated: false,
            rerun_failed: None,
            folder: crate::paths::identity(&job_dir),
            folder_at: Instant::now() + FOLDER_EVERY,
            folder_gone: false,
            spec,
        })
    }

    fn serve(&mut self) {
        let pending: Vec<ToSupervisor> = self.conns[0].take_messages();
        for message in pending {
            self.handle(0, message);
        }
        loop {
            while !self.finished() {
                self.poll_once();
                self.report_progress(false);
                self.escalate_when_due();
                self.limit_when_due();
                self.sample_when_due();
                self.commands_when_due();
                self.folder_when_due();
            }
            if !self.wait_between_runs() {
                break;
            }
        }
        self.finish();
    }

    /// A run that ended failed or signaled (not by a stop, not past its limit, not by
    /// a TERM to this supervisor), with restarts left: the daemon is told, and this
    /// waits for its `rerun` (true: the job runs again) or a stop (false: the end is
    /// written). Without a daemon it waits, so a daemon that comes back finds it.
    fn wait_between_runs(&mut self) -> bool {
        let Some(rule) = self.spec.restart else {
            return false;
        };
        if self.output.is_some() {
            self.read_output();
        }
        self.output = None;
        self.flush_mask();
        let status = self.run_status();
        let end = crate::end::classify(&status, self.pty.is_some());
        let restartable = matches!(end, crate::wire::End::Failed | crate::wire::End::Signaled)
            && status.past_limit_ms.is_none()
            && !self.terminated
            && !self.folder_gone;
        if !restartable || self.run >= rule.max_restarts {
            return false;
        }
        let between = BetweenRuns {
            run: self.run,
            status,
        };
        self.between = Some(between.clone());
        for conn in &mut self.conns {
            conn.send(&FromSupervisor::RunEnded {
                between: Box::new(between.clone()),
            });
        }
        self.report_progress(true);
        while self.between.is_some() {
            self.folder_when_due();
            if self.folder_gone && self.rerun_failed.is_none() {
                // Its next run would write into a log no reader sees (contract §15).
                self.rerun_failed = Some(format!(
                    "its folder {} was removed while it waited to start again",
                    self.spec.job_dir
                ));
            }
            if self.rerun_failed.is_none() {
                // Its next run could not start: no restart is counted for it, and its
                // last end stands.
                self.rerun_failed = self.cwd_gone();
            }
            if self.stop_actor.is_some() || self.terminated || self.rerun_failed.is_some() {
                self.between = None;
                return false;
            }
            self.poll_once();
            self.commands_when_due();
        }
        true
    }

    /// Why the next run could not start, when its working directory is gone.
    fn cwd_gone(&self) -> Option<String> {
        (!Path::new(&self.spec.cwd).is_dir()).then(|| {
            format!(
                "its working directory {} was removed while it waited to start again \
                 (start it anew with an existing --cwd)",
                self.spec.cwd
            )
        })
    }

    /// Starts the job again as run `run`, after `marker` as a line of its own in the
    /// log: a fresh process with the same spec (environment and secrets are in this
    /// process's memory), its own limit and samples; `spawned` tells the daemon.
    fn rerun(&mut self, run: u32, marker: &str) {
        let mut line = Vec::new();
        let log_path = JobDir(Path::new(&self.spec.job_dir)).log();
        // A folder removed while it waited (rm -rf, a removed home): its next run would
        // write into a log no reader sees, so it is not started (contract §15).
        let folder_kept = std::fs::symlink_metadata(&self.spec.job_dir).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(&log_path).is_ok();
        if !folder_kept {
            self.rerun_failed = Some(format!(
                "its folder {} was removed while it waited to start again",
                self.spec.job_dir
            ));
            self.progress_due = true;
            return;
        }
        if let Some(gone) = self.cwd_gone() {
            self.rerun_failed = Some(gone);
            self.progress_due = true;
            return;
        }
        if !self.log.at_line_start(&log_path) {
            line.push(b'\n');
        }
        line.extend_from_slice(marker.as_bytes());
        line.push(b'\n');
        self.log.append(&line);
        if let Some(raw) = self.raw_log.as_mut() {
            raw.append(&line);
        }
        // What the last run's mask held back was written by `flush_mask`.
        self.mask = self
            .mask
            .take()
            .map(|mask| StreamMask::new(mask.secrets().clone()));
        self.splicing = self.mask.is_none();
        let spawned = match spawn::spawn_job(&self.spec) {
            Ok(spawned) => spawned,
            Err(e) => {
                let message = spawn::spawn_message(&self.spec, &e);
                self.log
                    .append(format!("[bgwork: could not start it again: {message}]\n").as_bytes());
                self.rerun_failed = Some(message);
                self.progress_due = true;
                return;
            }
        };
        let job_dir = PathBuf::from(&self.spec.job_dir);
        let record = tree::TreeRecord {
            supervisor: tree::start_time(self.me).map(|start| (self.me, start)),
            job: tree::start_time(spawned.pid).map(|start| (spawned.pid, start)),
            cgroup: self.cgroup.clone(),
        };
        if let Err(e) = record.write(&job_dir) {
            crate::note!("bgwork supervise: could not record the job's processes: {e}");
        }
        self.pid = spawned.pid;
        self.output = Some(spawned.output);
        self.stdin = Some(spawned.input);
        self.pty = spawned.pty;
        self.input_queue.clear();
        self.close_input = false;
        self.phase = Phase::Running;
        self.killed_after_ms = None;
        self.past_limit = false;
        self.limit_at = self
            .spec
            .max_runtime_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        self.sample_every = FIRST_SAMPLE;
        self.sample_at = Instant::now() + FIRST_SAMPLE;
        self.run = run;
        self.between = None;
        self.progress_due = true;
        for conn in &mut self.conns {
            conn.send(&FromSupervisor::Spawned { pid: spawned.pid });
        }
        self.report_progress(true);
    }

    /// Carries out the commands its [`CommandSource`] has (a supervisor under Slurm),
    /// every [`COMMANDS_EVERY`]; input is answered the same way.
    fn commands_when_due(&mut self) {
        if self.commands.is_none() || Instant::now() < self.commands_at {
            return;
        }
        self.commands_at = Instant::now() + COMMANDS_EVERY;
        // A backstop for an end whose SIGCHLD went elsewhere (cheap: one waitpid).
        self.reap();
        let job_dir = PathBuf::from(&self.spec.job_dir);
        let Some(source) = self.commands.as_mut() else {
            return;
        };
        for message in source.take(&job_dir) {
            if let Some(
                answer @ (FromSupervisor::InputTaken { seq, .. }
                | FromSupervisor::InputRefused { seq, .. }),
            ) = self.carry_out(message)
            {
                if let Some(source) = self.commands.as_mut() {
                    source.answer(&job_dir, seq, &answer);
                }
            }
        }
    }

    fn finished(&self) -> bool {
        let drained = match self.phase {
            Phase::Running | Phase::Stopping { .. } => return false,
            Phase::Lingering { .. } => self.output.is_none(),
            Phase::Draining { until, .. } => self.output.is_none() || Instant::now() >= until,
        };
        drained && tree::descendants(self.me).is_empty()
    }

    fn poll_once(&mut self) {
        let timeout = self
            .next_deadline()
            .map(|at| at.saturating_duration_since(Instant::now()));
        let timeout = match timeout {
            Some(d) => PollTimeout::try_from(d.as_millis().min(60_000) as i32 + 1)
                .unwrap_or(PollTimeout::MAX),
            None => PollTimeout::NONE,
        };
        let (signals_ready, output_ready, listener_ready, stdin_ready, conn_ready) = {
            let mut fds = vec![
                PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
            ];
            let output_at = self.output.as_ref().map(|out| {
                fds.push(PollFd::new(out.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let stdin_at = match (&self.stdin, self.input_queue.is_empty()) {
                (Some(stdin), false) => {
                    fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLOUT));
                    Some(fds.len() - 1)
                }
                _ => None,
            };
            let conn_from = fds.len();
            for conn in &self.conns {
                let mut flags = PollFlags::POLLIN;
                if conn.wants_write() {
                    flags |= PollFlags::POLLOUT;
                }
                fds.push(PollFd::new(conn.stream.as_fd(), flags));
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => return,
                Err(e) => {
                    crate::note!("bgwork supervise: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            (
                ready(&fds[0]),
                output_at.is_some_and(|i| ready(&fds[i])),
                ready(&fds[1]),
                stdin_at.is_some_and(|i| ready(&fds[i])),
                fds[conn_from..].iter().map(ready).collect::<Vec<_>>(),
            )
        };
        if output_ready {
            self.read_output();
        }
        if signals_ready {
            self.read_signals();
        }
        if listener_ready {
            self.accept();
        }
        if stdin_ready {
            self.write_input();
        }
        for (index, ready) in conn_ready.into_iter().enumerate() {
            if ready {
                self.serve_conn(index);
            }
        }
        self.conns.retain(|conn| !conn.closed);
    }

    fn next_deadline(&self) -> Option<Instant> {
        let kill_at = self.phase.kill_at();
        let drain_until = match self.phase {
            Phase::Draining { until, .. } => Some(until),
            _ => None,
        };
        let ended = self.phase.main_end().is_some();
        let progress_at = self.progress_at();
        let after_exit = ended.then(|| Instant::now() + Duration::from_millis(200));
        let limit_at = self.limit_at.filter(|_| !ended);
        let sample_at = Some(self.sample_at).filter(|_| !ended);
        let commands_at = Some(self.commands_at).filter(|_| self.commands.is_some());
        [
            commands_at,
            kill_at,
            drain_until,
            progress_at,
            after_exit,
            limit_at,
            sample_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn read_output(&mut self) {
        let Some(output) = self.output.as_mut() else {
            return;
        };
        let mut appended = false;
        for _ in 0..16 {
            let moved = if self.splicing {
                self.log.splice_from(output, READ_CHUNK)
            } else {
                output.read(&mut self.buffer).inspect(|&n| {
                    let bytes = &self.buffer[..n];
                    match self.mask.as_mut() {
                        None => self.log.append(bytes),
                        Some(mask) => {
                            self.log.append(mask.push(bytes, &mut self.masked));
                            if let Some(raw) = self.raw_log.as_mut() {
                                raw.append(bytes);
                            }
                        }
                    }
                })
            };
            match moved {
                Ok(0) => {
                    self.output = None;
                    break;
                }
                Ok(_) => appended = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // splice does not serve this output (a terminal) or this disk (full):
                // copy through the buffer from now on, which counts what it cannot write.
                Err(_) if self.splicing => self.splicing = false,
                Err(_) => {
                    self.output = None;
                    break;
                }
            }
        }
        if self.output.is_none() {
            self.flush_mask();
        }
        if appended {
            self.progress_due = true;
        }
        self.report_progress(false);
    }

    /// A sub-agent's report (the file its `BGWORK_REPORT` names) becomes the notice of
    /// its end: it is masked like the output, whatever its size (a chunk at a time,
    /// through a mask of its own), into a new file renamed over it, before the end is
    /// told. Outside input: a link or a FIFO is left alone (the daemon refuses it).
    fn mask_report(&self) {
        let (Some(mask), Some(path)) = (&self.mask, self.spec.env.get("BGWORK_REPORT")) else {
            return;
        };
        let path = Path::new(path);
        let Ok(file) = crate::paths::open_untrusted(path) else {
            return;
        };
        let temp = path.with_extension("masking");
        let _ = std::fs::remove_file(&temp);
        match mask_file(file, &temp, mask.secrets()) {
            Ok(false) => {
                let _ = std::fs::remove_file(&temp);
            }
            Ok(true) => {
                if let Err(e) = std::fs::rename(&temp, path) {
                    self.report_unmasked(path, &temp, &e);
                }
            }
            Err(e) => self.report_unmasked(path, &temp, &e),
        }
    }

    /// A report that could not be masked is not left in clear for the notice.
    fn report_unmasked(&self, path: &Path, temp: &Path, e: &std::io::Error) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        crate::note!("bgwork supervise: could not mask the report: {e}");
        let _ = std::fs::remove_file(temp);
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(path)
            .and_then(|mut file| {
                file.write_all(b"[bgwork: the report held a secret and could not be masked]\n")
            });
    }

    /// The output ended (or will no longer be read): what the mask held back, to the log.
    fn flush_mask(&mut self) {
        if let Some(mask) = self.mask.as_mut() {
            mask.finish(&mut self.masked);
            self.log.append(&self.masked);
        }
    }

    /// When output progress is next due, if any is: after the daemon's pace, or
    /// after [`PROGRESS_INTERVAL`] when the dropped or unwritten bytes changed (a read
    /// must not take the cap's new hole for output).
    fn progress_at(&self) -> Option<Instant> {
        if !self.progress_due {
            return None;
        }
        let interval = match self.log_figures() == self.reported {
            true => self.pace,
            false => PROGRESS_INTERVAL,
        };
        Some(self.last_progress + interval)
    }

    /// Tells the daemon how far the log has grown, at most once per pace while output
    /// streams, so a fast writer does not make the daemon spin; `now` forces it
    /// (before the end is reported).
    fn report_progress(&mut self, now: bool) {
        let Some(due_at) = self.progress_at() else {
            return;
        };
        if !now && Instant::now() < due_at {
            return;
        }
        self.progress_due = false;
        self.last_progress = Instant::now();
        self.reported = self.log_figures();
        if self.commands.is_some() {
            self.write_figures();
        }
        for index in 0..self.conns.len() {
            let figures = self.figures();
            self.conns[index].progress(figures);
        }
    }

    /// Under Slurm, no daemon is connected: the log's dropped middle and unwritten
    /// bytes, which the file's length does not tell, go to [`JobDir::FIGURES`] each time
    /// they change (rarely: a punch of the cap, a full disk).
    fn write_figures(&mut self) {
        let now = self.log_figures();
        if now == self.figures_written {
            return;
        }
        let figures = JobDir(Path::new(&self.spec.job_dir)).figures();
        let written = crate::paths::write_whole(&figures, &control::encode(&self.figures()));
        match written {
            Ok(()) => self.figures_written = now,
            Err(e) => crate::note!("bgwork supervise: could not write {}: {e}", JobDir::FIGURES),
        }
    }

    /// The log's dropped bytes, unwritten bytes and where the first of those was lost:
    /// what its length does not tell.
    fn log_figures(&self) -> (u64, u64, u64) {
        (
            self.log.dropped(),
            self.log.unwritten(),
            self.log.unwritten_at(),
        )
    }

    /// The log's figures, as an output progress message.
    fn figures(&self) -> FromSupervisor {
        FromSupervisor::Output {
            log_len: self.log.len(),
            dropped: self.log.dropped(),
            unwritten: self.log.unwritten(),
            unwritten_at: self.log.unwritten_at(),
        }
    }

    fn read_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let signal = info.ssi_signo as i32;
            if signal == Signal::SIGTERM as i32 || signal == Signal::SIGINT as i32 {
                // Someone stopped the supervisor itself: stop the job, record no actor
                // (and start it no more).
                self.terminated = true;
                self.begin_stop(None, Duration::from_secs(5));
            }
        }
        self.reap();
    }

    fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.reaped(pid, Some(code), None),
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    self.reaped(pid, None, Some(signal as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    fn reaped(&mut self, pid: Pid, code: Option<i32>, signal: Option<i32>) {
        if pid.as_raw() != self.pid || self.phase.main_end().is_some() {
            return;
        }
        let main = (code, signal);
        self.stdin = None;
        let left = !tree::descendants(self.me).is_empty();
        self.phase = match self.phase {
            // Ended within a stop's grace: what is left is killed when the grace ends.
            Phase::Stopping { kill_at, .. } if left => Phase::Lingering { main, kill_at },
            Phase::Running if left => {
                // The main process ended but left processes behind: they go too.
                self.term_tree();
                let grace = Duration::from_millis(self.spec.linger_grace_ms);
                Phase::Lingering {
                    main,
                    kill_at: Instant::now() + grace,
                }
            }
            _ => Phase::Draining {
                main,
                until: Instant::now() + DRAIN_GRACE,
            },
        };
    }

    /// TERM to the job's tree, and CONT after it, so that a stopped process acts on it.
    fn term_tree(&self) {
        tree::signal_tree(self.me, self.pid, Signal::SIGTERM);
        tree::continue_tree(self.me, self.pid);
    }

    /// KILL to what is left of the job, once its phase says it is due.
    fn escalate_when_due(&mut self) {
        let now = Instant::now();
        if self.phase.kill_at().is_none_or(|at| now < at) {
            return;
        }
        self.phase = match self.phase {
            Phase::Stopping { grace, .. } => {
                // The job outlived the TERM of a stop: its end says it was killed.
                self.killed_after_ms = Some(grace.as_millis() as u64);
                Phase::Running
            }
            Phase::Lingering { main, .. } => Phase::Draining {
                main,
                until: now + DRAIN_GRACE,
            },
            phase => phase,
        };
        for _ in 0..3 {
            tree::signal_tree(self.me, self.pid, Signal::SIGKILL);
            if tree::descendants(self.me).is_empty() {
                break;
            }
        }
        self.reap();
    }

    /// Ends the job (TERM, a short grace, KILL) once its folder is no longer its own:
    /// removed, or another job's by now.
    fn folder_when_due(&mut self) {
        if self.folder_gone || Instant::now() < self.folder_at {
            return;
        }
        self.folder_at = Instant::now() + FOLDER_EVERY;
        if self.folder_is_ours() {
            return;
        }
        self.folder_gone = true;
        crate::note!(
            "bgwork supervise: the folder {} was removed or replaced: ending its job",
            self.spec.job_dir
        );
        self.begin_stop(None, FOLDER_GONE_GRACE);
    }

    /// Whether the job's folder is the one this supervisor was given (true where its
    /// identity could not be known).
    fn folder_is_ours(&self) -> bool {
        let Some(made) = self.folder else {
            return true;
        };
        crate::paths::identity(Path::new(&self.spec.job_dir)) == Some(made)
    }

    /// Stops the job as the agent once it has run past its `max_runtime_ms`.
    fn limit_when_due(&mut self) {
        let due = self.limit_at.is_some_and(|at| Instant::now() >= at);
        if !due || self.phase.main_end().is_some() {
            return;
        }
        self.limit_at = None;
        if self.stop_actor.is_none() {
            self.past_limit = true;
        }
        self.begin_stop(Some(Actor::Agent), LIMIT_GRACE);
    }

    /// Samples the resident memory of the job's tree (for its peak), quickly at first,
    /// then every few seconds.
    fn sample_when_due(&mut self) {
        let now = Instant::now();
        if now < self.sample_at || self.phase.main_end().is_some() {
            return;
        }
        let rss = crate::observe::usage(&tree::descendants(self.me)).rss_bytes;
        self.peak_rss = self.peak_rss.max(rss);
        self.sample_every = (self.sample_every * 2).min(SAMPLE_EVERY);
        self.sample_at = now + self.sample_every;
    }

    fn begin_stop(&mut self, actor: Option<Actor>, grace: Duration) {
        if self.phase.main_end().is_some() {
            return;
        }
        if self.stop_actor.is_none() {
            self.stop_actor = actor;
        }
        self.term_tree();
        let kill_at = Instant::now() + grace;
        let sooner = self.phase.kill_at().is_none_or(|at| kill_at < at);
        if sooner {
            self.phase = Phase::Stopping { kill_at, grace };
        }
    }

    /// Takes new control connections; one from another uid is closed unread (the
    /// folder's modes keep other users out; this holds even when they were opened).
    fn accept(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            if !same_user(&stream) {
                continue;
            }
            if let Ok(conn) = Conn::new(stream, Vec::new()) {
                self.conns.push(conn);
            }
        }
    }

    fn serve_conn(&mut self, index: usize) {
        if self.conns[index].flush() {
            let figures = self.figures();
            self.conns[index].send(&figures);
        }
        for message in self.conns[index].receive() {
            self.handle(index, message);
        }
    }

    fn handle(&mut self, index: usize, message: ToSupervisor) {
        if let Some(answer) = self.carry_out(message) {
            self.conns[index].send(&answer);
        }
    }

    /// Carries out a command of the daemon's, whether it came on a connection or as a
    /// file in the job's folder; returns the answer it calls for, if any.
    fn carry_out(&mut self, message: ToSupervisor) -> Option<FromSupervisor> {
        match message {
            ToSupervisor::Hello { .. } => Some(FromSupervisor::Hello {
                protocol: PROTOCOL,
                pid: self.pid,
                log_len: self.log.len(),
                dropped: self.log.dropped(),
                unwritten: self.log.unwritten(),
                unwritten_at: self.log.unwritten_at(),
                status: self.final_status.clone(),
                between: self.between.clone().map(Box::new),
            }),
            ToSupervisor::Stop { actor, .. } if self.between.is_some() => {
                // Waiting to start again: nothing runs, so the stop ends it now.
                self.stop_actor.get_or_insert(actor);
                None
            }
            ToSupervisor::Stop { grace_ms, actor } => {
                self.begin_stop(Some(actor), Duration::from_millis(grace_ms));
                None
            }
            ToSupervisor::Rerun { run, marker } => {
                // Only the start the waiting run calls for: a repeated one starts nothing.
                if self.between.as_ref().is_some_and(|b| b.run + 1 == run) {
                    self.rerun(run, &marker);
                }
                None
            }
            ToSupervisor::Input { data } => {
                if self.stdin.is_some() && !self.close_input {
                    self.input_queue.extend_from_slice(&data);
                    self.write_input();
                    None
                } else {
                    Some(FromSupervisor::InputClosed)
                }
            }
            ToSupervisor::Write { seq, data } => Some(match self.take_input(data) {
                Ok(queued) => FromSupervisor::InputTaken { seq, queued },
                Err((reason, full)) => FromSupervisor::InputRefused { seq, reason, full },
            }),
            ToSupervisor::CloseInput => {
                // Input sent before end-of-input is still written (a caller's stdin
                // passed on and then closed, `send` then C-d).
                self.close_input = true;
                self.write_input();
                None
            }
            ToSupervisor::Resize { cols, rows } => {
                if let Some(pty) = &self.pty {
                    let _ = pty.resize(pty_process::Size::new(rows, cols));
                }
                None
            }
            ToSupervisor::Pace { every_ms } => {
                self.pace = pace_of(every_ms);
                None
            }
            ToSupervisor::Signal { signal } => {
                // A key's signal (C-c, C-z, a pane's hang-up) goes where a terminal
                // sends it: the job's process group, nothing else.
                if let (Ok(signal), None) = (Signal::try_from(signal), self.phase.main_end()) {
                    tree::signal_group(self.pid, signal);
                }
                None
            }
        }
    }

    /// Queues input for the job, within [`INPUT_QUEUE_MAX`]; the bytes now waiting.
    /// `Err((reason, full))`: refused, `full` when it may be taken later.
    fn take_input(&mut self, data: Vec<u8>) -> Result<u64, (String, bool)> {
        if self.stdin.is_none() {
            return Err(("its stdin is closed".into(), false));
        }
        let waiting = self.input_queue.len();
        if waiting + data.len() > INPUT_QUEUE_MAX {
            let reason = format!(
                "it is not reading its input: {waiting} bytes sent earlier still wait \
                 (at most {INPUT_QUEUE_MAX} may)"
            );
            return Err((reason, true));
        }
        self.input_queue.extend_from_slice(&data);
        self.write_input();
        if self.stdin.is_none() {
            // The job had closed its end: nothing of it was taken.
            return Err(("its stdin is closed".into(), false));
        }
        Ok(self.input_queue.len() as u64)
    }

    fn write_input(&mut self) {
        let Some(stdin) = self.stdin.as_mut() else {
            self.input_queue.clear();
            return;
        };
        while !self.input_queue.is_empty() {
            match stdin.write(&self.input_queue) {
                Ok(n) => {
                    self.input_queue.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.stdin = None;
                    self.input_queue.clear();
                    for conn in &mut self.conns {
                        conn.send(&FromSupervisor::InputClosed);
                    }
                    return;
                }
            }
        }
        if self.close_input {
            self.stdin = None;
        }
    }

    /// How the current run ended, as a status (for its end, or a run that will be
    /// started again).
    fn run_status(&self) -> ExitStatus {
        let (exit_code, signal) = self.phase.main_end().unwrap_or((None, None));
        ExitStatus {
            protocol: PROTOCOL,
            exit_code,
            signal,
            stop_actor: self.stop_actor,
            spawn_error: None,
            log_len: self.log.len(),
            dropped: self.log.dropped(),
            unwritten: self.log.unwritten(),
            unwritten_at: self.log.unwritten_at(),
            owner: self.spec.owner.clone(),
            ended_at_ms: now_ms(),
            pid: Some(self.pid),
            killed_after_ms: self.killed_after_ms,
            past_limit_ms: self
                .past_limit
                .then_some(self.spec.max_runtime_ms)
                .flatten(),
            cpu_ms: Some(children_cpu_ms()),
            // The largest single process reaped is a floor for a tree never sampled.
            peak_rss_bytes: Some(self.peak_rss.max(children_max_rss())),
            scheduler_end: None,
            detail: None,
        }
    }

    fn finish(&mut self) {
        if self.output.is_some() {
            self.read_output();
        }
        // Output a leftover process still holds open is not read any more.
        self.flush_mask();
        // A folder that is another job's by now (a new home's of the same number) gets
        // nothing of this one: no report masked, no status, its control socket kept.
        let ours = !self.folder_gone && self.folder_is_ours();
        if ours {
            self.mask_report();
        }
        let mut status = self.run_status();
        if let Some(message) = &self.rerun_failed {
            status.detail = Some(format!("could not start it again: {message}"));
        } else if self.folder_gone {
            // The TERM was this supervisor's own: its report says why.
            status.detail = Some(format!(
                "its folder {} was removed or replaced, so bgwork ended it",
                self.spec.job_dir
            ));
        }
        let job_dir = PathBuf::from(&self.spec.job_dir);
        self.final_status = Some(status.clone());
        // The status is the only durable word of how the job ended: while it cannot be
        // written (a full disk), this supervisor stays, answering `hello` with it, and
        // tries again (for a day at most).
        let since = Instant::now();
        let mut said = false;
        while let Err(e) = match ours {
            true => write_status(&job_dir, &status),
            false => Ok(()),
        } {
            if !said || since.elapsed() > STATUS_PATIENCE {
                said = true;
                crate::note!("bgwork supervise: could not write the status file: {e}");
            }
            // Only a full disk is waited out; a folder that is gone (its home deleted)
            // or refused will not take the status later either.
            let full = matches!(
                e.raw_os_error(),
                Some(nix::libc::ENOSPC | nix::libc::EDQUOT)
            );
            if !full || since.elapsed() > STATUS_PATIENCE {
                break;
            }
            self.poll_once();
            self.conns.iter_mut().for_each(|conn| {
                conn.send(&FromSupervisor::Exited {
                    status: status.clone(),
                })
            });
        }
        self.accept();
        for conn in &mut self.conns {
            conn.send(&FromSupervisor::Exited {
                status: status.clone(),
            });
            conn.flush_blocking(Duration::from_secs(1));
        }
        if ours {
            let _ = std::fs::remove_file(JobDir(&job_dir).control_socket());
        }
        if let Some(dir) = &self.cgroup {
            cgroup::leave(dir);
        }
    }
}

/// The grace a job stopped for running past its limit gets between TERM and KILL.
const LIMIT_GRACE: Duration = Duration::from_secs(5);

/// CPU time (ms) of every process this supervisor reaped, with everything they reaped
/// (as a subreaper, that is every process of the job).
fn children_cpu_ms() -> u64 {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN) {
        Ok(usage) => {
            let ms = |t: nix::sys::time::TimeVal| {
                (t.tv_sec().max(0) as u64) * 1000 + (t.tv_usec().max(0) as u64) / 1000
            };
            ms(usage.user_time()) + ms(usage.system_time())
        }
        Err(_) => 0,
    }
}

/// The most resident memory any one reaped process held (bytes).
fn children_max_rss() -> u64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|usage| (usage.max_rss().max(0) as u64) * 1024)
        .unwrap_or(0)
}

/// Whether the peer of a control connection runs as this process's uid.
fn same_user(stream: &UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(stream, PeerCredentials)
        .is_ok_and(|peer| peer.uid() == nix::unistd::geteuid().as_raw())
}

/// Sends this process's stderr to the job's folder (a supervisor is started before it
/// knows its job).
fn redirect_stderr(path: &Path) {
    if let Ok(file) = File::create(path) {
        let _ = nix::unistd::dup2_stderr(&file);
    }
}

/// Writes the status file atomically (the room made by [`reserve_status`], then
/// rename): a reader finds the whole status or none, whenever any process dies. It is
/// not fsynced: like the store (`synchronous=NORMAL`), it survives process crashes,
/// not a power cut.
pub fn write_status(job_dir: &Path, status: &ExitStatus) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let temp = JobDir(job_dir).temp(JobDir::STATUS);
    let bytes = status.encode();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&temp)?;
    // Written over the room made earlier (no new block is needed), the rest blanked:
    // JSON allows the trailing spaces.
    let room = file.metadata()?.len() as usize;
    let mut padded = bytes;
    padded.resize(padded.len().max(room), b' ');
    file.write_all_at(&padded, 0)?;
    std::fs::rename(&temp, JobDir(job_dir).status())
}

/// Makes room for the status file while the disk has some.
fn reserve_status(job_dir: &Path) {
    let _ = std::fs::write(
        JobDir(job_dir).temp(JobDir::STATUS),
        vec![b' '; STATUS_ROOM],
    );
}

/// Writes the status of a job of `owner` that could not start, and why.
pub fn write_not_started(job_dir: &Path, owner: &str, why: &str) -> std::io::Result<()> {
    let status = ExitStatus {
        protocol: PROTOCOL,
        spawn_error: Some(why.to_string()),
        ended_at_ms: now_ms(),
        owner: owner.to_string(),
        ..ExitStatus::default()
    };
    write_status(job_dir, &status)
}

/// Reads a job's status file, if it has one. A status that names another owner than
/// `owner` (a folder left by an earlier job) is no status of this job.
pub fn read_status(job_dir: &Path, owner: &str) -> Option<Result<ExitStatus, String>> {
    // The job may have replaced it (a FIFO would block the reader, a link leak a file).
    let status = match crate::paths::read_untrusted(&JobDir(job_dir).status(), 1 << 20) {
        Ok(bytes) => ExitStatus::decode(&bytes),
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("status file unreadable: {e}"))),
    };
    if let Ok(found) = &status {
        if !owner.is_empty() && !found.owner.is_empty() && found.owner != owner {
            crate::note!(
                "bgwork: {} holds the status of {}, not of {owner}: ignored",
                job_dir.display(),
                found.owner
            );
            return None;
        }
    }
    Some(status)
}

/// A pace the daemon asked for, within [`PROGRESS_INTERVAL`] and [`SLOWEST_PACE`].
fn pace_of(every_ms: u64) -> Duration {
    Duration::from_millis(every_ms).clamp(PROGRESS_INTERVAL, SLOWEST_PACE)
}

/// Writes `file` masked by `secrets` into the new file `temp`, a chunk at a time (memory
/// stays bounded whatever the file's size); false (and `temp` left to remove) when the
/// masked text is the same as the file's.
fn mask_file(file: File, temp: &Path, secrets: &Secrets) -> std::io::Result<bool> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(temp)?;
    let mut stream = StreamMask::new(secrets.clone());
    let (mut chunk, mut masked) = (vec![0u8; READ_CHUNK], Vec::new());
    let (mut read_len, mut written_len) = (0u64, 0u64);
    let mut reader = &file;
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        read_len += n as u64;
        let piece = stream.push(&chunk[..n], &mut masked);
        written_len += piece.len() as u64;
        out.write_all(piece)?;
    }
    stream.finish(&mut masked);
    written_len += masked.len() as u64;
    out.write_all(&masked)?;
    drop(out);
    if read_len != written_len {
        return Ok(true);
    }
    same_bytes(&file, temp).map(|same| !same)
}

/// Whether `file` and the file at `other` hold the same bytes.
fn same_bytes(file: &File, other: &Path) -> std::io::Result<bool> {
    let other = File::open(other)?;
    let (mut a, mut b) = (vec![0u8; READ_CHUNK], vec![0u8; READ_CHUNK]);
    let mut at = 0u64;
    loop {
        let n = crate::output::read_full_at(file, &mut a, at)?;
        let m = crate::output::read_full_at(&other, &mut b, at)?;
        if n != m || a[..n] != b[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        at += n as u64;
    }
}
