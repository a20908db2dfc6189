//! The durable records: the only module that speaks SQL.
//!
//! How it works: one SQLite file (`work.db`, WAL, `synchronous=NORMAL`) holds the work
//! records, the per-session id counters, the read cursors and the notices outbox. An
//! end and the notice that reports it are written in one transaction ([`Store::settle`]),
//! so a crash can never keep one without the other. Schema changes are migrations in
//! [`schema`], applied in order and counted in `PRAGMA user_version`.

mod after;
mod harness;
mod history;
mod monitors;
mod notices;
mod restarts;
mod schema;
mod sessions;

pub use harness::HarnessBinding;
pub use history::COMMANDS_LISTED;
pub use monitors::{mode_text, MonitorRow, ScanProgress, Watched};
pub use sessions::sub_session_name;

use crate::wire::{Actor, End, Kind, State};
pub use restarts::RestartState;
use rusqlite::{params, Connection, OptionalExtension, Row};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the database failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database is newer than this build (schema {found}, this build knows {known}): run the newer bgwork")]
    TooNew { found: i64, known: i64 },
    #[error("{path} fails its integrity check ({detail}); it is kept as it is. Move it aside (`mv {path} {path}.broken`) and start again: running jobs are found again from the home's jobs/ folder")]
    Corrupt { path: String, detail: String },
}

/// Prepared statements kept by the store's connection (more than it has).
const STATEMENT_CACHE: usize = 128;

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
    /// What the end adds to its report: why it was lost, why it could not start, what
    /// a monitor saw, Slurm's word (the column is named `lost_reason`, as it was first).
    pub end_detail: Option<String>,
    /// A pane's terminal size.
    pub cols: Option<u16>,
    pub rows: Option<u16>,
    /// Output bytes that could not be written to the log (a full disk), and the log
    /// offset where the first of them was lost.
    pub unwritten: u64,
    pub unwritten_at: u64,
    /// What the job cost, once it has ended: CPU time (ms) and peak resident memory.
    pub cpu_ms: Option<u64>,
    pub peak_rss: Option<u64>,
    /// The limits it was started with: a notice after this long without output, and a
    /// stop after this long running.
    pub quiet_after_ms: Option<u64>,
    pub max_runtime_ms: Option<u64>,
    /// Its restart policy and where it is in it (`start --restart on-failure`).
    pub restart: Option<RestartState>,
    /// When it was made, when that was before it started (a waiting item that has
    /// started since; while it waits, `started_at` holds it).
    pub created_at: Option<i64>,
}

impl Record {
    /// When it was made: before a waiting item starts, or its start.
    pub fn created_at(&self) -> i64 {
        self.created_at.unwrap_or(self.started_at)
    }

    /// Whether it waits out its restart policy's back-off between two runs (shown
    /// `restarting`).
    pub fn restarting(&self) -> bool {
        self.end.is_none() && self.restart.as_ref().is_some_and(RestartState::waiting)
    }
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

/// An end as the store records it (`Store::settle`): how it ended (`End`, its codes,
/// its detail, its figures), with the notice to fire (if it was armed).
#[derive(Debug, Clone)]
pub struct EndRecord {
    pub end: End,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub ended_at: i64,
    pub log_len: u64,
    pub dropped: u64,
    /// See [`Record::end_detail`].
    pub end_detail: Option<String>,
    pub notice: Option<NewNotice>,
    /// The job's pid when the record does not have it yet.
    pub pid: Option<i32>,
    /// Output bytes that could not be written to the log (a full disk).
    pub unwritten: u64,
    pub unwritten_at: u64,
    /// What the job cost (CPU time in ms, peak resident memory), when known.
    pub cpu_ms: Option<u64>,
    pub peak_rss: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct NewNotice {
    pub text: String,
    pub tail: String,
}

impl NewNotice {
    /// The notice, saying how much output a full disk kept out of the log.
    pub fn with_unwritten(mut self, unwritten: u64) -> NewNotice {
        self.text.push_str(&crate::end::unwritten_note(unwritten));
        self
    }

    /// The notice, saying what the job cost when that was worth saying.
    pub fn with_cost(mut self, cpu_ms: Option<u64>, peak_rss: Option<u64>) -> NewNotice {
        self.text.push_str(&crate::end::cost_note(cpu_ms, peak_rss));
        self
    }
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
    /// The file that keeps row and notice numbers above every one ever used, even when
    /// the database itself is lost (`work.ids` beside it).
    reserve: Reserve,
}

/// Row and notice numbers reserved ahead in a file beside the database, in steps of
/// [`RESERVE_STEP`]: a fresh database starts above them, so no job folder, row or
/// notice id is ever used twice in a home.
struct Reserve {
    path: std::path::PathBuf,
    rows: i64,
    notices: i64,
    /// The database the reservation is for.
    token: i64,
    /// Whether the file names this database already.
    written: bool,
}

const RESERVE_STEP: i64 = 4096;

const RECORD_COLUMNS: &str = "row, session, id, kind, state, end_kind, exit_code, signal, name, \
    command, cwd, pid, started_at, ended_at, notify, env_names, job_dir, stop_actor, dropped, \
    log_len, lost_reason, cols, rows, unwritten, unwritten_at, cpu_ms, peak_rss, quiet_after_ms, \
    max_runtime_ms, (SELECT json_array(max_restarts, backoff_min_ms, backoff_max_ms, restarts, \
    runs_ended, last_end, last_exit_code, last_signal, last_ended_at, next_at, run_started_at, \
    refused) FROM restarts WHERE restarts.row = items.row), created_at";

/// `end_kind` of a notice about a running job (quiet, a port in use), not an end.
pub(crate) const EVENT_NOTICE: &str = "event";

/// `end_kind` of a notice that reports matches of a watch, not an end.
const MATCH_NOTICE: &str = "match";

/// How often [`checkpoint_apart`] looks at the write-ahead log.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Copies the write-ahead log of the database at `path` into the database on a thread
/// of its own, with a connection of its own, about once a second after writes: the
/// copy and its sync never happen inside a write of the daemon's, which holds its lock.
/// A passive checkpoint: it never waits for the daemon's writes, nor they for it.
///
/// The thread writes nothing itself: a write from a second connection would make the
/// daemon's transactions that read before they write fail at once ("database is
/// locked": SQLite's busy snapshot, which no busy timeout waits out).
pub fn checkpoint_apart(path: &std::path::Path) {
    let wal = std::path::PathBuf::from(format!("{}-wal", path.display()));
    // Opened and used here, before the daemon serves: its files are open from the start.
    let checkpoint =
        |conn: &Connection| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    let conn = match Connection::open(path) {
        Ok(conn) => conn,
        Err(e) => {
            crate::note!(
                "bgwork daemon: no checkpoint connection ({e}); SQLite checkpoints itself"
            );
            return;
        }
    };
    let _ = conn.busy_timeout(std::time::Duration::from_millis(100));
    let _ = checkpoint(&conn);
    let spawned = std::thread::Builder::new()
        .name("bgwork-checkpoint".into())
        .spawn(move || {
            let mut done_at = None;
            loop {
                std::thread::sleep(CHECKPOINT_EVERY);
                let written = std::fs::metadata(&wal).and_then(|m| m.modified()).ok();
                if written.is_none() || written == done_at {
                    continue;
                }
                if checkpoint(&conn).is_ok() {
                    // The log as this thread left it.
                    done_at = std::fs::metadata(&wal).and_then(|m| m.modified()).ok();
                }
            }
        });
    if let Err(e) = spawned {
        crate::note!("bgwork daemon: no checkpoint thread ({e}); SQLite checkpoints itself");
    }
}

impl Store {
    /// Opens (or creates) the database. A database that fails `PRAGMA quick_check` is
    /// refused, and kept as it is. `floor` is the highest row number known to have
    /// been used in this home (the job folders' names): rows start above it.
    pub fn open(path: &std::path::Path, floor: i64) -> Result<Store> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every statement is prepared once and kept: the hot ones (a record by row, a
        // cursor) run thousands of times a second under load.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let corrupt = |detail: String| StoreError::Corrupt {
            path: path.display().to_string(),
            detail,
        };
        // Only damage is called damage: a lock held by another process or a full disk
        // is its own error, and the advice to move the file aside is not given for it.
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                    corrupt(e.to_string())
                }
                _ => StoreError::Sqlite(e),
            })?;
        if check != "ok" {
            return Err(corrupt(check.lines().collect::<Vec<_>>().join("; ")));
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // The log is copied into the database by [`checkpoint_apart`]'s thread, not by
        // a write of the daemon's; SQLite's own checkpoint (at 1,000 pages, about 4 MB,
        // its default: a larger log fills a small disk) is reached only by a burst of
        // writes within a second.
        conn.pragma_update(None, "wal_autocheckpoint", 1_000)?;
        schema::migrate(&conn)?;
        if let Err(e) = history::rekey_runs(&conn) {
            crate::note!("bgwork daemon: could not mask the kept run history: {e}");
        }
        let ids = path.with_extension("ids");
        let (reserved_rows, reserved_notices) = read_reserve(&ids);
        let file_token = read_token(&ids);
        let (used_rows, used_notices) = (sequence(&conn, "items")?, sequence(&conn, "notices")?);
        // The database's identity: the reservation names the database it was made for.
        let db_token: Option<i64> = conn
            .prepare_cached("SELECT value FROM home WHERE key = 'token'")?
            .query_row([], |r| r.get(0))
            .optional()?;
        let token = match db_token {
            Some(token) => token,
            None => {
                let token = new_token();
                conn.prepare_cached("INSERT INTO home(key, value) VALUES ('token', ?1)")?
                    .execute([token])?;
                token
            }
        };
        // The reservation is a floor only for a database that is behind it: another
        // database than the one it was made for (a lost one replaced by a fresh one),
        // or one older than the numbers reserved last (one in step with it was at most
        // a step below). So a restart does not move the numbers on.
        let replaced = match (db_token, file_token) {
            (Some(db), Some(file)) => db != file,
            (None, _) => used_rows == 0 && used_notices == 0,
            (Some(_), None) => false,
        };
        let behind = |reserved: i64, used: i64| {
            if replaced || used < reserved - RESERVE_STEP {
                reserved
            } else {
                0
            }
        };
        let rows_floor = behind(reserved_rows, used_rows).max(floor);
        let notices_floor = behind(reserved_notices, used_notices);
        let mut store = Store {
            conn,
            reserve: Reserve {
                path: ids,
                rows: reserved_rows,
                notices: reserved_notices,
                token,
                written: file_token == Some(token),
            },
        };
        store.raise_floor(rows_floor, notices_floor)?;
        store.keep_reserve()?;
        Ok(store)
    }

    /// Keeps new rows above `rows` and new notices above `notices`. When the database
    /// is behind them (it was lost, or replaced), new ids start above `rows` too: an
    /// id is never given twice in a home, even to another session.
    fn raise_floor(&mut self, rows: i64, notices: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        let behind = sequence(&tx, "items")? < rows;
        for (table, floor) in [("items", rows), ("notices", notices)] {
            if sequence(&tx, table)? < floor {
                tx.prepare_cached("DELETE FROM sqlite_sequence WHERE name = ?1")?
                    .execute([table])?;
                tx.prepare_cached("INSERT INTO sqlite_sequence(name, seq) VALUES (?1, ?2)")?
                    .execute(params![table, floor])?;
            }
        }
        if behind {
            tx.prepare_cached(
                "INSERT INTO home(key, value) VALUES ('id_floor', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
            )?
            .execute([rows])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Moves the reservation ahead when the numbers in use come near it.
    fn keep_reserve(&mut self) -> Result<()> {
        let rows = sequence(&self.conn, "items")?;
        let notices = sequence(&self.conn, "notices")?;
        if rows < self.reserve.rows && notices < self.reserve.notices && self.reserve.written {
            return Ok(());
        }
        let (rows, notices) = (
            rows.saturating_add(RESERVE_STEP),
            notices.saturating_add(RESERVE_STEP),
        );
        let temp = self.reserve.path.with_extension("ids.tmp");
        let token = self.reserve.token;
        let text = format!("rows {rows}\nnotices {notices}\ntoken {token}\n");
        let written =
            std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, &self.reserve.path));
        match written {
            Ok(()) => {
                self.reserve.rows = rows;
                self.reserve.notices = notices;
                self.reserve.written = true;
            }
            // A full disk: the database still never reuses a number; only a database
            // lost at the same time could.
            Err(e) => crate::note!(
                "bgwork daemon: could not write {}: {e}",
                self.reserve.path.display()
            ),
        }
        Ok(())
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
        // The counter may be behind an id already taken (a database copied back over
        // newer job folders, which were then taken back): such ids are passed over.
        let id = loop {
            let n: i64 = tx.prepare_cached("INSERT INTO counters(session, prefix, next)
                     VALUES (?1, ?2, COALESCE((SELECT value FROM home WHERE key = 'id_floor'), 0) + 2)
                     ON CONFLICT(session, prefix) DO UPDATE SET next = next + 1
                     RETURNING next - 1")?.query_row(params![new.session, prefix],
                |r| r.get(0),
            )?;
            let id = format!("{prefix}-{n}");
            let taken: bool = tx
                .prepare_cached(
                    "SELECT EXISTS(SELECT 1 FROM items WHERE session = ?1 AND id = ?2)",
                )?
                .query_row(params![new.session, id], |r| r.get(0))?;
            if !taken {
                break id;
            }
        };
        tx.prepare_cached(
            "INSERT INTO items(session, id, kind, state, name, command, cwd, started_at, notify,
                               env_names, job_dir, cols, rows)
             VALUES (?1, ?2, ?3, 'starting', ?4, ?5, ?6, ?7, ?8, ?9, '', ?10, ?11)",
        )?
        .execute(params![
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
        ])?;
        let row = tx.last_insert_rowid();
        also(&tx, row, &id)?;
        tx.commit()?;
        self.keep_reserve()?;
        Ok(self.get(row)?.expect("the record just written"))
    }

    /// Takes back a record found only as its job folder (the database was lost): with
    /// its own row, id and folder, `starting` so that reconciling finds its end.
    pub fn adopt(&mut self, row: i64, record: &NewRecord, id: &str, job_dir: &str) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let taken: bool = tx
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM items WHERE row = ?1 OR (session = ?2 AND id = ?3))",
            )?
            .query_row(params![row, record.session, id], |r| r.get(0))?;
        if taken {
            return Ok(false);
        }
        tx.prepare_cached(
            "INSERT INTO items(row, session, id, kind, state, name, command, cwd, started_at,
                               notify, env_names, job_dir, cols, rows)
             VALUES (?1, ?2, ?3, ?4, 'starting', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )?
        .execute(params![
            row,
            record.session,
            id,
            kind_str(record.kind),
            record.name,
            record.command,
            record.cwd,
            record.started_at,
            record.notify,
            record.env_names.join(","),
            job_dir,
            record.cols,
            record.rows,
        ])?;
        if record.kind == Kind::SubAgent {
            // A sub-agent taken back keeps its session's parent.
            tx.prepare_cached(
                "INSERT OR IGNORE INTO sessions(name, parent, agent_row) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![
                sub_session_name(&record.session, id),
                record.session,
                row
            ])?;
        }
        // The session's counter goes past the id taken back.
        if let Some(n) = id.rsplit('-').next().and_then(|n| n.parse::<i64>().ok()) {
            tx.prepare_cached(
                "INSERT INTO counters(session, prefix, next) VALUES (?1, ?2, ?3)
                 ON CONFLICT(session, prefix) DO UPDATE SET next = max(next, excluded.next)",
            )?
            .execute(params![
                record.session,
                id_prefix(record.kind),
                n.saturating_add(1)
            ])?;
        }
        tx.commit()?;
        self.keep_reserve()?;
        Ok(true)
    }

    /// Whether a row number belongs to a record.
    pub fn has_row(&self, row: i64) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM items WHERE row = ?1)")?
            .query_row([row], |r| r.get(0))?)
    }

    pub fn set_job_dir(&mut self, row: i64, job_dir: &str) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE items SET job_dir = ?2 WHERE row = ?1")?
            .execute(params![row, job_dir])?;
        Ok(())
    }

    pub fn set_running(&mut self, row: i64, pid: i32) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE items SET state = 'running', pid = ?2 WHERE row = ?1 AND state != 'ended'",
            )?
            .execute(params![row, pid])?;
        Ok(())
    }

    pub fn set_size(&mut self, row: i64, cols: u16, rows: u16) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE items SET cols = ?2, rows = ?3 WHERE row = ?1")?
            .execute(params![row, cols, rows])?;
        Ok(())
    }

    /// Marks a record running that has no process (a monitor).
    pub fn mark_running(&mut self, row: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE items SET state = 'running' WHERE row = ?1 AND state != 'ended'",
            )?
            .execute([row])?;
        Ok(())
    }

    /// Arms the end notice of a record that has not ended (a promoted `run`); false
    /// when it had ended already (its end was settled without one).
    pub fn arm_notice(&mut self, row: i64) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached("UPDATE items SET notify = 1 WHERE row = ?1 AND state != 'ended'")?
            .execute([row])?;
        Ok(changed == 1)
    }

    pub fn set_stop_actor(&mut self, row: i64, actor: Actor) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE items SET stop_actor = ?2 WHERE row = ?1")?
            .execute(params![row, actor_str(actor)])?;
        Ok(())
    }

    /// Records the limits a job was started with (`start --quiet-after/--max-runtime`).
    pub fn set_limits(
        &mut self,
        row: i64,
        quiet_after_ms: Option<u64>,
        max_runtime_ms: Option<u64>,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE items SET quiet_after_ms = ?2, max_runtime_ms = ?3 WHERE row = ?1",
            )?
            .execute(params![
                row,
                quiet_after_ms.map(|n| n as i64),
                max_runtime_ms.map(|n| n as i64)
            ])?;
        Ok(())
    }

    /// Writes a notice about a running item (not its end) unless one with `key` was
    /// written before: a key names the event, so it is reported once.
    pub fn add_event_notice(
        &mut self,
        row: i64,
        key: &str,
        text: &str,
        tail: &str,
    ) -> Result<bool> {
        let added = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO notices(key, row, session, item, end_kind, text, tail,
                                           created_at)
             SELECT ?2, row, session, id, ?3, ?4, ?5, ?6 FROM items WHERE row = ?1",
            )?
            .execute(params![
                row,
                key,
                EVENT_NOTICE,
                text,
                tail,
                crate::paths::now_ms()
            ])?;
        self.keep_reserve()?;
        Ok(added == 1)
    }

    /// Says why an ended record ended where its end alone does not (a `run` killed at
    /// its deadline, say); shown in its report.
    pub fn set_detail(&mut self, row: i64, detail: &str) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE items SET lost_reason = ?2 WHERE row = ?1 AND state = 'ended'")?
            .execute(params![row, detail])?;
        Ok(())
    }

    /// Ends a record and writes its notice and its run (the history) in one
    /// transaction. Returns false (and changes nothing) when the record had already
    /// ended: an end is recorded once.
    pub fn settle(&mut self, row: i64, settlement: &EndRecord) -> Result<bool> {
        let mut tx = self.conn.transaction()?;
        let changed = tx
            .prepare_cached(
                "UPDATE items SET state = 'ended', end_kind = ?2, exit_code = ?3, signal = ?4,
                    ended_at = ?5, log_len = ?6, dropped = ?7, lost_reason = ?8,
                    pid = COALESCE(pid, ?9), unwritten = ?10, unwritten_at = ?11,
                    cpu_ms = ?12, peak_rss = ?13
             WHERE row = ?1 AND state != 'ended'",
            )?
            .execute(params![
                row,
                end_str(settlement.end),
                settlement.exit_code,
                settlement.signal,
                settlement.ended_at,
                settlement.log_len as i64,
                settlement.dropped as i64,
                settlement.end_detail,
                settlement.pid,
                settlement.unwritten as i64,
                settlement.unwritten_at as i64,
                settlement.cpu_ms.map(|n| n.min(i64::MAX as u64) as i64),
                settlement.peak_rss.map(|n| n.min(i64::MAX as u64) as i64),
            ])?;
        // A job stopped while it waited out its restart policy's back-off: its last
        // run's end is in the history already.
        if changed == 1 && !restarts::waiting_in(&tx, row)? {
            // The end is what matters: a run that cannot be kept (a damaged history) is
            // undone alone, said once in the daemon's log.
            let kept = tx.savepoint().map_err(StoreError::from).and_then(|mut sp| {
                sp.set_drop_behavior(rusqlite::DropBehavior::Rollback);
                history::add_run(&sp, row, settlement)?;
                sp.commit()?;
                Ok(())
            });
            if let Err(e) = kept {
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    crate::note!(
                        "bgwork daemon: could not keep a run in the history (ends are \
                         recorded without it): {e}"
                    );
                }
            }
        }
        if changed == 1 {
            // Its end is recorded now: a "may be stuck" after it would be false.
            withdraw_running_long(&tx, row)?;
            if let Some(notice) = &settlement.notice {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO notices(key, row, session, item, end_kind, exit_code,
                                                   signal, text, tail, created_at)
                     SELECT 'end:' || row, row, session, id, ?2, ?3, ?4, ?5, ?6, ?7
                     FROM items WHERE row = ?1",
                )?
                .execute(params![
                    row,
                    end_str(settlement.end),
                    settlement.exit_code,
                    settlement.signal,
                    notice.text,
                    notice.tail,
                    settlement.ended_at,
                ])?;
            }
        }
        tx.commit()?;
        self.keep_reserve()?;
        Ok(changed == 1)
    }

    pub fn get(&self, row: i64) -> Result<Option<Record>> {
        let sql = format!("SELECT {RECORD_COLUMNS} FROM items WHERE row = ?1");
        Ok(self
            .conn
            .prepare_cached(&sql)?
            .query_row([row], record)
            .optional()?)
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
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([session], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every session's records, by session then row: running ones, or all not
    /// dismissed with `all` (`list --all-sessions`).
    pub fn list_every_session(&self, all: bool) -> Result<Vec<Record>> {
        let filter = if all {
            "dismissed = 0"
        } else {
            "state != 'ended'"
        };
        let sql =
            format!("SELECT {RECORD_COLUMNS} FROM items WHERE {filter} ORDER BY session, row");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Whether any record (of any state, dismissed or not) belongs to `session` or
    /// to one of its sub-agents.
    pub fn session_used(&self, session: &str) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS(SELECT 1 FROM items WHERE session IN {})",
            sessions::tree("?1")
        );
        Ok(self
            .conn
            .prepare_cached(&sql)?
            .query_row([session], |r| r.get(0))?)
    }

    /// How many records of every session have not ended (the daemon-wide cap).
    pub fn count_unsettled(&self) -> Result<usize> {
        let n: i64 = self
            .conn
            .prepare_cached(
                // (The live states: `IN` uses the index on state, `!=` would read every row.)
                "SELECT COUNT(*) FROM items WHERE state IN ('starting', 'running')",
            )?
            .query_row([], |r| r.get(0))?;
        Ok(n as usize)
    }

    /// Every record not yet ended, of every session (for reconciling after a start).
    pub fn unsettled(&self) -> Result<Vec<Record>> {
        let sql = format!("SELECT {RECORD_COLUMNS} FROM items WHERE state != 'ended' ORDER BY row");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn cursor(&self, session: &str, row: i64) -> Result<u64> {
        let offset: Option<i64> = self
            .conn
            .prepare_cached("SELECT offset FROM cursors WHERE session = ?1 AND row = ?2")?
            .query_row(params![session, row], |r| r.get(0))
            .optional()?;
        Ok(offset.unwrap_or(0) as u64)
    }

    pub fn set_cursor(&mut self, session: &str, row: i64, offset: u64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO cursors(session, row, offset) VALUES (?1, ?2, ?3)
             ON CONFLICT(session, row) DO UPDATE SET offset = excluded.offset",
            )?
            .execute(params![session, row, offset as i64])?;
        Ok(())
    }

    pub fn dismiss(&mut self, row: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE items SET dismissed = 1 WHERE row = ?1")?
            .execute([row])?;
        Ok(())
    }

    /// Ended records that ended before `before_ms`, oldest first, leaving out those
    /// with a notice not yet delivered (gc must never take a notice nobody saw).
    pub fn ended_before(&self, before_ms: i64) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {RECORD_COLUMNS} FROM items WHERE state = 'ended' AND ended_at < ?1
               AND NOT EXISTS (SELECT 1 FROM notices
                               WHERE notices.row = items.row AND delivered_at IS NULL)
             ORDER BY ended_at"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([before_ms], record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Deletes a record with its cursors and notices; its id is never reused.
    pub fn delete(&mut self, row: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.prepare_cached("DELETE FROM cursors WHERE row = ?1")?
            .execute([row])?;
        tx.prepare_cached("DELETE FROM notices WHERE row = ?1")?
            .execute([row])?;
        tx.prepare_cached("DELETE FROM restarts WHERE row = ?1")?
            .execute([row])?;
        tx.prepare_cached("DELETE FROM items WHERE row = ?1")?
            .execute([row])?;
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
        kind: parse_kind(3, &r.get::<_, String>(3)?)?,
        state: parse_state(4, &r.get::<_, String>(4)?)?,
        end: r
            .get::<_, Option<String>>(5)?
            .map(|e| parse_end(5, &e))
            .transpose()?,
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
        stop_actor: r
            .get::<_, Option<String>>(17)?
            .map(|a| parse_actor(17, &a))
            .transpose()?,
        dropped: r.get::<_, i64>(18)? as u64,
        log_len: r.get::<_, i64>(19)? as u64,
        end_detail: r.get(20)?,
        cols: r.get(21)?,
        rows: r.get(22)?,
        unwritten: r.get::<_, i64>(23)? as u64,
        unwritten_at: r.get::<_, i64>(24)? as u64,
        cpu_ms: r.get::<_, Option<i64>>(25)?.map(|n| n.max(0) as u64),
        peak_rss: r.get::<_, Option<i64>>(26)?.map(|n| n.max(0) as u64),
        quiet_after_ms: r.get::<_, Option<i64>>(27)?.map(|n| n.max(0) as u64),
        max_runtime_ms: r.get::<_, Option<i64>>(28)?.map(|n| n.max(0) as u64),
        restart: r
            .get::<_, Option<String>>(29)?
            .map(|text| restarts::parse(29, &text))
            .transpose()?,
        created_at: r.get(30)?,
    })
}

/// The highest number AUTOINCREMENT has given in `table`.
fn sequence(conn: &Connection, table: &str) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = ?1")?
        .query_row([table], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// The numbers reserved in a home's `work.ids` file (0 when it has none).
/// The token of the database a home's `work.ids` was written for.
fn read_token(path: &std::path::Path) -> Option<i64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("token ")?.trim().parse().ok())
}

/// A number that names one database of a home (from the kernel's random source, or
/// the clock and pid where it cannot be read).
fn new_token() -> i64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    match random {
        Ok(()) => i64::from_le_bytes(bytes) & i64::MAX,
        Err(_) => crate::paths::now_ms() ^ ((std::process::id() as i64) << 40),
    }
}

fn read_reserve(path: &std::path::Path) -> (i64, i64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let value = |name: &str| {
        text.lines()
            .filter_map(|line| line.strip_prefix(name)?.trim().parse::<i64>().ok())
            .max()
            .unwrap_or(0)
    };
    (value("rows "), value("notices "))
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

/// A column whose text is none of the values this build writes: the row is refused
/// (a database from a newer build, or damaged), never read as some default.
fn unknown(column: usize, text: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        column,
        rusqlite::types::Type::Text,
        format!("unknown value {text:?}").into(),
    )
}

fn parse_kind(column: usize, text: &str) -> rusqlite::Result<Kind> {
    Ok(match text {
        "job" => Kind::Job,
        "pane" => Kind::Pane,
        "monitor" => Kind::Monitor,
        "sub_agent" => Kind::SubAgent,
        _ => return Err(unknown(column, text)),
    })
}

fn parse_state(column: usize, text: &str) -> rusqlite::Result<State> {
    Ok(match text {
        "starting" => State::Starting,
        "running" => State::Running,
        "ended" => State::Ended,
        "waiting" => State::Waiting,
        _ => return Err(unknown(column, text)),
    })
}

fn parse_actor(column: usize, text: &str) -> rusqlite::Result<Actor> {
    Ok(match text {
        "agent" => Actor::Agent,
        "person" => Actor::Person,
        _ => return Err(unknown(column, text)),
    })
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

fn parse_end(column: usize, text: &str) -> rusqlite::Result<End> {
    ENDS.iter()
        .find(|(_, s)| *s == text)
        .map(|(e, _)| *e)
        .ok_or_else(|| unknown(column, text))
}

/// Withdraws the running-long warnings (of any of its runs) of `row` not yet taken by
/// anyone: once a run's end is recorded, whether the item's or one a restart policy
/// starts again, a "may be stuck" about it would be false.
pub(crate) fn withdraw_running_long(tx: &rusqlite::Transaction<'_>, row: i64) -> Result<()> {
    tx.prepare_cached(
        "DELETE FROM notices
             WHERE (key = 'overrun:' || ?1 OR key LIKE 'overrun:' || ?1 || ':%')
             AND delivered_at IS NULL AND claim IS NULL",
    )?
    .execute([row])?;
    Ok(())
}
