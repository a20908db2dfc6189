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

/// A watcher looks at new output at most this often.
const SCAN_PAUSE: Duration = Duration::from_millis(200);
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
    /// Adds what the processes of running items use and listen on.
    pub(crate) async fn observe_items(&self, items: &mut [Item], records: &[Record]) {
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
        let dirs: Vec<PathBuf> = candidates
            .iter()
            .map(|r| PathBuf::from(&r.job_dir))
            .collect();
        let seen = tokio::task::spawn_blocking(move || observe_dirs(&dirs, true))
            .await
            .unwrap_or_default();
        candidates
            .iter()
            .zip(seen)
            .filter(|(_, seen)| seen.as_ref().is_some_and(|s| !s.listening.is_empty()))
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
        // Its own watch needs no haste: its supervisor reports at the relaxed pace
        // unless someone else waits on the output.
        let mut output = self.watch_output(&[row], crate::daemon::Pace::Relaxed);
        let mut first = true;
        loop {
            let deadline = watch.quiet_deadline();
            let wake = deadline.map_or(ALIVE_CHECK, |at| {
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
            if ended {
                forget_env(row);
            }
            if grew || watch.log_grew() {
                // An ended job's last output is still looked at once.
                watch.output_came(&self, &record).await;
                if ended {
                    return;
                }
                tokio::time::sleep(SCAN_PAUSE).await;
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
        let (since, cpu_then) = watch.spell_cpu;
        let sampled = since.elapsed();
        if sampled < MIN_SPELL_SAMPLE {
            // A spell that began before this daemon: measure its CPU for a moment.
            tokio::time::sleep(MIN_SPELL_SAMPLE - sampled).await;
            let ended = !matches!(self.lock().store.get(record.row), Ok(Some(r)) if r.state != State::Ended);
            if watch.log_grew() || ended {
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
        let waiting =
            tokio::task::spawn_blocking(move || foreground_reads(pid, &observe::job_pids(&dir)))
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
            let ports = ports_in(&line).unwrap_or_else(|| listened_ports_in(&command));
            let found = ports
                .iter()
                .find_map(|&port| holder_of(port, own, &twins).map(|h| (port, h)));
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

/// What makes a running item the twin of a new start.
pub(crate) struct Twin<'a> {
    pub kind: Kind,
    pub command: &'a str,
    pub cwd: &'a str,
    /// The `--env` variables: another value (`PORT=3001`) is another server.
    pub env: &'a std::collections::BTreeMap<String, String>,
}

impl Twin<'_> {
    fn matches(&self, session: &str, record: &Record) -> bool {
        let names: Vec<&String> = self.env.keys().collect();
        let known = env_fingerprint_of(record.row);
        record.session == session
            && record.kind == self.kind
            && record.state == State::Running
            && record.command == self.command
            && record.cwd == self.cwd
            && record.env_names.iter().collect::<Vec<_>>() == names
            && known.is_none_or(|known| known == fingerprint(self.env))
    }
}

/// The fingerprints of the `--env` values of jobs this daemon started (in memory only,
/// with a key of this process: values are never recorded, not even hashed on disk). A
/// job taken back after a restart is compared by the names of its variables alone.
fn env_fingerprints() -> &'static std::sync::Mutex<std::collections::HashMap<i64, u64>> {
    static PRINTS: OnceLock<std::sync::Mutex<std::collections::HashMap<i64, u64>>> =
        OnceLock::new();
    PRINTS.get_or_init(Default::default)
}

fn fingerprint(env: &std::collections::BTreeMap<String, String>) -> u64 {
    use std::hash::BuildHasher;
    static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEY.get_or_init(Default::default).hash_one(env)
}

fn env_fingerprint_of(row: i64) -> Option<u64> {
    let prints = env_fingerprints().lock().unwrap_or_else(|p| p.into_inner());
    prints.get(&row).copied()
}

/// Remembers the `--env` values of a job just started (see [`Twin`]).
pub(crate) fn remember_env(row: i64, env: &std::collections::BTreeMap<String, String>) {
    let mut prints = env_fingerprints().lock().unwrap_or_else(|p| p.into_inner());
    prints.insert(row, fingerprint(env));
}

/// Forgets what [`remember_env`] kept of an ended job.
pub(crate) fn forget_env(row: i64) {
    let mut prints = env_fingerprints().lock().unwrap_or_else(|p| p.into_inner());
    prints.remove(&row);
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
        .map(|dir| observe::supervisor_of(dir).map(crate::supervisor::tree::descendants))
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
    observe::usage(&observe::job_pids(job_dir)).cpu_ms
}

/// The first line of `bytes` that says an address is in use.
fn in_use_line(bytes: &[u8]) -> Option<String> {
    static PATTERN: OnceLock<regex::bytes::Regex> = OnceLock::new();
    let pattern = PATTERN.get_or_init(|| {
        regex::bytes::Regex::new(r"(?i)EADDRINUSE|address already in use").expect("a valid pattern")
    });
    let found = pattern.find(bytes)?;
    let start = bytes[..found.start()]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    let end = bytes[found.end()..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |at| found.end() + at);
    // Token shapes masked before the line is cut, so that no cut leaves a token's
    // first characters too short to be recognised.
    let line = crate::redact::mask_shapes_bytes(&bytes[start..end]);
    let line = String::from_utf8_lossy(&line);
    Some(line.chars().take(500).collect())
}

/// Port numbers a line names (`:3000`, `port 3000`), the last first.
fn ports_in(line: &str) -> Option<Vec<u16>> {
    static PATTERN: OnceLock<Regex> = OnceLock::new();
    let pattern = PATTERN
        .get_or_init(|| Regex::new(r"(?i)(?::|port\s*:?\s*)(\d{1,5})\b").expect("a valid pattern"));
    let mut ports: Vec<u16> = pattern
        .captures_iter(line)
        .filter_map(|c| c.get(1)?.as_str().parse().ok())
        .filter(|&p| p > 0)
        .collect();
    ports.reverse();
    (!ports.is_empty()).then_some(ports)
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

/// Who listens on `port`: an item of this daemon (any session; not `own`), else a pid
/// and its name, else the uid of a process bgwork cannot look into.
fn holder_of(port: u16, own: i64, running: &[Record]) -> Option<String> {
    let listeners: Vec<observe::Listener> = observe::listeners()
        .into_iter()
        .filter(|l| l.address.port() == port)
        .collect();
    let first = listeners.first()?;
    let inodes: std::collections::HashSet<u64> = listeners.iter().map(|l| l.inode).collect();
    // The job's own processes first (a second bind of its own), then other items.
    let own_first = running
        .iter()
        .filter(|r| r.row == own)
        .chain(running.iter().filter(|r| r.row != own && observable(r)));
    for record in own_first {
        let pids = observe::job_pids(Path::new(&record.job_dir));
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
        let node = "Error: listen EADDRINUSE: address already in use :::3000";
        assert_eq!(ports_in(node), Some(vec![3000]));
        let go = "listen tcp 127.0.0.1:8080: bind: address already in use";
        assert_eq!(ports_in(go), Some(vec![8080]));
        let words = "OSError: [Errno 98] Address already in use (port 5173)";
        assert_eq!(ports_in(words), Some(vec![5173]));
        assert_eq!(ports_in("OSError: [Errno 98] Address already in use"), None);
        assert!(in_use_line(b"ok\nlisten EADDRINUSE :::3000\nmore")
            .is_some_and(|l| l == "listen EADDRINUSE :::3000"));
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
