//! `SshExecutor`: jobs on another machine reached with the system's OpenSSH client
//! (`start --on ssh:HOST`). On the host runs bgwork itself (the same version, found on
//! its PATH or copied there: [`deploy`]), and the job is an ordinary job of the host's
//! own daemon: its own supervisor, whole-tree stop, real ends and exit codes, durable
//! status on the host's disk. The local daemon keeps the record and talks to the
//! host's daemon with bgwork's own requests over one connection per host ([`link`]).
//!
//! One task per job mirrors the host's log into the local job folder by offset (so
//! `read`, `--grep`, `wait --until`, notices' tails work as for a local job and keep
//! working while the host is down), learns the job's pid and end from the host, and
//! carries `stop` and `send` there. `ssh.json` in the job's folder names the host and
//! the job's name there (`bgw-<home-id>-<row>`), written before the job is handed over,
//! then its id there: a daemon restarted after a `kill -9`, or a link that dropped,
//! finds the job again by it and takes it back, never starting it again.

pub mod call;
pub mod deploy;
pub mod ends;
pub mod link;
pub mod logout;
mod mirror;
mod order;
pub mod relay;
mod tracker;

use super::{ExecEvent, Executor, JobHandle, On, Reattach, Running, View, Which};
use crate::job_dir::JobDir;
use crate::wire::control::{self, JobSpec, ToSupervisor};
use crate::wire::ssh::SshJob;
use crate::wire::{Envelope, Request, StartArgs, StartReply, WireError};
use link::{LinkError, Links};
use order::Order;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tracker::Tracker;

/// The file in a job's folder that says it runs on a host, and as which job there.
pub const SSH_FILE: &str = "ssh.json";

/// Where a `start` (a job or a pane) runs when it names a host: `ssh:HOST` from `on`
/// (else `BGWORK_EXECUTOR`); `None`: not on a host. `prefix`: how options are named to
/// the caller (`--` on the command line, none in MCP).
pub fn choose(on: Option<&str>, prefix: &str) -> Result<Option<String>, WireError> {
    let from_env = std::env::var("BGWORK_EXECUTOR")
        .ok()
        .filter(|v| !v.is_empty());
    let Some(executor) = on.map(str::to_string).or(from_env) else {
        return Ok(None);
    };
    let Some(host) = executor.strip_prefix("ssh:") else {
        return Ok(None);
    };
    let bad = host.is_empty()
        || host.starts_with('-')
        || host.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad {
        return Err(WireError::bad_request(format!(
            "{prefix}on {executor:?}: give a host as ssh knows it, e.g. {prefix}on ssh:build-box \
             or {prefix}on ssh:me@10.0.0.5 (a port or key goes in your ssh config)"
        )));
    }
    Ok(Some(host.to_string()))
}

/// What the daemon checks of a start on a host, whoever sent it.
pub fn check(args: &StartArgs) -> Result<(), WireError> {
    let Some(host) = &args.ssh else {
        return Ok(());
    };
    if args.slurm.is_some() {
        return Err(WireError::bad_request(
            "a job runs on Slurm or on an ssh host, not both: choose one --on",
        ));
    }
    choose(Some(&format!("ssh:{host}")), "--").map(|_| ())?;
    // `~`: the remote home, as the record of a job started without a folder says (its
    // restart).
    if let Some(cwd) = args.cwd.as_deref().filter(|&cwd| cwd != "~") {
        check_cwd(cwd, "cwd")?;
    }
    Ok(())
}

/// A folder on a host is an absolute path there (none: the remote user's home).
pub fn check_cwd(cwd: &str, flag: &str) -> Result<(), WireError> {
    match cwd.starts_with('/') {
        true => Ok(()),
        false => Err(WireError::bad_request(format!(
            "{flag} {cwd:?}: on an ssh host the folder is a path there, given whole (e.g. \
             /home/me/project); leave it out for the remote user's home"
        ))),
    }
}

/// What the host's daemon is asked for a job's record there.
fn session_of(home_id: &str, spec: &JobSpec) -> String {
    let local = spec
        .env
        .get("BGWORK_SESSION")
        .map(String::as_str)
        .unwrap_or("default");
    let mut session = format!("ssh-{home_id}.{}", local.replace('/', "."));
    session.truncate(120);
    session
}

pub struct SshExecutor {
    events: mpsc::UnboundedSender<ExecEvent>,
    home_id: String,
    links: Arc<Links>,
    /// The ends of every host's jobs, one `wait` per host and session.
    ends: Arc<ends::Ends>,
    /// Rows known to run (or to have run) on a host, and which; `None`: known not to.
    views: Arc<Mutex<HashMap<i64, Option<String>>>>,
    /// Rows whose host said they die at logout there (`SshJob::logout`).
    logouts: Arc<Mutex<HashMap<i64, String>>>,
}

impl SshExecutor {
    pub fn new(events: mpsc::UnboundedSender<ExecEvent>, home: &Path) -> SshExecutor {
        let home_id = super::slurm::home_id(home);
        SshExecutor {
            events,
            links: Arc::new(Links::new(home, &home_id)),
            ends: Arc::default(),
            home_id,
            views: Arc::default(),
            logouts: Arc::default(),
        }
    }

    /// "host H unreachable since T: …" of each host with work running that cannot be
    /// reached now.
    pub fn unreachable(&self) -> Vec<String> {
        self.links
            .busy()
            .iter()
            .filter_map(|l| l.unreachable())
            .collect()
    }

    fn host_of(&self, row: i64, job_dir: &str) -> Option<String> {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(host) = views.get(&row) {
            return host.clone();
        }
        let job = (!job_dir.is_empty())
            .then(|| read_ssh_file(Path::new(job_dir)))
            .flatten();
        let found = job.as_ref().map(|job| job.host.clone());
        views.insert(row, found.clone());
        drop(views);
        if let Some(logout) = job.and_then(|job| job.logout) {
            self.set_logout(row, Some(logout));
        }
        found
    }

    fn set_logout(&self, row: i64, logout: Option<String>) {
        let mut logouts = self.logouts.lock().unwrap_or_else(|p| p.into_inner());
        match logout {
            Some(logout) => logouts.insert(row, logout),
            None => logouts.remove(&row),
        };
    }

    fn set_host(&self, row: i64, host: &str) {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(row, Some(host.to_string()));
    }

    async fn hand_over(&self, row: i64, spec: &JobSpec, host: &str) -> Result<JobHandle, String> {
        let job_dir = PathBuf::from(&spec.job_dir);
        let mut job = SshJob {
            host: host.to_string(),
            name: format!("bgw-{}-{row}", self.home_id),
            session: session_of(&self.home_id, spec),
            remote_id: None,
            max_runtime_ms: spec.max_runtime_ms,
            logout: None,
            unsent: Default::default(),
        };
        write_ssh_file(&job_dir, &job)?;
        self.set_host(row, host);
        // The mirror: the host's log, by offset.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(JobDir(&job_dir).log())
            .map_err(|e| format!("could not make its log: {e}"))?;
        let mut env = spec.env.clone();
        env.remove("BGWORK_SESSION");
        env.remove("BGWORK_ITEM");
        let args = StartArgs {
            command: spec.command.clone(),
            // `~`: the remote user's home.
            cwd: (spec.cwd != "~").then(|| spec.cwd.clone()),
            env,
            name: Some(job.name.clone()),
            window_ms: Some(0),
            allow_duplicate: true,
            max_runtime_s: spec.max_runtime_ms.map(|ms| ms as f64 / 1000.0),
            secrets: spec.secrets.iter().map(|[name, _]| name.clone()).collect(),
            keep_raw_log: spec.keep_raw_log,
            // A pane: its terminal is made there, by the host's supervisor.
            pty: spec.pane.is_some(),
            cols: spec.pane.map(|p| p.cols),
            rows: spec.pane.map(|p| p.rows),
            ..StartArgs::default()
        };
        let link = self.links.of(host);
        link.try_now();
        let envelope = Envelope {
            session: job.session.clone(),
            request: Request::Start(args),
        };
        let reply: StartReply = match link.request(&envelope, Duration::ZERO).await {
            Ok(line) => crate::wire::decode_reply(&line)
                .map_err(|e| format!("{host} refused it: {}", host_words(host, &e.message)))?,
            // Sent, and no answer: the host may run it. Found by its name once the host
            // answers again (or lost, if the host never got it); never sent twice.
            Err(LinkError::InDoubt(why)) => {
                crate::note!("bgwork daemon: the start of row {row} is in doubt: {why}");
                return Ok(self.track(row, job_dir, job, spec.owner.clone(), false, 0));
            }
            Err(e) => return Err(e.to_string()),
        };
        job.remote_id = Some(reply.item.id.clone());
        // Said by the host's relay when the channel opened: this job dies at logout.
        job.logout = link.logout();
        self.set_logout(row, job.logout.clone());
        if let Err(e) = write_ssh_file(&job_dir, &job) {
            crate::note!("bgwork daemon: {e}");
        }
        Ok(self.track(row, job_dir, job, spec.owner.clone(), false, 0))
    }

    fn track(
        &self,
        row: i64,
        job_dir: PathBuf,
        job: SshJob,
        owner: String,
        spawned: bool,
        mirrored: u64,
    ) -> JobHandle {
        let (commands, incoming) = mpsc::unbounded_channel();
        let unanswered = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handle = JobHandle::new(commands, unanswered, refuses);
        // What an earlier daemon was asked and the host has not taken: sent after the
        // first look.
        let order = Order {
            pending: Mutex::new(job.unsent),
            folder: Mutex::new(Some(job_dir.clone())),
            ..Order::default()
        };
        let stop_actor = job.unsent.stop.map(|(_, actor)| actor);
        let tracker = Tracker {
            row,
            link: self.links.of(&job.host),
            ends: self.ends.clone(),
            job_dir,
            job,
            owner,
            events: self.events.clone(),
            spawned,
            pid: None,
            mirrored,
            stop_actor,
            order: Arc::new(order),
            ended_item: None,
        };
        tokio::spawn(tracker.run(incoming));
        handle
    }
}

impl Executor for SshExecutor {
    async fn start(&self, row: i64, spec: &JobSpec, on: &On) -> Result<JobHandle, String> {
        match on {
            On::Ssh(host) => self.hand_over(row, spec, host).await,
            _ => Err("a job for another executor was handed to the SSH executor".into()),
        }
    }

    async fn reattach(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        let Some(job) = read_ssh_file(job_dir) else {
            return Reattach::Lost(format!("its {SSH_FILE} is unreadable"));
        };
        self.set_host(row, &job.host);
        self.set_logout(row, job.logout.clone());
        let mirrored = std::fs::metadata(JobDir(job_dir).log()).map_or(0, |m| m.len());
        let pid = crate::supervisor::tree::TreeRecord::read(job_dir)
            .job
            .map_or(0, |(pid, _)| pid);
        let handle = self.track(
            row,
            job_dir.to_path_buf(),
            job,
            owner.to_string(),
            true,
            mirrored,
        );
        Reattach::Running(Running {
            pid,
            dropped: 0,
            unwritten: 0,
            unwritten_at: 0,
            handle,
            between: None,
        })
    }

    fn view(&self, row: i64, job_dir: &str) -> Option<View> {
        let host = self.host_of(row, job_dir)?;
        let unreachable = self.links.known(&host).and_then(|l| l.unreachable());
        let logout = self
            .logouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&row)
            .map(|why| format!("on {host}: {why}"));
        Some(View {
            which: Which::Ssh,
            host: Some(host),
            unreachable,
            logout,
            ..View::default()
        })
    }

    /// The job's supervisor lives on the host, asked through its daemon.
    fn supervisor_alive(&self, _job_dir: &Path) -> bool {
        true
    }

    /// Nothing of it runs on this machine; the host's daemon stops what is left there.
    fn sweep(&self, _key: &str, _job_dir: &Path) -> usize {
        0
    }

    fn claim(&self, row: i64) {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(row, Some(String::new()));
    }
}

/// What a job on a host cannot be asked.
fn refuses(command: &ToSupervisor) -> Option<&'static str> {
    match command {
        // Input (a pane's keys too) goes as a write, answered by the host's daemon.
        ToSupervisor::Input { .. } => Some("input reaches a job on an ssh host as a write"),
        ToSupervisor::Signal { signal } if key_of(*signal).is_none() && !is_hangup(*signal) => {
            Some("a job on an ssh host takes the keys C-c, C-\\ and C-z, no other signal")
        }
        ToSupervisor::Hello { .. } => Some("a job on an ssh host is reached through its host"),
        ToSupervisor::Rerun { .. } => Some("restart policies are not supported on ssh hosts yet"),
        ToSupervisor::Signal { .. }
        | ToSupervisor::Resize { .. }
        | ToSupervisor::CloseInput
        | ToSupervisor::Stop { .. }
        | ToSupervisor::Write { .. }
        | ToSupervisor::Pace { .. } => None,
    }
}

/// SIGHUP, which only `close` sends (a pane's hang-up): `close` on the host.
fn is_hangup(signal: i32) -> bool {
    signal == nix::sys::signal::Signal::SIGHUP as i32
}

/// The key of `send --key` that makes the host's daemon send a plain job `signal`, as
/// `keys::plain_job_key` maps it.
fn key_of(signal: i32) -> Option<&'static str> {
    use nix::sys::signal::Signal;
    match signal {
        s if s == Signal::SIGINT as i32 => Some("C-c"),
        s if s == Signal::SIGQUIT as i32 => Some("C-\\"),
        s if s == Signal::SIGTSTP as i32 => Some("C-z"),
        _ => None,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a job's folder says it runs on an ssh host.
pub fn host_of(job_dir: &Path) -> Option<String> {
    match job_dir.as_os_str().is_empty() {
        true => None,
        false => read_ssh_file(job_dir).map(|job| job.host),
    }
}

fn read_ssh_file(job_dir: &Path) -> Option<SshJob> {
    let bytes = crate::paths::read_untrusted(&job_dir.join(SSH_FILE), 1 << 16).ok()?;
    control::decode(&bytes).ok()
}

fn write_ssh_file(job_dir: &Path, job: &SshJob) -> Result<(), String> {
    crate::paths::write_whole(&job_dir.join(SSH_FILE), &control::encode(job))
        .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_and_folders_are_checked() {
        assert_eq!(
            super::choose(Some("ssh:me@box"), "--").unwrap(),
            Some("me@box".to_string())
        );
        assert_eq!(super::choose(Some("local"), "--").unwrap(), None);
        for bad in ["ssh:", "ssh:-oProxyCommand=x", "ssh:a b"] {
            assert!(super::choose(Some(bad), "--").is_err(), "{bad}");
        }
        assert!(super::check_cwd("/srv/x", "--cwd").is_ok());
        assert!(super::check_cwd("srv/x", "--cwd").is_err());
    }
}

/// A host daemon's words for a caller here: its own ids of items mean nothing here
/// (the caller knows the job by its id here), so "bg-23 could not start: …" at the
/// front is left to the reason, and any other id there is marked as the host's.
fn host_words(host: &str, message: &str) -> String {
    static ID: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let id = ID.get_or_init(|| {
        regex::Regex::new(r"\b(?:[A-Za-z0-9_.-]+/)?bg-[0-9]+\b").expect("a valid pattern")
    });
    let message = match message.split_once(" could not start: ") {
        Some((front, reason)) if id.find(front).is_some_and(|m| m.as_str() == front) => reason,
        _ => message,
    };
    id.replace_all(message, |m: &regex::Captures| {
        format!("{} (its id on {host})", &m[0])
    })
    .into_owned()
}

#[cfg(test)]
mod host_words_tests {
    use super::host_words;

    #[test]
    fn issue24_w3_the_hosts_ids_are_never_shown_as_ids_here() {
        assert_eq!(
            host_words("gpu", "bg-23 could not start: /nope: no such folder"),
            "/nope: no such folder"
        );
        assert_eq!(
            host_words("gpu", "bg-23 is not running"),
            "bg-23 (its id on gpu) is not running"
        );
        assert_eq!(host_words("gpu", "no id here"), "no id here");
    }
}
