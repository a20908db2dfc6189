//! The schema, as an ordered list of migrations counted in `PRAGMA user_version`.

use super::{Result, StoreError};
use rusqlite::Connection;

/// Each entry moves the schema one version up; never edit one that has shipped.
const MIGRATIONS: &[&str] = &[
    // 1: records, id counters, read cursors, the notices outbox.
    "CREATE TABLE items(
        row         INTEGER PRIMARY KEY,
        session     TEXT NOT NULL,
        id          TEXT NOT NULL,
        kind        TEXT NOT NULL,
        state       TEXT NOT NULL,
        end_kind    TEXT,
        exit_code   INTEGER,
        signal      INTEGER,
        name        TEXT,
        command     TEXT NOT NULL,
        cwd         TEXT NOT NULL,
        pid         INTEGER,
        started_at  INTEGER NOT NULL,
        ended_at    INTEGER,
        notify      INTEGER NOT NULL,
        env_names   TEXT NOT NULL,
        job_dir     TEXT NOT NULL,
        stop_actor  TEXT,
        dropped     INTEGER NOT NULL DEFAULT 0,
        log_len     INTEGER NOT NULL DEFAULT 0,
        dismissed   INTEGER NOT NULL DEFAULT 0,
        lost_reason TEXT,
        UNIQUE(session, id)
    );
    CREATE INDEX items_by_state ON items(state);
    CREATE TABLE counters(
        session TEXT NOT NULL,
        prefix  TEXT NOT NULL,
        next    INTEGER NOT NULL,
        PRIMARY KEY(session, prefix)
    );
    CREATE TABLE cursors(
        session TEXT NOT NULL,
        row     INTEGER NOT NULL,
        offset  INTEGER NOT NULL,
        PRIMARY KEY(session, row)
    );
    CREATE TABLE notices(
        nrow         INTEGER PRIMARY KEY,
        key          TEXT NOT NULL UNIQUE,
        row          INTEGER NOT NULL,
        session      TEXT NOT NULL,
        item         TEXT NOT NULL,
        end_kind     TEXT NOT NULL,
        exit_code    INTEGER,
        signal       INTEGER,
        text         TEXT NOT NULL,
        tail         TEXT NOT NULL,
        created_at   INTEGER NOT NULL,
        delivered_at INTEGER
    );
    CREATE INDEX notices_pending ON notices(session) WHERE delivered_at IS NULL;",
    // 2: a pane's terminal size.
    "ALTER TABLE items ADD COLUMN cols INTEGER;
    ALTER TABLE items ADD COLUMN rows INTEGER;",
    // 3: monitors, and notices that stand for several events (a watch's matches).
    "CREATE TABLE monitors(
        row         INTEGER PRIMARY KEY,
        mode        TEXT NOT NULL,
        condition   TEXT NOT NULL,
        target      TEXT NOT NULL,
        target_row  INTEGER,
        regex       TEXT,
        deadline_at INTEGER,
        offset      INTEGER NOT NULL DEFAULT 0,
        matches     INTEGER NOT NULL DEFAULT 0
    );
    ALTER TABLE notices ADD COLUMN count INTEGER NOT NULL DEFAULT 1;",
    // 4: rows and notice ids never reused (AUTOINCREMENT), a floor under new ids (after
    //    a lost database), and output bytes that could not be written (a full disk).
    "CREATE TABLE items_v4(
        row         INTEGER PRIMARY KEY AUTOINCREMENT,
        session     TEXT NOT NULL,
        id          TEXT NOT NULL,
        kind        TEXT NOT NULL,
        state       TEXT NOT NULL,
        end_kind    TEXT,
        exit_code   INTEGER,
        signal      INTEGER,
        name        TEXT,
        command     TEXT NOT NULL,
        cwd         TEXT NOT NULL,
        pid         INTEGER,
        started_at  INTEGER NOT NULL,
        ended_at    INTEGER,
        notify      INTEGER NOT NULL,
        env_names   TEXT NOT NULL,
        job_dir     TEXT NOT NULL,
        stop_actor  TEXT,
        dropped     INTEGER NOT NULL DEFAULT 0,
        log_len     INTEGER NOT NULL DEFAULT 0,
        dismissed   INTEGER NOT NULL DEFAULT 0,
        lost_reason TEXT,
        cols        INTEGER,
        rows        INTEGER,
        UNIQUE(session, id)
    );
    INSERT INTO items_v4 SELECT * FROM items;
    DROP TABLE items;
    ALTER TABLE items_v4 RENAME TO items;
    CREATE INDEX items_by_state ON items(state);
    ALTER TABLE items ADD COLUMN unwritten INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE items ADD COLUMN unwritten_at INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE notices_v4(
        nrow         INTEGER PRIMARY KEY AUTOINCREMENT,
        key          TEXT NOT NULL UNIQUE,
        row          INTEGER NOT NULL,
        session      TEXT NOT NULL,
        item         TEXT NOT NULL,
        end_kind     TEXT NOT NULL,
        exit_code    INTEGER,
        signal       INTEGER,
        text         TEXT NOT NULL,
        tail         TEXT NOT NULL,
        created_at   INTEGER NOT NULL,
        delivered_at INTEGER,
        count        INTEGER NOT NULL DEFAULT 1
    );
    INSERT INTO notices_v4 SELECT * FROM notices;
    DROP TABLE notices;
    ALTER TABLE notices_v4 RENAME TO notices;
    CREATE INDEX notices_pending ON notices(session) WHERE delivered_at IS NULL;
    CREATE TABLE home(
        key   TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    );",
    // 5: the file a watch follows (device, inode, and the bytes just before its offset),
    // and how long its event log was at its last recorded progress.
    "ALTER TABLE monitors ADD COLUMN file_dev INTEGER;
    ALTER TABLE monitors ADD COLUMN file_ino INTEGER;
    ALTER TABLE monitors ADD COLUMN file_tail BLOB;
    ALTER TABLE monitors ADD COLUMN log_len INTEGER;",
    // 6: claims: the daemon connection a pending notice is being delivered on.
    "ALTER TABLE notices ADD COLUMN claim INTEGER;
    CREATE INDEX notices_claimed ON notices(claim) WHERE claim IS NOT NULL;",
    // 7: the sessions bgwork made for sub-agents, with their parents (never inferred
    // from a name); those of existing sub-agents are filled in.
    "CREATE TABLE sessions(
        name      TEXT PRIMARY KEY,
        parent    TEXT NOT NULL,
        agent_row INTEGER NOT NULL
    );
    CREATE INDEX sessions_by_parent ON sessions(parent);
    INSERT OR IGNORE INTO sessions(name, parent, agent_row)
        SELECT session || '/' || id, session, row FROM items WHERE kind = 'sub_agent';",
    // 8: what a job cost (CPU time, peak memory) and the limits it was started with
    // (quiet-after, max-runtime), kept with the record so a restarted daemon keeps them.
    "ALTER TABLE items ADD COLUMN cpu_ms INTEGER;
    ALTER TABLE items ADD COLUMN peak_rss INTEGER;
    ALTER TABLE items ADD COLUMN quiet_after_ms INTEGER;
    ALTER TABLE items ADD COLUMN max_runtime_ms INTEGER;",
    // 9: the run history: each ended job or pane under its folder and normalised
    // command (see `store/history.rs`), kept apart from the records `gc` deletes.
    "CREATE TABLE runs(
        hrow        INTEGER PRIMARY KEY AUTOINCREMENT,
        cwd         TEXT NOT NULL,
        command     TEXT NOT NULL,
        session     TEXT NOT NULL,
        item        TEXT NOT NULL,
        started_at  INTEGER NOT NULL,
        ended_at    INTEGER NOT NULL,
        duration_ms INTEGER,
        end_kind    TEXT NOT NULL,
        exit_code   INTEGER,
        signal      INTEGER
    );
    CREATE INDEX runs_by_command ON runs(cwd, command, hrow);",
    // 10: the session of each harness process (its hooks' session, or the one its MCP
    // servers made), so that its MCP servers join its hooks and a restarted server
    // finds its work (contract §11).
    "CREATE TABLE harness_sessions(
        session        TEXT PRIMARY KEY,
        pid            INTEGER NOT NULL,
        started        INTEGER NOT NULL,
        boot           TEXT NOT NULL,
        by_hook        INTEGER NOT NULL,
        server_pid     INTEGER,
        server_started INTEGER,
        bound_at       INTEGER NOT NULL
    );
    CREATE INDEX harness_sessions_by_process ON harness_sessions(pid, started);",
    // 11: restart policies (`start --restart on-failure`): one row per job that has
    // one, with where it is in it (see `store/restarts.rs`).
    "CREATE TABLE restarts(
        row            INTEGER PRIMARY KEY,
        max_restarts   INTEGER NOT NULL,
        backoff_min_ms INTEGER NOT NULL,
        backoff_max_ms INTEGER NOT NULL,
        restarts       INTEGER NOT NULL DEFAULT 0,
        runs_ended     INTEGER NOT NULL DEFAULT 0,
        last_end       TEXT,
        last_exit_code INTEGER,
        last_signal    INTEGER,
        last_ended_at  INTEGER,
        next_at        INTEGER,
        run_started_at INTEGER,
        refused        TEXT
    );",
    // 12: when a record was made, apart from when it started running (a waiting item,
    // `start --after`, starts later; NULL: when it started).
    "ALTER TABLE items ADD COLUMN created_at INTEGER;",
];

pub fn migrate(conn: &Connection) -> Result<()> {
    let known = MIGRATIONS.len() as i64;
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = index as i64 + 1;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {sql}; PRAGMA user_version = {version}; COMMIT;"
        ))?;
    }
    Ok(())
}
