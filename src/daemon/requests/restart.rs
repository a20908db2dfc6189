//! `restart`: a new item with the command, folder, name, options and `--env` names of
//! an earlier one. The old record keeps its end; a running one is stopped first.

use crate::daemon::jobs::new_item::described_options;
use crate::daemon::Daemon;
use crate::wire::{
    Actor, ErrorCode, Kind, RestartArgs, RestartReply, StartArgs, State, StopArgs, WireError,
};

impl Daemon {
    /// A new item like `args.id`; one that ended inside its window is added to `shown`
    /// (its notice is delivered with the reply).
    pub(crate) async fn restart(
        &self,
        session: &str,
        args: RestartArgs,
        shown: &mut crate::daemon::Shown<'_>,
    ) -> Result<RestartReply, WireError> {
        let id = &args.id;
        let record = Self::find(&self.lock(), session, id)?;
        if record.kind == Kind::Monitor {
            return Err(WireError::refused(format!(
                "{id} is a monitor, which restart does not repeat: create it again with `bgwork monitor`"
            )));
        }
        if let Some(new) = self.replaced_a_moment_ago(record.row) {
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!(
                    "{id} was restarted as {new} a moment ago (by another call): restart \
                     {new} if another run is wanted (`bgwork restart {new}`)"
                ),
            ));
        }
        let _one_at_a_time = Replacing::take(self, record.row).ok_or_else(|| {
            WireError::new(
                ErrorCode::NotRunning,
                format!(
                    "{id} is being restarted by another call now: its new item is in \
                     `bgwork list` once that call returns (restart it again after, if \
                     another is wanted)"
                ),
            )
        })?;
        // The values of `--env` variables were never recorded: the caller gives them
        // again, or its environment has them; a waiting item's keeper still holds its
        // own (contract §14), which stand unless the caller gives others.
        // A plain login environment (the strip's) holds none of the item's values.
        let caller = match args.plain_env {
            true => Default::default(),
            false => args.inherit_env.clone().unwrap_or_default(),
        };
        let kept = match record.state {
            State::Waiting => crate::daemon::jobs::after::kept_env(&record).await,
            _ => std::collections::BTreeMap::new(),
        };
        let mut env = std::collections::BTreeMap::new();
        let mut missing = Vec::new();
        for name in &record.env_names {
            let value = args
                .env
                .get(name)
                .or_else(|| kept.get(name))
                .or_else(|| caller.get(name));
            match value {
                Some(value) => {
                    env.insert(name.clone(), value.clone());
                }
                None => missing.push(name.as_str()),
            }
        }
        let (mut secrets, keep_raw_log) = described_options(&record.job_dir);
        if !missing.is_empty() {
            // Each as it was given: a secret's value is given with --env, and stays one.
            let given: Vec<String> = missing
                .iter()
                .map(|&name| match secrets.iter().any(|s| s == name) {
                    true => format!("--secret {name}"),
                    false => format!("--env {name}"),
                })
                .collect();
            let flags: Vec<String> = missing.iter().map(|n| format!("--env {n}=VALUE")).collect();
            let why = match record.state {
                State::Waiting => {
                    "its keeper, which held the values while it waited, no longer answers"
                }
                _ => "whose values bgwork never records",
            };
            let still_secret = match secrets.iter().any(|s| missing.contains(&s.as_str())) {
                true => "; a secret stays masked in its output",
                false => "",
            };
            let or_else = match args.plain_env {
                true => " from a shell: a click has no environment to take them from",
                false => " or set them in your environment",
            };
            return Err(WireError::refused(format!(
                "{id} was started with {}, {why}: give them again (`bgwork restart {id} {}`{still_secret}){or_else}",
                given.join(", "),
                flags.join(" ")
            )));
        }
        for (name, value) in &args.env {
            env.insert(name.clone(), value.clone());
        }
        secrets.retain(|name| env.contains_key(name));
        let start = StartArgs {
            after: Vec::new(),
            command: record.command.clone(),
            cwd: Some(record.cwd.clone()),
            env,
            inherit_env: args.inherit_env,
            inherit_env_bytes: args.inherit_env_bytes,
            name: record.name.clone(),
            notify: record.notify,
            window_ms: args.window_ms,
            pty: record.kind == Kind::Pane,
            cols: record.cols,
            rows: record.rows,
            allow_duplicate: true,
            quiet_after_s: record.quiet_after_ms.map(|ms| ms as f64 / 1000.0),
            max_runtime_s: record.max_runtime_ms.map(|ms| ms as f64 / 1000.0),
            // Its --env values are masked again, and its --secret ones however short.
            secrets,
            keep_raw_log,
            // A job that ran on Slurm goes there again, with the same resources.
            ssh: self.executors.on_of(record.row, &record.job_dir).ssh_host(),
            slurm: self
                .executors
                .on_of(record.row, &record.job_dir)
                .slurm_args(),
            // Its restart policy too, afresh (no restarts made yet).
            restart: record
                .restart
                .as_ref()
                .map(|state| crate::wire::RestartPolicyArgs {
                    on: crate::daemon::jobs::restart_policy::ON_FAILURE.to_string(),
                    max_restarts: Some(state.max_restarts),
                    backoff: Some(format!(
                        "{}ms..{}ms",
                        state.backoff_min_ms, state.backoff_max_ms
                    )),
                }),
        };
        // What the new item would be is checked before the old one is stopped: a start
        // refused (its values shown, its folder gone) leaves the running item as it is.
        crate::daemon::jobs::new_item::check_start(&start)?;
        let on_here = start.ssh.is_none() && start.slurm.is_none();
        if on_here && record.kind != Kind::SubAgent && !std::path::Path::new(&record.cwd).is_dir() {
            return Err(WireError::refused(format!(
                "{id}'s folder {} is not a folder any more: nothing was stopped or started \
                 (start it afresh with `--cwd`)",
                record.cwd
            )));
        }
        let mut held = None;
        if record.state != State::Ended {
            // A start the rate guard would refuse must not cost the running item: the
            // start is held (counted) while the item stops.
            let root = self.lock().store.root_of(session)?;
            held = Some(self.hold_start(&root)?);
            // A click in the strip is the person's; any other restart is the agent's.
            let stop = StopArgs {
                id: id.clone(),
                grace_s: None,
                actor: match args.plain_env {
                    true => Actor::Person,
                    false => Actor::Agent,
                },
            };
            let stopped = self.stop(session, &stop).await?;
            if stopped.state != State::Ended {
                return Err(WireError::new(
                    ErrorCode::NotRunning,
                    format!("{id} was asked to stop and has not ended yet: restart it once it has (`bgwork wait {id}`)"),
                ));
            }
        }
        let holds = held.is_some();
        let reply = match record.kind {
            Kind::SubAgent => self.agent_start_held(session, start, holds).await?,
            _ => self.start_held(session, start, shown, holds).await?,
        };
        drop(held);
        let new = (reply.item.id.clone(), std::time::Instant::now());
        self.lock().replaced.insert(record.row, new);
        Ok(RestartReply {
            start: reply,
            restarted: id.clone(),
        })
    }

    /// The new item of `row` when a restart replaced it within [`A_MOMENT`].
    fn replaced_a_moment_ago(&self, row: i64) -> Option<String> {
        let mut inner = self.lock();
        inner
            .replaced
            .retain(|_, (_, when)| when.elapsed() < A_MOMENT);
        inner.replaced.get(&row).map(|(new, _)| new.clone())
    }
}

/// How long after a restart another of the same item is taken for the same click
/// (two calls of one intent, served one after the other) and refused.
const A_MOMENT: std::time::Duration = std::time::Duration::from_secs(2);

/// An item a `restart` call is replacing, until the call returns.
struct Replacing<'a> {
    daemon: &'a Daemon,
    row: i64,
}

impl<'a> Replacing<'a> {
    /// None when another call is replacing it already.
    fn take(daemon: &'a Daemon, row: i64) -> Option<Replacing<'a>> {
        // The lock is let go of before a guard exists (its drop takes the lock).
        let first = daemon.lock().restarting.insert(row);
        first.then(|| Replacing { daemon, row })
    }
}

impl Drop for Replacing<'_> {
    fn drop(&mut self) {
        self.daemon.lock().restarting.remove(&self.row);
    }
}
