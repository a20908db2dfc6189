//! Records as clients see them, and the calls over records: list, dismiss, gc, status.

use super::{Daemon, Inner};
use crate::paths::{now_ms, rfc3339};
use crate::store::{sub_session_name, Record};
use crate::wire::{
    Ack, End, ErrorCode, GcReply, Item, Kind, ListReply, State, StatusReply, WireError,
};
use std::collections::BTreeMap;

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
        let mut lost_reason = record.lost_reason.clone();
        if record.kind == Kind::Monitor {
            // A monitor's detail says what happened ("matched: …", "timed out …").
            if let (Some(text), Some(detail)) = (report.as_mut(), lost_reason.take()) {
                text.push_str(": ");
                text.push_str(&detail);
            }
        } else if record.end == Some(End::StoppedByAgent) {
            // A stop the agent did not ask for by itself says why ("killed at its
            // deadline: …", for a `run`).
            if let Some(detail) = lost_reason.take() {
                report = Some(format!("{} was {detail}", record.id));
            }
        }
        let running = record.state != State::Ended;
        Item {
            id,
            kind: record.kind,
            state: record.state,
            end: record.end,
            exit_code: record.exit_code,
            signal: record.signal,
            name: record.name.clone(),
            command: record.command.clone(),
            cwd: record.cwd.clone(),
            pid: record.pid,
            started_at: rfc3339(record.started_at),
            ended_at: record.ended_at.map(rfc3339),
            notify: record.notify,
            session: record.session.clone(),
            report,
            env_names: record.env_names.clone(),
            log_path: (!record.job_dir.is_empty()).then(|| {
                crate::output::log_path(&record.job_dir)
                    .display()
                    .to_string()
            }),
            stop_requested: (running && record.stop_actor.is_some()).then_some(true),
            lost_reason,
        }
    }

    /// The record `id` as `session` sees it, or `unknown_id`: `bg-2` is the session's
    /// own, `sub-1/bg-2` is `bg-2` of its sub-agent `sub-1` (and so on for nested ones).
    pub(crate) fn find(inner: &Inner, session: &str, id: &str) -> Result<Record, WireError> {
        let (owner, own_id) = match id.rsplit_once('/') {
            Some((path, own_id)) => (sub_session_name(session, path), own_id),
            None => (session.to_string(), id),
        };
        inner
            .store
            .find_in(session, &owner, own_id)?
            .ok_or_else(|| WireError::unknown_id(id))
    }

    pub(crate) fn list(&self, session: &str, all: bool) -> Result<ListReply, WireError> {
        let records = self.lock().store.list(session, all)?;
        Ok(ListReply {
            items: records.iter().map(|r| self.item_as(session, r)).collect(),
        })
    }

    pub(crate) fn dismiss(&self, session: &str, id: &str) -> Result<Ack, WireError> {
        let mut inner = self.lock();
        let record = Self::find(&inner, session, id)?;
        if record.state != State::Ended {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                format!("{id} is still running: `bgwork stop {id}` first, then dismiss it"),
            ));
        }
        inner.store.dismiss(record.row)?;
        Ok(Ack {
            ok: true,
            message: format!("{id} dismissed: it no longer shows in `list --all`"),
        })
    }

    /// Removes ended records older than the retention, then the oldest ended records
    /// while their logs together pass the size budget.
    pub(crate) fn gc(&self) -> Result<GcReply, WireError> {
        let mut inner = self.lock();
        let now = now_ms();
        let cutoff = now - self.config.retain.as_millis() as i64;
        let ended = inner.store.ended_before(now + 1)?;
        let sizes: Vec<u64> = ended.iter().map(|r| dir_size(&r.job_dir)).collect();
        let mut total: u64 = sizes.iter().sum();
        let (mut removed, mut freed) = (0, 0);
        for (record, size) in ended.iter().zip(sizes) {
            let too_old = record.ended_at.unwrap_or(0) < cutoff;
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

    pub(crate) fn status(&self) -> Result<StatusReply, WireError> {
        let inner = self.lock();
        let mut sessions = BTreeMap::new();
        for record in inner.store.unsettled()? {
            *sessions.entry(record.session).or_insert(0) += 1;
        }
        Ok(StatusReply {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            home: self.paths.home.display().to_string(),
            socket: self.paths.socket.display().to_string(),
            running: sessions.values().sum(),
            sessions,
        })
    }

    /// Running items that count toward a session's limit: those of its root session
    /// and of every sub-agent under it (nested work counts against the root's limits).
    pub(crate) fn counted(inner: &Inner, session: &str) -> Result<Vec<Record>, WireError> {
        Ok(Self::running_tree(inner, session)?
            .into_iter()
            .filter(|r| r.kind != Kind::SubAgent)
            .collect())
    }

    /// Running items of the whole tree of sessions `session` belongs to.
    pub(crate) fn running_tree(inner: &Inner, session: &str) -> Result<Vec<Record>, WireError> {
        let root = inner.store.root_of(session)?;
        Ok(inner.store.list(&root, false)?)
    }
}

/// The id by which `viewer` addresses a record: its own id when the record is the
/// viewer's, else prefixed by the path of sub-agents from the viewer to its owner.
pub(crate) fn display_id(viewer: &str, record: &Record) -> String {
    match record
        .session
        .strip_prefix(viewer)
        .and_then(|rest| rest.strip_prefix('/'))
    {
        Some(path) if record.session != viewer => format!("{path}/{}", record.id),
        _ => record.id.clone(),
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
