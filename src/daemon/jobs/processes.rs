//! What the daemon learns by watching running jobs' processes (see [`crate::observe`]):
//! their cost and ports for `list`, `read` and `status`; a `start` that repeats a
//! running command; quiet spells (`--quiet-after`); a port already in use.
//!
//! How it works: cost and ports are read from `/proc` when a client asks, on a blocking
//! thread, never under the lock. Each running job has one watcher task (started with
//! the job, or when a restarted daemon takes it back) that wakes on the job's output
//! growth, at most every [`SCAN_PAUSE`]: it scans the new output for a port in use (at
//! most [`SCAN_MAX`] bytes a wake, so a flood costs little) and keeps the quiet spell's
//! deadline. Notices about a running job carry a key naming their event (the spell by
//! the log length it started at), so none is written twice, even across restarts.

use crate::daemon::Daemon;
use crate::observe::{self, Observed};
use crate::output;
use crate::store::Record;
use crate::wire::{Item, Kind, State};
use regex::Regex;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A watcher looks at new output at most this often: the pace of a job nobody waits
/// on, so that its cost stays the same when someone does (a port in use is told within
/// a second; a quiet spell's deadline is kept exactly whatever the pause).
const SCAN_PAUSE: Duration = Duration::from_millis(crate::daemon::watchers::RELAXED_MS);
/// The most new output one look scans for a port in use (the newest bytes).
const SCAN_MAX: u64 = 64 << 10;
/// How often a watcher with nothing to wait for checks that its job still runs (its
/// end wakes it: this is only a safety net).
const ALIVE_CHECK: Duration = Duration::from_secs(60);
/// A quiet spell's CPU use is measured over at least this long.
const MIN_SPELL_SAMPLE: Duration = Duration::from_secs(1);
/// CPU use (percent of one core) from which a quiet job counts as busy.
const BUSY_PERCENT: f64 = 10.0;

impl Daemon {
    /// Adds what the processes of running items use and listen on, and what the run
    /// history expects of them.
    pub(crate) async fn observe_items(&self, items: &mut [Item], records: &[Record]) {
        self.expect_items(items, records);
        let targets: Vec<(usize, PathBuf)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| observable(r))
            .map(|(index, r)| (index, PathBuf::from(&r.job_dir)))
            .collect();
        if targets.is_empty() {
            return;
        }
        let dirs: Vec<PathBuf> = targets.iter().map(|(_, dir)| dir.clone()).collect();
        let ports = self.config.ports;
        let seen = tokio::task::spawn_blocking(move || observe_dirs(&dirs, ports))
            .await
            .unwrap_or_default();
        for ((index, _), seen) in targets.iter().zip(seen) {
            if let (Some(item), Some(seen)) = (items.get_mut(*index), seen) {
                apply(item, &seen);
            }
        }
    }

    /// The running item of `session` that runs `command` in `cwd` as `kind` and
    /// listens on a TCP port (`listening`: the rows [`Daemon::listening_twins`] found so,
    /// off the lock): a second copy of a server. Identical commands that listen on no
    /// port are fan-out (workers, retries, a loop in a script) and each starts.
    pub(crate) fn running_twin(
        inner: &crate::daemon::Inner,
        session: &str,
        twin: &Twin<'_>,
        listening: &[i64],
    ) -> Result<Option<Record>, crate::wire::WireError> {
        Ok(inner
            .store
            .list(session, false)?
            .into_iter()
            .find(|r| twin.matches(session, r) && listening.contains(&r.row)))
    }

    /// The rows of `session`'s running twins of a command that listen on a TCP port
    /// (all looked at in one pass, off the lock; [`Daemon::running_twin`] decides under
    /// it).
    pub(crate) async fn listening_twins(&self, session: &str, twin: &Twin<'_>) -> Vec<i64> {
        let candidates: Vec<Record> = match self.lock().store.list(session, false) {
            Ok(records) => records
                .into_iter()
                .filter(|r| twin.matches(session, r) && observable(r))
                .collect(),
            Err(_) => return Vec::new(),
        };
        if candidates.is_empty() {
            return Vec::new();
        }
        let candidates: Vec<Record> = candidates
            .into_iter()
            .filter(|r| twin.same_env(Path::new(&r.job_dir)))
            .collect();
        if candidates.is_empty() {
            return Vec::new();
        }
        let dirs: Vec<PathBuf> = candidates
            .iter()
            .map(|r| PathBuf::from(&r.job_dir))
            .collect();
        let seen = tokio::task::spawn_blocking(move || observe_dirs(&dirs, true))
            .await
            .unwrap_or_default();
        // One that waits out a restart's back-off is the server between two runs: it
        // listens again once started, so it counts as listening (contract §3, §15).
        candidates
            .iter()
            .zip(seen)
            .filter(|(record, seen)| {
                crate::daemon::restart_policy::waiting(record)
                    || seen.as_ref().is_some_and(|s| !s.listening.is_empty())
            })
            .map(|(record, _)| record.row)
            .collect()
    }

    /// Starts the watcher of a running job (its quiet spells, a port in use): `fresh`
    /// for a job that has just started (its whole output is scanned), else for one a
    /// restarted daemon takes back.
    pub(crate) fn watch_job(self: &Arc<Self>, row: i64, fresh: bool) {
        tokio::spawn(self.clone().job_watcher(row, fresh));
    }

    async fn job_watcher(self: Arc<Self>, row: i64, fresh: bool) {
        let record = match self.lock().store.get(row) {
            Ok(Some(record)) => record,
            _ => return,
        };
        if record.kind == Kind::Monitor || record.job_dir.is_empty() {
            return;
        }
        let mut watch = JobWatch::new(&record, self.config.log_head, fresh);
        // Far past its usual time (from the run history), one notice says so.
        let mut overrun = self.overrun_at(&record).and_then(|(at_ms, expectation)| {
            let left = at_ms.saturating_sub(crate::paths::now_ms()).max(0) as u64;
            let at = Instant::now().checked_add(Duration::from_millis(left))?;
            Some((at, expectation))
        });
        // Its own watch needs no haste: its supervisor reports at the relaxed pace
        // unless someone else waits on the output.
        let mut output = self.watch_output(&[row], crate::daemon::Pace::Relaxed);
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
            let record = match self.lock().store.get(row) {
                Ok(Some(record)) => record,
                _ => return,
            };
            let ended = record.state == State::Ended;
            if taken_back && !ended && deadline.is_some_and(|at| Instant::now() >= at) {
                // The spell passed while the daemon was down: it is told even when the
                // output resumes now.
                self.quiet_spell(&mut watch, &record).await;
            }
            if !ended
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

    /// A quiet spell passed its `--quiet-after`: its notice, once.
    async fn quiet_spell(&self, watch: &mut JobWatch, record: &Record) {
        if crate::daemon::restart_policy::waiting(record) {
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
    async fn waiting_prompt(&self, record: &Record) -> Option<String> {
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

    /// A line of `record`'s output says a port is in use: one notice (per job) naming
    /// who holds it.
    async fn port_in_use(&self, record: &Record, line: String) {
        let key = format!("addrinuse:{}", record.row);
        let twins = self
            .lock()
            .store
            .list_every_session(false)
            .unwrap_or_default();
        let own = record.row;
        let command = record.command.clone();
        let holder = tokio::task::spawn_blocking(move || {
            let ports = ports_in(&line).unwrap_or_else(|| {
                let ports = listened_ports_in(&command).into_iter();
                ports.map(|port| Named { port, on: None }).collect()
            });
            let found = ports
                .iter()
                .find_map(|named| holder_of(named, own, &twins).map(|h| (named.port, h)));
            let ports: Vec<u16> = ports.iter().map(|named| named.port).collect();
            (line, ports, found)
        })
        .await;
        let Ok((line, ports, found)) = holder else {
            return;
        };
        let text = match (found, ports.first()) {
            (Some((port, holder)), _) => {
                format!("{}: port {port} is already in use, held by {holder}", record.id)
            }
            (None, Some(port)) => format!(
                "{}: port {port} is already in use (nothing listens on it now: it may be free again)",
                record.id
            ),
            (None, None) => format!(
                "{}: an address is already in use (its output names no port bgwork could find)",
                record.id
            ),
        };
        let added = self
            .lock()
            .store
            .add_event_notice(record.row, &key, &text, &line);
        match added {
            Ok(true) => self.records_changed(),
            Ok(false) => {}
            Err(e) => crate::note!("bgwork daemon: could not record a port notice: {e}"),
        }
    }

    /// The addresses item `record`'s processes listen on now.
    pub(crate) async fn listening_of(&self, record: &Record) -> Vec<String> {
        if !observable(record) {
            return Vec::new();
        }
        let dir = PathBuf::from(&record.job_dir);
        tokio::task::spawn_blocking(move || {
            observe_dirs(&[dir], true)
                .pop()
                .flatten()
                .map(|seen| seen.listening)
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default()
    }

    /// CPU time and memory of every running item's processes together.
    pub(crate) async fn running_totals(&self, records: &[Record]) -> (u64, u64) {
        let dirs: Vec<PathBuf> = records
            .iter()
            .filter(|r| observable(r))
            .map(|r| PathBuf::from(&r.job_dir))
            .collect();
        let seen = tokio::task::spawn_blocking(move || observe_dirs(&dirs, false))
            .await
            .unwrap_or_default();
        seen.iter().flatten().fold((0, 0), |(cpu, rss), s| {
            (cpu + s.usage.cpu_ms, rss + s.usage.rss_bytes)
        })
    }
}

/// What makes a running item the twin of a new start: its session, kind, command and
/// folder, and the whole environment it was given (the caller's and `--env`), compared
/// by the salted digest in its `job.json`.
pub(crate) struct Twin<'a> {
    pub kind: Kind,
    pub command: &'a str,
    pub cwd: &'a str,
    pub env_names: Vec<String>,
    /// The environment the new job would be given (see `start::job_env`): another
    /// value (`PORT=3001`, from `--env` or the caller) is another server.
    pub env: (std::collections::BTreeMap<String, String>, Vec<[String; 2]>),
}

impl Twin<'_> {
    /// What the record says (the environment is [`Twin::same_env`]'s, off the lock).
    fn matches(&self, session: &str, record: &Record) -> bool {
        record.session == session
            && record.kind == self.kind
            && matches!(record.state, State::Running | State::Starting)
            && record.command == self.command
            && record.cwd == self.cwd
            && record.env_names == self.env_names
    }

    /// Whether the job in `job_dir` was given this environment (a job described
    /// without a digest is never a twin: starting a second copy harms less than
    /// refusing another server).
    fn same_env(&self, job_dir: &Path) -> bool {
        use std::io::Read;
        let path = crate::job_dir::JobDir(job_dir).record();
        let mut text = Vec::new();
        let read = crate::paths::open_untrusted(&path)
            .and_then(|file| file.take(1 << 20).read_to_end(&mut text));
        read.ok()
            .and_then(|_| {
                crate::wire::control::decode::<crate::wire::control::JobRecord>(&text).ok()
            })
            .and_then(|described| described.env_digest)
            .is_some_and(|digest| crate::environ::digest_matches(&digest, &self.env.0, &self.env.1))
    }
}

/// What a watcher knows of its job between wakes.
struct JobWatch {
    log: PathBuf,
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

    /// Whether the log is longer than last seen.
    fn log_grew(&self) -> bool {
        output::log_len(&self.log) > self.len
    }

    /// Output came: a new quiet spell begins, and the new bytes are scanned.
    async fn output_came(&mut self, daemon: &Daemon, record: &Record) {
        let len = output::log_len(&self.log);
        if len <= self.len {
            return;
        }
        self.len = len;
        // The spell began when the output was written, not when its report came (a
        // job nobody waits on reports once a second).
        self.last_output = last_change(&self.log);
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
        let (log, head) = (self.log.clone(), self.head);
        let mut partial = std::mem::take(&mut self.partial);
        let found = crate::daemon::scan::read_off_lock(len - from, move || {
            let (bytes, _) = output::read_range(&log, from, len, head, dropped);
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
fn last_change(log: &Path) -> Instant {
    let now = Instant::now();
    let age = std::fs::metadata(log)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|at| at.elapsed().ok())
        .unwrap_or_default();
    now.checked_sub(age).unwrap_or(now)
}

fn observable(record: &Record) -> bool {
    record.state != State::Ended && record.kind != Kind::Monitor && !record.job_dir.is_empty()
}

fn apply(item: &mut Item, seen: &Observed) {
    item.cost = live(seen);
}

/// What a running item's processes use and listen on now (no peak yet).
fn live(seen: &Observed) -> crate::wire::Cost {
    crate::wire::Cost {
        cpu_ms: Some(seen.usage.cpu_ms),
        rss_bytes: Some(seen.usage.rss_bytes),
        peak_rss_bytes: None,
        listening: seen.listening.clone(),
    }
}

/// What each job folder's processes use and listen on (none for a job whose
/// supervisor is gone).
pub(crate) fn observe_dirs(dirs: &[PathBuf], ports: bool) -> Vec<Option<Observed>> {
    let pids: Vec<Option<Vec<i32>>> = dirs
        .iter()
        .map(|dir| {
            crate::supervisor::tree::supervisor_of(dir).map(crate::supervisor::tree::descendants)
        })
        .collect();
    let known: Vec<Vec<i32>> = pids.iter().flatten().cloned().collect();
    let mut seen = observe::observe_jobs(&known, ports).into_iter();
    pids.iter()
        .map(|p| p.as_ref().and_then(|_| seen.next()))
        .collect()
}

/// The item's live figures in a `read` reply.
pub(crate) fn observe_read(reply: &mut crate::wire::ReadReply, job_dir: &Path, ports: bool) {
    if let Some(Some(seen)) = observe_dirs(&[job_dir.to_path_buf()], ports).pop() {
        reply.cost = live(&seen);
    }
}

fn cpu_of(job_dir: &Path) -> u64 {
    observe::usage(&crate::supervisor::tree::job_pids(job_dir)).cpu_ms
}

/// The first line of `bytes` that says an address is in use, as a reader is shown it
/// (the phrase is looked for in that text, like every matcher: see
/// `scan::reader_text`).
fn in_use_line(bytes: &[u8]) -> Option<String> {
    static PATTERN: OnceLock<regex::bytes::Regex> = OnceLock::new();
    let pattern = PATTERN.get_or_init(|| {
        regex::bytes::Regex::new(r"(?i)EADDRINUSE|address already in use").expect("a valid pattern")
    });
    // Plain text that does not hold the phrase cannot show it (masking adds none).
    if !crate::rendered::maybe_controls(bytes, true) && !pattern.is_match(bytes) {
        return None;
    }
    let mut in_key = false;
    let mut lines = bytes.split(|&b| b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let edge = match lines.peek() {
            Some(_) => crate::daemon::scan::Edge::Whole,
            None => crate::daemon::scan::Edge::Open,
        };
        let text = crate::daemon::scan::reader_text(line, edge, in_key);
        in_key = crate::redact::private_key_open_after(line, in_key);
        match text {
            Some(text) if pattern.is_match(text.as_bytes()) => {
                return Some(text.chars().take(500).collect());
            }
            _ => {}
        }
    }
    None
}

/// A port a line names, with the address it names it on (none: any address, as in
/// `:8080` or `port 5173`).
#[derive(Debug, Clone, PartialEq)]
struct Named {
    port: u16,
    /// The addresses meant (`localhost` means both loopbacks).
    on: Option<Vec<std::net::IpAddr>>,
}

/// Ports a line names (`127.0.0.1:3000`, `[::1]:3000`, `:::3000`, `:8080`, `port
/// 3000`), the last first. A number after a colon counts only when what comes before
/// the colon is an address, a host name or nothing: `07:15:29,411` is a time of day.
fn ports_in(line: &str) -> Option<Vec<Named>> {
    static WORDS: OnceLock<Regex> = OnceLock::new();
    static COLON: OnceLock<Regex> = OnceLock::new();
    let words = WORDS
        .get_or_init(|| Regex::new(r"(?i)\bport\s*:?\s*(\d{1,5})\b").expect("a valid pattern"));
    let colon = COLON.get_or_init(|| {
        Regex::new(r"([0-9A-Za-z.:\[\]*_-]*):(\d{1,5})\b").expect("a valid pattern")
    });
    let mut found: Vec<(usize, Named)> = Vec::new();
    for c in words.captures_iter(line) {
        if let Some(port) = c.get(1).and_then(|p| p.as_str().parse().ok()) {
            found.push((c.get(0).map_or(0, |m| m.start()), Named { port, on: None }));
        }
    }
    for c in colon.captures_iter(line) {
        let (Some(before), Some(port)) = (c.get(1), c.get(2)) else {
            continue;
        };
        // A number followed by `.`, `,` or `:` and a digit is a time or a figure.
        let after = &line[port.end()..];
        let mut rest = after.chars();
        if matches!((rest.next(), rest.next()), (Some('.' | ',' | ':'), Some(d)) if d.is_ascii_digit())
        {
            continue;
        }
        let Ok(port) = port.as_str().parse::<u16>() else {
            continue;
        };
        if let Some(on) = address_before(before.as_str()) {
            found.push((before.start(), Named { port, on }));
        }
    }
    found.retain(|(_, named)| named.port > 0);
    found.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    let ports: Vec<Named> = found.into_iter().map(|(_, named)| named).collect();
    (!ports.is_empty()).then_some(ports)
}

/// What the text before a `:PORT` names: `Some(None)` any address (nothing, `*`, a host
/// name), `Some(Some(addresses))` an address, `None` no address at all (`07:15`).
fn address_before(text: &str) -> Option<Option<Vec<std::net::IpAddr>>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let text = text.trim_start_matches(['(', '\'', '"']);
    if text.is_empty() || text == "*" {
        return Some(None);
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| Some(vec![IpAddr::V6(ip)]));
    }
    // Node's `:::3000`: the address `::` before the port's colon.
    if text == "::" || text == ":" {
        return Some(Some(vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)]));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(Some(vec![ip]));
    }
    if text.eq_ignore_ascii_case("localhost") {
        return Some(Some(vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ]));
    }
    // A host name has a letter and no colon; digits alone (`07`) or a time are none.
    let host = !text.contains(':') && text.chars().any(|c| c.is_ascii_alphabetic());
    host.then_some(None)
}

/// Whether a bind to `named` fails because of a socket listening on `listening`: the
/// same address, or a wildcard on either side (IPv6's `::` takes IPv4 too).
fn conflicts(named: &Named, listening: std::net::SocketAddr) -> bool {
    use std::net::IpAddr;
    if listening.port() != named.port {
        return false;
    }
    let Some(on) = &named.on else {
        return true;
    };
    let plain = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let held = plain(listening.ip());
    on.iter().any(|&ip| {
        let ip = plain(ip);
        ip == held
            || (held.is_unspecified() && (held.is_ipv6() || ip.is_ipv4()))
            || (ip.is_unspecified() && (ip.is_ipv6() || held.is_ipv4()))
    })
}

/// Numbers in a command that some process listens on (`http.server 8000`), for an
/// error line that names no port.
fn listened_ports_in(command: &str) -> Vec<u16> {
    let listening: std::collections::HashSet<u16> = observe::listeners()
        .iter()
        .map(|l| l.address.port())
        .collect();
    command
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u16>().ok())
        .filter(|p| listening.contains(p))
        .collect()
}

/// Who listens where a bind to `named` fails: an item of this daemon (any session; not `own`), else a pid
/// and its name, else the uid of a process bgwork cannot look into.
fn holder_of(named: &Named, own: i64, running: &[Record]) -> Option<String> {
    let listeners: Vec<observe::Listener> = observe::listeners()
        .into_iter()
        .filter(|l| conflicts(named, l.address))
        .collect();
    let first = listeners.first()?;
    let inodes: std::collections::HashSet<u64> = listeners.iter().map(|l| l.inode).collect();
    // The job's own processes first (a second bind of its own), then other items.
    let own_first = running
        .iter()
        .filter(|r| r.row == own)
        .chain(running.iter().filter(|r| r.row != own && observable(r)));
    for record in own_first {
        let pids = crate::supervisor::tree::job_pids(Path::new(&record.job_dir));
        let holder = pids.iter().find(|&&pid| {
            observe::socket_inodes(pid)
                .iter()
                .any(|i| inodes.contains(i))
        });
        match holder {
            Some(pid) if record.row == own => {
                return Some(format!("its own process {pid} (it binds the port twice)"))
            }
            Some(_) => {
                return Some(format!(
                    "{} of session {} (`{}`)",
                    record.id,
                    record.session,
                    // Another session's command may hold a token its agent wrote.
                    short(&crate::redact::mask_shapes(record.command.clone()))
                ));
            }
            None => {}
        }
    }
    if let Some(pid) = observe::pid_holding(&inodes) {
        if pid == std::process::id() as i32 {
            return Some(format!("this bgwork daemon (pid {pid})"));
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        return Some(format!(
            "pid {pid} ({}), which is not bgwork work",
            name.trim()
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    Some(match first.uid == me {
        true => format!("a process bgwork cannot see ({})", first.address),
        false => format!(
            "a process of another user (uid {}, {})",
            first.uid, first.address
        ),
    })
}

fn short(command: &str) -> String {
    let mut text: String = command.chars().take(60).collect();
    if text.len() < command.len() {
        text.push('…');
    }
    text
}

/// Whether the last line of a screen looks like a prompt: it ends in `>`, `$`, `?`,
/// `:` or `#` (the space after it is gone once trailing blanks are trimmed), or in a
/// choice such as `[y/N]`.
fn looks_like_prompt(line: &str) -> bool {
    let line = line.trim_end();
    line.ends_with(['>', '$', '?', ':', '#']) || line.ends_with(']') && line.contains('/')
}

/// Whether the processes in the foreground of `pid`'s terminal all sleep, and, where
/// the kernel names what they wait in, one of them waits for input (a read of the
/// terminal, or `poll`/`select` on it as readline and REPLs do; not a timer).
fn foreground_reads(pid: i32, tree: &[i32]) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_named_by_error_lines() {
        let first = |line: &str| ports_in(line).map(|p| p[0].port);
        let node = "Error: listen EADDRINUSE: address already in use :::3000";
        assert_eq!(first(node), Some(3000));
        let go = "listen tcp 127.0.0.1:8080: bind: address already in use";
        assert_eq!(first(go), Some(8080));
        assert_eq!(
            first("listen tcp :8080: bind: address already in use"),
            Some(8080)
        );
        let words = "OSError: [Errno 98] Address already in use (port 5173)";
        assert_eq!(first(words), Some(5173));
        assert_eq!(ports_in("OSError: [Errno 98] Address already in use"), None);
        let logged = "07:15:29,411 ERROR [Errno 98] Address already in use";
        assert_eq!(ports_in(logged), None);
        let both = "2026-12-01 07:15:29.411 bind [::1]:18960 failed: address already in use";
        let named = ports_in(both).unwrap();
        assert_eq!(named.len(), 1, "{named:?}");
        let v6: std::net::SocketAddr = "[::1]:18960".parse().unwrap();
        let v4: std::net::SocketAddr = "127.0.0.1:18960".parse().unwrap();
        let any: std::net::SocketAddr = "0.0.0.0:18960".parse().unwrap();
        assert!(conflicts(&named[0], v6) && !conflicts(&named[0], v4));
        let loopback4 = &ports_in("bind 127.0.0.1:18960: in use").unwrap()[0];
        assert!(conflicts(loopback4, v4) && conflicts(loopback4, any) && !conflicts(loopback4, v6));
        assert!(conflicts(&first_named("localhost:18960"), v6));
        assert!(in_use_line(b"ok\nlisten EADDRINUSE :::3000\nmore")
            .is_some_and(|l| l == "listen EADDRINUSE :::3000"));
    }

    fn first_named(line: &str) -> Named {
        ports_in(line).unwrap().remove(0)
    }

    #[test]
    fn prompts() {
        assert!(looks_like_prompt("Continue? "));
        assert!(looks_like_prompt("Password:"));
        assert!(looks_like_prompt(">>> "));
        assert!(looks_like_prompt("Overwrite [y/N]"));
        assert!(!looks_like_prompt("Compiling foo v0.1.0"));
    }
}
