//! Sessions and the sub-agents they start. A sub-agent's session (`PARENT/sub-N`) is
//! recorded with its parent when bgwork makes it; parenthood is never read from a name,
//! so a session a person names `proj/feature` is no sub-agent of `proj`.
//!
//! Three rules rest on that record:
//! - a session sees its own work and the work of its sub-agents' sessions, nested
//!   ones included ([`tree`]);
//! - a notice goes to the session that owns its item; when that is a sub-agent that has
//!   ended (nobody is left to hear it), to the nearest ancestor still there
//!   ([`recipients`]);
//! - limits count the work of a whole tree against its root session ([`Store::root_of`]).

use super::{record, Record, Result, Store, RECORD_COLUMNS};
use rusqlite::{params, OptionalExtension};

/// Nested sub-agents a chain may hold at most (a guard: the limits stop it sooner).
const MAX_DEPTH: usize = 64;

/// The name of the session bgwork makes for sub-agent `id` of `parent`.
pub fn sub_session_name(parent: &str, id: &str) -> String {
    format!("{parent}/{id}")
}

/// SQL: the names of session `param` and of every sub-agent session under it.
pub(super) fn tree(param: &str) -> String {
    format!(
        "(WITH RECURSIVE tree(name) AS (
            SELECT {param}
            UNION SELECT s.name FROM sessions s JOIN tree t ON s.parent = t.name
         ) SELECT name FROM tree)"
    )
}

/// SQL: the sessions whose notices go to session `param`: its own, and those of its
/// sub-agents that have ended (and of theirs, as long as each one on the way has ended).
pub(super) fn recipients(param: &str) -> String {
    format!(
        "(WITH RECURSIVE orphaned(name) AS (
            SELECT {param}
            UNION SELECT s.name FROM sessions s JOIN orphaned o ON s.parent = o.name
                  WHERE NOT EXISTS (SELECT 1 FROM items a
                                    WHERE a.row = s.agent_row AND a.state != 'ended')
         ) SELECT name FROM orphaned)"
    )
}

impl Store {
    /// Writes a sub-agent's record and registers its session under `new.session`, in
    /// one transaction. Returns the record and the sub-agent's session name.
    pub fn insert_sub_agent(&mut self, new: &super::NewRecord) -> Result<(Record, String)> {
        let mut name = String::new();
        let record = self.insert_with(new, |tx, row, id| {
            name = sub_session_name(&new.session, id);
            tx.prepare_cached("INSERT INTO sessions(name, parent, agent_row) VALUES (?1, ?2, ?3)")?
                .execute(params![name, new.session, row])?;
            Ok(())
        })?;
        Ok((record, name))
    }

    /// Whether bgwork made `name` for a sub-agent.
    pub fn is_sub_agent_session(&self, name: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM sessions WHERE name = ?1")?
            .query_row([name], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// The session at the top of `session`'s chain of parents (itself when it is no
    /// sub-agent's): the one whose limits its work counts against.
    pub fn root_of(&self, session: &str) -> Result<String> {
        let root: Option<String> = self
            .conn
            .prepare_cached(&format!(
                "WITH RECURSIVE up(name, depth) AS (
                        SELECT ?1, 0
                        UNION ALL SELECT s.parent, up.depth + 1 FROM sessions s
                              JOIN up ON s.name = up.name WHERE up.depth < {MAX_DEPTH}
                     ) SELECT name FROM up ORDER BY depth DESC LIMIT 1"
            ))?
            .query_row([session], |r| r.get(0))
            .optional()?;
        Ok(root.unwrap_or_else(|| session.to_string()))
    }

    /// The record `id` of session `owner`, when `owner` is `viewer` or a sub-agent
    /// session under it.
    pub fn find_in(&self, viewer: &str, owner: &str, id: &str) -> Result<Option<Record>> {
        let sql = format!(
            "SELECT {RECORD_COLUMNS} FROM items
             WHERE session = ?2 AND id = ?3 AND ?2 IN {}",
            tree("?1")
        );
        Ok(self
            .conn
            .prepare_cached(&sql)?
            .query_row(params![viewer, owner, id], record)
            .optional()?)
    }
}
