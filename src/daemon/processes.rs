//! What the daemon learns from running jobs' processes (see [`crate::observe`]): their
//! CPU time, memory and listening ports for `list`, `read`, `start` and `status`, read
//! from `/proc` when a client asks, on a blocking thread, never under the lock; and a
//! `start` that repeats a running command, answered with its running twin (`Twin`).
//! Each running job's own watcher (quiet spells, a port in use) is `job_watch.rs`.

use crate::daemon::Daemon;
use crate::observe::{self, Observed};
use crate::store::Record;
use crate::wire::{Item, Kind, State};
use std::path::{Path, PathBuf};

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
                record.restarting() || seen.as_ref().is_some_and(|s| !s.listening.is_empty())
            })
            .map(|(record, _)| record.row)
            .collect()
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

pub(super) fn observable(record: &Record) -> bool {
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

pub(super) fn cpu_of(job_dir: &Path) -> u64 {
    observe::usage(&crate::supervisor::tree::job_pids(job_dir)).cpu_ms
}
