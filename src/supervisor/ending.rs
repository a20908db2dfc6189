//! How a run ends: its processes reaped, a stop (TERM, the grace, then KILL to the
//! whole tree) begun and escalated, and the end written once (`finish`).

use super::{cgroup, tree, write_status, Phase, Supervisor, DRAIN_GRACE, STATUS_PATIENCE};
use crate::job_dir::JobDir;
use crate::paths::now_ms;
use crate::wire::control::{ExitStatus, FromSupervisor, PROTOCOL};
use crate::wire::Actor;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::time::{Duration, Instant};

impl Supervisor {
    pub(super) fn reap(&mut self) {
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

    pub(super) fn reaped(&mut self, pid: Pid, code: Option<i32>, signal: Option<i32>) {
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
    pub(super) fn term_tree(&self) {
        tree::signal_tree(self.me, self.pid, Signal::SIGTERM);
        tree::continue_tree(self.me, self.pid);
    }

    /// KILL to what is left of the job, once its phase says it is due.
    pub(super) fn escalate_when_due(&mut self) {
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

    pub(super) fn begin_stop(&mut self, actor: Option<Actor>, grace: Duration) {
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

    /// How the current run ended, as a status (for its end, or a run that will be
    /// started again).
    pub(super) fn run_status(&self) -> ExitStatus {
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

    pub(super) fn finish(&mut self) {
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

/// CPU time (ms) of every process this supervisor reaped, with everything they reaped
/// (as a subreaper, that is every process of the job).
pub(super) fn children_cpu_ms() -> u64 {
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
pub(super) fn children_max_rss() -> u64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|usage| (usage.max_rss().max(0) as u64) * 1024)
        .unwrap_or(0)
}
