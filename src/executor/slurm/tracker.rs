//! `Tracker`: the task that follows one job on Slurm, from its folder and from what
//! Slurm says of it, until its end; the commands the job can carry out.

use super::folder::{figures, SLURM_OUT, SPEC_FILE};
use super::folder_wake;
use super::handover::{self, Held};
use super::scheduler::{job_info, slurm_call, JobInfo, Queue, Seen, Watch};
use crate::executor::{Command, ExecEvent, WriteRefused, Writes};
use crate::job_dir::JobDir;
use crate::paths::now_ms;
use crate::supervisor::{self, tree::TreeRecord};
use crate::wire::control::{self, ExitStatus, ToSupervisor, PROTOCOL};
use crate::wire::{Actor, End};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

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

/// What `list` shows of a job on Slurm.
#[derive(Debug, Clone, Default)]
pub struct SlurmView {
    pub job_id: Option<String>,
    /// `squeue`'s reason while Slurm has not started it.
    pub reason: Option<String>,
}

/// The commands a job on Slurm cannot carry out: the supervisor on the node takes only
/// what it reads from the folder's `commands/`.
pub(super) fn refuses(command: &ToSupervisor) -> Option<&'static str> {
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
pub(super) struct Stop {
    actor: Actor,
    backstop_at: tokio::time::Instant,
    cancelled: bool,
}

pub(super) struct Tracker {
    pub(super) row: i64,
    pub(super) job_dir: PathBuf,
    pub(super) job_id: String,
    /// Its Slurm name (`bgw-<home-id>-<row>`).
    pub(super) name: String,
    pub(super) owner: String,
    /// Listed by the daemon's one `squeue` while this tracker lives.
    pub(super) _watch: Watch,
    pub(super) queue: Arc<Queue>,
    /// Input left for the supervisor, answered through the folder.
    pub(super) writes: Writes,
    pub(super) events: mpsc::UnboundedSender<ExecEvent>,
    pub(super) views: Arc<Mutex<HashMap<i64, Option<SlurmView>>>>,
    pub(super) spawned: bool,
    /// Taken back by a restarted daemon, which already knows whether it runs.
    pub(super) reattached: bool,
    pub(super) log_len: u64,
    /// The log's dropped, unwritten and unwritten-at figures last told.
    pub(super) figures: (u64, u64, u64),
    pub(super) stop: Option<Stop>,
    /// When Slurm was first seen to say the job ended, and what it said.
    pub(super) ended_seen: Option<(tokio::time::Instant, JobInfo)>,
    pub(super) said_unreachable: bool,
    /// Commands left in the folder so far (their files' names sort by it).
    pub(super) commands_left: u64,
    pub(super) env: Vec<(String, String)>,
    /// The job's environment and secrets, until its supervisor takes them.
    pub(super) held: Held,
}

impl Tracker {
    pub(super) async fn run(mut self, mut incoming: mpsc::UnboundedReceiver<Command>) {
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
pub(super) async fn slurm_detail(
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

pub(super) fn set_view(views: &Mutex<HashMap<i64, Option<SlurmView>>>, row: i64, view: SlurmView) {
    views
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(row, Some(view));
}
