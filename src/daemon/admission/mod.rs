//! The admission of a new item (contract §5): the one function every path that starts
//! something calls — `start`, `agent start`, `monitor`, `restart` (through `start`),
//! a restart policy's start again of its item (`jobs/restart_policy.rs`, `again`),
//! and `run`, whose promotion past its deadline asks [`Daemon::promotion_refused`] —
//! so that each rule has one place and the same filters everywhere.
//!
//! What is checked, under the daemon's lock that then writes the record: a shutdown
//! in progress, the daemon-wide cap and the start rate (`guard.rs`), then the
//! session's own limits, which a root session and its sub-agents share:
//! - items on this machine (jobs, panes, monitors): at most `max_running`;
//! - jobs on Slurm: at most `max_slurm`, counted apart (the cluster runs them);
//! - monitors: at most [`MAX_MONITORS`] of those on this machine;
//! - sub-agents: at most [`MAX_SUB_AGENTS`] running at once.
//!
//! Which executor a running item counts under is its executor's own word
//! ([`crate::executor::Executors::which`]), the same in every path.

pub(crate) mod guard;

use crate::daemon::{Daemon, Inner};
use crate::executor::Which;
use crate::history::plural;
use crate::store::Record;
use crate::wire::{ErrorCode, Kind, WireError};

/// Sub-agents a session may run at once (contract §5).
pub(crate) const MAX_SUB_AGENTS: usize = 2;

/// Monitors a session may run at once (contract §5).
pub(crate) const MAX_MONITORS: usize = 4;

/// What a new item is, as its admission counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Newcomer {
    /// A job or a pane, run by this executor.
    Job(Which),
    /// A sub-agent (on this machine, counted against its own limit).
    SubAgent,
    /// A monitor (in this daemon: counted as an item on this machine).
    Monitor,
}

/// A request to admit a new item.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    pub newcomer: Newcomer,
    /// A foreground `run`: past the session's limit and the daemon's cap for now,
    /// checked when it is promoted ([`Daemon::promotion_refused`]).
    pub checked_at_promotion: bool,
    /// A restart that holds a start of the rate guard (`Daemon::hold_start`).
    pub held: bool,
    /// A restart policy's new start of this item (its row), which counts among the
    /// running items already: it is not counted against itself.
    pub again: Option<i64>,
}

/// How a job is launched beyond its arguments.
#[derive(Default)]
pub(crate) struct Launch {
    /// Start even past the session's limit (a foreground `run`, checked at promotion).
    pub over_limit: bool,
    /// A sub-agent: counted against its own limit, with its session and report file.
    pub sub_agent: bool,
    /// Start nothing when the same command runs in the same session and folder
    /// (`start` without `allow_duplicate`).
    pub refuse_duplicate: bool,
    /// A restart that holds a start of the rate guard (`Daemon::hold_start`).
    pub held: bool,
}

/// The running items of a session's tree (its root and every sub-agent under it),
/// by what they count against.
pub(crate) struct Load {
    /// Items of this machine: jobs, panes and monitors (sub-agents apart).
    pub here: Vec<Record>,
    /// Jobs on Slurm.
    pub slurm: Vec<Record>,
    /// Jobs on ssh hosts (all hosts together).
    pub ssh: Vec<Record>,
    /// Running sub-agents.
    pub sub_agents: Vec<Record>,
}

impl Load {
    fn of(&self, which: Which) -> &[Record] {
        match which {
            Which::Local => &self.here,
            Which::Slurm => &self.slurm,
            Which::Ssh => &self.ssh,
        }
    }
}

impl Daemon {
    /// Admits a new item of `session` or says why not; returns the root session whose
    /// limits it counts against. Called under the lock that then writes its record
    /// (and counts its start with [`Daemon::count_start`]).
    pub(crate) fn admit(
        &self,
        inner: &mut Inner,
        session: &str,
        admission: Admission,
    ) -> Result<String, WireError> {
        let root = inner.store.root_of(session)?;
        let over = admission.checked_at_promotion;
        self.check_guards_held(
            inner,
            &root,
            over,
            admission.held,
            admission.again.is_some(),
        )?;
        let mut load = self.load(inner, session)?;
        if let Some(row) = admission.again {
            for records in [&mut load.here, &mut load.slurm, &mut load.ssh] {
                records.retain(|r| r.row != row);
            }
        }
        match admission.newcomer {
            Newcomer::SubAgent if load.sub_agents.len() >= MAX_SUB_AGENTS => {
                let running = running_items(self, &root, &load.sub_agents);
                let counted = plural(MAX_SUB_AGENTS, "item");
                Err(limit_error(&counted, session, &root, &running))
            }
            Newcomer::SubAgent => Ok(root),
            Newcomer::Monitor => {
                let monitors = load.here.iter().filter(|r| r.kind == Kind::Monitor).count();
                if monitors >= MAX_MONITORS || load.here.len() >= self.config.max_running {
                    let ids: Vec<String> = load.here.iter().map(|r| r.id.clone()).collect();
                    return Err(WireError::new(
                        ErrorCode::Limit,
                        format!(
                            "this session runs {} ({}; the limits are {} and \
                             {MAX_MONITORS}): {}. Stop one first",
                            plural(load.here.len(), "item"),
                            plural(monitors, "monitor"),
                            self.config.max_running,
                            ids.join(", ")
                        ),
                    ));
                }
                Ok(root)
            }
            Newcomer::Job(which) => {
                let max = self.max_of(which);
                let running = load.of(which);
                if !over && running.len() >= max {
                    let running = running_items(self, &root, running);
                    let counted = match which {
                        Which::Local => plural(max, "item"),
                        Which::Ssh => format!("{} on ssh hosts", plural(max, "job")),
                        Which::Slurm => {
                            format!("{} on Slurm (BGWORK_MAX_SLURM)", plural(max, "job"))
                        }
                    };
                    return Err(limit_error(&counted, session, &root, &running));
                }
                Ok(root)
            }
        }
    }

    /// Why the `run` of `row` at its deadline is killed rather than promoted to a
    /// background job: its session past its limit where the run runs (this machine, or
    /// ssh hosts together; the run itself counted, other runs still in the foreground
    /// not: the first at its deadline takes the room), or the daemon past its cap; none:
    /// promoted.
    pub(crate) fn promotion_refused(
        &self,
        inner: &Inner,
        session: &str,
        which: Which,
        row: i64,
    ) -> Result<Option<String>, WireError> {
        let load = self.load(inner, session)?;
        let max = self.max_of(which);
        let counted = load
            .of(which)
            .iter()
            .filter(|r| r.row == row || !inner.foreground.contains(&r.row))
            .count();
        if counted > max {
            let counted = match which {
                Which::Ssh => format!("{} on ssh hosts", plural(max, "running job")),
                Which::Local | Which::Slurm => plural(max, "running item"),
            };
            return Ok(Some(format!("the session was at its limit of {counted}")));
        }
        if self.over_total_cap(inner)? {
            return Ok(Some(format!(
                "the daemon was at its cap of {} across all sessions \
                 (BGWORK_MAX_RUNNING_TOTAL)",
                plural(self.config.max_running_total, "running item")
            )));
        }
        Ok(None)
    }

    /// The running items of `session`'s tree, by what they count against.
    pub(crate) fn load(&self, inner: &Inner, session: &str) -> Result<Load, WireError> {
        let root = inner.store.root_of(session)?;
        let mut load = Load {
            here: Vec::new(),
            slurm: Vec::new(),
            ssh: Vec::new(),
            sub_agents: Vec::new(),
        };
        // A waiting item runs nothing: it counts once it starts (`jobs/after.rs`).
        let running = inner.store.list(&root, false)?.into_iter();
        for record in running.filter(|r| r.state != crate::wire::State::Waiting) {
            match record.kind {
                Kind::SubAgent => load.sub_agents.push(record),
                Kind::Monitor => load.here.push(record),
                Kind::Job | Kind::Pane => match self.executors.which(record.row, &record.job_dir) {
                    Which::Local => load.here.push(record),
                    Which::Slurm => load.slurm.push(record),
                    Which::Ssh => load.ssh.push(record),
                },
            }
        }
        Ok(load)
    }

    /// A session's limit of running items under an executor.
    fn max_of(&self, which: Which) -> usize {
        match which {
            Which::Local => self.config.max_running,
            Which::Slurm => self.config.max_slurm,
            // Work on hosts counts apart from this machine's, against the same number
            // (each host's own daemon enforces its limits too).
            Which::Ssh => self.config.max_running,
        }
    }
}

fn running_items(daemon: &Daemon, root: &str, records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            let item = daemon.item_as(root, r);
            format!("{} ({})", item.id, item.name.unwrap_or(item.command))
        })
        .collect()
}

/// `counted` (`2 items`, `1 job on ssh hosts`) run: the limit of `session`'s tree.
fn limit_error(counted: &str, session: &str, root: &str, running: &[String]) -> WireError {
    let whose = if session == root {
        format!("this session already runs {counted}, its limit")
    } else {
        format!(
            "session {root} and its sub-agents, whose limit this sub-agent shares, already run \
             {counted}, the limit"
        )
    };
    WireError::new(
        ErrorCode::Limit,
        format!(
            "{whose}: {}. Stop one (`bgwork stop ID`) or wait for one to end",
            running.join(", ")
        ),
    )
}
