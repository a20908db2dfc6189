//! Applying what executors report, settling ends (with their notices), and reconciling
//! every unsettled record when the daemon starts (SPEC §7).

use super::{Daemon, Live};
use crate::end;
use crate::executor::{ExecEvent, Reattach};
use crate::output;
use crate::paths::now_ms;
use crate::store::{NewNotice, Record, Settlement};
use crate::wire::control::ExitStatus;
use crate::wire::{End, State};
use std::path::Path;
use std::sync::Arc;
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

    fn apply(&self, event: ExecEvent) {
        match event {
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
            ExecEvent::Ended { row, status } => self.settle_status(row, &status),
            ExecEvent::Detached { row } => {
                let record = match self.lock().store.get(row) {
                    Ok(Some(record)) if record.state != State::Ended => record,
                    _ => return,
                };
                match crate::supervisor::read_status(Path::new(&record.job_dir)) {
                    Some(Ok(status)) => self.settle_status(row, &status),
                    Some(Err(reason)) => self.lose(&record, &reason),
                    None => self.lose(&record, "its supervisor died before the job ended"),
                }
            }
        }
    }

    /// Records the end a supervisor reported, with its notice if one was armed.
    pub(crate) fn settle_status(&self, row: i64, status: &ExitStatus) {
        let result = (|| {
            let mut inner = self.lock();
            let Some(record) = inner.store.get(row)? else {
                return Ok(());
            };
            let end = end::classify(status);
            let path = output::log_path(&record.job_dir);
            let settlement = Settlement {
                end,
                exit_code: status.exit_code,
                signal: status.signal,
                ended_at: status.ended_at_ms,
                log_len: status.log_len,
                dropped: status.dropped,
                lost_reason: status.spawn_error.clone(),
                notice: self.armed_notice(
                    &record,
                    end,
                    status.exit_code,
                    status.signal,
                    &path,
                    status.dropped,
                ),
            };
            inner.store.settle(row, &settlement)?;
            inner.live.remove(&row);
            Ok::<(), crate::store::StoreError>(())
        })();
        if let Err(e) = result {
            eprintln!("bgwork daemon: could not record an end: {e}");
        }
        self.bump();
    }

    /// A job whose supervisor is gone: kill what is left of it, then settle it `lost`.
    fn lose(&self, record: &Record, reason: &str) {
        let killed = crate::supervisor::tree::sweep_job(&job_key(record));
        if killed > 0 {
            eprintln!(
                "bgwork daemon: {} lost; killed {killed} leftover process(es)",
                record.id
            );
        }
        self.settle_lost(record.row, reason);
    }

    /// Settles a record whose end cannot be known: `lost`, with no exit code.
    pub(crate) fn settle_lost(&self, row: i64, reason: &str) {
        let result = (|| {
            let mut inner = self.lock();
            let Some(record) = inner.store.get(row)? else {
                return Ok(());
            };
            let path = output::log_path(&record.job_dir);
            let settlement = Settlement {
                end: End::Lost,
                exit_code: None,
                signal: None,
                ended_at: now_ms(),
                log_len: output::log_len(&path),
                dropped: record.dropped,
                lost_reason: Some(reason.to_string()),
                notice: self.armed_notice(&record, End::Lost, None, None, &path, record.dropped),
            };
            inner.store.settle(row, &settlement)?;
            inner.live.remove(&row);
            Ok::<(), crate::store::StoreError>(())
        })();
        if let Err(e) = result {
            eprintln!("bgwork daemon: could not record a lost item: {e}");
        }
        self.bump();
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
        Some(NewNotice {
            text: end::report(&record.id, end, exit_code, signal),
            tail: output::tail(log, self.config.log_head, dropped),
        })
    }

    /// Finds every record left unsettled by an earlier daemon: reattached when its
    /// supervisor answers, settled from its status file when it ended meanwhile, `lost`
    /// when neither can be known.
    pub(crate) async fn reconcile(&self) {
        let unsettled = match self.lock().store.unsettled() {
            Ok(records) => records,
            Err(e) => {
                eprintln!("bgwork daemon: could not read records to reconcile: {e}");
                return;
            }
        };
        let (mut attached, mut settled, mut lost) = (0, 0, 0);
        for record in unsettled {
            if record.job_dir.is_empty() {
                self.settle_lost(record.row, "the daemon stopped while starting it");
                lost += 1;
                continue;
            }
            match self
                .executor
                .reattach(record.row, Path::new(&record.job_dir))
                .await
            {
                Reattach::Running(running) => {
                    let mut inner = self.lock();
                    if let Err(e) = inner.store.set_running(record.row, running.pid) {
                        eprintln!("bgwork daemon: {e}");
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
                    self.settle_status(record.row, &status);
                    settled += 1;
                }
                Reattach::Lost(reason) => {
                    self.lose(&record, &reason);
                    lost += 1;
                }
            }
        }
        if attached + settled + lost > 0 {
            eprintln!(
                "bgwork daemon: reconciled {attached} reattached, {settled} settled, {lost} lost"
            );
        }
    }
}

/// The key a job's processes carry in `BGWORK_JOB`: its folder, unique on the machine.
pub(crate) fn job_key(record: &Record) -> String {
    record.job_dir.clone()
}
