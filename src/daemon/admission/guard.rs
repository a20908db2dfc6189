//! Guard rails on starting work (contract §5): a cap on running items across every
//! session of the daemon, and a start rate per session against runaway loops.
//!
//! Both are checked under the daemon's lock together with the session's own limits,
//! before a record is written; a start counts toward the rate only once its record
//! exists, so a refused start never counts. Starts of jobs, panes, monitors, sub-agents,
//! runs and restarts all count. The rate is kept per root session (a session and its
//! sub-agents together, as the other limits are), in memory: a restarted daemon starts
//! counting again.

use crate::daemon::{Daemon, Inner};
use crate::wire::{ErrorCode, WireError};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

const MINUTE: Duration = Duration::from_secs(60);
/// Sessions whose starts are remembered before the old ones are swept.
const SWEEP_PAST: usize = 256;

/// The starts of each root session in the last minute, and the starts held for
/// restarts that are stopping their running item first.
#[derive(Default)]
pub(crate) struct Starts(HashMap<String, VecDeque<Instant>>, HashMap<String, usize>);

/// A start held for a `restart` while it stops the running item: counted by the rate
/// guard (so two restarts at once cannot both stop their items and then find the rate
/// spent), given back when dropped.
pub(crate) struct Held<'a> {
    daemon: &'a Daemon,
    root: String,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut inner = self.daemon.lock();
        let held = &mut inner.starts.1;
        if let Some(count) = held.get_mut(&self.root) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.root);
            }
        }
    }
}

impl Starts {
    fn recent(&mut self, root: &str, now: Instant) -> Option<&mut VecDeque<Instant>> {
        let starts = self.0.get_mut(root)?;
        while starts
            .front()
            .is_some_and(|t| now.duration_since(*t) >= MINUTE)
        {
            starts.pop_front();
        }
        Some(starts)
    }
}

impl Daemon {
    /// Refuses a start while a shutdown is under way, past the daemon-wide cap (unless
    /// `over_cap`: a `run`, checked when it is promoted) or past the session's start
    /// rate (the starts held for restarts count, but for the one this start holds, if
    /// `held`). Part of the one admission of a new item (`admission/mod.rs`).
    pub(crate) fn check_guards_held(
        &self,
        inner: &mut Inner,
        root: &str,
        over_cap: bool,
        held: bool,
        again: bool,
    ) -> Result<(), WireError> {
        // Checked under the lock that writes the record: a shutdown that has begun sees
        // every start that got past this.
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(WireError::new(
                crate::wire::ErrorCode::Unavailable,
                "the daemon is shutting down: nothing was started; run the command again \
                 once it has stopped (a new daemon starts on demand)",
            ));
        }
        let cap = self.config.max_running_total;
        if !over_cap && cap > 0 {
            // A restart policy's new start of an item that counts already.
            let running = inner
                .store
                .count_unsettled()?
                .saturating_sub(usize::from(again));
            if running >= cap {
                return Err(total_error(cap, running));
            }
        }
        self.check_rate(inner, root, held)
    }

    /// Refuses a start past the session's start rate (the starts held for restarts
    /// count, but for the one this start holds, if `held`).
    fn check_rate(&self, inner: &mut Inner, root: &str, held: bool) -> Result<(), WireError> {
        let rate = self.config.max_starts_per_minute;
        if rate > 0 {
            let now = Instant::now();
            let holds = inner.starts.1.get(root).copied().unwrap_or(0);
            let holds = holds.saturating_sub(usize::from(held));
            let (count, oldest) = match inner.starts.recent(root, now) {
                Some(starts) => (starts.len(), starts.front().copied()),
                None => (0, None),
            };
            if count + holds >= rate {
                // With only held starts, the wait is that of a restart: a moment.
                let oldest = oldest.unwrap_or(now);
                let wait = MINUTE.saturating_sub(now.duration_since(oldest));
                return Err(rate_error(rate, root, wait));
            }
        }
        Ok(())
    }

    /// How long until `root`'s start rate allows a start again (zero when it does now,
    /// or the guard is off), so a refused start is tried again then, not before.
    pub(crate) fn rate_wait(&self, inner: &mut Inner, root: &str) -> Duration {
        let rate = self.config.max_starts_per_minute;
        if rate == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let Some(starts) = inner.starts.recent(root, now) else {
            return Duration::ZERO;
        };
        match starts.len().checked_sub(rate) {
            // The start that leaves the window lets the next one in.
            Some(past) => starts
                .get(past)
                .map(|t| MINUTE.saturating_sub(now.duration_since(*t)))
                .unwrap_or_default(),
            None => Duration::ZERO,
        }
    }

    /// Checks the rate for a restart of a running item and holds its start while the
    /// item is stopped.
    pub(crate) fn hold_start(&self, root: &str) -> Result<Held<'_>, WireError> {
        let mut inner = self.lock();
        self.check_rate(&mut inner, root, false)?;
        *inner.starts.1.entry(root.to_string()).or_default() += 1;
        Ok(Held {
            daemon: self,
            root: root.to_string(),
        })
    }

    /// Counts a start of `root`'s tree toward its rate (its record was written).
    pub(crate) fn count_start(&self, inner: &mut Inner, root: &str) {
        if self.config.max_starts_per_minute == 0 {
            return;
        }
        let now = Instant::now();
        let starts = &mut inner.starts;
        if starts.0.len() > SWEEP_PAST {
            starts
                .0
                .retain(|_, s| s.back().is_some_and(|t| now.duration_since(*t) < MINUTE));
        }
        starts.0.entry(root.to_string()).or_default().push_back(now);
    }

    /// Whether the daemon runs more than its cap allows (a `run` past its deadline is
    /// then not promoted).
    pub(crate) fn over_total_cap(&self, inner: &Inner) -> Result<bool, WireError> {
        let cap = self.config.max_running_total;
        Ok(cap > 0 && inner.store.count_unsettled()? > cap)
    }
}

fn total_error(cap: usize, running: usize) -> WireError {
    WireError::new(
        ErrorCode::Limit,
        format!(
            "the daemon already runs {} across all sessions, its cap of {cap} \
             (BGWORK_MAX_RUNNING_TOTAL): stop some (`bgwork stop ID`) or wait for some to end \
             (a person sees every session's work with bgwork status); to raise the cap, \
             restart the daemon with BGWORK_MAX_RUNNING_TOTAL set higher in its environment \
             (bgwork shutdown, then any call starts it again: work goes on and is taken back)",
            crate::history::plural(running, "item")
        ),
    )
}

/// Where the start rate's refusal says when the next start is allowed (a restart
/// policy's refusal leaves it out: its next attempt says it).
pub(crate) const RATE_COUNTDOWN: &str = "; the next start is allowed in";

/// The start rate's advice to a caller starting work: none to give to work that starts
/// by itself (a waiting item, a restart policy), which [`without_advice`] leaves out.
const RATE_ADVICE: &str = ": is a loop starting work? Wait for work to end (`bgwork wait \
     ID`) rather than start more";

/// A refusal as said of work that starts by itself: the start rate's advice to a caller
/// left out.
pub(crate) fn without_advice(message: &str) -> String {
    message.replacen(RATE_ADVICE, "", 1)
}

fn rate_error(rate: usize, root: &str, wait: Duration) -> WireError {
    WireError::new(
        ErrorCode::Limit,
        format!(
            "session {root} has made {} in the last minute (a restart policy's start again \
             counts), the start-rate guard's \
             limit of {} a minute (BGWORK_MAX_STARTS_PER_MINUTE; 0 turns it off)\
             {RATE_ADVICE}{RATE_COUNTDOWN} {} s",
            crate::history::plural(rate, "start"),
            crate::history::plural(rate, "start"),
            wait.as_secs() + 1
        ),
    )
}
