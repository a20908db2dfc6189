//! The Slurm commands the executor runs, each with a deadline and the caller's
//! `SLURM_CONF`: one `squeue` a second for every job a daemon watches (the [`Queue`]),
//! `scontrol show job` for the detail of an end, `squeue -n` to find a job by name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest a Slurm command may take.
const SLURM_CALL: Duration = Duration::from_secs(20);

/// How Slurm sees a job (`scontrol show job`).
#[derive(Debug, Clone, Default)]
pub struct JobInfo {
    pub name: String,
    pub state: String,
    pub reason: String,
    pub exit: Option<i32>,
    pub signal: Option<i32>,
}

impl JobInfo {
    pub fn ended(&self) -> bool {
        ended(&self.state)
    }

    pub fn exit_text(&self) -> String {
        format!("{}:{}", self.exit.unwrap_or(0), self.signal.unwrap_or(0))
    }
}

/// Whether a Slurm job state is an end.
fn ended(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
    )
}

/// `scontrol show job -o ID` of the job named `name`: `Ok(None)` when Slurm no longer
/// knows it (a controller that restarted without having saved it may even have given
/// its id to another job, which is not taken for it).
pub async fn job_info(
    job_id: &str,
    name: &str,
    env: &[(String, String)],
) -> Result<Option<JobInfo>, String> {
    let mut command = tokio::process::Command::new("scontrol");
    command.args(["show", "job", "-o", job_id]);
    let text = match slurm_call(command, env).await {
        Ok(text) => text,
        Err(e) if e.contains("Invalid job id") => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(parse_job_info(&text).filter(|info| info.name == name))
}

/// The fields of `scontrol show job -o` that matter here.
fn parse_job_info(text: &str) -> Option<JobInfo> {
    let mut info = JobInfo::default();
    let mut found = false;
    for field in text.split_whitespace() {
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        match key {
            "JobState" => {
                info.state = value.to_string();
                found = true;
            }
            "JobName" => info.name = value.to_string(),
            "Reason" => info.reason = value.to_string(),
            "ExitCode" => {
                let (exit, signal) = parse_exit_code(value);
                info.exit = exit;
                info.signal = signal;
            }
            _ => {}
        }
    }
    found.then_some(info)
}

/// Slurm's `EXIT:SIGNAL` (`3:0` → exit 3, `0:15` → signal 15).
pub fn parse_exit_code(text: &str) -> (Option<i32>, Option<i32>) {
    let (exit, signal) = text.split_once(':').unwrap_or((text, "0"));
    (exit.parse().ok(), signal.parse().ok())
}

/// The Slurm job id of a job by its name, among the jobs Slurm knows.
pub async fn find_by_name(name: &str, env: &[(String, String)]) -> Result<Option<String>, String> {
    let mut command = tokio::process::Command::new("squeue");
    command.args(["-h", "-t", "all", "-o", "%i", "-n", name]);
    let text = slurm_call(command, env).await?;
    Ok(text.split_whitespace().next().map(str::to_string))
}

/// Runs a Slurm command with a deadline; its stdout, or what went wrong. It runs with
/// `env` alone (the caller's `SLURM_CONF`, `PATH` and account defaults), never the
/// daemon's environment: `sbatch` saves the environment it runs with in Slurm's state
/// and hands it to the job.
pub async fn slurm_call(
    mut command: tokio::process::Command,
    env: &[(String, String)],
) -> Result<String, String> {
    command
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let program = command.as_std().get_program().to_string_lossy().to_string();
    let output = tokio::time::timeout(SLURM_CALL, command.output())
        .await
        .map_err(|_| format!("{program} did not answer within {} s", SLURM_CALL.as_secs()))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("{program} was not found: install Slurm's client commands (slurm-client)")
            }
            _ => format!("{program} could not run: {e}"),
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{program} failed: {}", stderr.trim()));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// How often the jobs a daemon watches are listed.
const QUEUE_EVERY: Duration = Duration::from_millis(1000);
/// The most job names one `squeue` call is given.
const NAMES_PER_CALL: usize = 100;

/// What the last listing said of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not listed yet since it was watched.
    NotYet,
    /// Slurm did not answer.
    Unreachable(String),
    /// Listed with its state (`PENDING`, `RUNNING`, `COMPLETED`, …) and reason.
    Listed { state: String, reason: String },
    /// Slurm no longer knows it.
    Unknown,
}

impl Seen {
    /// Whether Slurm says the job has ended (or knows it no more).
    pub fn ended(&self) -> bool {
        match self {
            Seen::Listed { state, .. } => ended(state),
            Seen::Unknown => true,
            Seen::NotYet | Seen::Unreachable(_) => false,
        }
    }
}

type Env = Vec<(String, String)>;

struct Watched {
    name: String,
    env: Env,
    seen: Seen,
}

#[derive(Default)]
struct Watching {
    jobs: HashMap<String, Watched>,
    /// Whether the listing task runs (it ends when nothing is watched).
    listing: bool,
}

/// The jobs a daemon watches on Slurm, listed together: one `squeue` a second for all
/// of them (per Slurm configuration, by name), rather than one call per job; the
/// trackers read what it last said.
#[derive(Default)]
pub struct Queue {
    watching: Mutex<Watching>,
}

/// A job being watched; dropped, it is not listed any more.
pub struct Watch {
    queue: Arc<Queue>,
    job_id: String,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.queue.lock().jobs.remove(&self.job_id);
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watching> {
        self.watching.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists the job `job_id` named `name` from now on (until the [`Watch`] is dropped).
    pub fn watch(self: &Arc<Self>, job_id: &str, name: &str, env: &[(String, String)]) -> Watch {
        let mut watching = self.lock();
        watching.jobs.insert(
            job_id.to_string(),
            Watched {
                name: name.to_string(),
                env: env.to_vec(),
                seen: Seen::NotYet,
            },
        );
        if !watching.listing {
            watching.listing = true;
            tokio::spawn(self.clone().list());
        }
        Watch {
            queue: self.clone(),
            job_id: job_id.to_string(),
        }
    }

    /// What the last listing said of a watched job.
    pub fn seen(&self, job_id: &str) -> Seen {
        self.lock()
            .jobs
            .get(job_id)
            .map_or(Seen::NotYet, |job| job.seen.clone())
    }

    async fn list(self: Arc<Self>) {
        let mut every = tokio::time::interval(QUEUE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let mut groups: HashMap<Env, Vec<(String, String)>> = HashMap::new();
            {
                let mut watching = self.lock();
                if watching.jobs.is_empty() {
                    watching.listing = false;
                    return;
                }
                for (id, job) in &watching.jobs {
                    groups
                        .entry(job.env.clone())
                        .or_default()
                        .push((id.clone(), job.name.clone()));
                }
            }
            for (env, jobs) in groups {
                for chunk in jobs.chunks(NAMES_PER_CALL) {
                    let seen = list_by_name(chunk, &env).await;
                    let mut watching = self.lock();
                    for ((id, _), seen) in chunk.iter().zip(seen) {
                        if let Some(job) = watching.jobs.get_mut(id) {
                            job.seen = seen;
                        }
                    }
                }
            }
        }
    }
}

/// One `squeue` for the jobs `(id, name)`: what it says of each, in their order.
async fn list_by_name(jobs: &[(String, String)], env: &[(String, String)]) -> Vec<Seen> {
    let names: Vec<&str> = jobs.iter().map(|(_, name)| name.as_str()).collect();
    let mut command = tokio::process::Command::new("squeue");
    command.args([
        "-h",
        "-t",
        "all",
        "-o",
        "%i|%j|%T|%r",
        "-n",
        &names.join(","),
    ]);
    match slurm_call(command, env).await {
        Ok(text) => jobs
            .iter()
            .map(|(id, name)| seen_in(&text, id, name))
            .collect(),
        Err(e) => vec![Seen::Unreachable(e); jobs.len()],
    }
}

/// What `squeue -o %i|%j|%T|%r` says of the job `id` named `name`: a row with its id
/// under another name is another job (Slurm gave the id again), so not this one.
fn seen_in(text: &str, id: &str, name: &str) -> Seen {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, '|');
            Some((
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            ))
        })
        .find(|(i, n, _, _)| *i == id && *n == name)
        .map_or(Seen::Unknown, |(_, _, state, reason)| Seen::Listed {
            state: state.to_string(),
            reason: reason.trim().to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_slurms_own() {
        assert_eq!(parse_exit_code("3:0"), (Some(3), Some(0)));
        assert_eq!(parse_exit_code("0:15"), (Some(0), Some(15)));
        let info =
            parse_job_info("JobId=7 JobName=x JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15")
                .expect("parsed");
        assert_eq!(info.state, "TIMEOUT");
        assert_eq!(info.name, "x");
        assert_eq!(info.signal, Some(15));
        assert!(info.ended());
    }

    #[test]
    fn a_job_is_known_by_its_id_and_its_name() {
        let text = "69|bgw-a-1|RUNNING|None\n70|other|PENDING|Priority\n71|bgw-a-3|PENDING|PartitionDown\n";
        assert_eq!(
            seen_in(text, "69", "bgw-a-1"),
            Seen::Listed {
                state: "RUNNING".into(),
                reason: "None".into()
            }
        );
        assert!(!seen_in(text, "69", "bgw-a-1").ended());
        // Slurm gave a forgotten job's id to another job: this one is unknown, so ended.
        assert_eq!(seen_in(text, "70", "bgw-a-2"), Seen::Unknown);
        assert!(seen_in(text, "70", "bgw-a-2").ended());
        assert_eq!(
            seen_in(text, "71", "bgw-a-3"),
            Seen::Listed {
                state: "PENDING".into(),
                reason: "PartitionDown".into()
            }
        );
        let info = parse_job_info("JobId=70 JobName=other JobState=RUNNING ExitCode=0:0");
        assert_eq!(info.map(|i| i.name), Some("other".to_string()));
    }
}
