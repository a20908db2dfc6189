//! `JobDir`: a job's folder (`jobs/N` in the home) and the one place that names its
//! files. The supervisor writes them, the daemon and the executors read them; nobody
//! else spells a file name.

use std::path::{Path, PathBuf};

/// Job folder numbers at or past this are no job folders of this home (a row number
/// never comes near it): they raise no floor and are never taken back.
pub const MAX_JOB_FOLDER: i64 = 1 << 53;

/// A job's folder, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct JobDir<'a>(pub &'a Path);

impl<'a> JobDir<'a> {
    /// The output log (head and newest bytes within the cap; holes where the middle was
    /// dropped).
    pub const LOG: &'static str = "output.log";
    /// The unmasked log of a job with secrets and `--keep-raw-log`.
    pub const RAW_LOG: &'static str = "output.raw.log";
    /// The end, written by the supervisor before it tells anyone (`ExitStatus`).
    pub const STATUS: &'static str = "status";
    /// The supervisor's control socket (jobs of this machine).
    pub const CONTROL_SOCKET: &'static str = "control.sock";
    /// The job's processes: the supervisor's and the job's pids with start times, and
    /// its cgroup.
    pub const PROCESSES: &'static str = "processes";
    /// The log's dropped and unwritten figures, for a supervisor no daemon connection
    /// reaches (under Slurm).
    pub const FIGURES: &'static str = "figures.json";
    /// Commands left for a supervisor under Slurm, one file each.
    pub const COMMANDS: &'static str = "commands";
    /// That supervisor's answers to input left in [`JobDir::COMMANDS`].
    pub const ANSWERS: &'static str = "answers";
    /// What was started (`JobRecord`), so a lost database can take the job back.
    pub const RECORD: &'static str = "job.json";
    /// The supervisor's own complaints.
    pub const SUPERVISOR_LOG: &'static str = "supervisor.log";
    /// The pid of the supervisor a job was handed to, written before the hand-over
    /// (jobs of this machine): a restarted daemon finds a supervisor that has not
    /// recorded its processes yet.
    pub const SUPERVISOR_PID: &'static str = "supervisor.pid";
    /// A sub-agent's report (`BGWORK_REPORT`), read as outside input when it ends.
    pub const REPORT: &'static str = "report";
    /// A pane's terminal sizes with the log offset where each began.
    pub const SIZES: &'static str = "sizes";

    pub fn path(self) -> &'a Path {
        self.0
    }

    pub fn log(self) -> PathBuf {
        self.0.join(Self::LOG)
    }

    pub fn raw_log(self) -> PathBuf {
        self.0.join(Self::RAW_LOG)
    }

    pub fn status(self) -> PathBuf {
        self.0.join(Self::STATUS)
    }

    pub fn control_socket(self) -> PathBuf {
        self.0.join(Self::CONTROL_SOCKET)
    }

    pub fn processes(self) -> PathBuf {
        self.0.join(Self::PROCESSES)
    }

    pub fn figures(self) -> PathBuf {
        self.0.join(Self::FIGURES)
    }

    pub fn commands(self) -> PathBuf {
        self.0.join(Self::COMMANDS)
    }

    pub fn answers(self) -> PathBuf {
        self.0.join(Self::ANSWERS)
    }

    pub fn record(self) -> PathBuf {
        self.0.join(Self::RECORD)
    }

    pub fn supervisor_log(self) -> PathBuf {
        self.0.join(Self::SUPERVISOR_LOG)
    }

    pub fn supervisor_pid(self) -> PathBuf {
        self.0.join(Self::SUPERVISOR_PID)
    }

    pub fn report(self) -> PathBuf {
        self.0.join(Self::REPORT)
    }

    pub fn sizes(self) -> PathBuf {
        self.0.join(Self::SIZES)
    }

    /// A file's temporary name, renamed over it once written whole.
    pub fn temp(self, name: &str) -> PathBuf {
        self.0.join(format!("{name}.tmp"))
    }
}
