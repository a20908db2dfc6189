//! `LineMonitor`: a wait on a line of an item's output, or a watch of an item's output or
//! of a file. One step reads a bounded amount, off the daemon's lock, on a blocking
//! thread; a watch records its matches chunk by chunk, so memory never grows with a
//! burst.

use super::event_log::EventLog;
use super::follow::{Follow, LogSource, Next};
use super::Outcome;
use crate::daemon::output::scan::{LineScan, Seen, STEP};
use crate::daemon::Daemon;
use crate::output;
use crate::paths::now_ms;
use crate::store::ScanProgress;
use crate::wire::End;
use regex::Regex;
use std::time::{Duration, Instant};

/// How often a monitor that reads without matching saves how far it got.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// The most of a matched line that a monitor's report quotes.
const QUOTE_BYTES: usize = 400;

pub(crate) enum Source {
    Log(LogSource),
    File(Follow),
}

pub(crate) enum Mode {
    /// Ends at the first line, frame or unterminated last line that matches.
    Wait { pattern: String },
    /// Records every whole line that matches.
    Watch { log: EventLog, matches: u64 },
}

pub(crate) struct LineMonitor {
    pub row: i64,
    pub source: Source,
    pub lines: LineScan,
    pub regex: Option<Regex>,
    pub mode: Mode,
    /// The progress last saved, and when.
    pub saved: ScanProgress,
    pub saved_at: Instant,
    /// A monitor's scan saves its progress; a waiting item's (`jobs/after.rs`) reads
    /// again from the start after a restart, and saves nothing.
    pub durable: bool,
    /// Bytes of the source passed over unscanned (a log's middle dropped before the
    /// scan reached it).
    pub passed_over: u64,
}

/// What a waiting item's scan of an output found (`start --after ID:output RE`).
pub(crate) enum LineOutcome {
    Matched,
    Pending {
        behind: bool,
    },
    /// The item ended without such a line (or its log is gone): the detail says so.
    Never(String),
}

impl LineMonitor {
    /// A scan of item `target`'s output, from its first byte, for a line that
    /// `regex` matches, for the waiting item `row`.
    pub fn of_output(row: i64, target: i64, id: &str, regex: Regex) -> LineMonitor {
        LineMonitor {
            row,
            source: Source::Log(LogSource::new(target, id.to_string())),
            lines: LineScan::at(0),
            mode: Mode::Wait {
                pattern: regex.as_str().to_string(),
            },
            regex: Some(regex),
            saved: ScanProgress::default(),
            saved_at: Instant::now(),
            durable: false,
            passed_over: 0,
        }
    }

    /// [`LineMonitor::step`] of a waiting item's scan.
    pub fn step_output(&mut self, daemon: &Daemon) -> LineOutcome {
        match self.step(daemon) {
            Outcome::Done(End::Succeeded, _) => LineOutcome::Matched,
            Outcome::Done(_, detail) => LineOutcome::Never(detail),
            Outcome::Pending { behind } => LineOutcome::Pending { behind },
        }
    }

    /// Reads up to [`STEP`] bytes of what is new and acts on the lines in it.
    pub fn step(&mut self, daemon: &Daemon) -> Outcome {
        let mut buf = Vec::new();
        let mut budget = STEP;
        loop {
            if budget == 0 {
                self.save(daemon, false);
                return Outcome::Pending { behind: true };
            }
            let offset = self.lines.offset;
            let next = match &mut self.source {
                Source::Log(log) => log.next(daemon, offset, &mut buf),
                Source::File(follow) => follow.next(offset, &mut buf),
            };
            let next = match next {
                Ok(next) => next,
                Err(detail) => return Outcome::Done(End::Failed, detail),
            };
            match next {
                Next::Data(at) if buf.is_empty() => {
                    self.passed_over += at.saturating_sub(self.lines.offset);
                    self.lines.skip_to(at)
                }
                Next::Data(at) => {
                    self.passed_over += at.saturating_sub(self.lines.offset);
                    budget = budget.saturating_sub(buf.len() as u64);
                    if self.lines.needs_key_check() {
                        let open = self.key_open_at(daemon, self.lines.offset);
                        self.lines.set_in_key(open);
                    }
                    if let Some(done) = self.take_in(daemon, Some((at, &buf))) {
                        return done;
                    }
                }
                Next::Idle => break,
                Next::Restart => {
                    self.lines.restart(0);
                    self.save(daemon, true);
                }
                Next::Ended => {
                    if let Some(done) = self.take_in(daemon, None) {
                        return done;
                    }
                    match &self.source {
                        Source::Log(log) => {
                            let id = log.id.clone();
                            return self.source_ended(&id);
                        }
                        Source::File(_) => {
                            self.lines.restart(0);
                            self.save(daemon, true);
                        }
                    }
                }
            }
        }
        if let Mode::Wait { .. } = self.mode {
            let regex = self.regex.as_ref();
            let mut found = None;
            self.lines.offer_partial(&mut |seen, line: &str| {
                let hit = regex.is_none_or(|r| crate::daemon::output::scan::hit(r, seen, line));
                if hit {
                    found = Some(matched(crate::daemon::output::scan::shown(seen, line)));
                }
                hit
            });
            if let Some(detail) = found {
                return Outcome::Done(End::Succeeded, detail);
            }
        }
        self.save(daemon, false);
        Outcome::Pending { behind: false }
    }

    /// Takes in a chunk found at an offset (or, with none, the end of the source: its
    /// unterminated last line); a wait may end on it, a watch records its matches.
    fn take_in(&mut self, daemon: &Daemon, chunk: Option<(u64, &[u8])>) -> Option<Outcome> {
        let regex = self.regex.as_ref();
        let waits = matches!(self.mode, Mode::Wait { .. });
        let mut found = None;
        let mut batch = String::new();
        let mut count = 0u64;
        let mut each = |seen: Seen, line: &str| {
            if !regex.is_none_or(|r| crate::daemon::output::scan::hit(r, seen, line)) {
                return false;
            }
            // The line is what a reader is shown (see `scan::reader_text`).
            if waits {
                found = Some(matched(crate::daemon::output::scan::shown(seen, line)));
                return true;
            }
            if seen == Seen::Line {
                batch.push_str(line);
                batch.push('\n');
                count += 1;
            }
            if seen == Seen::Head {
                batch.push_str(crate::daemon::output::scan::shown(seen, line));
                batch.push_str(crate::daemon::output::scan::CUT_MARK);
                batch.push('\n');
                count += 1;
            }
            false
        };
        match chunk {
            Some((at, bytes)) => self.lines.feed(at, bytes, &mut each),
            None => self.lines.finish(&mut each),
        };
        if let Some(detail) = found {
            return Some(Outcome::Done(End::Succeeded, detail));
        }
        if count > 0 {
            self.record(daemon, &batch, count);
        }
        None
    }

    fn source_ended(&mut self, id: &str) -> Outcome {
        match &self.mode {
            // A line in a middle dropped before the scan reached it was never looked at.
            Mode::Wait { pattern } if self.passed_over > 0 => Outcome::Done(
                End::Failed,
                format!(
                    "{id} ended without printing {pattern} in the output it kept (its log's \
                     cap dropped {} of its middle before they were scanned: a line there was \
                     not looked at)",
                    crate::history::plural(self.passed_over as usize, "byte")
                ),
            ),
            Mode::Wait { pattern } => Outcome::Done(
                End::Failed,
                format!("{id} ended without printing {pattern}"),
            ),
            Mode::Watch { matches, .. } => Outcome::Done(
                End::Succeeded,
                format!(
                    "{id} ended; {} matched",
                    crate::history::plural(*matches as usize, "line")
                ),
            ),
        }
    }

    /// Appends a watch's matching lines to its log and folds them into its notice,
    /// with the progress that goes with them.
    fn record(&mut self, daemon: &Daemon, batch: &str, count: u64) {
        let file = self.file_id();
        let tail_before = self.file_tail(self.lines.line_start);
        let Mode::Watch { log, matches } = &mut self.mode else {
            return;
        };
        if let Err(e) = log.append(batch.as_bytes()) {
            crate::note!("bgwork daemon: a watch could not write its event log: {e}");
        }
        let progress = ScanProgress {
            offset: self.lines.line_start,
            file,
            file_tail: tail_before,
            log_len: Some(log.len()),
            dropped: log.dropped(),
        };
        let tail = newest_lines(batch, output::TAIL_BYTES as usize);
        let total = *matches + count;
        let saved = {
            let mut inner = daemon.lock();
            let running = matches!(inner.store.get(self.row), Ok(Some(r)) if r.state != crate::wire::State::Ended);
            running
                && inner
                    .store
                    .add_watch_matches(self.row, count, &tail, now_ms(), &progress, total)
                    .map_err(|e| {
                        crate::note!("bgwork daemon: a watch could not record its matches: {e}")
                    })
                    .is_ok()
        };
        *matches = total;
        if saved {
            self.saved = progress;
            self.saved_at = Instant::now();
        }
        daemon.records_changed();
    }

    /// Whether a private key is open at `offset` of the source (a scan resumed or
    /// started there shows none of its lines).
    fn key_open_at(&self, daemon: &Daemon, offset: u64) -> bool {
        match &self.source {
            Source::Log(log) => log.path().is_some_and(|(path, dropped)| {
                crate::daemon::output::scan::key_open_at(
                    path,
                    offset,
                    daemon.config.log_head,
                    dropped,
                )
            }),
            Source::File(follow) => {
                crate::daemon::output::scan::key_open_at(follow.path(), offset, 0, 0)
            }
        }
    }

    fn file_tail(&self, at: u64) -> Option<Vec<u8>> {
        match &self.source {
            Source::File(follow) => follow.tail_before(at),
            Source::Log(_) => None,
        }
    }

    fn file_id(&self) -> Option<(u64, u64)> {
        match &self.source {
            Source::File(follow) => follow.file_id(),
            Source::Log(_) => None,
        }
    }

    /// Saves how far the scan got: at once when `now`, otherwise at most every
    /// [`SAVE_EVERY`]. What is saved never goes back past recorded matches.
    fn save(&mut self, daemon: &Daemon, now: bool) {
        if !self.durable {
            return;
        }
        let mut progress = ScanProgress {
            offset: self.lines.line_start,
            file: self.file_id(),
            ..self.saved.clone()
        };
        if let Mode::Watch { log, .. } = &self.mode {
            progress.log_len = Some(log.len());
            progress.dropped = log.dropped();
        }
        if progress == self.saved || (!now && self.saved_at.elapsed() < SAVE_EVERY) {
            return;
        }
        progress.file_tail = self.file_tail(progress.offset);
        if let Err(e) = daemon
            .lock()
            .store
            .set_monitor_progress(self.row, &progress)
        {
            crate::note!("bgwork daemon: a monitor could not save its progress: {e}");
            return;
        }
        self.saved = progress;
        self.saved_at = Instant::now();
    }
}

/// A monitor's report of the line that matched, quoting at most [`QUOTE_BYTES`].
fn matched(line: &str) -> String {
    if line.len() <= QUOTE_BYTES {
        return format!("matched: {line}");
    }
    let mut end = QUOTE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("matched: {}…", &line[..end])
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
