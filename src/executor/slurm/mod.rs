//! `SlurmExecutor`: jobs run by a Slurm cluster, each under the same supervisor as a
//! local job, started on the compute node by the batch script.
//!
//! How it works: `start` writes the job's spec into its folder (the supervisor reads it
//! and removes it), a batch script that runs `bgwork supervise --spec-file`, and
//! `slurm.json` (the job's Slurm name `bgw-<home-id>-<row>`, written before `sbatch`
//! so that a daemon that dies meanwhile finds the job by name and never submits it
//! twice, then its Slurm job id). One task per job then watches the job's folder,
//! which must be on a filesystem both the daemon and the node see: the tree record
//! (the job's process started: `spawned`), the log's length (`output`) and the status
//! file (the end); and asks `scontrol` how Slurm sees the job, for the queue's reason
//! and for the ends that leave no status (a time limit or a node that failed with the
//! supervisor). Commands reach the supervisor as files in the folder's `commands/`
//! (see ARCHITECTURE.md: no connection from the daemon to the node is needed), with
//! `scancel` as the backstop when the supervisor does not end the job in time.

mod commands;
mod folder_wake;
pub mod handover;
mod options;
mod scheduler;

pub use commands::{supervise, CommandFiles};
pub use options::choose;
pub use scheduler::parse_exit_code;

use super::{
    Command, ExecEvent, Executor, JobHandle, On, Reattach, Running, View, Which, WriteRefused,
    Writes,
};
use crate::job_dir::JobDir;
use crate::paths::now_ms;
use crate::supervisor::{self, tree::TreeRecord};
use crate::wire::control::{self, ExitStatus, JobSpec, ToSupervisor, PROTOCOL};
use crate::wire::{Actor, End, SlurmArgs};
use handover::{Held, Values};
use scheduler::{find_by_name, job_info, slurm_call, JobInfo, Queue, Seen, Watch};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The file in a job's folder that says it runs on Slurm, and as which Slurm job.
pub const SLURM_FILE: &str = "slurm.json";
const SPEC_FILE: &str = "spec.json";
const SCRIPT_FILE: &str = "slurm.sh";
/// The batch script's own output (the supervisor's complaints, Slurm's messages).
const SLURM_OUT: &str = "slurm.out";
/// How often the job's folder is looked at.
const FILES_EVERY: Duration = Duration::from_millis(100);
/// How often a job's tracker reads what Slurm last said of it.
const SCHEDULER_EVERY: Duration = Duration::from_millis(1000);
/// How long a job Slurm says has ended is given for its status file to appear (a
/// shared filesystem may show it late) before the end is taken from Slurm.
const STATUS_PATIENCE: Duration = Duration::from_secs(5);
/// How long the supervisor on the node has to take input left for it.
const INPUT_PATIENCE: Duration = Duration::from_secs(10);
/// After a stop's grace, how long the supervisor has to end the job before `scancel`.
const STOP_SLACK: Duration = Duration::from_secs(5);

/// What `slurm.json` holds.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct SlurmJob {
    pub name: String,
    #[serde(default)]
    pub job_id: Option<String>,
    #[serde(default)]
    pub args: SlurmArgs,
    /// What the Slurm commands of this job run with: the caller's `SLURM_CONF` and
    /// `PATH` (the daemon may have been started with other ones).
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

/// The variables of a job's environment that its Slurm commands take, and the only
/// ones they get: where Slurm's configuration is, where its commands are, and the
/// defaults of `sbatch` options a site asks its users to set (an account, say) that
/// bgwork leaves to the caller. No other value of the caller's, nor any of the daemon's,
/// reaches `sbatch`, which would save it in Slurm's state and give it to the job.
const SLURM_ENV: [&str; 9] = [
    "SLURM_CONF",
    "PATH",
    "SBATCH_ACCOUNT",
    "SBATCH_PARTITION",
    "SBATCH_QOS",
    "SBATCH_RESERVATION",
    "SBATCH_TIMELIMIT",
    "SBATCH_CONSTRAINT",
    "SBATCH_WCKEY",
];

fn slurm_env(env: &std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut chosen: Vec<(String, String)> = SLURM_ENV
        .iter()
        .filter_map(|name| env.get(*name).map(|v| (name.to_string(), v.clone())))
        .collect();
    // A caller without a PATH: Slurm's commands are found on the daemon's.
    if !env.contains_key("PATH") {
        if let Ok(path) = std::env::var("PATH") {
            chosen.push(("PATH".into(), path));
        }
    }
    chosen
}

/// What `list` shows of a job on Slurm.
#[derive(Debug, Clone, Default)]
pub struct SlurmView {
    pub job_id: Option<String>,
    /// `squeue`'s reason while Slurm has not started it.
    pub reason: Option<String>,
}

pub struct SlurmExecutor {
    exe: Arc<PathBuf>,
    events: mpsc::UnboundedSender<ExecEvent>,
    home_id: String,
    /// Rows known to run (or to have run) on Slurm; `None`: known not to.
    views: Arc<Mutex<HashMap<i64, Option<SlurmView>>>>,
    queue: Arc<Queue>,
}

impl SlurmExecutor {
    pub fn new(events: mpsc::UnboundedSender<ExecEvent>, home: &Path) -> SlurmExecutor {
        let exe = std::env::var_os("BGWORK_SLURM_BGWORK")
            .map(PathBuf::from)
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_else(|| PathBuf::from("bgwork"));
        SlurmExecutor {
            exe: Arc::new(exe),
            events,
            home_id: home_id(home),
            views: Arc::default(),
            queue: Arc::default(),
        }
    }

    /// The Slurm job name of a row: `bgw-<home-id>-<row>`.
    pub fn job_name(&self, row: i64) -> String {
        format!("bgw-{}-{row}", self.home_id)
    }

    /// What `list` shows of a row: `None` for a job of this machine. A row not seen
    /// since the daemon started is looked up in its folder once.
    fn slurm_view(&self, row: i64, job_dir: &str) -> Option<SlurmView> {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(view) = views.get(&row) {
            return view.clone();
        }
        // A folder whose `slurm.json` cannot be read is still Slurm's (its reattach
        // says so).
        let found = (!job_dir.is_empty())
            .then(|| {
                let dir = Path::new(job_dir);
                read_slurm_file(dir).or_else(|| is_slurm_job(dir).then(SlurmJob::default))
            })
            .flatten()
            .map(|job| SlurmView {
                job_id: job.job_id,
                reason: None,
            });
        views.insert(row, found.clone());
        found
    }

    fn set_view(&self, row: i64, view: SlurmView) {
        set_view(&self.views, row, view);
    }

    /// Submits a job with `sbatch`; `Spawned`, `Output` and `Ended` follow as events.
    async fn submit(
        &self,
        row: i64,
        spec: &JobSpec,
        args: &SlurmArgs,
    ) -> Result<JobHandle, String> {
        let job_dir = PathBuf::from(&spec.job_dir);
        let name = self.job_name(row);
        let mut job = SlurmJob {
            name: name.clone(),
            job_id: None,
            args: args.clone(),
            env: slurm_env(&spec.env),
        };
        // The spec file holds what is not sensitive; the job's environment and secrets
        // stay in this process until the supervisor asks for them (`handover`).
        let mut on_disk = spec.clone();
        let values = Values::take(&mut on_disk);
        write_private(&job_dir.join(SPEC_FILE), &control::encode(&on_disk))?;
        let script = format!(
            "#!/bin/sh\n# Written by bgwork: the job's supervisor, in the allocation.\nexec {} supervise --spec-file {}\n",
            shell_quote(&self.exe.display().to_string()),
            shell_quote(&job_dir.join(SPEC_FILE).display().to_string()),
        );
        write_private(&job_dir.join(SCRIPT_FILE), script.as_bytes())?;
        write_slurm_file(&job_dir, &job)?;
        self.set_view(row, SlurmView::default());
        let mut command = tokio::process::Command::new("sbatch");
        command
            .arg("--parsable")
            .arg("--no-requeue")
            // The job's environment is the one `sbatch` runs with, which bgwork chose
            // (`slurm_env`); its values come to the supervisor sealed (`handover`).
            // Not NONE, nor a list of names: with those Slurm loads the user's login
            // environment on the node (`--get-user-env`).
            .arg("--export=ALL")
            .arg(format!("--job-name={name}"))
            .arg(format!("--output={}", job_dir.join(SLURM_OUT).display()))
            .arg(format!("--chdir={}", job_dir.display()));
        if let Some(partition) = &args.partition {
            command.arg(format!("--partition={partition}"));
        }
        if let Some(time) = &args.time {
            command.arg(format!("--time={time}"));
        }
        if let Some(cpus) = args.cpus {
            command.arg(format!("--cpus-per-task={cpus}"));
        }
        if let Some(mem) = &args.mem {
            command.arg(format!("--mem={mem}"));
        }
        if let Some(gpus) = args.gpus {
            command.arg(format!("--gpus={gpus}"));
        }
        if let Some(nodes) = args.nodes {
            command.arg(format!("--nodes={nodes}"));
        }
        command.args(&args.sbatch_args);
        command.arg(job_dir.join(SCRIPT_FILE));
        // Slurm's SLURM_SUBMIT_DIR: the caller's folder, as when they run sbatch there.
        if Path::new(&spec.cwd).is_dir() {
            command.current_dir(&spec.cwd);
        }
        let output = slurm_call(command, &job.env).await.map_err(|e| {
            let _ = std::fs::remove_file(job_dir.join(SPEC_FILE));
            format!("sbatch could not submit it: {e}")
        })?;
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        let job_id = output
            .trim()
            .split(';')
            .next()
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("sbatch answered {output:?}, not a job id"))?
            .to_string();
        job.job_id = Some(job_id.clone());
        if let Err(e) = write_slurm_file(&job_dir, &job) {
            // The job runs all the same: a restarted daemon finds it by its name.
            crate::note!("bgwork daemon: {e}");
        }
        self.set_view(
            row,
            SlurmView {
                job_id: Some(job_id.clone()),
                reason: None,
            },
        );
        Ok(self.track(
            row,
            job_dir,
            job_id,
            spec.owner.clone(),
            false,
            job.env,
            Held::Values(values),
        ))
    }

    /// Finds a job on Slurm again after a daemon restart: by its status file, else by
    /// its Slurm job id (or, when the daemon died before it was written, its name).
    async fn find_again(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        let job = read_slurm_file(job_dir);
        if let Some(found) = supervisor::read_status(job_dir, owner) {
            let env = job.as_ref().map(|j| j.env.clone()).unwrap_or_default();
            return match (found, job.and_then(|j| j.job_id)) {
                (Ok(status), Some(id)) => {
                    let name = self.job_name(row);
                    Reattach::Ended(slurm_detail(&id, &name, status, None, &env).await)
                }
                (Ok(status), None) => Reattach::Ended(status),
                (Err(reason), _) => Reattach::Lost(reason),
            };
        }
        let Some(mut job) = job else {
            return Reattach::Lost(format!("its {SLURM_FILE} is unreadable"));
        };
        if job.job_id.is_none() {
            match find_by_name(&job.name, &job.env).await {
                Ok(Some(id)) => {
                    job.job_id = Some(id);
                    let _ = write_slurm_file(job_dir, &job);
                }
                Ok(None) => {
                    return Reattach::Lost(
                        "the daemon stopped while submitting it to Slurm, which does not know it"
                            .into(),
                    )
                }
                Err(e) => crate::note!("bgwork daemon: {e}"),
            }
        }
        let Some(job_id) = job.job_id else {
            return Reattach::Lost("Slurm could not be asked for it".into());
        };
        self.set_view(
            row,
            SlurmView {
                job_id: Some(job_id.clone()),
                reason: None,
            },
        );
        let spawned = TreeRecord::read(job_dir).job;
        // A job that has not started has no way to its values any more: they were in
        // the memory of the daemon that submitted it.
        let held = match spawned {
            Some(_) => Held::HandedOver,
            None => Held::Gone(handover::GONE_WITH_THE_DAEMON.into()),
        };
        // A job not started yet is told `spawned` when it starts, as a new one is.
        let handle = self.track(
            row,
            job_dir.to_path_buf(),
            job_id,
            owner.to_string(),
            spawned.is_some(),
            job.env,
            held,
        );
        let (dropped, unwritten, unwritten_at) = figures(job_dir);
        Reattach::Running(Running {
            pid: spawned.map_or(0, |(pid, _)| pid),
            dropped,
            unwritten,
            unwritten_at,
            handle,
            between: None,
        })
    }

    /// Spawns the task that watches one job; returns its handle.
    #[allow(clippy::too_many_arguments)]
    fn track(
        &self,
        row: i64,
        job_dir: PathBuf,
        job_id: String,
        owner: String,
        reattached: bool,
        env: Vec<(String, String)>,
        held: Held,
    ) -> JobHandle {
        let (commands, incoming) = mpsc::unbounded_channel();
        // Answers are files named by `seq`: a restarted daemon's never meet an older
        // one's.
        let writes = Writes {
            next_seq: now_ms().max(0) as u64 * 1000,
            ..Writes::default()
        };
        let handle = JobHandle::new(commands, writes.unanswered.clone(), refuses);
        let name = self.job_name(row);
        let tracker = Tracker {
            row,
            _watch: self.queue.watch(&job_id, &name, &env),
            queue: self.queue.clone(),
            job_dir,
            job_id,
            name,
            owner,
            writes,
            events: self.events.clone(),
            views: self.views.clone(),
            spawned: false,
            reattached,
            log_len: 0,
            figures: (0, 0, 0),
            stop: None,
            ended_seen: None,
            said_unreachable: false,
            commands_left: 0,
            env,
            held,
        };
        tokio::spawn(tracker.run(incoming));
        handle
    }
}

impl Executor for SlurmExecutor {
    async fn start(&self, row: i64, spec: &JobSpec, on: &On) -> Result<JobHandle, String> {
        match on {
            On::Slurm(args) => self.submit(row, spec, args).await,
            On::Local | On::Ssh(_) => {
                Err("a job for another executor was handed to the Slurm executor".into())
            }
        }
    }

    async fn reattach(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        self.find_again(row, job_dir, owner).await
    }

    fn view(&self, row: i64, job_dir: &str) -> Option<View> {
        self.slurm_view(row, job_dir).map(|view| View {
            which: Which::Slurm,
            queue_reason: view.reason,
            slurm_job_id: view.job_id,
            ..View::default()
        })
    }

    /// The supervisor runs on a node; where the node is this machine (a loopback
    /// cluster) its recorded pid and start time say whether it lives, as locally.
    fn supervisor_alive(&self, job_dir: &Path) -> bool {
        super::local::supervisor_alive(job_dir)
    }

    fn claim(&self, row: i64) {
        self.set_view(row, SlurmView::default());
    }

    /// As locally: what the record names is killed only where it is still the job's
    /// (pid and start time), so a node's pids never hit this machine's processes.
    fn sweep(&self, key: &str, job_dir: &Path) -> usize {
        supervisor::tree::sweep_job(key, job_dir)
    }
}

/// The commands a job on Slurm cannot carry out: the supervisor on the node takes only
/// what it reads from the folder's `commands/`.
fn refuses(command: &ToSupervisor) -> Option<&'static str> {
    match command {
        ToSupervisor::Resize { .. } => {
            Some("a job on Slurm has no terminal to resize (panes run on this machine)")
        }
        ToSupervisor::Hello { .. } => Some("a job on Slurm is not reached by a connection"),
        ToSupervisor::Rerun { .. } => {
            Some("restart policies are not supported on Slurm yet (`--restart` runs locally)")
        }
        ToSupervisor::Stop { .. }
        | ToSupervisor::Input { .. }
        | ToSupervisor::Write { .. }
        | ToSupervisor::CloseInput
        | ToSupervisor::Signal { .. }
        | ToSupervisor::Pace { .. } => None,
    }
}

/// The next wake of a folder's watch; never without one.
async fn next_wake(wake: &mut Option<folder_wake::FolderWake>) {
    match wake {
        Some(wake) => wake.next().await,
        None => std::future::pending().await,
    }
}

/// A stop asked for: by whom, and when `scancel` takes over.
struct Stop {
    actor: Actor,
    backstop_at: tokio::time::Instant,
    cancelled: bool,
}

struct Tracker {
    row: i64,
    job_dir: PathBuf,
    job_id: String,
    /// Its Slurm name (`bgw-<home-id>-<row>`).
    name: String,
    owner: String,
    /// Listed by the daemon's one `squeue` while this tracker lives.
    _watch: Watch,
    queue: Arc<Queue>,
    /// Input left for the supervisor, answered through the folder.
    writes: Writes,
    events: mpsc::UnboundedSender<ExecEvent>,
    views: Arc<Mutex<HashMap<i64, Option<SlurmView>>>>,
    spawned: bool,
    /// Taken back by a restarted daemon, which already knows whether it runs.
    reattached: bool,
    log_len: u64,
    /// The log's dropped, unwritten and unwritten-at figures last told.
    figures: (u64, u64, u64),
    stop: Option<Stop>,
    /// When Slurm was first seen to say the job ended, and what it said.
    ended_seen: Option<(tokio::time::Instant, JobInfo)>,
    said_unreachable: bool,
    /// Commands left in the folder so far (their files' names sort by it).
    commands_left: u64,
    env: Vec<(String, String)>,
    /// The job's environment and secrets, until its supervisor takes them.
    held: Held,
}

impl Tracker {
    async fn run(mut self, mut incoming: mpsc::UnboundedReceiver<Command>) {
        let mut files = tokio::time::interval(FILES_EVERY);
        files.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut scheduler = tokio::time::interval(SCHEDULER_EVERY);
        scheduler.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut commands_open = true;
        // The supervisor's files (its key, its tree record, its status) are looked at
        // as soon as they are renamed into place where inotify sees it, else on the
        // clock.
        let mut wake = folder_wake::FolderWake::new(&self.job_dir);
        loop {
            tokio::select! {
                command = incoming.recv(), if commands_open => match command {
                    Some(command) => self.command(command).await,
                    None => commands_open = false,
                },
                _ = next_wake(&mut wake) => {
                    if let Some(status) = self.look_at_files() {
                        let status = self.with_slurm_detail(status).await;
                        self.end(status);
                        return;
                    }
                }
                _ = files.tick() => {
                    if let Some(status) = self.look_at_files() {
                        let status = self.with_slurm_detail(status).await;
                        self.end(status);
                        return;
                    }
                }
                _ = scheduler.tick() => {
                    if let Some(status) = self.ask_scheduler().await {
                        self.end(status);
                        return;
                    }
                }
            }
        }
    }

    /// Tells the end. The spec and the hand-over's files go if they are still there:
    /// a job taken off the queue before it started never read them.
    fn end(&self, status: ExitStatus) {
        for file in [SPEC_FILE, handover::KEY_FILE, handover::SEALED_FILE] {
            let _ = std::fs::remove_file(self.job_dir.join(file));
        }
        let _ = self.events.send(ExecEvent::Ended {
            row: self.row,
            status,
        });
    }

    /// What `list` shows as the reason the job waits in Slurm's queue (none once it runs).
    fn set_reason(&self, reason: Option<String>) {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(view)) = views.get_mut(&self.row) {
            view.reason = reason;
        }
    }

    /// Spawned and output from the folder; the status once the supervisor wrote it.
    fn look_at_files(&mut self) -> Option<ExitStatus> {
        self.take_answers();
        if !self.spawned {
            self.held.answer(&self.job_dir);
            if let Some((pid, _)) = TreeRecord::read(&self.job_dir).job {
                self.spawned = true;
                self.set_reason(None);
                if !self.reattached {
                    let _ = self.events.send(ExecEvent::Spawned { row: self.row, pid });
                }
            }
        }
        let len = std::fs::metadata(JobDir(&self.job_dir).log()).map_or(0, |m| m.len());
        // The figures may be written after the log's last growth was seen.
        let figures = figures(&self.job_dir);
        if len > self.log_len || figures != self.figures {
            self.log_len = len;
            self.figures = figures;
            let (dropped, unwritten, unwritten_at) = figures;
            let _ = self.events.send(ExecEvent::Output {
                row: self.row,
                log_len: len,
                dropped,
                unwritten,
                unwritten_at,
            });
        }
        match supervisor::read_status(&self.job_dir, &self.owner) {
            Some(Ok(status)) => Some(status),
            _ => None,
        }
    }

    /// A status the supervisor wrote, with what Slurm adds: a time limit, or a
    /// cancellation by someone outside bgwork (the supervisor saw only a TERM).
    async fn with_slurm_detail(&self, status: ExitStatus) -> ExitStatus {
        let asked = self.stop.as_ref().map(|s| s.actor);
        slurm_detail(&self.job_id, &self.name, status, asked, &self.env).await
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Send(ToSupervisor::Stop { grace_ms, actor }) => {
                let grace = Duration::from_millis(grace_ms);
                self.stop = Some(Stop {
                    actor,
                    backstop_at: tokio::time::Instant::now() + grace + STOP_SLACK,
                    cancelled: false,
                });
                // A supervisor that starts after this is stopped by the file too.
                self.leave_command(&control::encode(&ToSupervisor::Stop { grace_ms, actor }));
                if !self.spawned && TreeRecord::read(&self.job_dir).job.is_none() {
                    // Not started yet: Slurm takes it off its queue.
                    self.cancel().await;
                }
            }
            Command::Send(
                command @ (ToSupervisor::Signal { .. }
                | ToSupervisor::Input { .. }
                | ToSupervisor::CloseInput),
            ) => self.leave_command(&control::encode(&command)),
            // The folder is looked at every 100 ms whatever the pace: nothing to tell.
            Command::Send(ToSupervisor::Pace { .. }) => {}
            // Refused by the handle before they are sent (see `refuses`).
            Command::Send(
                command @ (ToSupervisor::Resize { .. }
                | ToSupervisor::Hello { .. }
                | ToSupervisor::Rerun { .. }),
            ) => {
                crate::note!(
                    "bgwork daemon: Slurm job {} cannot carry out {command:?}",
                    self.job_id
                );
            }
            Command::Send(ToSupervisor::Write { .. }) => {
                crate::note!(
                    "bgwork daemon: input for Slurm job {} comes as a write with its answer",
                    self.job_id
                );
            }
            Command::Write { answer, .. } if !self.spawned => {
                let _ = answer.send(Err(WriteRefused::Unreachable(
                    "it has not started yet (it waits in Slurm's queue): send it once it runs"
                        .into(),
                )));
            }
            Command::Write { data, answer } => {
                for line in self.writes.ask(data, answer) {
                    self.leave_command(&line);
                }
            }
        }
    }

    /// Leaves a command (one encoded line) for the supervisor in the job's folder,
    /// written whole, then renamed into place, so it never reads half of one. Names
    /// sort in the order they were left.
    fn leave_command(&mut self, line: &[u8]) {
        let dir = JobDir(&self.job_dir).commands();
        let _ = std::fs::create_dir(&dir);
        self.commands_left += 1;
        let name = format!(
            "{:013}-{}-{:08}",
            now_ms(),
            std::process::id(),
            self.commands_left
        );
        if let Err(e) = crate::paths::write_whole(&dir.join(format!("{name}.json")), line) {
            crate::note!(
                "bgwork daemon: could not leave a command in {}: {e}",
                dir.display()
            );
        }
    }

    /// The supervisor's answers to input left for it, and the writes it has not
    /// answered in time.
    fn take_answers(&mut self) {
        if self.writes.waiting.is_empty() {
            return;
        }
        let dir = JobDir(&self.job_dir).answers();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|x| x != "json") {
                    continue;
                }
                let answer = crate::paths::read_untrusted(&path, 4096)
                    .ok()
                    .and_then(|bytes| control::decode::<control::FromSupervisor>(&bytes).ok());
                let _ = std::fs::remove_file(&path);
                match answer {
                    Some(control::FromSupervisor::InputTaken { seq, queued }) => {
                        self.writes.answer(seq, Ok(queued));
                    }
                    Some(control::FromSupervisor::InputRefused { seq, reason, full }) => {
                        let refused = match full {
                            true => WriteRefused::Full(reason),
                            false => WriteRefused::Closed,
                        };
                        self.writes.answer(seq, Err(refused));
                    }
                    _ => {}
                }
            }
        }
        self.writes.expire(INPUT_PATIENCE);
    }

    async fn cancel(&mut self) {
        if let Some(stop) = self.stop.as_mut() {
            stop.cancelled = true;
        }
        let mut command = tokio::process::Command::new("scancel");
        command.arg(&self.job_id);
        if let Err(e) = slurm_call(command, &self.env).await {
            crate::note!("bgwork daemon: scancel {} failed: {e}", self.job_id);
        }
    }

    /// Asks Slurm how the job stands: the queue's reason, the backstop of a stop, and
    /// the end of a job that left no status.
    async fn ask_scheduler(&mut self) -> Option<ExitStatus> {
        let due = self
            .stop
            .as_ref()
            .is_some_and(|s| !s.cancelled && tokio::time::Instant::now() >= s.backstop_at);
        if due {
            crate::note!(
                "bgwork daemon: the supervisor of Slurm job {} did not end it in time: scancel",
                self.job_id
            );
            self.cancel().await;
        }
        let info = match self.queue.seen(&self.job_id) {
            Seen::NotYet => return None,
            Seen::Unreachable(e) => {
                if !self.said_unreachable {
                    self.said_unreachable = true;
                    crate::note!("bgwork daemon: Slurm does not answer ({e}); asking again");
                }
                return None;
            }
            Seen::Listed { state, reason } if state == "PENDING" => {
                self.said_unreachable = false;
                if let Some(why) = self.held.gone().map(str::to_string) {
                    // It could only start without its environment: taken off the queue.
                    self.cancel().await;
                    return Some(self.never_started(why));
                }
                self.set_reason(Some(reason));
                return None;
            }
            seen if !seen.ended() => {
                self.said_unreachable = false;
                return None;
            }
            // An end: its detail (codes, signal) once, from `scontrol`.
            _ => match &self.ended_seen {
                Some((_, info)) => info.clone(),
                None => match job_info(&self.job_id, &self.name, &self.env).await {
                    Ok(Some(info)) if info.ended() => info,
                    // Listed as ended a moment ago, yet not ended now: asked again later.
                    Ok(Some(_)) => return None,
                    Ok(None) => JobInfo {
                        state: "UNKNOWN".into(),
                        ..JobInfo::default()
                    },
                    Err(e) => {
                        crate::note!("bgwork daemon: Slurm does not answer ({e}); asking again");
                        return None;
                    }
                },
            },
        };
        self.said_unreachable = false;
        let now = tokio::time::Instant::now();
        let first = self.ended_seen.get_or_insert((now, info.clone())).0;
        // A job taken off the queue before it started leaves no status to wait for.
        let never_ran = !self.spawned && self.stop.as_ref().is_some_and(|s| s.cancelled);
        if now < first + STATUS_PATIENCE && !never_ran {
            return None;
        }
        // One last look: the status file may have come with this very tick.
        if let Some(status) = self.look_at_files() {
            return Some(self.with_slurm_detail(status).await);
        }
        Some(self.status_from_scheduler(&info))
    }

    /// The end of a job that never started and never will.
    fn never_started(&self, why: String) -> ExitStatus {
        ExitStatus {
            protocol: PROTOCOL,
            owner: self.owner.clone(),
            ended_at_ms: now_ms(),
            spawn_error: Some(why),
            ..ExitStatus::default()
        }
    }

    /// The end of a job whose supervisor left no status, from what Slurm says.
    fn status_from_scheduler(&self, info: &JobInfo) -> ExitStatus {
        let mut status = ExitStatus {
            protocol: PROTOCOL,
            owner: self.owner.clone(),
            ended_at_ms: now_ms(),
            log_len: std::fs::metadata(JobDir(&self.job_dir).log()).map_or(0, |m| m.len()),
            pid: TreeRecord::read(&self.job_dir).job.map(|(pid, _)| pid),
            ..ExitStatus::default()
        };
        // Slurm's `EXIT:SIGNAL` of the batch step: the signal Slurm ended it with.
        let signal = info.signal.filter(|&s| s != 0);
        let said = format!("Slurm job {} ended {}", self.job_id, info.state);
        match info.state.as_str() {
            "TIMEOUT" => {
                status.scheduler_end = Some(End::Signaled);
                status.signal = signal;
                status.detail = Some("time limit".into());
            }
            "OUT_OF_MEMORY" => {
                status.scheduler_end = Some(End::Signaled);
                status.signal = signal;
                status.detail = Some("out of memory".into());
            }
            "DEADLINE" | "PREEMPTED" => {
                status.scheduler_end = Some(End::Signaled);
                status.signal = signal;
                status.detail = Some(info.state.to_lowercase());
            }
            "NODE_FAIL" | "BOOT_FAIL" => {
                status.scheduler_end = Some(End::Lost);
                status.detail = Some("node failed".into());
            }
            // A controller restarted without its saved state forgets the jobs it had
            // not saved yet, and its nodes end them.
            "UNKNOWN" if self.spawned => {
                status.scheduler_end = Some(End::Lost);
                status.detail = Some(format!(
                    "Slurm no longer knows job {} and its supervisor left no status (was \
                     slurmctld restarted before it saved the job?)",
                    self.job_id
                ));
            }
            "CANCELLED" => {
                let actor = self.stop.as_ref().map_or(Actor::Person, |s| s.actor);
                status.stop_actor = Some(actor);
                status.detail = Some(match self.stop.as_ref().is_some_and(|s| s.cancelled) {
                    true if self.spawned => {
                        "its supervisor did not end it in time: cancelled with scancel".into()
                    }
                    true => "cancelled in Slurm's queue before it started".into(),
                    false => "cancelled in Slurm (scancel)".into(),
                });
            }
            _ if !self.spawned => {
                status.spawn_error = Some(format!(
                    "{said} (exit {}) before its supervisor started the command: see {}",
                    info.exit_text(),
                    self.job_dir.join(SLURM_OUT).display()
                ));
            }
            _ => {
                status.scheduler_end = Some(End::Lost);
                status.detail = Some(format!(
                    "its supervisor left no status ({said}, exit {})",
                    info.exit_text()
                ));
            }
        }
        status
    }
}

/// A status the supervisor wrote, with what Slurm adds: a time limit, or a
/// cancellation by someone outside bgwork (the supervisor saw only a TERM), which is
/// the person's stop unless bgwork asked for it (`asked`).
async fn slurm_detail(
    job_id: &str,
    name: &str,
    mut status: ExitStatus,
    asked: Option<Actor>,
    env: &[(String, String)],
) -> ExitStatus {
    // A job ended by a signal bgwork did not send may have been ended by Slurm (a time
    // limit, an outside scancel), which Slurm may not say yet in the instant the
    // status appears, nor answer at once under load: asked for a few seconds.
    let by_signal = status.signal.is_some() || status.exit_code.is_some_and(|c| c > 128);
    let tries = if by_signal && status.stop_actor.is_none() {
        12
    } else {
        1
    };
    let mut info = None;
    for attempt in 1..=tries {
        match job_info(job_id, name, env).await {
            Ok(Some(said)) if said.ended() || attempt == tries => {
                info = Some(said);
                break;
            }
            Ok(None) => return status,
            Ok(Some(_)) | Err(_) if attempt < tries => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(Some(_)) | Err(_) => {}
        }
    }
    let Some(info) = info else {
        return status;
    };
    match info.state.as_str() {
        "TIMEOUT" => status.detail = Some("time limit".into()),
        "OUT_OF_MEMORY" => status.detail = Some("out of memory".into()),
        "NODE_FAIL" | "BOOT_FAIL" => status.detail = Some("node failed".into()),
        "CANCELLED" if status.stop_actor.is_none() => {
            status.stop_actor = Some(asked.unwrap_or(Actor::Person));
            status.detail = Some("cancelled in Slurm (scancel)".into());
        }
        _ => {}
    }
    status
}

fn set_view(views: &Mutex<HashMap<i64, Option<SlurmView>>>, row: i64, view: SlurmView) {
    views
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(row, Some(view));
}

/// The log's dropped middle and unwritten bytes as the supervisor last wrote them
/// (none written: nothing dropped, nothing lost).
fn figures(job_dir: &Path) -> (u64, u64, u64) {
    let read = crate::paths::read_untrusted(&JobDir(job_dir).figures(), 4096)
        .ok()
        .and_then(|bytes| control::decode::<control::FromSupervisor>(&bytes).ok());
    match read {
        Some(control::FromSupervisor::Output {
            dropped,
            unwritten,
            unwritten_at,
            ..
        }) => (dropped, unwritten, unwritten_at),
        _ => (0, 0, 0),
    }
}

/// Whether a job's folder says it runs on Slurm.
fn is_slurm_job(job_dir: &Path) -> bool {
    job_dir.join(SLURM_FILE).exists()
}

/// What a job that ran on Slurm asked of it (none for a job of this machine).
pub fn args_of(job_dir: &Path) -> Option<SlurmArgs> {
    match job_dir.as_os_str().is_empty() {
        true => None,
        false => read_slurm_file(job_dir).map(|job| job.args),
    }
}

fn read_slurm_file(job_dir: &Path) -> Option<SlurmJob> {
    let bytes = crate::paths::read_untrusted(&job_dir.join(SLURM_FILE), 1 << 16).ok()?;
    control::decode(&bytes).ok()
}

fn write_slurm_file(job_dir: &Path, job: &SlurmJob) -> Result<(), String> {
    crate::paths::write_whole(&job_dir.join(SLURM_FILE), &control::encode(job))
        .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|e| format!("could not write {}: {e}", path.display()))
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A short id of a home, the same for every daemon of that home (FNV-1a of its path),
/// so that Slurm job names of two homes never meet.
pub(crate) fn home_id(home: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in home.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", hash as u32)
}
