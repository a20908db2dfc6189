//! What the run history (see [`crate::history`]) tells callers: `history`, the
//! expectation of items not yet ended (in `start`, `list` and MCP), the one notice of
//! a job running far past its usual time, and the deadline of `run --timeout auto`
//! (contract §13).

use super::Daemon;
use crate::history::{human_ms, plural, shown_ms, Expectation, Run};
use crate::paths::{now_ms, rfc3339};
use crate::store::Record;
use crate::wire::{CommandHistory, HistoryReply, Item, Kind, PastRun, State, WireError};
use std::time::Duration;

/// The shortest foreground deadline `run --timeout auto` gives (3× a tiny usual time
/// would promote a command that is merely slowed by a busy machine).
const AUTO_FLOOR: Duration = Duration::from_secs(1);

/// The deadline `run --timeout auto` chose, with the words that say why.
pub(crate) enum AutoDeadline {
    /// Background at once, with its notice armed (the words say why, not what).
    Background(String),
    /// Wait in the foreground this long, then promote (or kill) as any run: why, and
    /// the wait in words ("3× that (9 s)").
    Foreground(Duration, String, String),
}

impl Daemon {
    /// `history`: the commands run in `cwd` (or `command` alone), newest first.
    pub(crate) fn history(
        &self,
        cwd: &str,
        command: Option<&str>,
    ) -> Result<HistoryReply, WireError> {
        crate::paths::require_absolute(cwd, "cwd")?;
        let asked = command.map(crate::history::key);
        if asked.as_deref() == Some("") {
            return Err(WireError::bad_request(
                "the command is empty: name one, or leave it out for every command run in \
                 the folder",
            ));
        }
        let inner = self.lock();
        let (keys, more_commands) = match &asked {
            Some(key) => (vec![key.clone()], 0),
            None => inner.store.run_commands(cwd)?,
        };
        let mut commands = Vec::new();
        for key in keys {
            let runs = inner.store.runs(cwd, &key)?;
            let Some(expectation) = Expectation::of(&runs) else {
                continue;
            };
            commands.push(CommandHistory {
                command: key,
                runs: expectation.runs,
                median_ms: expectation.usual_ms,
                p90_ms: expectation.p90_ms,
                expected: expectation.line(),
                last: runs.iter().map(past_run).collect(),
            });
        }
        Ok(HistoryReply {
            cwd: crate::history::normalise_folder(cwd),
            command: asked,
            commands,
            more_commands,
        })
    }

    /// What history expects of `command` in `cwd`; none without runs (or when the store
    /// cannot say).
    pub(crate) fn expectation(&self, cwd: &str, command: &str) -> Option<Expectation> {
        let runs = self.lock().store.runs(cwd, command).ok()?;
        Expectation::of(&runs)
    }

    /// Adds to each job or pane not yet ended what history expects of it, and how far
    /// it has got against that.
    pub(crate) fn expect_items(&self, items: &mut [Item], records: &[Record]) {
        for (item, record) in items.iter_mut().zip(records) {
            if record.state == State::Ended || !matches!(record.kind, Kind::Job | Kind::Pane) {
                continue;
            }
            let Some(expectation) = self.expectation(&record.cwd, &record.command) else {
                continue;
            };
            item.expected = Some(expectation.line());
            item.usual_ms = expectation.usual_ms;
            // A job waiting out its restart policy's back-off runs nothing now.
            if record.state == State::Running && !record.restarting() {
                let running = now_ms().saturating_sub(record.run_started_at()).max(0) as u64;
                item.progress = expectation.progress(running);
            }
        }
    }

    /// The deadline of `run --timeout auto` for `command` in `cwd`.
    pub(crate) fn auto_deadline(&self, cwd: &str, command: &str, plain: Duration) -> AutoDeadline {
        let Some(expectation) = self.expectation(cwd, command) else {
            return AutoDeadline::Foreground(
                plain,
                "no history of this command in this folder".to_owned(),
                format!("the plain {}", human_ms(millis(plain))),
            );
        };
        let Some(usual) = expectation.usual_ms.map(Duration::from_millis) else {
            return AutoDeadline::Foreground(
                plain,
                format!(
                    "history has {} of it but none ended by itself (no usual time)",
                    plural(expectation.runs, "run"),
                ),
                format!("the plain {}", human_ms(millis(plain))),
            );
        };
        let threshold = self.config.auto_background;
        let usual_text = format!("usually {} here", human_ms(millis(usual)));
        // Compared as shown, so the words never say "1.0 s, longer than the 1.0 s".
        if shown_ms(millis(usual)) > shown_ms(millis(threshold)) {
            return AutoDeadline::Background(format!(
                "{usual_text} ({}), longer than the {} worth waiting for",
                expectation.counted(),
                human_ms(millis(threshold))
            ));
        }
        // 3× the usual time as shown: the words' numbers agree.
        let tripled = Duration::from_millis(shown_ms(millis(usual))).saturating_mul(3);
        let deadline = tripled.max(AUTO_FLOOR);
        let waited = if tripled < AUTO_FLOOR {
            format!(
                "{} (3× that, {}, is under the least wait of {})",
                human_ms(millis(deadline)),
                human_ms(millis(tripled)),
                human_ms(millis(AUTO_FLOOR))
            )
        } else {
            format!("3× that ({})", human_ms(millis(deadline)))
        };
        AutoDeadline::Foreground(
            deadline,
            format!(
                "{usual_text} ({}), not over the {} worth backgrounding",
                expectation.counted(),
                human_ms(millis(threshold)),
            ),
            waited,
        )
    }

    /// When a running job counts as running long (see [`Expectation::overrun_after`]),
    /// as milliseconds since the epoch; none without a usual time.
    pub(crate) fn overrun_at(&self, record: &Record) -> Option<(i64, Expectation)> {
        if !matches!(record.kind, Kind::Job | Kind::Pane) {
            return None;
        }
        let expectation = self.expectation(&record.cwd, &record.command)?;
        let after = expectation.overrun_after(self.config.overrun_margin)?;
        // A stored duration may be absurd: past the end of time is never.
        let after = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
        Some((record.run_started_at().saturating_add(after), expectation))
    }

    /// The one notice of a job running far past its usual time, with its last lines;
    /// none for one that listens on a port (a server has no usual end).
    pub(crate) async fn overran(&self, record: &Record, expectation: &Expectation) {
        if !self.listening_of(record).await.is_empty() {
            return;
        }
        let running = now_ms().saturating_sub(record.run_started_at()).max(0) as u64;
        let usual = expectation.usual_ms.unwrap_or_default();
        let text = format!(
            "{} has run {}, {} its usual {} ({}): it may be stuck (`bgwork read {}`, \
             `bgwork stop {}`)",
            record.id,
            human_ms(running),
            times_of(running, usual),
            human_ms(usual),
            expectation.counted(),
            record.id,
            record.id
        );
        let log = crate::output::log_path(&record.job_dir);
        let (head, dropped) = (self.config.log_head, self.lock().dropped(record));
        let tail = tokio::task::spawn_blocking(move || crate::output::tail(&log, head, dropped))
            .await
            .unwrap_or_default();
        // One per run: a restart policy's next run is told of again.
        let key = match record.restart.as_ref().map_or(0, |r| r.restarts) {
            0 => format!("overrun:{}", record.row),
            restarts => format!("overrun:{}:{restarts}", record.row),
        };
        let mut inner = self.lock();
        let same_run = |r: &Record| {
            r.state != State::Ended
                && !r.restarting()
                && r.run_started_at() == record.run_started_at()
        };
        if !matches!(inner.store.get(record.row), Ok(Some(r)) if same_run(&r)) {
            // It (or this run of its restart policy) ended meanwhile: its end says the
            // rest.
            return;
        }
        let added = inner.store.add_event_notice(record.row, &key, &text, &tail);
        drop(inner);
        match added {
            Ok(true) => self.records_changed(),
            Ok(false) => {}
            Err(e) => crate::note!("bgwork daemon: could not record a running-long notice: {e}"),
        }
    }
}

/// A duration in milliseconds, saturated.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How many times its usual time a run has taken, as the shown numbers give it and
/// never more (`3.0×` at exactly three times, `12×`).
fn times_of(running_ms: u64, usual_ms: u64) -> String {
    let (running, usual) = (shown_ms(running_ms), shown_ms(usual_ms));
    if usual == 0 {
        return "far past".to_string();
    }
    let tenths = u128::from(running) * 10 / u128::from(usual);
    match tenths {
        0..=99 => format!("{}.{}×", tenths / 10, tenths % 10),
        _ => format!("{}×", tenths / 10),
    }
}

fn past_run(run: &Run) -> PastRun {
    PastRun {
        id: run.item.clone(),
        session: run.session.clone(),
        end: run.end,
        exit_code: run.exit_code,
        signal: run.signal,
        duration_ms: run.duration_ms,
        started_at: rfc3339(run.started_at),
        ended_at: rfc3339(run.ended_at),
    }
}
