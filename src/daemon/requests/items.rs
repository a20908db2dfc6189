//! Records as clients see them, and the calls over records: list, dismiss, gc, status.

use crate::daemon::{display_id, Daemon, Inner};
use crate::paths::{now_ms, rfc3339};
use crate::store::{sub_session_name, Record};
use crate::wire::{
    Ack, End, ErrorCode, GcReply, Item, Kind, ListReply, SessionReply, State, StatusReply,
    WireError,
};
use std::collections::BTreeMap;
use std::path::Path;

impl Daemon {
    /// The item of a record (with what the registry knows of it while it runs), as its
    /// own session sees it.
    pub(crate) fn item(&self, record: &Record) -> Item {
        self.item_as(&record.session, record)
    }

    /// The item of a record as session `viewer` sees it: a sub-agent's item carries the
    /// id the viewer addresses it by (`sub-1/bg-2`).
    pub(crate) fn item_as(&self, viewer: &str, record: &Record) -> Item {
        let id = display_id(viewer, record);
        let mut report = record.end.map(|end| {
            crate::end::report(&id, end, record.exit_code, record.signal)
                + &crate::end::unwritten_note(record.unwritten)
        });
        let cost = crate::end::cost_note(record.cpu_ms, record.peak_rss);
        let mut detail = record.end_detail.clone();
        let stopped = matches!(record.end, Some(End::StoppedByAgent | End::StoppedByPerson));
        let killed_at_deadline = record.end == Some(End::StoppedByAgent)
            && detail
                .as_deref()
                .is_some_and(|d| d.starts_with(crate::daemon::requests::run::KILLED_AT_DEADLINE));
        if killed_at_deadline {
            // A stop the agent did not ask for by itself says why ("killed at its
            // deadline: …", for a `run`).
            if let Some(detail) = detail.take() {
                report = Some(format!("{id} was {detail}"));
            }
        } else if record.kind == Kind::Monitor || stopped || record.end == Some(End::Signaled) {
            // A monitor's detail says what happened ("matched: …", "timed out …"); a
            // stop's, what it had to do ("did not stop on TERM; killed after 5 s").
            if let (Some(text), Some(detail)) = (report.as_mut(), detail.take()) {
                text.push_str(": ");
                text.push_str(&detail);
            }
        }
        if let (Some(End::SpawnFailed), Some(detail)) = (record.end, &detail) {
            report = Some(format!("{id} could not start: {detail}"));
        }
        if let (Some(End::Cancelled), None, Some(detail)) = (record.end, record.pid, &detail) {
            // A waiting item that never ran (`start --after`) says why it will not.
            report = Some(format!("{id} was cancelled: {detail}"));
        }
        if let (true, Some(End::Lost), Some(detail)) = (record.never_ran(), record.end, &detail) {
            // Lost while it waited (its folder removed): why, not a daemon restart.
            report = Some(format!("{id} was lost: {detail}"));
        }
        let view = self.executors.view(record.row, &record.job_dir);
        if let (true, Some(End::Lost), Some(detail)) = (view.tells_loss(), record.end, &detail) {
            // A job on Slurm is lost for the reason Slurm gave, not a daemon restart.
            report = Some(format!("{id} was lost: {detail}"));
        }
        if let (Some(text), Some(gave_up)) = (
            report.as_mut(),
            crate::daemon::jobs::restart_policy::gave_up_words(record),
        ) {
            text.push_str(&gave_up);
        }
        if let Some(text) = report.as_mut() {
            text.push_str(&cost);
        }
        let running = record.state != State::Ended;
        let restarting = record.restarting();
        let state = match (view.which.queues(), record.state) {
            (_, State::Starting | State::Running) if restarting => State::Restarting,
            (true, State::Starting) => State::Queued,
            (_, state) => state,
        };
        Item {
            id,
            kind: record.kind,
            state,
            end: record.end,
            exit_code: record.exit_code,
            signal: record.signal,
            // Token shapes masked, as in the run history (contract §8).
            name: record.name.clone().map(crate::redact::mask_shapes),
            command: crate::redact::mask_shapes(record.command.clone()),
            cwd: crate::redact::mask_shapes(record.cwd.clone()),
            // Waiting out its back-off, it has no process.
            pid: record.pid.filter(|_| state != State::Restarting),
            // A waiting item has not started: its record's time is when it was made.
            started_at: record.ran_from().map(rfc3339),
            created_at: rfc3339(record.created_at()),
            ended_at: record.ended_at.map(rfc3339),
            notify: record.notify,
            session: record.session.clone(),
            // An end's words may quote a folder, a host or a pattern given.
            report: report.map(crate::redact::mask_shapes),
            env_names: record.env_names.clone(),
            log_path: (!record.job_dir.is_empty()).then(|| {
                crate::output::log_path(&record.job_dir)
                    .display()
                    .to_string()
            }),
            folder: (!record.job_dir.is_empty()).then(|| record.job_dir.clone()),
            stop_requested: (running && record.stop_actor.is_some()).then_some(true),
            already_ended: None,
            queued: None,
            end_detail: detail.map(crate::redact::mask_shapes),
            cost: crate::wire::Cost::recorded(record.cpu_ms, record.peak_rss),
            executor: view.executor_name().map(str::to_string),
            queue_reason: view.queue_reason.filter(|_| state == State::Queued),
            slurm_job_id: view.slurm_job_id,
            expected: None,
            usual_ms: None,
            progress: None,
            quiet_after_s: record.quiet_after_ms.map(|ms| ms as f64 / 1000.0),
            host: view.host,
            host_unreachable: view.unreachable.filter(|_| running),
            logout_warning: view.logout.filter(|_| running),
            restart: crate::daemon::jobs::restart_policy::view(record),
            waiting_for: (record.state == State::Waiting).then(|| {
                let what = self.waiting.get(record.row);
                crate::redact::mask_shapes(format!(
                    "waiting for {}",
                    what.as_deref().unwrap_or("its conditions")
                ))
            }),
        }
    }

    /// The record `id` as `session` sees it, or `unknown_id`: `bg-2` is the session's
    /// own, `sub-1/bg-2` is `bg-2` of its sub-agent `sub-1` (and so on for nested ones).
    pub(crate) fn find(inner: &Inner, session: &str, id: &str) -> Result<Record, WireError> {
        let (owner, own_id) = match id.rsplit_once('/') {
            Some((path, own_id)) => (sub_session_name(session, path), own_id),
            None => (session.to_string(), id),
        };
        if let Some(record) = inner.store.find_in(session, &owner, own_id)? {
            return Ok(record);
        }
        // `bg4`, `BG-4`, `bg_4` or `4`: the id it was meant to be, when there is one.
        let meant = crate::wire::id_meant(own_id)
            .filter(|meant| meant != own_id)
            .filter(|meant| matches!(inner.store.find_in(session, &owner, meant), Ok(Some(_))));
        let mut error = WireError::unknown_id(id);
        if let Some(meant) = meant {
            let full = match id.rsplit_once('/') {
                Some((path, _)) => format!("{path}/{meant}"),
                None => meant,
            };
            error.message = format!("no item {id} in this session: did you mean {full}?");
        }
        Err(error)
    }

    pub(crate) async fn list(
        &self,
        session: &str,
        all: bool,
        all_sessions: bool,
    ) -> Result<ListReply, WireError> {
        let records = match all_sessions {
            true => self.lock().store.list_every_session(all)?,
            false => self.lock().store.list(session, all)?,
        };
        // Every session's items are shown as their own sessions name them.
        let mut items: Vec<Item> = match all_sessions {
            true => records.iter().map(|r| self.item(r)).collect(),
            false => records.iter().map(|r| self.item_as(session, r)).collect(),
        };
        self.observe_items(&mut items, &records).await;
        Ok(ListReply { items })
    }

    /// Drops ended records from lists: all of `ids`, or none when one of them is
    /// unknown or still running.
    pub(crate) fn dismiss(&self, session: &str, ids: &[String]) -> Result<Ack, WireError> {
        if ids.is_empty() {
            return Err(WireError::bad_request(
                "dismiss needs at least one id, e.g. `bgwork dismiss bg-1 bg-2`",
            ));
        }
        let mut inner = self.lock();
        let mut rows = Vec::new();
        for id in ids {
            let record = Self::find(&inner, session, id)?;
            if record.state != State::Ended {
                let words = self
                    .item_as(session, &record)
                    .live_words()
                    .unwrap_or_else(|| "still running".to_string());
                return Err(WireError::refused(format!(
                    "{id} is {words}: `bgwork stop {id}` first, then dismiss it"
                )));
            }
            rows.push(record.row);
        }
        for row in rows {
            inner.store.dismiss(row)?;
        }
        let message = match ids {
            [id] => format!("{id} dismissed: it no longer shows in `list --all`"),
            _ => format!(
                "{} dismissed: they no longer show in `list --all`",
                ids.join(", ")
            ),
        };
        Ok(Ack { ok: true, message })
    }

    /// Removes ended records older than the retention, then the oldest ended records while their logs together pass
    /// the size budget. A record whose notice was not delivered stays.
    pub(crate) fn gc(&self) -> Result<GcReply, WireError> {
        self.gc_with(None, false)
    }

    /// `gc` with the caller's age (`--older-than`), or every ended record (`--all-ended`).
    pub(crate) fn gc_with(
        &self,
        older_than_s: Option<f64>,
        all_ended: bool,
    ) -> Result<GcReply, WireError> {
        let retain = match (older_than_s, all_ended) {
            (Some(_), true) => {
                return Err(WireError::bad_request(
                    "give --older-than or --all-ended, not both",
                ))
            }
            (Some(s), false) if s.is_finite() && s >= 0.0 => {
                std::time::Duration::from_secs_f64(s.min(1e10))
            }
            (Some(_), false) => {
                return Err(WireError::bad_request(
                    "--older-than takes a duration, e.g. 2h or 30m",
                ))
            }
            (None, true) => std::time::Duration::ZERO,
            (None, false) => self.config.retain,
        };
        let mut inner = self.lock();
        let now = now_ms();
        let cutoff = now - retain.as_millis() as i64;
        // What a waiting item awaits stays until it has judged it (it then no longer
        // waits, and the next gc may take it).
        let awaited = crate::daemon::jobs::after::awaited_rows(&inner.store);
        let ended: Vec<_> = inner
            .store
            .ended_before(now + 1)?
            .into_iter()
            .filter(|r| !awaited.contains(&r.row))
            .collect();
        let sizes: Vec<u64> = ended.iter().map(|r| dir_size(&r.job_dir)).collect();
        let mut total: u64 = sizes.iter().sum();
        let (mut removed, mut freed) = (0, 0);
        for (record, size) in ended.iter().zip(sizes) {
            let too_old = all_ended || record.ended_at.unwrap_or(0) < cutoff;
            if !too_old && total <= self.config.gc_total_bytes {
                continue;
            }
            // The folder goes first: a gc killed in between leaves a record without
            // its folder (gone at the next gc), never a folder that outlives its record.
            if !record.job_dir.is_empty() {
                let _ = std::fs::remove_dir_all(&record.job_dir);
            }
            inner.store.delete(record.row)?;
            inner.screens.forget(record.row);
            total -= size;
            removed += 1;
            freed += size;
        }
        Ok(GcReply {
            removed,
            freed_bytes: freed,
        })
    }

    /// A session name no record uses and no other front end was given: `base`, else
    /// `base-2`, `base-3`, …
    pub(crate) fn unique_session(&self, base: &str) -> Result<SessionReply, WireError> {
        let base = base.trim();
        if base.is_empty() || base.len() > 200 || base.contains(['/', '\0']) {
            return Err(WireError::bad_request(
                "a session name is 1 to 200 bytes, without '/' or NUL",
            ));
        }
        let mut inner = self.lock();
        for n in 1u64.. {
            let name = match n {
                1 => base.to_string(),
                n => format!("{base}-{n}"),
            };
            if !inner.claimed.contains(&name)
                && !inner.store.session_used(&name)?
                && !inner.store.harness_session_bound(&name)?
            {
                inner.claimed.insert(name.clone());
                return Ok(SessionReply { session: name });
            }
        }
        unreachable!("some number is free")
    }

    pub(crate) async fn status(&self) -> Result<StatusReply, WireError> {
        let (waiting, unsettled): (Vec<_>, Vec<_>) = self
            .lock()
            .store
            .unsettled()?
            .into_iter()
            .partition(|r| r.state == State::Waiting);
        let (cpu_ms, rss_bytes) = self.running_totals(&unsettled).await;
        let mut sessions = BTreeMap::new();
        let mut restarting = Vec::new();
        for record in unsettled {
            if let Some(state) = record.restart.as_ref().filter(|_| record.restarting()) {
                restarting.push(format!(
                    "{}/{}: {}",
                    record.session,
                    record.id,
                    crate::wire::restart_count(state.restarts, state.max_restarts)
                ));
            }
            *sessions.entry(record.session).or_insert(0) += 1;
        }
        Ok(StatusReply {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            home: self.paths.home.display().to_string(),
            socket: self.paths.socket.display().to_string(),
            running: sessions.values().sum(),
            sessions,
            cpu_ms: Some(cpu_ms),
            rss_bytes: Some(rss_bytes),
            restarting,
            waiting: waiting.len() as u64,
            hosts_unreachable: self.executors.ssh.unreachable(),
            settings_refused: self.config.refused.clone(),
        })
    }
}

impl Daemon {
    /// Why `record` (addressed as `id`) cannot take `what` now because nothing of it
    /// runs: it waits for other work, or is between two runs of its restart policy, in
    /// the words every reader uses, and what to do; `None` when it is neither (it is
    /// being attached: a moment).
    pub(crate) fn not_running_now(&self, record: &Record, id: &str, what: &str) -> WireError {
        let text = if record.state == State::Waiting {
            let waits = self.waiting.get(record.row).unwrap_or_default();
            format!(
                "{id} is waiting for {waits} and runs nothing yet: {what} once it runs \
                 (`bgwork list` says when; `bgwork stop {id}` ends it now)"
            )
        } else if record.restarting() {
            let restart = crate::daemon::jobs::restart_policy::view(record);
            let words = crate::wire::live_words(State::Restarting, None, restart.as_ref())
                .unwrap_or_default();
            format!(
                "{id} is {words}: nothing of it runs between two runs; {what} once it runs \
                 again (`bgwork stop {id}` ends it for good)"
            )
        } else {
            format!("{id} is not attached yet: try again in a moment")
        };
        WireError::new(ErrorCode::NotRunning, text)
    }
}

fn dir_size(dir: &str) -> u64 {
    if dir.is_empty() {
        return 0;
    }
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

impl Daemon {
    pub(crate) fn state_of(&self, row: i64) -> Option<State> {
        self.lock().store.get(row).ok().flatten().map(|r| r.state)
    }

    pub(crate) fn has_ended(&self, row: i64) -> bool {
        let inner = self.lock();
        matches!(inner.store.get(row), Ok(Some(r)) if r.state == State::Ended)
    }

    /// Whether a record has ended, asking its status file too: before a deadline is
    /// taken to have passed with the item still running, an end already written to
    /// disk (whose message may still wait in a socket after a pause) is recorded.
    pub(crate) fn ended_now(&self, row: i64) -> bool {
        if self.has_ended(row) {
            return true;
        }
        let record = match self.lock().store.get(row) {
            Ok(Some(record)) if !record.job_dir.is_empty() => record,
            _ => return false,
        };
        let owner = crate::daemon::jobs::settle::owner(&record);
        match crate::supervisor::read_status(Path::new(&record.job_dir), &owner) {
            Some(Ok(status)) => self.settle_status(row, &status) && self.has_ended(row),
            _ => false,
        }
    }
}
