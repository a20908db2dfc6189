//! Harness sessions: which session each harness process speaks for (see
//! [`crate::harness`]). A hook binds its session to its harness process (`by_hook`);
//! an MCP server with no hook to join makes a session of its own and binds it, with
//! itself as its `server`, so that a server started again under the same harness
//! process takes it over once the first one is gone.

use super::{Result, Store};
use crate::wire::ProcessKey;
use rusqlite::{params, Row};

/// One session bound to a harness process.
#[derive(Debug, Clone)]
pub struct HarnessBinding {
    pub session: String,
    pub harness: ProcessKey,
    /// Bound by a hook (the harness's own session), not made by an MCP server.
    pub by_hook: bool,
    /// The MCP server that made it and holds it (pid, start time), when not a hook's.
    pub server: Option<(u32, u64)>,
    pub bound_at: i64,
}

const COLUMNS: &str = "session, pid, started, boot, by_hook, server_pid, server_started, bound_at";

impl Store {
    /// Binds `session` to the harness process `harness` (a hook's word: it replaces
    /// what the session was bound to).
    pub fn bind_hook_session(
        &mut self,
        session: &str,
        harness: &ProcessKey,
        at: i64,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO harness_sessions(session, pid, started, boot, by_hook, bound_at)
                 VALUES (?1, ?2, ?3, ?4, 1, ?5)
                 ON CONFLICT(session) DO UPDATE SET pid = ?2, started = ?3, boot = ?4,
                     by_hook = 1, server_pid = NULL, server_started = NULL, bound_at = ?5",
            )?
            .execute(params![
                session,
                harness.pid,
                harness.started as i64,
                harness.boot,
                at
            ])?;
        Ok(())
    }

    /// Binds a session an MCP server made to its harness process, held by `server`.
    pub fn bind_server_session(
        &mut self,
        session: &str,
        harness: &ProcessKey,
        server: &ProcessKey,
        at: i64,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO harness_sessions(session, pid, started, boot, by_hook,
                                                         server_pid, server_started, bound_at)
                 VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7)",
            )?
            .execute(params![
                session,
                harness.pid,
                harness.started as i64,
                harness.boot,
                server.pid,
                server.started as i64,
                at
            ])?;
        Ok(())
    }

    /// Hands a server's session to `server` when `before` still holds it (the server
    /// that made it is gone); false when another took it first.
    pub fn take_over_server_session(
        &mut self,
        session: &str,
        before: (u32, u64),
        server: &ProcessKey,
        at: i64,
    ) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE harness_sessions SET server_pid = ?4, server_started = ?5, bound_at = ?6
                 WHERE session = ?1 AND by_hook = 0 AND server_pid = ?2 AND server_started = ?3",
            )?
            .execute(params![
                session,
                before.0,
                before.1 as i64,
                server.pid,
                server.started as i64,
                at
            ])?;
        Ok(changed == 1)
    }

    /// The sessions bound to the harness process `harness`, newest first.
    pub fn harness_bindings(&self, harness: &ProcessKey) -> Result<Vec<HarnessBinding>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM harness_sessions
             WHERE pid = ?1 AND started = ?2 AND boot = ?3 ORDER BY bound_at DESC, session"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(
            params![harness.pid, harness.started as i64, harness.boot],
            binding,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every binding (to forget those whose harness process is gone).
    pub fn all_harness_bindings(&self) -> Result<Vec<HarnessBinding>> {
        let sql = format!("SELECT {COLUMNS} FROM harness_sessions");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], binding)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Whether `session` is bound to a harness process.
    pub fn harness_session_bound(&self, session: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM harness_sessions WHERE session = ?1)")?
            .query_row([session], |r| r.get(0))?)
    }

    /// Forgets the binding of `session` to the process `harness` (that process is gone).
    pub fn forget_harness_binding(&mut self, session: &str, harness: &ProcessKey) -> Result<()> {
        self.conn
            .prepare_cached(
                "DELETE FROM harness_sessions
                 WHERE session = ?1 AND pid = ?2 AND started = ?3 AND boot = ?4",
            )?
            .execute(params![
                session,
                harness.pid,
                harness.started as i64,
                harness.boot
            ])?;
        Ok(())
    }
}

fn binding(r: &Row) -> rusqlite::Result<HarnessBinding> {
    let server_pid: Option<u32> = r.get(5)?;
    let server_started: Option<i64> = r.get(6)?;
    Ok(HarnessBinding {
        session: r.get(0)?,
        harness: ProcessKey {
            pid: r.get(1)?,
            started: r.get::<_, i64>(2)? as u64,
            boot: r.get(3)?,
        },
        by_hook: r.get(4)?,
        server: server_pid.zip(server_started.map(|s| s as u64)),
        bound_at: r.get(7)?,
    })
}
