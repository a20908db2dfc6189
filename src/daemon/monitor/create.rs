//! Making a monitor: checking what it names, resolving where it starts (a wait looks at
//! everything written so far, a watch at what comes from now on), the session's limits,
//! and its records.

use super::{Daemon, Instant};
use crate::daemon::admission::{Admission, Newcomer};
use crate::output;
use crate::paths::now_ms;
use crate::store::{mode_text, MonitorRow, NewRecord, ScanProgress, Watched};
use crate::wire::{Condition, ErrorCode, Item, Kind, MonitorArgs, MonitorMode, State, WireError};
use regex::Regex;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What a new monitor watches, resolved before it is recorded.
struct Target {
    condition: Watched,
    target: String,
    target_row: Option<i64>,
    progress: ScanProgress,
}

impl Daemon {
    pub(crate) async fn monitor(
        self: &Arc<Self>,
        session: &str,
        args: MonitorArgs,
    ) -> Result<Item, WireError> {
        let (row, timeout) = self.create_monitor(session, &args)?;
        let deadline = timeout.map(|t| Instant::now() + t);
        tokio::spawn(self.clone().run_monitor(row, Some(deadline)));
        let record = self.lock().store.get(row)?;
        record
            .map(|r| self.item(&r))
            .ok_or_else(|| WireError::internal("record vanished"))
    }

    /// Records a new monitor; returns its row and its timeout.
    fn create_monitor(
        &self,
        session: &str,
        args: &MonitorArgs,
    ) -> Result<(i64, Option<Duration>), WireError> {
        if let Some(pattern) = &args.regex {
            Regex::new(pattern)
                .map_err(|e| WireError::bad_request(format!("the regex is not valid: {e}")))?;
        }
        let timeout = match (args.timeout_s, args.mode) {
            (Some(_), MonitorMode::Watch) => {
                return Err(WireError::bad_request(
                    "--timeout belongs to `monitor wait`: a watch runs until it is stopped \
                     (or until the item it watches ends)",
                ))
            }
            (Some(s), MonitorMode::Wait) => Some(crate::wire::seconds("--timeout", s)?),
            (None, _) => None,
        };
        if matches!(args.condition, Condition::Output { .. })
            && args.mode == MonitorMode::Wait
            && args.regex.is_none()
        {
            return Err(WireError::bad_request(
                "--until-output takes an id and a regex: --until-output bg-1 'listening on'",
            ));
        }
        let target = self.monitor_target(session, args)?;
        let mut inner = self.lock();
        let admission = Admission {
            newcomer: Newcomer::Monitor,
            checked_at_promotion: false,
            held: false,
            again: None,
        };
        let root = self.admit(&mut inner, session, admission)?;
        let mode = mode_text(args.mode);
        let described = match &args.regex {
            Some(regex) => format!("{mode} {} {} /{regex}/", target.condition, target.target),
            None => format!("{mode} {} {}", target.condition, target.target),
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
        self.count_start(&mut inner, &root);
        let job_dir = self.paths.job_dir(record.row);
        std::fs::create_dir_all(&job_dir).map_err(|e| {
            WireError::internal(format!("could not make {}: {e}", job_dir.display()))
        })?;
        inner
            .store
            .set_job_dir(record.row, &job_dir.display().to_string())?;
        let monitor = MonitorRow {
            mode: args.mode,
            condition: target.condition,
            target: target.target,
            target_row: target.target_row,
            regex: args.regex.clone(),
            deadline_at: timeout.map(|t| now_ms() + t.as_millis() as i64),
            progress: target.progress,
            matches: 0,
        };
        inner.store.insert_monitor(record.row, &monitor)?;
        inner.store.mark_running(record.row)?;
        Ok((record.row, timeout))
    }

    /// Checks what a new monitor names and where it starts: a wait looks at everything
    /// written so far, a watch at what comes from now on.
    fn monitor_target(&self, session: &str, args: &MonitorArgs) -> Result<Target, WireError> {
        let watch = args.mode == MonitorMode::Watch;
        let mut progress = ScanProgress::default();
        let (condition, target, target_row) = match (&args.condition, args.mode) {
            (Condition::Output { id }, _) => {
                let (record, dropped) = {
                    let inner = self.lock();
                    let record = Self::find(&inner, session, id)?;
                    let dropped = inner.dropped(&record);
                    (record, dropped)
                };
                if watch {
                    if record.state == State::Ended {
                        return Err(WireError::new(
                            ErrorCode::NotRunning,
                            format!(
                                "{id} has ended: nothing more will come to watch (`bgwork read {id} --all` shows its output)"
                            ),
                        ));
                    }
                    let path = output::log_path(&record.job_dir);
                    progress.offset = watch_start(&path, self.config.log_head, dropped);
                }
                (Watched::Output, id.clone(), Some(record.row))
            }
            (Condition::End { id }, MonitorMode::Wait) => {
                let record = Self::find(&self.lock(), session, id)?;
                (Watched::End, id.clone(), Some(record.row))
            }
            (Condition::PortOf { id }, MonitorMode::Wait) => {
                let record = Self::find(&self.lock(), session, id)?;
                if record.kind == crate::wire::Kind::Monitor {
                    return Err(WireError::refused(format!(
                        "{id} is a monitor, which has no processes: --of takes a job or a pane"
                    )));
                }
                (Watched::PortOf, id.clone(), Some(record.row))
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
                (Watched::Port, address.clone(), None)
            }
            (Condition::File { path }, _) => {
                check_path(path, watch)?;
                if watch && self.inside_jobs(Path::new(path)) {
                    // Watches following each other's logs would feed each other for ever.
                    return Err(WireError::bad_request(format!(
                        "{path} is the log of a bgwork item: watch it with `monitor watch --output ID`"
                    )));
                }
                if watch {
                    if let Ok(meta) = std::fs::metadata(path) {
                        if !meta.is_file() {
                            return Err(WireError::bad_request(format!(
                                "{path} is not a regular file: a watch follows regular files"
                            )));
                        }
                        progress.offset = meta.len();
                        progress.file = Some((meta.dev(), meta.ino()));
                    }
                    progress.log_len = Some(0);
                }
                (Watched::File, path.clone(), None)
            }
            _ => {
                return Err(WireError::bad_request(
                    "a watch follows --output ID or --file PATH; a wait takes one of \
                     --until-output, --until-port, --until-file, --until-end",
                ))
            }
        };
        if watch {
            progress.log_len = Some(0);
        }
        Ok(Target {
            condition,
            target,
            target_row,
            progress,
        })
    }

    /// Whether a path lies in this home's folder of item logs.
    fn inside_jobs(&self, path: &Path) -> bool {
        let Ok(jobs) = self.paths.jobs.canonicalize() else {
            return false;
        };
        // The nearest folder on the way that exists, as the kernel resolves it.
        let folder = path.ancestors().skip(1).find_map(|p| p.canonicalize().ok());
        folder.is_some_and(|f| f.starts_with(&jobs))
    }
}

/// A monitor's path must be absolute: the daemon's own directory means nothing to the
/// caller, so the CLI resolves relative paths against the caller's.
fn check_path(path: &str, watch: bool) -> Result<(), WireError> {
    let flag = if watch { "--file" } else { "--until-file" };
    if path.is_empty() || path.contains('\0') {
        return Err(WireError::bad_request(format!(
            "{flag} takes a path to a file"
        )));
    }
    if !Path::new(path).is_absolute() {
        return Err(WireError::bad_request(format!(
            "{flag} {path}: the daemon takes absolute paths only (the CLI resolves a \
             relative one against your directory; other clients must do the same)"
        )));
    }
    Ok(())
}

/// Where a watch of a log begins: its end, or the start of a token shape the job is
/// still writing there, so that the watch sees the token whole (and masked), never its
/// rest alone.
fn watch_start(path: &std::path::Path, head: u64, dropped: u64) -> u64 {
    let len = output::log_len(path);
    let from = len.saturating_sub(256);
    let (bytes, _) = output::read_range(path, from, len, head, dropped);
    match crate::redact::unfinished_token(&bytes) {
        Some(start) if bytes.len() as u64 == len - from => from + start as u64,
        _ => len,
    }
}
