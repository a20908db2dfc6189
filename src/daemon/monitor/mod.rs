//! Monitors (`mon-N`): durable waits (until a condition holds) and watches (every
//! matching line), run by the daemon itself and resumed from their records after a
//! restart, where a watch goes on from the offset it had reached.
//!
//! How it works: each monitor is one task. A line monitor (a wait on an item's output,
//! a watch of an item's output or of a file, [`lines`]) reads a bounded step at a time
//! on a blocking thread, off the daemon's lock, and looks at each new byte once. Output
//! and end conditions re-check when the daemon's change counter moves (new output, an
//! end); file conditions are woken by inotify ([`fs_wake`]) and also poll with a
//! back-off (50 ms → 1 s), as port conditions do. A deadline is turned into a monotonic
//! instant when the task starts, so a wall-clock jump neither fires nor delays it. A
//! watch appends each matching line to its own capped log (`read mon-N`) and folds its
//! matches into at most one pending notice; a watch of an item ends when the item ends.

mod create;
mod event_log;
mod follow;
mod fs_wake;
mod lines;

use super::Daemon;
use crate::daemon::output::scan::LineScan;
use crate::output;
use crate::paths::now_ms;
use crate::store::{EndRecord, MonitorRow, NewNotice, Record, Watched};
use crate::wire::MonitorMode;
use crate::wire::{End, Kind, State};
use event_log::EventLog;
use follow::{Follow, LogSource};
use fs_wake::{FsEvents, FsWake};
pub(crate) use lines::{LineMonitor, LineOutcome};
use lines::{Mode, Source};
use regex::Regex;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often a monitor woken by the daemon's changes looks whether it was stopped.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// What one check of a monitor found.
pub(crate) enum Outcome {
    /// Nothing yet; `behind` when more is already waiting to be read.
    Pending { behind: bool },
    /// The monitor ended so, with this detail.
    Done(End, String),
}

/// What a monitor's task checks.
enum Task {
    /// Lines of an output or a file; out of its slot while a step runs.
    Lines(Option<Box<LineMonitor>>),
    /// A wait until a path exists.
    FileExists(PathBuf),
    /// A wait until something accepts connections on HOST:PORT.
    Port(String),
    /// A wait until an item's processes listen on a TCP port.
    PortOf { row: i64, id: String },
    /// A wait until an item ends.
    End { row: i64, id: String },
}

impl Task {
    /// Whether a change of the daemon (new output, an end) can make it hold.
    fn wakes_on_changes(&self) -> bool {
        match self {
            Task::Lines(Some(lines)) => matches!(lines.source, Source::Log(_)),
            Task::End { .. } => true,
            _ => false,
        }
    }

    /// The item whose output it reads, if it reads one.
    fn log_row(&self) -> Option<i64> {
        match self {
            Task::Lines(Some(lines)) => match &lines.source {
                Source::Log(log) => Some(log.row),
                _ => None,
            },
            _ => None,
        }
    }

    /// The path it follows or waits for, for inotify.
    fn path(&self) -> Option<PathBuf> {
        match self {
            Task::Lines(Some(lines)) => match &lines.source {
                Source::File(follow) => Some(follow.path().to_path_buf()),
                Source::Log(_) => None,
            },
            Task::FileExists(path) => Some(path.clone()),
            _ => None,
        }
    }

    fn offset(&self) -> u64 {
        match self {
            Task::Lines(Some(lines)) => lines.lines.offset,
            _ => 0,
        }
    }
}

impl Daemon {
    /// Starts the task of every monitor still running (after a daemon start).
    pub(crate) fn resume_monitors(self: &Arc<Self>) {
        let rows: Vec<i64> = match self.lock().store.unsettled() {
            Ok(records) => records
                .into_iter()
                .filter(|r| r.kind == Kind::Monitor)
                .map(|r| r.row)
                .collect(),
            Err(_) => return,
        };
        for row in rows {
            tokio::spawn(self.clone().run_monitor(row, None));
        }
    }

    /// Runs one monitor until it ends. A new monitor brings its deadline on the
    /// monotonic clock; a resumed one has only the wall-clock time it was recorded with.
    async fn run_monitor(self: Arc<Self>, row: i64, deadline: Option<Option<Instant>>) {
        let loaded = {
            let inner = self.lock();
            (inner.store.get(row), inner.store.monitor(row))
        };
        let (record, monitor) = match loaded {
            (Ok(Some(record)), Ok(Some(monitor))) => (record, monitor),
            (Ok(Some(_)), Ok(None)) => {
                self.settle_monitor(row, End::Failed, "its settings were not recorded");
                return;
            }
            _ => return,
        };
        if record.state == State::Ended {
            return;
        }
        // After a restart, the one look at the wall clock: the rest of the wait follows
        // the monotonic one.
        let deadline = deadline.unwrap_or_else(|| {
            monitor.deadline_at.map(|at| {
                Instant::now() + Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64)
            })
        });
        let mut task = match self.task(&record, &monitor) {
            Ok(task) => task,
            Err(detail) => {
                self.settle_monitor(row, End::Failed, &detail);
                return;
            }
        };
        let mut wake = task.path().and_then(|path| FsWake::new(&path));
        let polls = !task.wakes_on_changes();
        let mut changes = self.changes();
        // The output of the item it reads, when it reads one: nothing else's wakes it.
        let mut output = task
            .log_row()
            .map(|row| self.watch_output(&[row], crate::daemon::Pace::Waiting));
        let mut backoff = FIRST_BACKOFF;
        let mut next_poll = Instant::now();
        let mut events = FsEvents::default();
        let mut due = true;
        let mut stop_checked: Option<Instant> = None;
        loop {
            // A stop settles the record; look for it at most every STOP_CHECK (a
            // monitor that reads on after its stop records nothing: see `record`).
            if stop_checked.is_none_or(|at| at.elapsed() >= STOP_CHECK) {
                if self.has_ended(row) {
                    return;
                }
                stop_checked = Some(Instant::now());
            }
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if due || timed_out {
                let before = task.offset();
                let outcome = self.check(&mut task, events).await;
                events = FsEvents::default();
                match outcome {
                    Outcome::Done(end, detail) => {
                        self.settle_monitor(row, end, &detail);
                        return;
                    }
                    Outcome::Pending { .. } if timed_out => {
                        let detail = format!(
                            "timed out waiting for {} {}",
                            monitor.condition, monitor.target
                        );
                        self.settle_monitor(row, End::Failed, &detail);
                        return;
                    }
                    Outcome::Pending { behind: true } => {
                        due = true;
                        tokio::task::yield_now().await;
                        continue;
                    }
                    Outcome::Pending { behind: false } => {}
                }
                if task.offset() != before {
                    backoff = FIRST_BACKOFF;
                }
                if polls {
                    next_poll = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
            let far = Instant::now() + Duration::from_secs(86_400);
            let poll_at = if polls { next_poll } else { far };
            let until = deadline.map_or(poll_at, |d| d.min(poll_at));
            tokio::select! {
                // Polling conditions have nothing to learn from the daemon's changes.
                changed = changes.changed(), if !polls => {
                    if changed.is_err() {
                        return;
                    }
                    due = true;
                }
                _ = crate::daemon::output_changed(&mut output) => due = true,
                _ = tokio::time::sleep_until(until) => due = true,
                seen = next_event(&mut wake) => {
                    events.created |= seen.created;
                    backoff = FIRST_BACKOFF;
                    due = true;
                }
            }
        }
    }

    /// What a monitor's task checks, from its records.
    fn task(&self, record: &Record, monitor: &MonitorRow) -> Result<Task, String> {
        let regex = monitor
            .regex
            .as_deref()
            .map(Regex::new)
            .transpose()
            .map_err(|e| format!("its regex is not valid: {e}"))?;
        let path = PathBuf::from(&monitor.target);
        let source = match (monitor.mode, monitor.condition) {
            (_, Watched::Output) => {
                let row = monitor.target_row.unwrap_or(0);
                Source::Log(LogSource::new(row, monitor.target.clone()))
            }
            (MonitorMode::Watch, Watched::File) => Source::File(Follow::new(
                &path,
                monitor.progress.file,
                monitor.progress.file_tail.clone(),
            )),
            (MonitorMode::Wait, Watched::File) => return Ok(Task::FileExists(path)),
            (MonitorMode::Wait, Watched::Port) => return Ok(Task::Port(monitor.target.clone())),
            (MonitorMode::Wait, Watched::PortOf) => {
                return Ok(Task::PortOf {
                    row: monitor.target_row.unwrap_or(0),
                    id: monitor.target.clone(),
                })
            }
            (MonitorMode::Wait, Watched::End) => {
                return Ok(Task::End {
                    row: monitor.target_row.unwrap_or(0),
                    id: monitor.target.clone(),
                })
            }
            (mode, condition) => {
                return Err(format!(
                    "no monitor {} {condition} exists",
                    crate::store::mode_text(mode)
                ))
            }
        };
        let mode = match monitor.mode {
            MonitorMode::Watch => {
                let log = EventLog::open(
                    &output::log_path(&record.job_dir),
                    self.config.log_cap,
                    self.config.log_head,
                    monitor.progress.log_len,
                    monitor.progress.dropped,
                )
                .map_err(|e| format!("could not open its event log: {e}"))?;
                Mode::Watch {
                    log,
                    matches: monitor.matches,
                }
            }
            MonitorMode::Wait => Mode::Wait {
                pattern: monitor.regex.clone().unwrap_or_default(),
            },
        };
        Ok(Task::Lines(Some(Box::new(LineMonitor {
            row: record.row,
            source,
            lines: LineScan::at(monitor.progress.offset),
            regex,
            mode,
            saved: monitor.progress.clone(),
            saved_at: std::time::Instant::now(),
            durable: true,
            passed_over: 0,
        }))))
    }

    async fn check(self: &Arc<Self>, task: &mut Task, events: FsEvents) -> Outcome {
        let pending = Outcome::Pending { behind: false };
        match task {
            Task::Lines(slot) => {
                let Some(mut lines) = slot.take() else {
                    return pending;
                };
                let daemon = self.clone();
                let step = tokio::task::spawn_blocking(move || {
                    let outcome = lines.step(&daemon);
                    (lines, outcome)
                });
                match step.await {
                    Ok((lines, outcome)) => {
                        *slot = Some(lines);
                        outcome
                    }
                    Err(e) => Outcome::Done(End::Failed, format!("the monitor failed: {e}")),
                }
            }
            Task::FileExists(path) => {
                let probe = path.clone();
                let exists = tokio::task::spawn_blocking(move || std::fs::metadata(probe).is_ok());
                let shown = path.display();
                if exists.await.unwrap_or(false) {
                    Outcome::Done(End::Succeeded, format!("{shown} exists"))
                } else if events.created {
                    Outcome::Done(
                        End::Succeeded,
                        format!("{shown} was created (and was gone again at once)"),
                    )
                } else {
                    pending
                }
            }
            Task::Port(address) => {
                let connect = tokio::net::TcpStream::connect(address.as_str());
                match tokio::time::timeout(Duration::from_millis(500), connect).await {
                    Ok(Ok(_)) => {
                        Outcome::Done(End::Succeeded, format!("{address} accepts connections"))
                    }
                    _ => pending,
                }
            }
            Task::PortOf { row, id } => {
                let record = self.lock().store.get(*row).ok().flatten();
                let Some(record) = record else {
                    return Outcome::Done(End::Failed, format!("{id} no longer exists"));
                };
                let listening = self.listening_of(&record).await;
                if !listening.is_empty() {
                    let described = crate::observe::describe_listening(&listening);
                    return Outcome::Done(End::Succeeded, format!("{id} listens on {described}"));
                }
                match record.state {
                    State::Ended => Outcome::Done(
                        End::Failed,
                        format!("{id} ended without listening on a TCP port"),
                    ),
                    _ => pending,
                }
            }
            Task::End { row, id } => {
                let record = self.lock().store.get(*row).ok().flatten();
                match record {
                    Some(r) if r.state == State::Ended => {
                        let report = r
                            .end
                            .map(|e| crate::end::report(&r.id, e, r.exit_code, r.signal));
                        Outcome::Done(End::Succeeded, report.unwrap_or_default())
                    }
                    Some(_) => pending,
                    None => Outcome::Done(End::Failed, format!("{id} no longer exists")),
                }
            }
        }
    }

    /// Ends a monitor, with its notice when armed (not for a stop by the agent).
    pub(crate) fn settle_monitor(&self, row: i64, end: End, detail: &str) {
        // Its detail may quote its pattern or path: token shapes masked, as listed.
        let detail = &crate::redact::mask_shapes(detail.to_string());
        let Ok(Some(record)) = self.lock().store.get(row) else {
            return;
        };
        if record.state == State::Ended {
            return;
        }
        let armed = record.notify && end != End::StoppedByAgent;
        // Read before the lock is taken again: never hold it across file I/O.
        let tail = armed.then(|| {
            output::tail(
                &output::log_path(&record.job_dir),
                self.config.log_head,
                record.dropped,
            )
        });
        let notice = tail.map(|tail| NewNotice {
            text: format!(
                "{}: {detail}",
                crate::end::report(&record.id, end, None, None)
            ),
            tail,
        });
        let settlement = EndRecord {
            end,
            exit_code: None,
            signal: None,
            ended_at: now_ms(),
            log_len: record.log_len,
            dropped: record.dropped,
            end_detail: Some(detail.to_string()),
            notice,
            pid: None,
            unwritten: 0,
            unwritten_at: 0,
            cpu_ms: None,
            peak_rss: None,
        };
        if let Err(e) = self.lock().store.settle(row, &settlement) {
            crate::note!("bgwork daemon: could not end {}: {e}", record.id);
        }
        self.records_changed();
    }
}

/// The next inotify wake, or never without inotify.
async fn next_event(wake: &mut Option<FsWake>) -> FsEvents {
    match wake {
        Some(wake) => wake.next().await,
        None => std::future::pending().await,
    }
}
