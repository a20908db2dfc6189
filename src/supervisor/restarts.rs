//! A job with a restart policy: the wait between its runs (the daemon counts the
//! back-off and says when), and the next run started in the same folder and log.

use super::{spawn, tree, Phase, Supervisor, FIRST_SAMPLE};
use crate::job_dir::JobDir;
use crate::redact::StreamMask;
use crate::wire::control::{BetweenRuns, FromSupervisor};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

impl Supervisor {
    /// A run that ended failed or signaled (not by a stop, not past its limit, not by
    /// a TERM to this supervisor), with restarts left: the daemon is told, and this
    /// waits for its `rerun` (true: the job runs again) or a stop (false: the end is
    /// written). Without a daemon it waits, so a daemon that comes back finds it.
    pub(super) fn wait_between_runs(&mut self) -> bool {
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
    pub(super) fn cwd_gone(&self) -> Option<String> {
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
    pub(super) fn rerun(&mut self, run: u32, marker: &str) {
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
}
