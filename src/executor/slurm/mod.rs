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
mod folder;
mod folder_wake;
pub mod handover;
mod options;
mod scheduler;
mod tracker;

pub use commands::{supervise, CommandFiles};
pub use options::choose;
pub use scheduler::parse_exit_code;

use super::{ExecEvent, Executor, JobHandle, On, Reattach, Running, View, Which, Writes};
use crate::paths::now_ms;
use crate::supervisor::{self, tree::TreeRecord};
use crate::wire::control::{self, JobSpec};
use crate::wire::SlurmArgs;
use folder::{figures, write_private, SCRIPT_FILE, SLURM_OUT, SPEC_FILE};
use handover::{Held, Values};
use scheduler::{find_by_name, slurm_call, Queue};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tracker::{refuses, set_view, slurm_detail, SlurmView, Tracker};

/// The file in a job's folder that says it runs on Slurm, and as which Slurm job.
pub const SLURM_FILE: &str = "slurm.json";

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
