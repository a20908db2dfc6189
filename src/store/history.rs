//! The run history (see [`crate::history`]): one row per ended job or pane, keyed by
//! its folder and its normalised command, written in the transaction of its end and
//! kept within [`RUNS_KEPT`] a command and [`RUNS_TOTAL`] a home. `gc` of records
//! leaves it alone.

use super::{end_str, parse_end, EndRecord, Result, Store};
use crate::history::{normalise, normalise_folder, Run, RUNS_KEPT, RUNS_TOTAL};
use crate::wire::End;
use rusqlite::{params, OptionalExtension, Transaction};

/// The most commands of one folder a history listing names (the most recently run).
pub const COMMANDS_LISTED: usize = 200;

/// Adds the run that `row` ended with (inside the transaction of its end), and drops
/// what falls past the bounds. Only jobs and panes have runs, and a command that could
/// not start has none.
pub(super) fn add_run(tx: &Transaction, row: i64, settlement: &EndRecord) -> Result<()> {
    if settlement.end == End::SpawnFailed {
        return Ok(());
    }
    let found: Option<(String, String, String, String, String, i64)> = tx
        .prepare_cached(
            // A job started again by its restart policy: its run began at that start.
            "SELECT kind, session, id, command, cwd,
                    COALESCE((SELECT run_started_at FROM restarts WHERE restarts.row = items.row),
                             started_at)
             FROM items WHERE row = ?1",
        )?
        .query_row([row], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .optional()?;
    let Some((kind, session, id, command, cwd, started_at)) = found else {
        return Ok(());
    };
    if kind != "job" && kind != "pane" {
        return Ok(());
    }
    let (cwd, command) = (normalise_folder(&cwd), normalise(&command));
    // A lost item's end is when the daemon found out, not when the work ended.
    let duration = (settlement.end != End::Lost)
        .then(|| settlement.ended_at.saturating_sub(started_at).max(0));
    tx.prepare_cached(
        "INSERT INTO runs(cwd, command, session, item, started_at, ended_at, duration_ms,
                          end_kind, exit_code, signal)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        cwd,
        command,
        session,
        id,
        started_at,
        settlement.ended_at,
        duration,
        end_str(settlement.end),
        settlement.exit_code,
        settlement.signal,
    ])?;
    let newest = tx.last_insert_rowid();
    tx.prepare_cached(
        "DELETE FROM runs WHERE cwd = ?1 AND command = ?2 AND hrow <=
            (SELECT hrow FROM runs WHERE cwd = ?1 AND command = ?2
             ORDER BY hrow DESC LIMIT 1 OFFSET ?3)",
    )?
    .execute(params![cwd, command, RUNS_KEPT as i64])?;
    tx.prepare_cached("DELETE FROM runs WHERE hrow <= ?1")?
        .execute([newest - RUNS_TOTAL])?;
    Ok(())
}

impl Store {
    /// The kept runs of `command` in `cwd` (both normalised here), newest first.
    pub fn runs(&self, cwd: &str, command: &str) -> Result<Vec<Run>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT session, item, started_at, ended_at, duration_ms, end_kind, exit_code,
                    signal
             FROM runs WHERE cwd = ?1 AND command = ?2 ORDER BY hrow DESC LIMIT ?3",
        )?;
        let rows = stmt.query_map(
            params![normalise_folder(cwd), normalise(command), RUNS_KEPT as i64],
            |r| {
                Ok(Run {
                    session: r.get(0)?,
                    item: r.get(1)?,
                    started_at: r.get(2)?,
                    ended_at: r.get(3)?,
                    duration_ms: r.get::<_, Option<i64>>(4)?.map(|n| n.max(0) as u64),
                    end: parse_end(5, &r.get::<_, String>(5)?)?,
                    exit_code: r.get(6)?,
                    signal: r.get(7)?,
                })
            },
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The commands (normalised) with runs in `cwd`, the most recently ended first, at
    /// most [`COMMANDS_LISTED`].
    pub fn run_commands(&self, cwd: &str) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT command FROM runs WHERE cwd = ?1 GROUP BY command
             ORDER BY max(hrow) DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(
            params![normalise_folder(cwd), COMMANDS_LISTED as i64],
            |r| r.get(0),
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
