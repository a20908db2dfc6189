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

mod capture;
pub(crate) mod cgroup;
mod commands;
mod conn;
mod ending;
mod log;
mod restarts;
mod spawn;
mod status;
pub mod tree;

use status::reserve_status;
pub use status::{read_status, write_not_started, write_status};

use crate::job_dir::JobDir;
use crate::paths::SocketPath;
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
use std::fs::File;
use std::io::{BufRead, BufReader};
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
}

/// The grace a job stopped for running past its limit gets between TERM and KILL.
const LIMIT_GRACE: Duration = Duration::from_secs(5);

/// Sends this process's stderr to the job's folder (a supervisor is started before it
/// knows its job).
fn redirect_stderr(path: &Path) {
    if let Ok(file) = File::create(path) {
        let _ = nix::unistd::dup2_stderr(&file);
    }
}

/// A pace the daemon asked for, within [`PROGRESS_INTERVAL`] and [`SLOWEST_PACE`].
fn pace_of(every_ms: u64) -> Duration {
    Duration::from_millis(every_ms).clamp(PROGRESS_INTERVAL, SLOWEST_PACE)
}
