//! Restart policies (`start --restart on-failure [--max-restarts N] [--backoff
//! MIN..MAX]`, contract §15): a job whose run ends `failed` or `signaled` is started
//! again as the same item, after a back-off, through the one admission.
//!
//! How it works: the job's supervisor knows how many restarts it may make
//! (`JobSpec::restart`). When a run ends failed or signaled (not by a stop, not past
//! `--max-runtime`, not by a TERM to the supervisor itself) with restarts left, it
//! does not write its status: it says `run_ended` and waits, holding the job's
//! environment and secrets in its memory as it did for the first run. The daemon
//! records that run's end (its run of the history, the item's last end) and when it
//! is tried again, in one transaction (`Store::run_ended`); at that moment it asks
//! the admission (a start for the rate and the limits, the item not counted against
//! itself), records the decision (`Store::rerun_decided`) and sends `rerun`, and the
//! supervisor writes the marker line into the log and starts the command again. A
//! stop while it waits ends it at once (stopped). A daemon killed at any moment
//! finds the supervisor waiting (its `hello` says which run ended) and goes on from
//! its records: a run is recorded once and started once (each step names the count
//! it expects; the supervisor starts only the run after the one that ended).
//!
//! Intermediate ends fire no notice; the end after the last restart fires one
//! (whether or not the job was started with `--notify`), saying the policy gave up.

use crate::daemon::admission::guard::RATE_COUNTDOWN;
use crate::daemon::admission::Launch;
use crate::daemon::admission::{Admission, Newcomer};
use crate::daemon::Daemon;
use crate::paths::{now_ms, rfc3339};
use crate::store::{EndRecord, NewNotice, Record, RestartState};
use crate::wire::control::{BetweenRuns, ExitStatus, RestartRule, ToSupervisor};
use crate::wire::{End, ErrorCode, Kind, RestartView, StartArgs, WireError};
use std::sync::Arc;
use std::time::Duration;

/// The one policy there is.
pub(crate) const ON_FAILURE: &str = "on-failure";
/// Restarts a policy makes when the caller names no number, and at most.
pub(crate) const DEFAULT_MAX_RESTARTS: u32 = 5;
const MOST_RESTARTS: u32 = 1000;
/// The back-off when the caller names none: 1 s, doubling up to 60 s.
pub(crate) const DEFAULT_BACKOFF_MS: (u64, u64) = (1_000, 60_000);
/// The shortest and the longest back-off a caller may ask for.
const SHORTEST_BACKOFF_MS: u64 = 100;
/// The longest a start rate keeps a start waiting.
const MINUTE_MS: u64 = 60_000;
const LONGEST_BACKOFF_MS: u64 = 24 * 3600 * 1000;

/// A job's restart policy, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub max_restarts: u32,
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
}

impl Policy {
    /// The policy a start asks for (none without `restart`), or why it cannot have it.
    pub(crate) fn of(args: &StartArgs, launch: &Launch) -> Result<Option<Policy>, WireError> {
        let Some(asked) = &args.restart else {
            return Ok(None);
        };
        let refuse = |why: String| Err(WireError::bad_request(why));
        if asked.on != ON_FAILURE {
            return refuse(format!(
                "--restart {:?} is no restart policy: the one there is, is `--restart {ON_FAILURE}`",
                asked.on
            ));
        }
        if args.pty || launch.sub_agent || launch.over_limit {
            let what = match (launch.sub_agent, launch.over_limit) {
                (true, _) => "a sub-agent",
                (_, true) => "a foreground `run`",
                _ => "a pane (--pty)",
            };
            return refuse(format!(
                "--restart is for jobs, not {what}: start it without --restart"
            ));
        }
        if args.slurm.is_some() || args.ssh.is_some() {
            return refuse(
                "--restart is not supported on Slurm or ssh hosts yet: start it on this \
                 machine, or without --restart"
                    .to_string(),
            );
        }
        let max_restarts = asked.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS);
        if !(1..=MOST_RESTARTS).contains(&max_restarts) {
            return refuse(format!(
                "--max-restarts {max_restarts} is out of range: give 1 to {MOST_RESTARTS}"
            ));
        }
        let (backoff_min_ms, backoff_max_ms) = match &asked.backoff {
            None => DEFAULT_BACKOFF_MS,
            Some(text) => parse_backoff(text).map_err(WireError::bad_request)?,
        };
        Ok(Some(Policy {
            max_restarts,
            backoff_min_ms,
            backoff_max_ms,
        }))
    }

    /// What the job's supervisor is told of it.
    pub(crate) fn rule(&self) -> RestartRule {
        RestartRule {
            max_restarts: self.max_restarts,
            backoff_min_ms: self.backoff_min_ms,
            backoff_max_ms: self.backoff_max_ms,
        }
    }
}

/// `MIN..MAX` (`1s..60s`, `500ms..10s`), or one duration for a back-off that does not
/// grow; each as `humantime` reads it, or plain seconds.
fn parse_backoff(text: &str) -> Result<(u64, u64), String> {
    let one = |part: &str| -> Result<u64, String> {
        let part = part.trim();
        let parsed = match part.parse::<f64>() {
            Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => {
                Ok(Duration::from_secs_f64(seconds.min(1e9)))
            }
            _ => humantime::parse_duration(part),
        };
        parsed
            .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
            .map_err(|e| format!("--backoff {text:?}: {part:?} is no duration ({e}); give MIN..MAX, e.g. 1s..60s"))
    };
    let (min, max) = match text.split_once("..") {
        Some((min, max)) => (one(min)?, one(max)?),
        None => {
            let both = one(text)?;
            (both, both)
        }
    };
    if min < SHORTEST_BACKOFF_MS || max > LONGEST_BACKOFF_MS || min > max {
        return Err(format!(
            "--backoff {text:?} is out of range: MIN at least 100ms, MAX at most 24h, and \
             MIN no more than MAX (e.g. 1s..60s)"
        ));
    }
    Ok((min, max))
}

/// The back-off before restart `restart` (1 for the first): MIN, doubling, up to MAX.
fn backoff_ms(state: &RestartState, restart: u32) -> u64 {
    let doublings = restart.saturating_sub(1).min(40);
    state
        .backoff_min_ms
        .saturating_mul(1u64 << doublings)
        .min(state.backoff_max_ms)
}

/// `1s..60s`, as a caller gives it.
fn backoff_text(state: &RestartState) -> String {
    let text = |ms: u64| match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    };
    format!(
        "{}..{}",
        text(state.backoff_min_ms),
        text(state.backoff_max_ms)
    )
}

/// The line written into the log where a run starts again. It holds none of the words
/// a reader waits for in a job's own output ("started", "ready", "listening", "error",
/// "failed", "exit", "done", in any case), so a pattern for them does not match it.
pub(crate) fn marker(record: &Record, restart: u32, max: u32) -> String {
    format!(
        "[bgwork: {} run again, restart {restart} of {max}, at {}]",
        record.id,
        rfc3339(now_ms())
    )
}

/// What `list` and the other replies show of a record's policy.
pub(crate) fn view(record: &Record) -> Option<RestartView> {
    let state = record.restart.as_ref()?;
    let waiting = state.waiting() && record.end.is_none();
    // Ended by a run's end, its last run is the record's own end (the state holds the
    // run before it); ended between two runs (a stop, a loss), the state's run is the last.
    let (last_end, last_exit_code, last_signal, last_ended_at) = match record.end {
        Some(end) if !state.waiting() => {
            (Some(end), record.exit_code, record.signal, record.ended_at)
        }
        _ => (
            state.last_end,
            state.last_exit_code,
            state.last_signal,
            state.last_ended_at,
        ),
    };
    Some(RestartView {
        policy: ON_FAILURE.to_string(),
        restarts: state.restarts,
        max_restarts: state.max_restarts,
        backoff: backoff_text(state),
        last_end,
        last_exit_code,
        last_signal,
        last_ended_at: last_ended_at.map(rfc3339),
        next_attempt_at: state.next_at.filter(|_| waiting).map(rfc3339),
        refused: state.refused.clone().filter(|_| waiting),
    })
}

/// The notice of an end after the last restart: the item's one notice (made when
/// none was armed), saying the policy gave up. None for any other end.
pub(crate) fn gave_up(
    record: &Record,
    end: End,
    status: &ExitStatus,
    notice: Option<NewNotice>,
    tail: impl FnOnce() -> String,
) -> Option<NewNotice> {
    let Some(state) = &record.restart else {
        return notice;
    };
    let spent = state.restarts >= state.max_restarts
        || status
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with(COULD_NOT_START_AGAIN));
    let failing = matches!(end, End::Failed | End::Signaled) && status.past_limit_ms.is_none();
    if !spent || !failing || status.stop_actor.is_some() {
        return notice;
    }
    let mut notice = notice.unwrap_or_else(|| NewNotice {
        text: crate::end::report(&record.id, end, status.exit_code, status.signal),
        tail: tail(),
    });
    notice
        .text
        .push_str(&spent_words(state, status.detail.as_deref()));
    Some(notice)
}

/// What an ended item's report adds when its policy gave up: `: gave up after 5 of 5
/// restarts (--restart on-failure)`. None for any other end.
pub(crate) fn gave_up_words(record: &Record) -> Option<String> {
    let state = record.restart.as_ref()?;
    let detail = record
        .end_detail
        .as_deref()
        .filter(|d| d.starts_with(COULD_NOT_START_AGAIN));
    let spent = state.restarts >= state.max_restarts || detail.is_some();
    let failing = matches!(record.end, Some(End::Failed | End::Signaled));
    (spent && failing).then(|| spent_words(state, detail))
}

/// The start of the detail of an end whose next start failed (written by the
/// supervisor: `could not start it again: …`).
const COULD_NOT_START_AGAIN: &str = "could not start it again";

fn spent_words(state: &RestartState, detail: Option<&str>) -> String {
    let mut words = format!(
        ": gave up after {} of {} restarts (--restart {ON_FAILURE})",
        state.restarts, state.max_restarts
    );
    if let Some(detail) = detail {
        words.push_str(&format!("; {detail}"));
    }
    words
}

impl Daemon {
    /// The restart policy a start asks for, recorded with its new record (under the
    /// lock that wrote it).
    pub(crate) fn record_policy(
        &self,
        inner: &mut crate::daemon::Inner,
        row: i64,
        policy: Option<Policy>,
    ) -> Result<(), WireError> {
        if let Some(policy) = policy {
            inner.store.set_restart_policy(
                row,
                policy.max_restarts,
                policy.backoff_min_ms,
                policy.backoff_max_ms,
            )?;
        }
        Ok(())
    }

    /// A run of `row` ended and its supervisor waits: the run is recorded (once) and
    /// its next start timed; a start decided before a daemon restart and never carried
    /// out is sent again.
    pub(crate) fn run_ended(self: &Arc<Self>, row: i64, between: BetweenRuns) {
        let mut inner = self.lock();
        let record = match inner.store.get(row) {
            Ok(Some(record)) if record.end.is_none() => record,
            _ => return,
        };
        let Some(state) = record.restart.clone() else {
            return;
        };
        if between.run < state.runs_ended {
            // Told again (a daemon that took the job back): nothing new to record.
            if state.restarts == between.run + 1 {
                let restart = state.restarts;
                drop(inner);
                self.send_rerun(&record, restart, state.max_restarts);
            } else if state.waiting() {
                drop(inner);
                self.time_rerun(row);
            }
            return;
        }
        let status = &between.status;
        let end = crate::end::classify(status, record.kind == Kind::Pane);
        // Its restart's number is the supervisor's (a record behind it, as after a lost
        // database, catches up).
        let restart = between.run + 1;
        // From the run's own end: one that ended while no daemon ran (its supervisor
        // waited) has waited out that much of its back-off already.
        let ended_at = match status.ended_at_ms {
            at if at > 0 => at.min(now_ms()),
            _ => now_ms(),
        };
        let next_at = ended_at.saturating_add(backoff_ms(&state, restart) as i64);
        let settlement = EndRecord {
            end,
            exit_code: status.exit_code,
            signal: status.signal,
            ended_at: status.ended_at_ms,
            log_len: status.log_len,
            dropped: status.dropped,
            end_detail: None,
            notice: None,
            pid: status.pid,
            unwritten: status.unwritten,
            unwritten_at: status.unwritten_at,
            cpu_ms: None,
            peak_rss: None,
        };
        match inner
            .store
            .run_ended(row, between.run, &settlement, next_at)
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                // A full disk, say: the supervisor still waits; told again in a moment.
                crate::note!(
                    "bgwork daemon: could not record a run's end of {} (will retry): {e}",
                    record.id
                );
                drop(inner);
                let daemon = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    daemon.run_ended(row, between);
                });
                return;
            }
        }
        if let Some(live) = inner.live.get_mut(&row) {
            live.dropped = status.dropped;
        }
        drop(inner);
        crate::note!(
            "bgwork daemon: {}; restart {} of {} in {} ms",
            crate::end::report(&record.id, end, status.exit_code, status.signal),
            restart,
            state.max_restarts,
            backoff_ms(&state, restart)
        );
        self.records_changed();
        self.time_rerun(row);
    }

    /// Starts the one timer of `row`'s next start (none when one waits already).
    fn time_rerun(self: &Arc<Self>, row: i64) {
        if !self.lock().rerun_timers.insert(row) {
            return;
        }
        tokio::spawn(self.clone().rerun_when_due(row));
    }

    /// Waits until `row`'s next start is due, then asks the admission: admitted, the
    /// start is recorded and sent; refused, it is tried again after the next back-off
    /// (a shutdown in progress: left to the next daemon).
    async fn rerun_when_due(self: Arc<Self>, row: i64) {
        let mut told: Option<String> = None;
        let mut first = true;
        loop {
            let record = {
                let mut inner = self.lock();
                match inner.store.get(row) {
                    Ok(Some(record)) if record.restarting() => record,
                    // Under the lock that saw it: a run that ends after this times its
                    // own start again.
                    _ => {
                        inner.rerun_timers.remove(&row);
                        return;
                    }
                }
            };
            let Some(state) = record.restart.clone() else {
                self.lock().rerun_timers.remove(&row);
                return;
            };
            if std::mem::take(&mut first) && state.refused.is_some() {
                // Refused by an earlier daemon, whose counts went with it (the start
                // rate begins afresh): due when its back-off from the run's end is.
                let due = state
                    .last_ended_at
                    .unwrap_or(0)
                    .saturating_add(backoff_ms(&state, state.restarts + 1) as i64);
                if let Err(e) = self.lock().store.rerun_retimed(row, due) {
                    crate::note!("bgwork daemon: {e}");
                }
                self.records_changed();
                continue;
            }
            // Never longer than its longest back-off (a wall clock set back meanwhile).
            let due_in = state
                .next_at
                .unwrap_or(0)
                .saturating_sub(now_ms())
                .min(state.backoff_max_ms.max(MINUTE_MS) as i64);
            if due_in > 0 {
                tokio::time::sleep(Duration::from_millis(due_in as u64)).await;
                continue;
            }
            let restart = state.restarts + 1;
            if !self.lock().live.contains_key(&row) {
                // Its supervisor is not connected (being reconnected, or gone): nothing
                // is decided until it answers (or is found lost, which ends the wait).
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let admitted = {
                let mut inner = self.lock();
                let admission = Admission {
                    newcomer: Newcomer::Job(self.executors.which(row, &record.job_dir)),
                    checked_at_promotion: false,
                    held: false,
                    again: Some(row),
                };
                let admitted = match self.admit(&mut inner, &record.session, admission) {
                    Ok(root) => match inner.store.rerun_decided(row, restart, now_ms()) {
                        Ok(true) => {
                            self.count_start(&mut inner, &root);
                            Ok(true)
                        }
                        Ok(false) => Ok(false),
                        Err(e) => Err(e.to_string()),
                    },
                    // A shutdown: the next daemon goes on from the record.
                    Err(e) if e.code == ErrorCode::Unavailable => Ok(false),
                    Err(e) => {
                        // Tried again when the start rate allows it (not before), at the
                        // earliest after a back-off; the reason without its own countdown,
                        // which `next_attempt_at` tells.
                        let root = inner.store.root_of(&record.session).unwrap_or_default();
                        let rate_ms = self.rate_wait(&mut inner, &root).as_millis() as u64;
                        let pause = backoff_ms(&state, restart).max(rate_ms);
                        let next_at = now_ms().saturating_add(pause as i64);
                        let message = crate::daemon::admission::guard::without_advice(&e.message);
                        let message = match message.split_once(RATE_COUNTDOWN) {
                            Some((before, _)) => before,
                            None => message.as_str(),
                        };
                        let reason = format!("not started again: {message}");
                        if let Err(e) = inner.store.rerun_refused(row, &reason, next_at) {
                            crate::note!("bgwork daemon: {e}");
                        }
                        Err(reason)
                    }
                };
                if admitted.is_ok() {
                    inner.rerun_timers.remove(&row);
                }
                admitted
            };
            match admitted {
                Ok(true) => {
                    self.records_changed();
                    self.send_rerun(&record, restart, state.max_restarts);
                    return;
                }
                Ok(false) => return,
                Err(reason) => {
                    // Told once for a run of refusals for the same reason.
                    if told.as_deref() != Some(reason.as_str()) {
                        crate::note!(
                            "bgwork daemon: {}: {reason} (tried again when allowed)",
                            record.id
                        );
                        told = Some(reason);
                    }
                    self.records_changed();
                    // Until the recorded next attempt (the rate's own wait); the store
                    // may refuse writes (a full disk): a back-off at least, anyway.
                    let recorded = self
                        .lock()
                        .store
                        .get(row)
                        .ok()
                        .flatten()
                        .and_then(|r| r.restart)
                        .and_then(|s| s.next_at)
                        .map(|at| at.saturating_sub(now_ms()).max(0) as u64)
                        .unwrap_or(0);
                    let pause = backoff_ms(&state, restart)
                        .max(SHORTEST_BACKOFF_MS)
                        .max(recorded.min(MINUTE_MS));
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }
    }

    /// Tells `record`'s supervisor to start restart `restart` (its run of that number).
    /// A supervisor not connected now is told when it is taken back (its `hello`).
    fn send_rerun(&self, record: &Record, restart: u32, max: u32) {
        let handle = self.lock().live.get(&record.row).map(|l| l.handle.clone());
        let message = ToSupervisor::Rerun {
            run: restart,
            marker: marker(record, restart, max),
        };
        if let Some(handle) = handle {
            if let Err(e) = handle.send(message) {
                crate::note!("bgwork daemon: {} not started again yet: {e:?}", record.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_reads_ranges_and_single_durations() {
        assert_eq!(parse_backoff("1s..60s"), Ok((1_000, 60_000)));
        assert_eq!(parse_backoff("500ms..2s"), Ok((500, 2_000)));
        assert_eq!(parse_backoff("2"), Ok((2_000, 2_000)));
        assert!(parse_backoff("10ms..1s").is_err());
        assert!(parse_backoff("5s..1s").is_err());
        assert!(parse_backoff("soon").is_err());
    }

    #[test]
    fn backoff_doubles_up_to_its_most() {
        let state = RestartState {
            max_restarts: 10,
            backoff_min_ms: 1_000,
            backoff_max_ms: 5_000,
            restarts: 0,
            runs_ended: 0,
            last_end: None,
            last_exit_code: None,
            last_signal: None,
            last_ended_at: None,
            next_at: None,
            run_started_at: None,
            refused: None,
        };
        let delays: Vec<u64> = (1..=5).map(|n| backoff_ms(&state, n)).collect();
        assert_eq!(delays, [1_000, 2_000, 4_000, 5_000, 5_000]);
        assert_eq!(backoff_ms(&state, u32::MAX), 5_000);
    }
}
