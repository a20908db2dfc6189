//! `wait`: blocks until items end, or a pattern appears in their new output, or the
//! timeout passes. Woken by events, never by polling. A `--until` scan looks at each new
//! byte once, however often the wait is woken (see [`crate::daemon::output::scan`]), and reads on a
//! blocking thread, off the daemon's lock, a bounded step at a time.

use crate::daemon::output::scan::{read_data, read_off_lock, LineScan, Seen, STEP};
use crate::daemon::Daemon;
use crate::output;
use crate::store::Record;
use crate::wire::{State, WaitArgs, WaitReason, WaitReply, WireError};
use regex::Regex;
use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(50);

/// Where a `--until` scan of one item stands.
#[derive(Default)]
struct Scan {
    row: i64,
    /// The item's log path, once looked up.
    path: Option<std::path::PathBuf>,
    /// The item's log, once it exists.
    file: Option<File>,
    lines: LineScan,
}

/// What one step of a scan found.
struct Step {
    matched: Option<String>,
    /// More output waits to be read (the step's bound was reached).
    behind: bool,
}

impl Daemon {
    /// Waits; ended records the reply shows are added to `shown` (their notices are
    /// delivered with the reply).
    pub(crate) async fn wait(
        &self,
        session: &str,
        args: &WaitArgs,
        shown: &mut crate::daemon::Shown<'_>,
    ) -> Result<WaitReply, WireError> {
        if args.ids.is_empty() {
            return Err(WireError::bad_request(
                "wait needs at least one id, e.g. `bgwork wait bg-1`",
            ));
        }
        let until = match &args.until {
            // Shared, not cloned, by each step: a clone of a `Regex` starts with empty
            // caches, which each search then builds again.
            Some(pattern) => Some(std::sync::Arc::new(Regex::new(pattern).map_err(|e| {
                WireError::bad_request(format!("--until is not a valid regular expression: {e}"))
            })?)),
            None => None,
        };
        let timeout = match args.timeout_s {
            Some(s) => crate::wire::seconds("--timeout", s)?,
            None => DEFAULT_TIMEOUT,
        };
        let mut ids = args.ids.clone();
        ids.dedup();
        let rows: Vec<i64> = {
            let inner = self.lock();
            let records: Result<Vec<Record>, WireError> = ids
                .iter()
                .map(|id| Self::find(&inner, session, id))
                .collect();
            records?.iter().map(|r| r.row).collect()
        };
        // The ends this wait returns are shown by its reply: their notices wait for it.
        shown.watch(&rows);
        // "New" output is what this session has not read yet, so `send` then
        // `wait --until` cannot miss a reply that came before the wait.
        let mut scans: Vec<Scan> = rows
            .iter()
            .map(|&row| Scan {
                row,
                path: None,
                file: None,
                lines: LineScan::at(self.unread_from(session, row)),
            })
            .collect();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.changes();
        // Output of these items only, when a scan needs it; never output of others.
        let mut output = until
            .as_ref()
            .map(|_| self.watch_output(&rows, crate::daemon::Pace::Waiting));
        // Ends come with a change of records, never with output alone: they are looked
        // for first, and again after each change.
        let mut look_at_ends = true;
        let mut ended = 0;
        let (reason, matched) = loop {
            let timed_out = tokio::time::Instant::now() >= deadline;
            let mut behind = false;
            if let Some(regex) = &until {
                for scan in scans.iter_mut() {
                    let step = self.scan_step(scan, regex).await;
                    if let Some(line) = step.matched {
                        return self.wait_reply(
                            session,
                            &rows,
                            WaitReason::Matched,
                            Some(line),
                            shown,
                        );
                    }
                    behind |= step.behind;
                }
            }
            // An end never wins over output not yet looked at: a line the ended item
            // printed is a match.
            if behind && !timed_out {
                tokio::task::yield_now().await;
                continue;
            }
            if std::mem::take(&mut look_at_ends) {
                ended = rows.iter().filter(|&&row| self.has_ended(row)).count();
            }
            let done = if args.all {
                ended == rows.len()
            } else {
                ended > 0
            };
            if done {
                break (WaitReason::Ended, None);
            }
            if timed_out {
                // A deadline never wins over an end that already happened: one recorded
                // since the last look (its change not seen yet), or found on disk now
                // (recorded by `ended_now`), is looked at once more.
                let fresh = rows.iter().filter(|&&row| self.ended_now(row)).count();
                if fresh == ended {
                    break (WaitReason::Timeout, None);
                }
                look_at_ends = true;
                continue;
            }
            if behind {
                tokio::task::yield_now().await;
            } else {
                tokio::select! {
                    _ = changes.changed() => look_at_ends = true,
                    _ = crate::daemon::output_changed(&mut output) => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
        };
        self.wait_reply(session, &rows, reason, matched, shown)
    }

    fn wait_reply(
        &self,
        session: &str,
        rows: &[i64],
        reason: WaitReason,
        matched: Option<String>,
        shown: &mut crate::daemon::Shown<'_>,
    ) -> Result<WaitReply, WireError> {
        let inner = self.lock();
        let mut items = Vec::new();
        let mut tails = BTreeMap::new();
        for &row in rows {
            let Some(record) = inner.store.get(row)? else {
                continue;
            };
            let dropped = inner.dropped(&record);
            let path = output::log_path(&record.job_dir);
            let item = self.item_as(session, &record);
            tails.insert(
                item.id.clone(),
                output::tail(&path, self.config.log_head, dropped),
            );
            if record.state == State::Ended {
                // The reply carries the end: it delivers the end's notice (when it is
                // this session's: a sub-agent still hears of its own work).
                shown.push(row);
            }
            items.push(item);
        }
        Ok(WaitReply {
            reason,
            items,
            matched,
            tails,
        })
    }

    fn unread_from(&self, session: &str, row: i64) -> u64 {
        self.lock().store.cursor(session, row).unwrap_or(0)
    }

    /// Reads a bounded step of one item's new output on a blocking thread and returns
    /// the first line (or frame, or unterminated last line) matching `regex`.
    async fn scan_step(&self, scan: &mut Scan, regex: &std::sync::Arc<Regex>) -> Step {
        let idle = Step {
            matched: None,
            behind: false,
        };
        let (path, dropped) = {
            let inner = self.lock();
            // A running item's figures are in memory; the record is asked only once
            // for its log's path, and for the final figures of an item that ended.
            let live = inner.live.get(&scan.row).map(|live| live.dropped);
            match (&scan.path, live) {
                (Some(path), Some(dropped)) => (path.clone(), dropped),
                _ => {
                    let Ok(Some(record)) = inner.store.get(scan.row) else {
                        return idle;
                    };
                    let path = output::log_path(&record.job_dir);
                    scan.path = Some(path.clone());
                    (path, inner.dropped(&record))
                }
            }
        };
        let head = self.config.log_head;
        let gap = head..head + dropped;
        // The log held open is asked its length (no walk of its path at every wake).
        let len = match &scan.file {
            Some(file) => file.metadata().map_or(0, |m| m.len()),
            None => output::log_len(&path),
        };
        if len <= scan.lines.offset {
            return idle;
        }
        let mut taken = std::mem::take(scan);
        let regex = regex.clone();
        let bytes = len - taken.lines.offset;
        let work = read_off_lock(bytes, move || {
            let step = advance(&mut taken, &path, len, gap, &regex);
            (taken, step)
        });
        match work.await {
            Some((taken, step)) => {
                *scan = taken;
                step
            }
            None => idle,
        }
    }
}

/// Reads up to [`STEP`] bytes of `[offset, len)` of a log and matches what it finds.
fn advance(scan: &mut Scan, path: &Path, len: u64, gap: Range<u64>, regex: &Regex) -> Step {
    let mut matched = None;
    // The lines come as a reader is shown them (see `scan::reader_text`).
    let mut each = |seen: Seen, line: &str| {
        let hit = crate::daemon::output::scan::hit(regex, seen, line);
        if hit {
            matched = Some(crate::daemon::output::scan::shown(seen, line).to_string());
        }
        hit
    };
    if scan.file.is_none() {
        scan.file = File::open(path).ok();
    }
    if scan.lines.needs_key_check() {
        let (head, dropped) = (gap.start, gap.end - gap.start);
        let open = crate::daemon::output::scan::key_open_at(path, scan.lines.offset, head, dropped);
        scan.lines.set_in_key(open);
    }
    let Some(file) = &scan.file else {
        return Step {
            matched: None,
            behind: false,
        };
    };
    let mut buf = Vec::new();
    let mut budget = STEP;
    let mut behind = false;
    let mut hit = false;
    while scan.lines.offset < len && !hit {
        if budget == 0 {
            behind = true;
            break;
        }
        let Ok(at) = read_data(file, scan.lines.offset, len, gap.clone(), &mut buf) else {
            break;
        };
        if buf.is_empty() {
            scan.lines.skip_to(at);
            continue;
        }
        budget = budget.saturating_sub(buf.len() as u64);
        hit = scan.lines.feed(at, &buf, &mut each);
    }
    if !behind && !hit {
        scan.lines.offer_partial(&mut each);
    }
    Step { matched, behind }
}
