//! `stop` (TERM, a grace, then KILL to the whole tree, through the job's supervisor),
//! `close` of a pane, and `shutdown` of the daemon.

use crate::daemon::Daemon;
use crate::store::{sub_session_name, Record};
use crate::wire::control::ToSupervisor;
use crate::wire::{Ack, Actor, End, ErrorCode, Item, Kind, State, StopArgs, WireError};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often a stop that waits for its job's end looks whether the job's host has
/// become unreachable (then it answers at once that the stop is queued).
const UNREACHABLE_LOOK: Duration = Duration::from_millis(100);

/// What a reply says of a request (`what`: "the stop") kept for an item whose host
/// cannot be reached now.
pub(crate) fn queued(item: &Item, what: &str) -> Option<String> {
    item.host_unreachable.as_ref().map(|why| {
        format!(
            "{what} of {} is queued: {why}; it is carried out when the host answers \
             (`bgwork wait {}` to see it end)",
            item.id, item.id
        )
    })
}

/// A stop waits this long past its grace for the job to be gone.
const STOP_SLACK: Duration = Duration::from_secs(2);
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// How long `stop` waits for a job that is starting (or being reconnected to) to be
/// attached before it says so.
const ATTACH_WAIT: Duration = Duration::from_secs(5);

impl Daemon {
    /// `close`: hangs up a running pane, as closing its terminal window does.
    pub(crate) fn close(&self, session: &str, id: &str) -> Result<Item, WireError> {
        let inner = self.lock();
        let record = Self::find(&inner, session, id)?;
        if record.kind != Kind::Pane {
            return Err(WireError::refused(format!(
                "{id} is no pane (it has no terminal to close): `bgwork stop {id}` ends it"
            )));
        }
        let mut item = self.item_as(session, &record);
        if record.state == State::Ended {
            item.already_ended = Some(true);
            return Ok(item);
        }
        let Some(live) = inner.live.get(&record.row) else {
            return Err(self.not_running_now(&record, id, "close it"));
        };
        let hangup = ToSupervisor::Signal {
            signal: nix::sys::signal::Signal::SIGHUP as i32,
        };
        crate::daemon::sent(id, live.handle.send(hangup))?;
        item.stop_requested = Some(true);
        item.queued = queued(&item, "the hang-up");
        Ok(item)
    }

    pub(crate) async fn stop(&self, session: &str, args: &StopArgs) -> Result<Item, WireError> {
        let grace = match args.grace_s {
            Some(s) => crate::wire::seconds("--grace", s)?,
            None => DEFAULT_GRACE,
        };
        let record = Self::find(&self.lock(), session, &args.id)?;
        if record.state == State::Ended {
            return Ok(already_ended(self.item_as(session, &record)));
        }
        // A sub-agent is stopped with everything it started (its own sub-agents' too).
        let mut rows = vec![record.row];
        if record.kind == Kind::SubAgent {
            let child = sub_session_name(&record.session, &record.id);
            rows.extend(self.lock().store.list(&child, false)?.iter().map(|r| r.row));
        }
        for &row in &rows {
            // A job still being handed to its supervisor (or reconnected to) is waited
            // for a moment: a stop is never lost to that race.
            let attached = |d: &Daemon| {
                let inner = d.lock();
                inner.live.contains_key(&row)
                    || matches!(inner.store.get(row), Ok(Some(r)) if matches!(r.state, State::Ended | State::Waiting) || r.kind == Kind::Monitor)
                    || !matches!(inner.store.get(row), Ok(Some(_)))
            };
            self.wait_for(ATTACH_WAIT, attached).await;
            self.request_stop(row, grace, args.actor)?;
        }
        // Waits for the end, but not for a host that cannot be reached: the stop is
        // kept until it answers (`executor/ssh`), and the reply says so at once.
        let deadline = tokio::time::Instant::now() + grace + STOP_SLACK;
        let unreachable = |d: &Daemon| {
            let inner = d.lock();
            matches!(inner.store.get(record.row), Ok(Some(r))
                if r.state != State::Ended && d.item_as(session, &r).host_unreachable.is_some())
        };
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let ended = self
                .wait_for(left.min(UNREACHABLE_LOOK), |d| {
                    rows.iter().all(|&row| d.has_ended(row))
                })
                .await;
            if ended || left <= UNREACHABLE_LOOK || unreachable(self) {
                break;
            }
        }
        let inner = self.lock();
        let record = inner
            .store
            .get(record.row)?
            .ok_or_else(|| WireError::unknown_id(&args.id))?;
        let mut item = self.item_as(session, &record);
        if record.state != State::Ended {
            item.stop_requested = Some(true);
            item.queued = queued(&item, "the stop");
        }
        Ok(item)
    }

    /// Asks one running item to stop: its supervisor for a job, the daemon for a monitor.
    fn request_stop(&self, row: i64, grace: Duration, actor: Actor) -> Result<(), WireError> {
        let mut inner = self.lock();
        let Some(record) = inner.store.get(row)? else {
            return Ok(());
        };
        if record.state == State::Ended {
            return Ok(());
        }
        if record.state == State::Waiting {
            // Nothing runs yet: it ends at once (`jobs/after.rs`).
            drop(inner);
            if self.stop_waiting(row, actor) {
                return Ok(());
            }
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!("{} began to start just now: stop it again", record.id),
            ));
        }
        if record.kind == Kind::Monitor {
            drop(inner);
            let end = match actor {
                Actor::Agent => End::StoppedByAgent,
                Actor::Person => End::StoppedByPerson,
            };
            self.settle_monitor(row, end, "stopped");
            return Ok(());
        }
        let Some(live) = inner.live.get(&row) else {
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!("{} is not attached yet: try again in a moment", record.id),
            ));
        };
        let stop = ToSupervisor::Stop {
            grace_ms: grace.as_millis() as u64,
            actor,
        };
        crate::daemon::sent(&record.id, live.handle.send(stop))?;
        inner.store.set_stop_actor(row, actor)?;
        Ok(())
    }

    pub(crate) async fn shutdown(&self, stop_work: bool) -> Result<Ack, WireError> {
        let (mut stopped, mut still, mut unstarted) = (0, 0, 0);
        // No start gets past its guard from now on; one that got past it has its record.
        self.closing.store(true, Ordering::SeqCst);
        if stop_work {
            // An item still being started (or taken back) is stopped as it comes alive.
            self.stopping_all.store(true, Ordering::SeqCst);
            let unsettled = self.lock().store.unsettled().unwrap_or_default();
            let (waiting, unsettled): (Vec<Record>, Vec<Record>) = unsettled
                .into_iter()
                .partition(|r| r.state == State::Waiting);
            // Work that waits for work ends without running.
            for record in &waiting {
                if self.stop_waiting(record.row, Actor::Agent) {
                    unstarted += 1;
                }
            }
            // Their keepers are let go before the daemon goes, not by tasks it may not
            // finish: none outlives it holding an environment.
            for record in waiting.iter().filter(|r| !r.job_dir.is_empty()) {
                crate::daemon::jobs::after::forget_keeper(std::path::Path::new(&record.job_dir))
                    .await;
            }
            let (monitors, rows): (Vec<Record>, Vec<Record>) =
                unsettled.into_iter().partition(|r| r.kind == Kind::Monitor);
            let rows: Vec<i64> = rows.iter().map(|r| r.row).collect();
            {
                let mut inner = self.lock();
                for &row in &rows {
                    if inner.live.contains_key(&row) {
                        self.stop_for_shutdown(&mut inner, row);
                    }
                }
            }
            // Monitors are work too: they end with the rest.
            let monitors: Vec<i64> = monitors.iter().map(|r| r.row).collect();
            for &row in &monitors {
                self.settle_monitor(row, End::StoppedByAgent, "stopped");
            }
            let rows: Vec<i64> = rows.into_iter().chain(monitors).collect();
            self.wait_for(DEFAULT_GRACE + STOP_SLACK, |d| {
                rows.iter().all(|row| d.has_ended(*row))
            })
            .await;
            stopped = rows.iter().filter(|row| self.has_ended(**row)).count();
            still = rows.len() - stopped;
        }
        self.request_shutdown();
        // The waiting items it ended are counted apart: nothing of them ran.
        let waited = match unstarted {
            0 => String::new(),
            n => format!(
                ", {} stopped before they started",
                crate::history::plural(n, "waiting item")
            ),
        };
        let message = if still > 0 {
            format!(
                "daemon stopping; {} stopped{waited}, {still} did not end \
                 in time (their supervisors may be stopped): they are reattached at the next start",
                crate::history::plural(stopped, "running item")
            )
        } else if stop_work {
            format!(
                "daemon stopping; {} stopped{waited}",
                crate::history::plural(stopped, "running item")
            )
        } else {
            "daemon stopping; running work goes on and is reattached at the next start".into()
        };
        Ok(Ack { ok: true, message })
    }

    /// Stops a live item for `shutdown --stop-work`, as the agent, with the default
    /// grace.
    pub(crate) fn stop_for_shutdown(&self, inner: &mut crate::daemon::Inner, row: i64) {
        if let Some(live) = inner.live.get(&row) {
            // Every executor carries a stop; one whose connection is gone is taken
            // back (and stopped, see `go_live`) or settled.
            let _ = live.handle.send(ToSupervisor::Stop {
                grace_ms: DEFAULT_GRACE.as_millis() as u64,
                actor: Actor::Agent,
            });
        }
        let _ = inner.store.set_stop_actor(row, Actor::Agent);
    }
}

/// A stop's reply for an item that had ended before it: its end, said as past.
fn already_ended(mut item: Item) -> Item {
    if let Some(report) = &item.report {
        let how = report.strip_prefix(&item.id).unwrap_or(report).trim_start();
        let how = how.strip_prefix("was ").unwrap_or(how);
        item.report = Some(format!("{} had already ended: {how}", item.id));
    }
    item.already_ended = Some(true);
    item
}
