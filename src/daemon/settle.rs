//! Applying what executors report, settling ends (with their notices), and reconciling
//! every unsettled record when the daemon starts (SPEC §7).

use super::report::Report;
use super::{Daemon, Live};
use crate::end;
use crate::executor::{ExecEvent, Reattach};
use crate::output;
use crate::paths::now_ms;
use crate::store::{NewNotice, Record, Settlement};
use crate::wire::control::ExitStatus;
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
    fn settle_or_retry(self: &Arc<Self>, row: i64, end: Ending) {
        if self.settle_ending(row, &end) {
            return;
        }
        let daemon = self.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                tokio::time::sleep(delay).await;
                if daemon.settle_ending(row, &end) {
                    crate::note!("bgwork daemon: an end that could not be recorded earlier is now");
                    return;
                }
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        });
    }

    fn settle_ending(&self, row: i64, end: &Ending) -> bool {
        match end {
            Ending::Status(status) => self.settle_status(row, status),
            Ending::Lost(reason) => self.settle_lost(row, reason),
        }
    }

    fn apply(self: &Arc<Self>, event: ExecEvent) {
        match event {
            ExecEvent::Spawned { row, pid } => {
                if let Err(e) = self.lock().store.set_running(row, pid) {
                    crate::note!("bgwork daemon: could not record a start: {e}");
                }
                self.bump();
            }
            ExecEvent::SpawnFailed { row, message } => {
                let status = ExitStatus {
                    protocol: crate::wire::control::PROTOCOL,
                    spawn_error: Some(message),
                    ended_at_ms: now_ms(),
                    ..ExitStatus::default()
                };
                self.settle_or_retry(row, Ending::Status(status));
            }
            ExecEvent::Output { row, dropped, .. } => {
                if let Some(live) = self.lock().live.get_mut(&row) {
                    live.dropped = dropped;
                }
                self.bump();
            }
            ExecEvent::InputClosed { row } => {
                if let Some(live) = self.lock().live.get_mut(&row) {
                    live.input_closed = true;
                }
            }
            ExecEvent::Ended { row, status } => self.settle_or_retry(row, Ending::Status(status)),
            ExecEvent::Detached { row } => {
                let record = match self.lock().store.get(row) {
                    Ok(Some(record)) if record.state != State::Ended => record,
                    _ => return,
                };
                match crate::supervisor::read_status(Path::new(&record.job_dir)) {
                    Some(Ok(status)) => self.settle_or_retry(row, Ending::Status(status)),
                    Some(Err(reason)) => self.lose(&record, &reason),
                    None => self.lose(&record, "its supervisor died before the job ended"),
                }
            }
        }
    }

    /// Records the end a supervisor reported, with its notice if one was armed. False
    /// when the store could not take it.
    pub(crate) fn settle_status(&self, row: i64, status: &ExitStatus) -> bool {
        self.record_end(row, |record, path| {
            let end = end::classify(status, record.kind == crate::wire::Kind::Pane);
            let (code, signal, dropped) = (status.exit_code, status.signal, status.dropped);
            Settlement {
                end,
                exit_code: code,
                signal,
                ended_at: status.ended_at_ms,
                log_len: status.log_len,
                dropped,
                lost_reason: status.spawn_error.clone(),
                pid: status.pid,
                notice: self.armed_notice(record, end, code, signal, path, dropped),
            }
        })
    }

    /// Settles a record whose end cannot be known: `lost`, with no exit code. False
    /// when the store could not take it.
    pub(crate) fn settle_lost(&self, row: i64, reason: &str) -> bool {
        self.record_end(row, |record, path| Settlement {
            end: End::Lost,
            exit_code: None,
            signal: None,
            ended_at: now_ms(),
            log_len: output::log_len(path),
            dropped: record.dropped,
            lost_reason: Some(reason.to_string()),
            pid: None,
            notice: self.armed_notice(record, End::Lost, None, None, path, record.dropped),
        })
    }

    /// Writes the settlement `settle` makes of a record (with its log's path), drops the
    /// record from the registry and wakes waiters. False when the store refused it.
    fn record_end(&self, row: i64, settle: impl FnOnce(&Record, &Path) -> Settlement) -> bool {
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
            inner.live.remove(&row);
            Ok::<(), crate::store::StoreError>(())
        })();
        self.bump();
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
        let killed = crate::supervisor::tree::sweep_job(&job_key(record));
        if killed > 0 {
            crate::note!(
                "bgwork daemon: {} lost; killed {killed} leftover process(es)",
                record.id
            );
        }
        self.settle_or_retry(record.row, Ending::Lost(reason.to_string()));
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
        for record in unsettled.into_iter().filter(|r| r.kind != Kind::Monitor) {
            if record.job_dir.is_empty() {
                let reason = "the daemon stopped while starting it".to_string();
                self.settle_or_retry(record.row, Ending::Lost(reason));
                lost += 1;
                continue;
            }
            let daemon = self.clone();
            pending.spawn(async move {
                let job_dir = Path::new(&record.job_dir).to_path_buf();
                let found = daemon.executor.reattach(record.row, &job_dir).await;
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
                    if let Err(e) = inner.store.set_running(record.row, running.pid) {
                        crate::note!("bgwork daemon: {e}");
                    }
                    inner.live.insert(
                        record.row,
                        Live {
                            handle: running.handle,
                            dropped: running.dropped,
                            input_closed: false,
                        },
                    );
                    attached += 1;
                }
                Reattach::Ended(status) => {
                    self.settle_or_retry(record.row, Ending::Status(status));
                    settled += 1;
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

/// The report file in a sub-agent's folder.
pub(crate) const REPORT_FILE: &str = "report";

/// An end to record: a supervisor's status, or `lost` with its reason.
enum Ending {
    Status(ExitStatus),
    Lost(String),
}

/// The key a job's processes carry in `BGWORK_JOB`: its folder, unique on the machine.
pub(crate) fn job_key(record: &Record) -> String {
    record.job_dir.clone()
}
