//! Applying what executors report, settling ends (with their notices), and reconciling
//! every unsettled record when the daemon starts (contract §7).

use crate::daemon::jobs::report::Report;
use crate::daemon::jobs::restart_policy;
use crate::daemon::{Daemon, Live};
use crate::end;
use crate::executor::{ExecEvent, Reattach};
use crate::output;
use crate::paths::now_ms;
use crate::store::{EndRecord, NewNotice, NewRecord, Record};
use crate::wire::control::{self, ExitStatus, JobRecord};
use crate::wire::{End, Kind, State};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

impl Daemon {
    /// Applies executor events until the daemon stops.
    pub(crate) async fn apply_events(
        self: Arc<Self>,
        mut events: mpsc::UnboundedReceiver<ExecEvent>,
    ) {
        while let Some(event) = events.recv().await {
            self.apply(event);
        }
    }

    /// Records an end, or retries it while the store refuses it (a full disk, say),
    /// backing off up to a minute between tries, until it lands.
    fn settle_or_retry(self: &Arc<Self>, row: i64, end: EndEvidence) {
        if self.settle_ending(row, &end) {
            return;
        }
        self.retry_in_background(move |daemon| {
            let landed = daemon.settle_ending(row, &end);
            if landed {
                crate::note!("bgwork daemon: an end that could not be recorded earlier is now");
            }
            landed
        });
    }

    /// Tries `write` again in the background, backing off from 200 ms up to a minute,
    /// until it returns true (a store that refuses writes: a full disk, say).
    fn retry_in_background(
        self: &Arc<Self>,
        mut write: impl FnMut(&Daemon) -> bool + Send + 'static,
    ) {
        let daemon = self.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                tokio::time::sleep(delay).await;
                if write(&daemon) {
                    return;
                }
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        });
    }

    fn settle_ending(&self, row: i64, end: &EndEvidence) -> bool {
        match end {
            EndEvidence::Status(status) => self.settle_status(row, status),
            EndEvidence::Lost(reason) => self.settle_lost(row, reason),
        }
    }

    fn apply(self: &Arc<Self>, event: ExecEvent) {
        match event {
            ExecEvent::Spawned { row, pid } => {
                if let Err(e) = self.lock().store.set_running(row, pid) {
                    // A full disk, say: the start is recorded once the store takes it.
                    crate::note!("bgwork daemon: could not record a start (will retry): {e}");
                    self.retry_in_background(move |daemon| {
                        let recorded = daemon.lock().store.set_running(row, pid).is_ok();
                        if recorded {
                            daemon.records_changed();
                        }
                        recorded
                    });
                }
                self.records_changed();
                // A run its restart policy started again keeps the job's one watcher.
                let again = matches!(
                    self.lock().store.get(row),
                    Ok(Some(record)) if record.restart.as_ref().is_some_and(|r| r.restarts > 0)
                );
                if !again {
                    self.watch_job(row, true);
                }
            }
            ExecEvent::Pid { row, pid } => match self.lock().store.set_running(row, pid) {
                Ok(()) => self.records_changed(),
                Err(e) => crate::note!("bgwork daemon: could not record a pid: {e}"),
            },
            ExecEvent::SpawnFailed { row, message } => {
                let status = ExitStatus {
                    protocol: crate::wire::control::PROTOCOL,
                    spawn_error: Some(message),
                    ended_at_ms: now_ms(),
                    ..ExitStatus::default()
                };
                self.settle_or_retry(row, EndEvidence::Status(status));
            }
            event @ ExecEvent::Output { .. } => self.apply_output(event),
            ExecEvent::InputClosed { row } => {
                if let Some(live) = self.lock().live.get_mut(&row) {
                    live.input_closed = true;
                }
            }
            ExecEvent::Ended { row, status } => {
                self.settle_or_retry(row, EndEvidence::Status(status))
            }
            ExecEvent::RunEnded { row, between } => self.run_ended(row, between),
            ExecEvent::Detached { row } => {
                // The handle is dead; a new one comes with a reconnect.
                self.end_live(&mut self.lock(), row);
                tokio::spawn(self.clone().recover(row));
            }
        }
    }

    /// Output progress: the live item's figures, and a wake of its output's watchers
    /// (called by the task that read it, see [`crate::executor::OutputSink`]).
    pub(crate) fn apply_output(&self, event: ExecEvent) {
        let ExecEvent::Output {
            row,
            dropped,
            unwritten,
            unwritten_at,
            ..
        } = event
        else {
            return;
        };
        if let Some(live) = self.lock().live.get_mut(&row) {
            live.dropped = dropped;
            live.unwritten = unwritten;
            live.unwritten_at = unwritten_at;
        }
        self.output_grew(row);
    }

    /// A supervisor connection closed without an end. A closed connection is no proof
    /// of death: while the supervisor lives it is reconnected to (backing off up to 5 s
    /// between tries); its status file settles the end once it is gone; `lost` only when
    /// it is gone and left no status.
    async fn recover(self: Arc<Self>, row: i64) {
        let mut delay = Duration::from_millis(20);
        let mut said = false;
        loop {
            let record = match self.lock().store.get(row) {
                Ok(Some(record)) if record.state != State::Ended => record,
                _ => return,
            };
            let job_dir = Path::new(&record.job_dir).to_path_buf();
            match self.reattach(row, &job_dir, &owner(&record)).await {
                Reattach::Running(running) => {
                    let mut inner = self.lock();
                    if running.pid > 0 {
                        if let Err(e) = inner.store.set_running(row, running.pid) {
                            crate::note!("bgwork daemon: {e}");
                        }
                    }
                    let between = running.between.clone();
                    self.go_live(&mut inner, row, live(running));
                    drop(inner);
                    if let Some(between) = between {
                        self.run_ended(row, between);
                    }
                    if said {
                        crate::note!("bgwork daemon: {} reconnected to its supervisor", record.id);
                    }
                    self.records_changed();
                    return;
                }
                Reattach::Ended(status) => {
                    self.settle_or_retry(row, EndEvidence::Status(status));
                    return;
                }
                Reattach::Lost(reason) => {
                    if !self.supervisor_alive(&record) {
                        self.lose(&record, &reason);
                        return;
                    }
                }
            }
            if !said {
                said = true;
                crate::note!(
                    "bgwork daemon: the supervisor of {} lives but does not answer; retrying",
                    record.id
                );
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Whether a record's supervisor may still live (then it is not lost yet).
    fn supervisor_alive(&self, record: &Record) -> bool {
        self.executors
            .supervisor_alive(record.row, Path::new(&record.job_dir))
    }

    /// Finds a job again, through the executor that ran it.
    async fn reattach(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        self.executors.reattach(row, job_dir, owner).await
    }

    /// Records the end a supervisor reported, with its notice if one was armed. False
    /// when the store could not take it.
    pub(crate) fn settle_status(&self, row: i64, status: &ExitStatus) -> bool {
        self.record_end(row, |record, path| {
            let end = end::classify(status, record.kind == crate::wire::Kind::Pane);
            let (code, signal, dropped) = (status.exit_code, status.signal, status.dropped);
            EndRecord {
                end,
                exit_code: code,
                signal,
                ended_at: status.ended_at_ms,
                log_len: status.log_len,
                dropped,
                end_detail: status
                    .spawn_error
                    .clone()
                    .or_else(|| stop_detail(status))
                    .or_else(|| status.detail.clone()),
                pid: status.pid,
                unwritten: status.unwritten,
                unwritten_at: status.unwritten_at,
                notice: restart_policy::gave_up(
                    record,
                    end,
                    status,
                    self.armed_notice(record, end, code, signal, path, dropped)
                        .or_else(|| self.limit_notice(record, status, path)),
                    || output::tail(path, self.config.log_head, dropped),
                )
                .map(|notice| notice.with_unwritten(status.unwritten))
                .map(|notice| notice.with_cost(status.cpu_ms, status.peak_rss_bytes)),
                cpu_ms: status.cpu_ms,
                peak_rss: status.peak_rss_bytes,
            }
        })
    }

    /// Settles a record whose end cannot be known: `lost`, with no exit code. False
    /// when the store could not take it.
    pub(crate) fn settle_lost(&self, row: i64, reason: &str) -> bool {
        self.record_end(row, |record, path| EndRecord {
            end: End::Lost,
            exit_code: None,
            signal: None,
            ended_at: now_ms(),
            log_len: output::log_len(path),
            dropped: record.dropped,
            end_detail: Some(reason.to_string()),
            pid: None,
            unwritten: record.unwritten,
            unwritten_at: record.unwritten_at,
            notice: self
                .armed_notice(record, End::Lost, None, None, path, record.dropped)
                .map(|notice| notice.with_unwritten(record.unwritten)),
            cpu_ms: None,
            peak_rss: None,
        })
    }

    /// Writes the settlement `settle` makes of a record (with its log's path), drops the
    /// record from the registry and wakes waiters. False when the store refused it.
    fn record_end(&self, row: i64, settle: impl FnOnce(&Record, &Path) -> EndRecord) -> bool {
        // A sub-agent's report is a file the sub-agent controls: read it before taking
        // the lock, so that no such file can hold up the daemon.
        let report = self.report_of(row);
        let result = (|| {
            let mut inner = self.lock();
            let Some(record) = inner.store.get(row)? else {
                return Ok(());
            };
            let mut settlement = settle(&record, &output::log_path(&record.job_dir));
            if let Some(notice) = settlement.notice.as_mut() {
                report.apply(&mut notice.tail);
            }
            inner.store.settle(row, &settlement)?;
            self.end_live(&mut inner, row);
            inner.screens.forget(row);
            Ok::<(), crate::store::StoreError>(())
        })();
        self.records_changed();
        // The job's watcher (see `observe.rs`) listens to its output only: the end
        // wakes it too, to look at the last output and go.
        self.output_grew(row);
        match result {
            Ok(()) => true,
            Err(e) => {
                crate::note!("bgwork daemon: could not record an end (will retry): {e}");
                false
            }
        }
    }

    /// The report of a sub-agent that has not ended yet and whose notice is armed.
    fn report_of(&self, row: i64) -> Report {
        let record = match self.lock().store.get(row) {
            Ok(Some(record)) => record,
            _ => return Report::Absent,
        };
        if record.kind != Kind::SubAgent || record.state == State::Ended || !record.notify {
            return Report::Absent;
        }
        Report::read(Path::new(&record.job_dir))
    }

    /// A job whose supervisor is gone: kill what is left of it, then settle it `lost`.
    fn lose(self: &Arc<Self>, record: &Record, reason: &str) {
        let killed = self
            .executors
            .sweep(record.row, &job_key(record), Path::new(&record.job_dir));
        if killed > 0 {
            crate::note!(
                "bgwork daemon: {} lost; killed {killed} leftover process(es)",
                record.id
            );
        }
        self.settle_or_retry(record.row, EndEvidence::Lost(reason.to_string()));
    }

    /// The notice an end fires: only when armed, and never for a stop the agent asked
    /// for (its reply already said it). A person's stop does notify the agent.
    fn armed_notice(
        &self,
        record: &Record,
        end: End,
        exit_code: Option<i32>,
        signal: Option<i32>,
        log: &Path,
        dropped: u64,
    ) -> Option<NewNotice> {
        if !record.notify || end == End::StoppedByAgent {
            return None;
        }
        // A sub-agent's report replaces this tail (see `record_end`).
        let tail = output::tail(log, self.config.log_head, dropped);
        Some(NewNotice {
            text: end::report(&record.id, end, exit_code, signal),
            tail,
        })
    }

    /// The notice of a job stopped for running past `--max-runtime` (when armed): the
    /// agent did not ask for that stop, so, unlike its own stops, it is told.
    fn limit_notice(&self, record: &Record, status: &ExitStatus, log: &Path) -> Option<NewNotice> {
        let limit = status.past_limit_ms?;
        if !record.notify {
            return None;
        }
        let detail = stop_detail(status).unwrap_or_else(|| format!("{PAST_LIMIT} ({limit} ms)"));
        Some(NewNotice {
            text: format!("{} was stopped by the agent: {detail}", record.id),
            tail: output::tail(log, self.config.log_head, status.dropped),
        })
    }

    /// Takes back the job folders the database does not know (it was lost, or
    /// replaced): each becomes its record again, with its own id, and reconciling then
    /// reattaches it or settles it. One that had ended already fires no notice: whether
    /// it was delivered before the loss cannot be known, and a notice is never doubled.
    pub(crate) fn adopt_orphans(&self) {
        let mut taken = Vec::new();
        for (row, dir) in self.paths.job_folders() {
            let is_folder = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
            if !is_folder || row >= crate::job_dir::MAX_JOB_FOLDER {
                continue;
            }
            let known = self.lock().store.has_row(row);
            if !matches!(known, Ok(false)) {
                continue;
            }
            let description =
                crate::paths::read_untrusted(&crate::job_dir::JobDir(&dir).record(), 1 << 20)
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| control::decode::<JobRecord>(&bytes));
            let description = match description {
                Ok(description) => description,
                Err(e) => {
                    crate::note!(
                        "bgwork daemon: {} is no job this database knows, and has no readable job.json ({e}): left as it is",
                        dir.display()
                    );
                    continue;
                }
            };
            if description.kind == Kind::Monitor {
                // Monitors have no folder: this one was not made by bgwork.
                continue;
            }
            let ended = crate::job_dir::JobDir(&dir).status().exists();
            let record = NewRecord {
                session: description.session,
                kind: description.kind,
                name: description.name,
                command: description.command,
                cwd: description.cwd,
                notify: description.notify && !ended,
                env_names: description.env_names,
                started_at: description.started_at,
                cols: description.cols,
                rows: description.rows,
            };
            let dir_text = dir.display().to_string();
            match self
                .lock()
                .store
                .adopt(row, &record, &description.id, &dir_text)
            {
                Ok(true) => {
                    if let Some(rule) = description.restart.filter(|_| !ended) {
                        let (min, max) = (rule.backoff_min_ms, rule.backoff_max_ms);
                        let policy = self.lock().store.set_restart_policy(
                            row,
                            rule.max_restarts,
                            min,
                            max.max(min),
                        );
                        if let Err(e) = policy {
                            crate::note!("bgwork daemon: {}: its restart policy: {e}", dir.display());
                        }
                    }
                    taken.push(format!("{} ({})", description.id, record.session))
                }
                Ok(false) => crate::note!(
                    "bgwork daemon: {} names {} of {}, which the database already holds: left as it is",
                    dir.display(),
                    description.id,
                    record.session
                ),
                Err(e) => crate::note!("bgwork daemon: could not take back {}: {e}", dir.display()),
            }
        }
        if !taken.is_empty() {
            crate::note!(
                "bgwork daemon: the database did not know {}; took them back: {}",
                crate::history::plural(taken.len(), "job folder"),
                taken.join(", ")
            );
        }
    }

    /// Finds every record left unsettled by an earlier daemon: reattached when its
    /// supervisor answers, settled from its status file when it ended meanwhile, `lost`
    /// when neither can be known.
    pub(crate) async fn reconcile(self: &Arc<Self>) {
        let unsettled = match self.lock().store.unsettled() {
            Ok(records) => records,
            Err(e) => {
                crate::note!("bgwork daemon: could not read records to reconcile: {e}");
                return;
            }
        };
        let (mut attached, mut settled, mut lost) = (0, 0, 0);
        // Every job is looked for at once: one slow supervisor delays no other.
        let mut pending = tokio::task::JoinSet::new();
        for record in unsettled
            .into_iter()
            .filter(|r| r.kind != Kind::Monitor && r.state != State::Waiting)
        {
            if record.job_dir.is_empty() {
                let reason = "the daemon stopped while starting it".to_string();
                self.settle_or_retry(record.row, EndEvidence::Lost(reason));
                lost += 1;
                continue;
            }
            let daemon = self.clone();
            pending.spawn(async move {
                let job_dir = Path::new(&record.job_dir).to_path_buf();
                let found = daemon.reattach(record.row, &job_dir, &owner(&record)).await;
                (record, found)
            });
        }
        while let Some(joined) = pending.join_next().await {
            let Ok((record, found)) = joined else {
                continue;
            };
            match found {
                Reattach::Running(running) => {
                    let mut inner = self.lock();
                    // A job still in a cluster's queue has no process yet (pid 0).
                    if running.pid > 0 {
                        if let Err(e) = inner.store.set_running(record.row, running.pid) {
                            crate::note!("bgwork daemon: {e}");
                        }
                    }
                    let between = running.between.clone();
                    self.go_live(&mut inner, record.row, live(running));
                    drop(inner);
                    self.watch_job(record.row, false);
                    if let Some(between) = between {
                        // It waits to start again: its policy goes on from its record.
                        self.run_ended(record.row, between);
                    }
                    attached += 1;
                }
                Reattach::Ended(status) => {
                    self.settle_or_retry(record.row, EndEvidence::Status(status));
                    settled += 1;
                }
                Reattach::Lost(_) if self.supervisor_alive(&record) => {
                    // Alive but not answering (stopped, or slow): not lost.
                    tokio::spawn(self.clone().recover(record.row));
                    attached += 1;
                }
                Reattach::Lost(reason) => {
                    self.lose(&record, &reason);
                    lost += 1;
                }
            }
        }
        if attached + settled + lost > 0 {
            crate::note!(
                "bgwork daemon: reconciled {attached} reattached, {settled} settled, {lost} lost"
            );
        }
    }
}

/// What a stop had to do beyond TERM, in the words of the end's report.
fn stop_detail(status: &ExitStatus) -> Option<String> {
    let killed = killed_detail(status);
    let Some(limit) = status.past_limit_ms else {
        return killed;
    };
    let limit = humantime::format_duration(Duration::from_millis(limit));
    let limit = format!("{PAST_LIMIT} (--max-runtime {limit})");
    Some(match killed {
        Some(killed) => format!("{limit}; {killed}"),
        None => limit,
    })
}

/// The detail of a job stopped for running past `--max-runtime`.
pub(crate) const PAST_LIMIT: &str = "ran past its limit";

fn killed_detail(status: &ExitStatus) -> Option<String> {
    let ms = status.killed_after_ms?;
    if ms == 0 {
        return Some("killed at once (a grace of 0 s)".to_string());
    }
    let seconds = ms as f64 / 1000.0;
    Some(format!("did not stop on TERM; killed after {seconds} s"))
}

fn live(running: crate::executor::Running) -> Live {
    Live {
        handle: running.handle,
        dropped: running.dropped,
        input_closed: false,
        unwritten: running.unwritten,
        unwritten_at: running.unwritten_at,
    }
}

/// What an end is settled from (the evidence of it): the status a supervisor wrote, or
/// `lost` with the reason no status will come. The store records it as an
/// [`EndRecord`], classified as a [`crate::wire::End`].
enum EndEvidence {
    Status(ExitStatus),
    Lost(String),
}

/// Who a job's status file must name: its session, id and start time, which no other
/// job of the home shares.
pub(crate) fn owner(record: &Record) -> String {
    format!("{}/{}@{}", record.session, record.id, record.started_at)
}

/// The key a job's processes carry in `BGWORK_JOB`: its folder, unique on the machine.
pub(crate) fn job_key(record: &Record) -> String {
    record.job_dir.clone()
}
