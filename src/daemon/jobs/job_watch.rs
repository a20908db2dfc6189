//! The watcher of each running job (`JobWatch`, one task a job, started with the job
//! or when a restarted daemon takes it back), woken by the job's output growth at
//! most every [`SCAN_PAUSE`] and by its end: it keeps the deadline of each quiet spell
//! (`--quiet-after`: busy, idle, or a pane at a prompt) and scans the new output for a
//! port in use (at most [`SCAN_MAX`] bytes a wake, so a flood costs little;
//! `port_in_use.rs`). Notices about a running job carry a key naming their event (the
//! spell by the log length it started at), so none is written twice, even across
//! restarts.

use super::port_in_use::in_use_line;
use crate::daemon::processes::cpu_of;
use crate::daemon::Daemon;
use crate::history::Expectation;
use crate::observe;
use crate::output;
use crate::store::Record;
use crate::wire::{Kind, State};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A watcher looks at new output at most this often: the pace of a job nobody waits
/// on, so that its cost stays the same when someone does (a port in use is told within
/// a second; a quiet spell's deadline is kept exactly whatever the pause).
pub(super) const SCAN_PAUSE: Duration =
    Duration::from_millis(crate::daemon::output::watchers::RELAXED_MS);

/// The most new output one look scans for a port in use (the newest bytes).
pub(super) const SCAN_MAX: u64 = 64 << 10;

/// How often a watcher with nothing to wait for checks that its job still runs (its
/// end wakes it: this is only a safety net).
pub(super) const ALIVE_CHECK: Duration = Duration::from_secs(60);

/// How long a watcher takes its record as it last read it while only output came.
const RECORD_FRESH: Duration = Duration::from_secs(5);

/// A quiet spell's CPU use is measured over at least this long.
pub(super) const MIN_SPELL_SAMPLE: Duration = Duration::from_secs(1);

/// CPU use (percent of one core) from which a quiet job counts as busy.
pub(super) const BUSY_PERCENT: f64 = 10.0;

/// What a watcher knows of its job between wakes.
pub(super) struct JobWatch {
    log: PathBuf,
    /// The log, held open once it exists: a look asks it its length and reads it with
    /// no walk of its path.
    file: Option<Arc<std::fs::File>>,
    head: u64,
    quiet: Option<Duration>,
    /// The log length last seen, and when it last grew.
    len: u64,
    last_output: Instant,
    /// The log length when the current quiet spell began (names the spell).
    spell_len: u64,
    /// When the spell's CPU was sampled, and the job's CPU time (ms) then.
    spell_cpu: (Instant, u64),
    /// The spell's notice was written.
    fired: bool,
    /// Where the scan for a port in use goes on, and the unfinished line before it.
    scanned: u64,
    partial: Vec<u8>,
    /// A port in use was seen (once per job).
    port_seen: bool,
}

impl JobWatch {
    fn new(record: &Record, head: u64, fresh: bool) -> JobWatch {
        let log = output::log_path(&record.job_dir);
        let len = match fresh {
            true => 0,
            false => output::log_len(&log),
        };
        // A daemon that takes a job back counts its quiet spell from the log's last
        // change, not from its own start.
        let now = Instant::now();
        let last_output = match fresh {
            true => now,
            false => last_change(&log),
        };
        JobWatch {
            log,
            file: None,
            head,
            quiet: record.quiet_after_ms.map(Duration::from_millis),
            len,
            last_output,
            spell_len: len,
            spell_cpu: (now, cpu_of(Path::new(&record.job_dir))),
            fired: false,
            scanned: len.saturating_sub(SCAN_MAX),
            partial: Vec::new(),
            port_seen: false,
        }
    }

    fn quiet_deadline(&self) -> Option<Instant> {
        let quiet = self.quiet.filter(|_| !self.fired)?;
        Some(self.last_output + quiet)
    }

    /// The log, opened at the first look that finds it.
    fn log_file(&mut self) -> Option<Arc<std::fs::File>> {
        if self.file.is_none() {
            self.file = output::open_log(&self.log).ok().map(Arc::new);
        }
        self.file.clone()
    }

    /// The log's length and modification time now.
    fn log_now(&mut self) -> Option<std::fs::Metadata> {
        self.log_file()?.metadata().ok()
    }

    /// Whether the log is longer than last seen.
    fn log_grew(&mut self) -> bool {
        self.log_now().is_some_and(|m| m.len() > self.len)
    }

    /// Output came: a new quiet spell begins, and the new bytes are scanned.
    async fn output_came(&mut self, daemon: &Daemon, record: &Record) {
        let Some(now) = self.log_now() else {
            return;
        };
        let len = now.len();
        if len <= self.len {
            return;
        }
        self.len = len;
        // The spell began when the output was written, not when its report came (a
        // job nobody waits on reports once a second).
        self.last_output = changed_at(&now);
        self.spell_len = len;
        self.fired = false;
        if self.quiet.is_some() {
            let dir = PathBuf::from(&record.job_dir);
            let cpu = tokio::task::spawn_blocking(move || cpu_of(&dir))
                .await
                .unwrap_or(0);
            self.spell_cpu = (Instant::now(), cpu);
        }
        if self.port_seen {
            return;
        }
        let from = self.scanned.max(len.saturating_sub(SCAN_MAX));
        if from > self.scanned {
            self.partial.clear();
        }
        let dropped = daemon.lock().dropped(record);
        let Some(log) = self.log_file() else {
            return;
        };
        let head = self.head;
        let mut partial = std::mem::take(&mut self.partial);
        let found = crate::daemon::output::scan::read_off_lock(len - from, move || {
            let (bytes, _) = output::Holes::new(&log, head, dropped).read(from, len);
            partial.extend_from_slice(&bytes);
            let found = in_use_line(&partial);
            // Only the unfinished last line is kept for the next look (bounded).
            let rest = match partial.iter().rposition(|&b| b == b'\n') {
                Some(at) => partial[at + 1..].to_vec(),
                None => partial,
            };
            let rest = rest[rest.len().saturating_sub(4096)..].to_vec();
            (found, rest)
        })
        .await;
        self.scanned = len;
        if let Some((found, rest)) = found {
            self.partial = rest;
            if let Some(line) = found {
                self.port_seen = true;
                daemon.port_in_use(record, line).await;
            }
        }
    }
}

/// When the log last changed (its modification time), on the monotonic clock; now when
/// that cannot be told.
pub(super) fn last_change(log: &Path) -> Instant {
    match std::fs::metadata(log) {
        Ok(meta) => changed_at(&meta),
        Err(_) => Instant::now(),
    }
}

/// When a file of `meta` last changed, on the monotonic clock; now when that cannot be
/// told.
fn changed_at(meta: &std::fs::Metadata) -> Instant {
    let now = Instant::now();
    let age = meta
        .modified()
        .ok()
        .and_then(|at| at.elapsed().ok())
        .unwrap_or_default();
    now.checked_sub(age).unwrap_or(now)
}

/// Whether the last line of a screen looks like a prompt: it ends in `>`, `$`, `?`,
/// `:` or `#` (the space after it is gone once trailing blanks are trimmed), or in a
/// choice such as `[y/N]`.
pub(super) fn looks_like_prompt(line: &str) -> bool {
    let line = line.trim_end();
    line.ends_with(['>', '$', '?', ':', '#']) || line.ends_with(']') && line.contains('/')
}

/// Whether the processes in the foreground of `pid`'s terminal all sleep, and, where
/// the kernel names what they wait in, one of them waits for input (a read of the
/// terminal, or `poll`/`select` on it as readline and REPLs do; not a timer).
pub(super) fn foreground_reads(pid: i32, tree: &[i32]) -> bool {
    let Some(group) = observe::terminal_foreground(pid) else {
        return false;
    };
    let members: Vec<i32> = tree
        .iter()
        .copied()
        .filter(|&p| observe::group_of(p) == Some(group))
        .collect();
    if members.is_empty() || members.iter().any(|&p| observe::state_of(p) != Some('S')) {
        return false;
    }
    let waits: Vec<String> = members
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/wchan")).ok())
        .filter(|w| !w.is_empty() && w != "0")
        .collect();
    waits.is_empty()
        || waits.iter().any(|w| {
            ["tty", "read", "wait_woken", "poll", "select"]
                .iter()
                .any(|k| w.contains(k))
        })
}

impl Daemon {
    /// Starts the watcher of a running job (its quiet spells, a port in use): `fresh`
    /// for a job that has just started (its whole output is scanned), else for one a
    /// restarted daemon takes back.
    pub(crate) fn watch_job(self: &Arc<Self>, row: i64, fresh: bool) {
        tokio::spawn(self.clone().job_watcher(row, fresh));
    }

    pub(super) async fn job_watcher(self: Arc<Self>, row: i64, fresh: bool) {
        let record = match self.lock().store.get(row) {
            Ok(Some(record)) => record,
            _ => return,
        };
        if record.kind == Kind::Monitor || record.job_dir.is_empty() {
            return;
        }
        let mut watch = JobWatch::new(&record, self.config.log_head, fresh);
        // Far past its usual time (from the run history), one notice says so: armed
        // again for each run of a restart policy (history may know the command by then).
        let mut armed_for = record.run_started_at();
        let mut overrun = self.overrun_deadline(&record);
        // Its own watch needs no haste: its supervisor reports at the relaxed pace
        // unless someone else waits on the output.
        let mut output = self.watch_output(&[row], crate::daemon::Pace::Relaxed);
        // The record is asked of the store again only after a change of records (an
        // end, a restart, a stop), at a wake by the clock, or when it is a few seconds
        // old: a look at new output a second, for a hundred chatty jobs, is otherwise a
        // hundred queries a second.
        let mut changes = self.changes();
        changes.borrow_and_update();
        let mut known = (record, Instant::now());
        let mut first = true;
        // A job a restarted daemon takes back, before its first look.
        let mut taken_back = !fresh;
        loop {
            let deadline = watch.quiet_deadline();
            let next = match (deadline, overrun.as_ref().map(|(at, _)| *at)) {
                (Some(quiet), Some(long)) => Some(quiet.min(long)),
                (quiet, long) => quiet.or(long),
            };
            let wake = next.map_or(ALIVE_CHECK, |at| {
                at.saturating_duration_since(Instant::now())
                    .min(ALIVE_CHECK)
            });
            // The first look needs no wake: a quick job may have written (and ended)
            // before its watcher started.
            let grew = !std::mem::take(&mut first)
                && tokio::select! {
                    changed = output.changed() => changed.is_ok(),
                    _ = tokio::time::sleep(wake) => false,
                };
            let fresh =
                grew && !changes.has_changed().unwrap_or(true) && known.1.elapsed() < RECORD_FRESH;
            if !fresh {
                changes.borrow_and_update();
                known = match self.lock().store.get(row) {
                    Ok(Some(record)) => (record, Instant::now()),
                    _ => return,
                };
            }
            let record = known.0.clone();
            let ended = record.state == State::Ended;
            if !record.restarting() && record.run_started_at() != armed_for {
                armed_for = record.run_started_at();
                overrun = self.overrun_deadline(&record);
            }
            if taken_back && !ended && deadline.is_some_and(|at| Instant::now() >= at) {
                // The spell passed while the daemon was down: it is told even when the
                // output resumes now.
                self.quiet_spell(&mut watch, &record).await;
            }
            if !ended
                && !record.restarting()
                && overrun
                    .as_ref()
                    .is_some_and(|(at, _)| Instant::now() >= *at)
            {
                if let Some((_, expectation)) = overrun.take() {
                    self.overran(&record, &expectation).await;
                }
            }
            taken_back = false;
            if grew || watch.log_grew() {
                // An ended job's last output is still looked at once.
                watch.output_came(&self, &record).await;
                if ended {
                    return;
                }
                // A pause before the next look, but never past the end of the quiet
                // spell that has just begun.
                let pause = Instant::now() + SCAN_PAUSE;
                let until = watch
                    .quiet_deadline()
                    .map_or(pause, |quiet| quiet.min(pause));
                tokio::time::sleep_until(until.into()).await;
                continue;
            }
            if ended {
                return;
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                self.quiet_spell(&mut watch, &record).await;
            }
        }
    }

    /// When the current run of `record` counts as running long, and what history
    /// expects of it; none without a usual time.
    fn overrun_deadline(&self, record: &Record) -> Option<(Instant, Expectation)> {
        let (at_ms, expectation) = self.overrun_at(record)?;
        let left = at_ms.saturating_sub(crate::paths::now_ms()).max(0) as u64;
        let at = Instant::now().checked_add(Duration::from_millis(left))?;
        Some((at, expectation))
    }

    /// A quiet spell passed its `--quiet-after`: its notice, once.
    pub(super) async fn quiet_spell(&self, watch: &mut JobWatch, record: &Record) {
        if record.restarting() {
            // Nothing runs while it waits out its restart policy's back-off: no spell
            // to tell (a new one begins with the next run's output).
            watch.fired = true;
            return;
        }
        let (since, cpu_then) = watch.spell_cpu;
        let sampled = since.elapsed();
        if sampled < MIN_SPELL_SAMPLE {
            // A spell that began before this daemon: measure its CPU for a moment.
            // The spell happened whatever comes meanwhile (output, or the job's end,
            // which has a notice of its own).
            tokio::time::sleep(MIN_SPELL_SAMPLE - sampled).await;
            let ended = !matches!(self.lock().store.get(record.row), Ok(Some(r)) if r.state != State::Ended);
            if ended {
                return;
            }
        }
        watch.fired = true;
        let dir = PathBuf::from(&record.job_dir);
        let cpu_now = tokio::task::spawn_blocking(move || cpu_of(&dir))
            .await
            .unwrap_or(0);
        let elapsed = since.elapsed().as_secs_f64().max(0.001);
        let percent = cpu_now.saturating_sub(cpu_then) as f64 / 10.0 / elapsed;
        let quiet = humantime::format_duration(watch.quiet.unwrap_or_default());
        let mut how = match percent >= BUSY_PERCENT {
            true => format!("quiet and busy (cpu {percent:.0}%)"),
            false => format!("quiet and idle (cpu {percent:.0}%)"),
        };
        // A job on an ssh host has no processes here to measure.
        if self.executors.which(record.row, &record.job_dir) == crate::executor::Which::Ssh {
            how = "quiet (it runs on an ssh host, whose CPU use is not measured here)".into();
        }
        if record.kind == Kind::Pane && percent < BUSY_PERCENT {
            if let Some(prompt) = self.waiting_prompt(record).await {
                how = format!("waiting for input at a prompt: {prompt:?} (cpu {percent:.0}%)");
            }
        }
        let text = format!("{} has printed nothing for {quiet}: {how}", record.id);
        let log = output::log_path(&record.job_dir);
        let (head, dropped) = (self.config.log_head, self.lock().dropped(record));
        let tail = tokio::task::spawn_blocking(move || output::tail(&log, head, dropped))
            .await
            .unwrap_or_default();
        let key = format!("quiet:{}:{}", record.row, watch.spell_len);
        let added = self
            .lock()
            .store
            .add_event_notice(record.row, &key, &text, &tail);
        match added {
            Ok(true) => self.records_changed(),
            Ok(false) => {}
            Err(e) => crate::note!("bgwork daemon: could not record a quiet notice: {e}"),
        }
    }

    /// The prompt a pane waits at: its screen's last line looks like one and the
    /// processes in the foreground of its terminal sleep (in a read, where the kernel
    /// says so).
    pub(super) async fn waiting_prompt(&self, record: &Record) -> Option<String> {
        let screen = self.screen(&record.session, &record.id).await.ok()?;
        let line = screen
            .output
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())?
            .trim_end()
            .to_string();
        if !looks_like_prompt(&line) {
            return None;
        }
        let pid = record.pid?;
        let dir = PathBuf::from(&record.job_dir);
        let waiting = tokio::task::spawn_blocking(move || {
            foreground_reads(pid, &crate::supervisor::tree::job_pids(&dir))
        })
        .await
        .unwrap_or(false);
        waiting.then_some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts() {
        assert!(looks_like_prompt("Continue? "));
        assert!(looks_like_prompt("Password:"));
        assert!(looks_like_prompt(">>> "));
        assert!(looks_like_prompt("Overwrite [y/N]"));
        assert!(!looks_like_prompt("Compiling foo v0.1.0"));
    }
}
