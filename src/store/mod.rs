//! The durable records: the only module that speaks SQL.
//!
//! How it works: one SQLite file (`work.db`, WAL, `synchronous=NORMAL`) holds the work
//! records, the per-session id counters, the read cursors and the notices outbox. An
//! end and the notice that reports it are written in one transaction ([`Store::settle`]),
//! so a crash can never keep one without the other. Schema changes are migrations in
//! [`schema`], applied in order and counted in `PRAGMA user_version`.

mod monitors;
mod schema;
mod sessions;

pub use monitors::MonitorRow;
pub use sessions::sub_session_name;

use crate::wire::{Actor, End, Kind, State};
use rusqlite::{params, Connection, OptionalExtension, Row};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the database failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database is newer than this build (schema {found}, this build knows {known}): run the newer bgwork")]
    TooNew { found: i64, known: i64 },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// One work record, as stored.
#[derive(Debug, Clone)]
pub struct Record {
    pub row: i64,
    pub session: String,
    pub id: String,
    pub kind: Kind,
    pub state: State,
    pub end: Option<End>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub name: Option<String>,
    pub command: String,
    pub cwd: String,
    pub pid: Option<i32>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub notify: bool,
    pub env_names: Vec<String>,
    pub job_dir: String,
    pub stop_actor: Option<Actor>,
    pub dropped: u64,
    pub log_len: u64,
    pub lost_reason: Option<String>,
    /// A pane's terminal size.
    pub cols: Option<u16>,
    pub rows: Option<u16>,
}

/// What a new record holds before it runs.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub session: String,
    pub kind: Kind,
    pub name: Option<String>,
    pub command: String,
    pub cwd: String,
    pub notify: bool,
    pub env_names: Vec<String>,
    pub started_at: i64,
    pub cols: Option<u16>,
    pub rows: Option<u16>,
}

/// How a record ended, with the notice to fire (if it was armed).
#[derive(Debug, Clone)]
pub struct Settlement {
    pub end: End,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub ended_at: i64,
    pub log_len: u64,
    pub dropped: u64,
    pub lost_reason: Option<String>,
    pub notice: Option<NewNotice>,
    /// The job's pid when the record does not have it yet.
    pub pid: Option<i32>,
}

#[derive(Debug, Clone)]
pub struct NewNotice {
    pub text: String,
    pub tail: String,
}

/// A notice in the outbox.
#[derive(Debug, Clone)]
pub struct NoticeRow {
    pub nrow: i64,
    pub session: String,
    pub item: String,
    /// None for a watch's batch of matches.
    pub end: Option<End>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub text: String,
    pub tail: String,
    pub created_at: i64,
    pub count: u64,
}

pub struct Store {
    conn: Connection,
}

const RECORD_COLUMNS: &str = "row, session, id, kind, state, end_kind, exit_code, signal, name, \
    command, cwd, pid, started_at, ended_at, notify, env_names, job_dir, stop_actor, dropped, \
    log_len, lost_reason, cols, rows";

/// `end_kind` of a notice that reports matches of a watch, not an end.
const MATCH_NOTICE: &str = "match";

impl Store {
    pub fn open(path: &std::path::Path) -> Result<Store> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        schema::migrate(&conn)?;
        Ok(Store { conn })
    }

    /// Writes a new record (state `starting`) with the session's next id for its kind.
    pub fn insert(&mut self, new: &NewRecord) -> Result<Record> {
        self.insert_with(new, |_, _, _| Ok(()))
    }

    /// [`Store::insert`], with `also` run in the same transaction (given the new
    /// record's row and id).
    fn insert_with(
        &mut self,
        new: &NewRecord,
        also: impl FnOnce(&rusqlite::Transaction, i64, &str) -> rusqlite::Result<()>,
    ) -> Result<Record> {
        let tx = self.conn.transaction()?;
        let prefix = id_prefix(new.kind);
        let n: i64 = tx.query_row(
            "INSERT INTO counters(session, prefix, next) VALUES (?1, ?2, 2)
                 ON CONFLICT(session, prefix) DO UPDATE SET next = next + 1
                 RETURNING next - 1",
            params![new.session, prefix],
            |r| r.get(0),
        )?;
        let id = format!("{prefix}-{n}");
        tx.execute(
            "INSERT INTO items(session, id, kind, state, name, command, cwd, started_at, notify,
                               env_names, job_dir, cols, rows)
             VALUES (?1, ?2, ?3, 'starting', ?4, ?5, ?6, ?7, ?8, ?9, '', ?10, ?11)",
            params![
                new.session,
                id,
                kind_str(new.kind),
                new.name,
                new.command,
                new.cwd,
                new.started_at,
                new.notify,
                new.env_names.join(","),
                new.cols,
                new.rows,
            ],
        )?;
        let row = tx.last_insert_rowid();
        also(&tx, row, &id)?;
        tx.commit()?;
        Ok(self.get(row)?.expect("the record just written"))
    }

    pub fn set_job_dir(&mut self, row: i64, job_dir: &str) -> Result<()> {
        self.conn.execute(
            "UPDATE items SET job_dir = ?2 WHERE row = ?1",
            params![row, job_dir],
        )?;
        Ok(())
    }

    pub fn set_running(&mut self, row: i64, pid: i32) -> Result<()> {
        self.conn.execute(
            "UPDATE items SET state = 'running', pid = ?2 WHERE row = ?1 AND state != 'ended'",
            params![row, pid],
        )?;
        Ok(())
    }

    pub fn set_size(&mut self, row: i64, cols: u16, rows: u16) -> Result<()> {
        self.conn.execute(
            "UPDATE items SET cols = ?2, rows = ?3 WHERE row = ?1",
            params![row, cols, rows],
        )?;
        Ok(())
    }

    /// Marks a record running that has no process (a monitor).
    pub fn mark_running(&mut self, row: i64) -> Result<()> {
        self.conn.execute(
            "UPDATE items SET state = 'running' WHERE row = ?1 AND state != 'ended'",
            [row],
        )?;
        Ok(())
    }

    pub fn set_stop_actor(&mut self, row: i64, actor: Actor) -> Result<()> {
        self.conn.execute(
            "UPDATE items SET stop_actor = ?2 WHERE row = ?1",
            params![row, actor_str(actor)],
        )?;
        Ok(())
    }

    /// Ends a record and writes its notice in one transaction. Returns false (and
    /// changes nothing) when the record had already ended: an end is recorded once.
    pub fn settle(&mut self, row: i64, settlement: &Settlement) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let changed = tx.execute(
            "UPDATE items SET state = 'ended', end_kind = ?2, exit_code = ?3, signal = ?4,
                    ended_at = ?5, log_len = ?6, dropped = ?7, lost_reason = ?8,
                    pid = COALESCE(pid, ?9)
             WHERE row = ?1 AND state != 'ended'",
            params![
                row,
                end_str(settlement.end),
                settlement.exit_code,
                settlement.signal,
                settlement.ended_at,
                settlement.log_len as i64,
                settlement.dropped as i64,
                settlement.lost_reason,
                settlement.pid,
            ],
        )?;
        if changed == 1 {
            if let Some(notice) = &settlement.notice {
                tx.execute(
                    "INSERT OR IGNORE INTO notices(key, row, session, item, end_kind, exit_code,
                                                   signal, text, tail, created_at)
                     SELECT 'end:' || row, row, session, id, ?2, ?3, ?4, ?5, ?6, ?7
                     FROM items WHERE row = ?1",
                    params![
                        row,
                        end_str(settlement.end),
                        settlement.exit_code,
                        settlement.signal,
                        notice.text,
                        notice.tail,
                        settlement.ended_at,
                    ],
                )?;
            }
        }
        tx.commit()?;
        Ok(changed == 1)
    }

    pub fn get(&self, row: i64) -> Result<Option<Record>> {
        let sql = format!("SELECT {RECORD_COLUMNS} FROM items WHERE row = ?1");
        Ok(self.conn.query_row(&sql, [row], record).optional()?)
    }

    /// The records of a session and of its sub-agents' sessions: running ones, or all
    /// not dismissed with `all`.
    pub fn list(&self, session: &str, all: bool) -> Result<Vec<Record>> {
        let filter = if all {
            "dismissed = 0"
        } else {
            "state != 'ended'"
        };
        let sql = format!(
            "SELECT {RECORD_COLUMNS} FROM items WHERE session IN {} AND {filter} ORDER BY row",
            sessions::tree("?1")
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([session], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every record not yet ended, of every session (for reconciling after a start).
    pub fn unsettled(&self) -> Result<Vec<Record>> {
        let sql = format!("SELECT {RECORD_COLUMNS} FROM items WHERE state != 'ended' ORDER BY row");
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn cursor(&self, session: &str, row: i64) -> Result<u64> {
        let offset: Option<i64> = self
            .conn
            .query_row(
                "SELECT offset FROM cursors WHERE session = ?1 AND row = ?2",
                params![session, row],
                |r| r.get(0),
            )
            .optional()?;
        Ok(offset.unwrap_or(0) as u64)
    }

    pub fn set_cursor(&mut self, session: &str, row: i64, offset: u64) -> Result<()> {
        self.conn.execute(
            "INSERT INTO cursors(session, row, offset) VALUES (?1, ?2, ?3)
             ON CONFLICT(session, row) DO UPDATE SET offset = excluded.offset",
            params![session, row, offset as i64],
        )?;
        Ok(())
    }

    /// Notices not yet delivered that go to the session (see [`sessions::recipients`]),
    /// oldest first. The item of a notice that comes from an ended sub-agent's session is
    /// named as the session sees it (`sub-1/bg-2`).
    pub fn pending_notices(&self, session: &str) -> Result<Vec<NoticeRow>> {
        // The path from this session to the item's, as an id prefix (`sub-1/`).
        let prefix = "substr(session, length(?1) + 2) || '/'";
        let sql = format!(
            "SELECT nrow, session,
                    CASE WHEN session = ?1 THEN item ELSE {prefix} || item END,
                    end_kind, exit_code, signal,
                    CASE WHEN session = ?1 OR substr(text, 1, length(item)) != item THEN text
                         ELSE {prefix} || text END,
                    tail, created_at, count
             FROM notices WHERE session IN {} AND delivered_at IS NULL ORDER BY nrow",
            sessions::recipients("?1")
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([session], |r| {
            Ok(NoticeRow {
                nrow: r.get(0)?,
                session: r.get(1)?,
                item: r.get(2)?,
                end: Some(r.get::<_, String>(3)?)
                    .filter(|e| e != MATCH_NOTICE)
                    .map(|e| parse_end(&e)),
                exit_code: r.get(4)?,
                signal: r.get(5)?,
                text: r.get(6)?,
                tail: r.get(7)?,
                created_at: r.get(8)?,
                count: r.get::<_, i64>(9)? as u64,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn mark_delivered(&mut self, nrows: &[i64], at: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        for nrow in nrows {
            tx.execute(
                "UPDATE notices SET delivered_at = ?2 WHERE nrow = ?1 AND delivered_at IS NULL",
                params![nrow, at],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Marks the end notice of a record delivered (its end was already shown).
    pub fn mark_end_notice_delivered(&mut self, row: i64, at: i64) -> Result<()> {
        self.conn.execute(
            "UPDATE notices SET delivered_at = ?2 WHERE key = 'end:' || ?1 AND delivered_at IS NULL",
            params![row, at],
        )?;
        Ok(())
    }

    pub fn dismiss(&mut self, row: i64) -> Result<()> {
        self.conn
            .execute("UPDATE items SET dismissed = 1 WHERE row = ?1", [row])?;
        Ok(())
    }

    /// Ended records that ended before `before_ms`, oldest first.
    pub fn ended_before(&self, before_ms: i64) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {RECORD_COLUMNS} FROM items WHERE state = 'ended' AND ended_at < ?1
             ORDER BY ended_at"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([before_ms], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Deletes a record with its cursors and notices; its id is never reused.
    pub fn delete(&mut self, row: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute("DELETE FROM cursors WHERE row = ?1", [row])?;
        tx.execute("DELETE FROM notices WHERE row = ?1", [row])?;
        tx.execute("DELETE FROM items WHERE row = ?1", [row])?;
        tx.commit()?;
        Ok(())
    }

    pub fn integrity_check(&self) -> Result<String> {
        Ok(self
            .conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
    }
}

fn record(r: &Row) -> rusqlite::Result<Record> {
    let env_names: String = r.get(15)?;
    Ok(Record {
        row: r.get(0)?,
        session: r.get(1)?,
        id: r.get(2)?,
        kind: parse_kind(&r.get::<_, String>(3)?),
        state: parse_state(&r.get::<_, String>(4)?),
        end: r.get::<_, Option<String>>(5)?.map(|e| parse_end(&e)),
        exit_code: r.get(6)?,
        signal: r.get(7)?,
        name: r.get(8)?,
        command: r.get(9)?,
        cwd: r.get(10)?,
        pid: r.get(11)?,
        started_at: r.get(12)?,
        ended_at: r.get(13)?,
        notify: r.get(14)?,
        env_names: env_names
            .split(',')
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect(),
        job_dir: r.get(16)?,
        stop_actor: r.get::<_, Option<String>>(17)?.map(|a| {
            if a == "person" {
                Actor::Person
            } else {
                Actor::Agent
            }
        }),
        dropped: r.get::<_, i64>(18)? as u64,
        log_len: r.get::<_, i64>(19)? as u64,
        lost_reason: r.get(20)?,
        cols: r.get(21)?,
        rows: r.get(22)?,
    })
}

pub fn id_prefix(kind: Kind) -> &'static str {
    match kind {
        Kind::Job | Kind::Pane => "bg",
        Kind::Monitor => "mon",
        Kind::SubAgent => "sub",
    }
}

fn kind_str(kind: Kind) -> &'static str {
    match kind {
        Kind::Job => "job",
        Kind::Pane => "pane",
        Kind::Monitor => "monitor",
        Kind::SubAgent => "sub_agent",
    }
}

fn parse_kind(text: &str) -> Kind {
    match text {
        "pane" => Kind::Pane,
        "monitor" => Kind::Monitor,
        "sub_agent" => Kind::SubAgent,
        _ => Kind::Job,
    }
}

fn parse_state(text: &str) -> State {
    match text {
        "starting" => State::Starting,
        "running" => State::Running,
        _ => State::Ended,
    }
}

fn actor_str(actor: Actor) -> &'static str {
    match actor {
        Actor::Agent => "agent",
        Actor::Person => "person",
    }
}

const ENDS: [(End, &str); 8] = [
    (End::Succeeded, "succeeded"),
    (End::Failed, "failed"),
    (End::StoppedByAgent, "stopped_by_agent"),
    (End::StoppedByPerson, "stopped_by_person"),
    (End::Signaled, "signaled"),
    (End::Cancelled, "cancelled"),
    (End::SpawnFailed, "spawn_failed"),
    (End::Lost, "lost"),
];

fn end_str(end: End) -> &'static str {
    ENDS.iter()
        .find(|(e, _)| *e == end)
        .map(|(_, s)| *s)
        .unwrap_or("lost")
}

fn parse_end(text: &str) -> End {
    ENDS.iter()
        .find(|(_, s)| *s == text)
        .map(|(e, _)| *e)
        .unwrap_or(End::Lost)
}
