//! Monitors (`mon-N`): durable waits (until a condition holds) and watches (every
//! matching line), run by the daemon itself and resumed from their records after a
//! restart, where a watch goes on from the offset it had reached.
//!
//! How it works: each monitor is one task. Output and end conditions re-check when the
//! daemon's change counter moves (new output, an end), so they never poll; port and
//! file conditions have nothing to wake them and check with a back-off (50 ms → 1 s).
//! A watch appends each matching line to its own log (`read mon-N`) and folds its
//! matches into at most one pending notice.

use super::Daemon;
use crate::output;
use crate::paths::now_ms;
use crate::store::{MonitorRow, NewNotice, NewRecord, Settlement};
use crate::wire::{
    Condition, End, ErrorCode, Item, Kind, MonitorArgs, MonitorMode, State, WireError,
};
use regex::Regex;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Monitors a session may run at once (SPEC §5).
const MAX_MONITORS: usize = 4;
/// The most one step of a scan reads.
const SCAN_CHUNK: u64 = 1 << 20;
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What one check of a monitor found.
enum Check {
    /// Nothing yet: check again after the next change (or the back-off).
    Pending,
    /// The monitor ended so, with this detail.
    Done(End, String),
}

impl Daemon {
    pub(crate) async fn monitor(
        self: &Arc<Self>,
        session: &str,
        args: MonitorArgs,
    ) -> Result<Item, WireError> {
        let row = self.create_monitor(session, &args)?;
        tokio::spawn(self.clone().run_monitor(row));
        let record = self.lock().store.get(row)?;
        record
            .map(|r| self.item(&r))
            .ok_or_else(|| WireError::internal("record vanished"))
    }

    fn create_monitor(&self, session: &str, args: &MonitorArgs) -> Result<i64, WireError> {
        let regex = match &args.regex {
            Some(pattern) => Some(
                Regex::new(pattern)
                    .map_err(|e| WireError::bad_request(format!("the regex is not valid: {e}")))?,
            ),
            None => None,
        };
        let timeout = match args.timeout_s {
            Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s.min(1e7))),
            Some(_) => return Err(WireError::bad_request("--timeout takes seconds, 0 or more")),
            None => None,
        };
        let mut inner = self.lock();
        let (condition, target, target_row) = match (&args.condition, args.mode) {
            (Condition::Output { id }, _) => {
                let record = Self::find(&inner, session, id)?;
                ("output", id.clone(), Some(record.row))
            }
            (Condition::End { id }, MonitorMode::Wait) => {
                let record = Self::find(&inner, session, id)?;
                ("end", id.clone(), Some(record.row))
            }
            (Condition::Port { address }, MonitorMode::Wait) => {
                if address
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse::<u16>().ok())
                    .is_none()
                {
                    return Err(WireError::bad_request(format!(
                        "--until-port {address}: write HOST:PORT, e.g. 127.0.0.1:8080"
                    )));
                }
                ("port", address.clone(), None)
            }
            (Condition::File { path }, _) if !path.is_empty() => ("file", path.clone(), None),
            _ => {
                return Err(WireError::bad_request(
                    "a watch follows --output ID or --file PATH; a wait takes one of \
                     --until-output, --until-port, --until-file, --until-end",
                ))
            }
        };
        if condition == "output" && args.mode == MonitorMode::Wait && regex.is_none() {
            return Err(WireError::bad_request(
                "--until-output takes an id and a regex: --until-output bg-1 'listening on'",
            ));
        }
        let running = Self::counted(&inner, session)?;
        let monitors = running.iter().filter(|r| r.kind == Kind::Monitor).count();
        if monitors >= MAX_MONITORS || running.len() >= self.config.max_running {
            let ids: Vec<String> = running.iter().map(|r| r.id.clone()).collect();
            return Err(WireError::new(
                ErrorCode::Limit,
                format!(
                    "this session runs {} items ({monitors} monitors; the limits are {} and {MAX_MONITORS}): {}. Stop one first",
                    running.len(),
                    self.config.max_running,
                    ids.join(", ")
                ),
            ));
        }
        let mode = match args.mode {
            MonitorMode::Wait => "wait",
            MonitorMode::Watch => "watch",
        };
        let described = match &args.regex {
            Some(regex) => format!("{mode} {condition} {target} /{regex}/"),
            None => format!("{mode} {condition} {target}"),
        };
        let record = inner.store.insert(&NewRecord {
            session: session.to_string(),
            kind: Kind::Monitor,
            name: args.name.clone(),
            command: described,
            cwd: String::new(),
            notify: args.notify || args.mode == MonitorMode::Watch,
            env_names: Vec::new(),
            started_at: now_ms(),
            cols: None,
            rows: None,
        })?;
        let job_dir = self.paths.job_dir(record.row);
        std::fs::create_dir_all(&job_dir).map_err(|e| {
            WireError::internal(format!("could not make {}: {e}", job_dir.display()))
        })?;
        inner
            .store
            .set_job_dir(record.row, &job_dir.display().to_string())?;
        // A wait looks at everything written so far; a watch at what comes from now on.
        let offset = match (args.mode, condition) {
            (MonitorMode::Watch, "output") => {
                let target = inner.store.get(target_row.unwrap_or(0))?;
                target.map_or(0, |t| output::log_len(&output::log_path(&t.job_dir)))
            }
            (MonitorMode::Watch, "file") => std::fs::metadata(&target).map_or(0, |m| m.len()),
            _ => 0,
        };
        let monitor = MonitorRow {
            mode: mode.to_string(),
            condition: condition.to_string(),
            target,
            target_row,
            regex: args.regex.clone(),
            deadline_at: timeout.map(|t| now_ms() + t.as_millis() as i64),
            offset,
            matches: 0,
        };
        inner.store.insert_monitor(record.row, &monitor)?;
        inner.store.mark_running(record.row)?;
        Ok(record.row)
    }

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
            tokio::spawn(self.clone().run_monitor(row));
        }
    }

    async fn run_monitor(self: Arc<Self>, row: i64) {
        let mut changes = self.changes();
        let mut backoff = Duration::from_millis(50);
        loop {
            let Ok(Some(monitor)) = self.lock().store.monitor(row) else {
                return;
            };
            if self.has_ended(row) {
                return;
            }
            match self.check(row, &monitor).await {
                Check::Done(end, detail) => {
                    self.settle_monitor(row, end, &detail);
                    return;
                }
                Check::Pending => {}
            }
            let deadline = monitor.deadline_at.map(|at| {
                let left = (at - now_ms()).max(0) as u64;
                tokio::time::Instant::now() + Duration::from_millis(left)
            });
            let until = deadline
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
            let polls = matches!(monitor.condition.as_str(), "port" | "file");
            if polls {
                tokio::time::sleep_until(until.min(tokio::time::Instant::now() + backoff)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            } else {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }

    async fn check(&self, row: i64, monitor: &MonitorRow) -> Check {
        if monitor.deadline_at.is_some_and(|at| now_ms() >= at) {
            return Check::Done(
                End::Failed,
                format!(
                    "timed out waiting for {} {}",
                    monitor.condition, monitor.target
                ),
            );
        }
        match monitor.condition.as_str() {
            "output" | "file" => self.scan_monitor(row, monitor),
            "end" => {
                let record = monitor
                    .target_row
                    .and_then(|r| self.lock().store.get(r).ok().flatten());
                match record {
                    Some(r) if r.state == State::Ended => {
                        let report = r
                            .end
                            .map(|e| crate::end::report(&r.id, e, r.exit_code, r.signal));
                        Check::Done(End::Succeeded, report.unwrap_or_default())
                    }
                    Some(_) => Check::Pending,
                    None => {
                        Check::Done(End::Failed, format!("{} no longer exists", monitor.target))
                    }
                }
            }
            "port" => {
                let connect = tokio::net::TcpStream::connect(&monitor.target);
                match tokio::time::timeout(Duration::from_millis(500), connect).await {
                    Ok(Ok(_)) => Check::Done(
                        End::Succeeded,
                        format!("{} accepts connections", monitor.target),
                    ),
                    _ => Check::Pending,
                }
            }
            _ => Check::Pending,
        }
    }

    /// Reads new lines of the watched output or file; a wait ends at the first match, a
    /// watch records every match.
    fn scan_monitor(&self, row: i64, monitor: &MonitorRow) -> Check {
        let regex = monitor
            .regex
            .as_deref()
            .map(Regex::new)
            .and_then(Result::ok);
        let is_file = monitor.condition == "file";
        let wait = monitor.mode == "wait";
        if is_file && wait {
            return if Path::new(&monitor.target).exists() {
                Check::Done(End::Succeeded, format!("{} exists", monitor.target))
            } else {
                Check::Pending
            };
        }
        let (path, head, dropped, source_ended, source) = if is_file {
            (
                Path::new(&monitor.target).to_path_buf(),
                u64::MAX / 2,
                0,
                false,
                monitor.target.clone(),
            )
        } else {
            let inner = self.lock();
            let Ok(Some(target)) = inner.store.get(monitor.target_row.unwrap_or(0)) else {
                return Check::Done(End::Failed, format!("{} no longer exists", monitor.target));
            };
            let dropped = inner.dropped(&target);
            let path = output::log_path(&target.job_dir);
            (
                path,
                self.config.log_head,
                dropped,
                target.state == State::Ended,
                target.id,
            )
        };
        let len = output::log_len(&path);
        let mut offset = monitor.offset.min(len);
        let mut matched: Vec<String> = Vec::new();
        while offset < len {
            let to = len.min(offset + SCAN_CHUNK);
            let (bytes, _) = output::read_range(&path, offset, to, head, dropped);
            let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            if complete == 0 && to < len {
                offset = to; // a line longer than a chunk: skip it
                continue;
            }
            let text = output::readable(&bytes[..complete]);
            offset += complete as u64;
            for line in text.lines() {
                if regex.as_ref().is_none_or(|r| r.is_match(line)) {
                    if wait {
                        return Check::Done(End::Succeeded, format!("matched: {line}"));
                    }
                    matched.push(line.to_string());
                }
            }
            if complete == 0 {
                break;
            }
        }
        let matches = monitor.matches + matched.len() as u64;
        if !matched.is_empty() {
            self.record_matches(row, &matched, (offset, matches));
        } else if offset != monitor.offset {
            let _ = self.lock().store.set_monitor_progress(row, offset, matches);
        }
        if source_ended && offset >= len {
            return if wait {
                Check::Done(
                    End::Failed,
                    format!("{source} ended without a matching line"),
                )
            } else {
                Check::Done(
                    End::Succeeded,
                    format!("{source} ended; {matches} line(s) matched"),
                )
            };
        }
        Check::Pending
    }

    /// Appends a watch's matching lines to its log and folds them into its notice.
    fn record_matches(&self, row: i64, lines: &[String], progress: (u64, u64)) {
        let mut inner = self.lock();
        let Ok(Some(record)) = inner.store.get(row) else {
            return;
        };
        let mut text = lines.join("\n");
        text.push('\n');
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(output::log_path(&record.job_dir))
            .and_then(|mut log| log.write_all(text.as_bytes()));
        if let Err(e) = appended {
            crate::note!(
                "bgwork daemon: {} could not write its event log: {e}",
                record.id
            );
        }
        let tail = newest_lines(&text, output::TAIL_BYTES as usize);
        let at = now_ms();
        if let Err(e) = inner
            .store
            .add_watch_matches(row, lines.len() as u64, &tail, at, progress)
        {
            crate::note!(
                "bgwork daemon: {} could not record its matches: {e}",
                record.id
            );
        }
        drop(inner);
        self.bump();
    }

    /// Ends a monitor, with its notice when armed (not for a stop by the agent).
    pub(crate) fn settle_monitor(&self, row: i64, end: End, detail: &str) {
        let mut inner = self.lock();
        let Ok(Some(record)) = inner.store.get(row) else {
            return;
        };
        let notice = (record.notify && end != End::StoppedByAgent).then(|| NewNotice {
            text: format!(
                "{}: {detail}",
                crate::end::report(&record.id, end, None, None)
            ),
            tail: output::tail(&output::log_path(&record.job_dir), self.config.log_head, 0),
        });
        let settlement = Settlement {
            end,
            exit_code: None,
            signal: None,
            ended_at: now_ms(),
            log_len: 0,
            dropped: 0,
            lost_reason: Some(detail.to_string()),
            notice,
            pid: None,
            unwritten: 0,
            unwritten_at: 0,
        };
        if let Err(e) = inner.store.settle(row, &settlement) {
            crate::note!("bgwork daemon: could not end {}: {e}", record.id);
        }
        drop(inner);
        self.bump();
    }
}

/// The newest whole lines of `text` within `max` bytes.
fn newest_lines(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    match text[start..].find('\n') {
        Some(i) => text[start + i + 1..].to_string(),
        None => text[start..].to_string(),
    }
}
