//! The run history (see [`crate::history`]): one row per ended job or pane, keyed by
//! its folder and its normalised command, written in the transaction of its end and
//! kept within [`RUNS_KEPT`] a command and [`RUNS_TOTAL`] a home. `gc` of records
//! leaves it alone.

use super::{end_str, parse_end, EndRecord, Result, Store};
use crate::history::{key, normalise_folder, Run, RUNS_KEPT, RUNS_TOTAL};
use crate::wire::End;
use rusqlite::{params, Connection, OptionalExtension};
use std::sync::atomic::{AtomicBool, Ordering};

/// The most commands of one folder a history listing names (the most recently run).
pub const COMMANDS_LISTED: usize = 200;

/// Adds the run that `row` ended with (inside a savepoint of the transaction of its end:
/// see `Store::settle`, where a failure here never keeps the end from being recorded),
/// and drops what falls past the bounds. Only jobs and panes have runs, and a command
/// that could not start has none.
pub(super) fn add_run(tx: &Connection, row: i64, settlement: &EndRecord) -> Result<()> {
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
    let (cwd, command) = (normalise_folder(&cwd), key(&command));
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
    /// The kept runs of `command` in `cwd` (both made keys here), newest first. A row
    /// this build cannot read (an end it does not know, a column of another type) is
    /// skipped, said once in the daemon's log: it never costs the command its history.
    pub fn runs(&self, cwd: &str, command: &str) -> Result<Vec<Run>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT session, item, started_at, ended_at, duration_ms, end_kind, exit_code,
                    signal
             FROM runs WHERE cwd = ?1 AND command = ?2 ORDER BY hrow DESC LIMIT ?3",
        )?;
        let rows = stmt.query_map(
            params![normalise_folder(cwd), key(command), RUNS_KEPT as i64],
            |r| Ok(read_run(r)),
        )?;
        let mut runs = Vec::new();
        for row in rows {
            match row? {
                Ok(run) => runs.push(run),
                Err(why) => {
                    static SAID: AtomicBool = AtomicBool::new(false);
                    if !SAID.swap(true, Ordering::Relaxed) {
                        crate::note!(
                            "bgwork daemon: a kept run cannot be read ({why}): such runs \
                             are left out of the history"
                        );
                    }
                }
            }
        }
        Ok(runs)
    }

    /// The commands (keys) with runs in `cwd`, the most recently ended first, at
    /// most [`COMMANDS_LISTED`]; and how many more there are.
    pub fn run_commands(&self, cwd: &str) -> Result<(Vec<String>, u64)> {
        let cwd = normalise_folder(cwd);
        let mut stmt = self.conn.prepare_cached(
            "SELECT command FROM runs WHERE cwd = ?1 GROUP BY command
             ORDER BY max(hrow) DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![cwd, COMMANDS_LISTED as i64], |r| r.get(0))?;
        let listed: Vec<String> = rows.collect::<rusqlite::Result<_>>()?;
        let all: i64 = self
            .conn
            .prepare_cached("SELECT count(DISTINCT command) FROM runs WHERE cwd = ?1")?
            .query_row([&cwd], |r| r.get(0))?;
        let more = (all.max(0) as u64).saturating_sub(listed.len() as u64);
        Ok((listed, more))
    }
}

/// One kept run, or why this build cannot read it.
fn read_run(r: &rusqlite::Row<'_>) -> std::result::Result<Run, String> {
    let why = |e: rusqlite::Error| e.to_string();
    let end: String = r.get(5).map_err(why)?;
    let end =
        parse_end(5, &end).map_err(|_| format!("an end this bgwork does not know: {end:?}"))?;
    Ok(Run {
        session: r.get(0).map_err(why)?,
        item: r.get(1).map_err(why)?,
        started_at: r.get(2).map_err(why)?,
        ended_at: r.get(3).map_err(why)?,
        duration_ms: r
            .get::<_, Option<i64>>(4)
            .map_err(why)?
            .map(|n| n.max(0) as u64),
        end,
        exit_code: r.get(6).map_err(why)?,
        signal: r.get(7).map_err(why)?,
    })
}

/// Makes every kept command a key as this build makes them, so that runs kept before
/// hold no token shape (masked as readers mask them). Run at each open: a command that
/// is already a key is left as it is, and only one that may hold a shape is looked at.
pub(super) fn rekey_runs(conn: &Connection) -> Result<()> {
    let mut found = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT hrow, command FROM runs")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let command: String = row.get(1)?;
            if !crate::redact::may_hold_shapes(command.as_bytes()) {
                continue;
            }
            let rekeyed = key(&command);
            if rekeyed != command {
                found.push((row.get::<_, i64>(0)?, rekeyed));
            }
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    for (hrow, command) in &found {
        tx.prepare_cached("UPDATE runs SET command = ?2 WHERE hrow = ?1")?
            .execute(params![hrow, command])?;
    }
    tx.commit()?;
    Ok(())
}
