//! Restart policies (`start --restart on-failure`): one row per job that has one, with
//! where it is in it. A run that ends and will be started again is recorded here (and
//! as a run of the history) in one transaction; the record itself stays unended until
//! its last run's end is settled (`Store::settle`).
//!
//! `runs_ended` counts the runs whose end was recorded here, `restarts` the starts
//! again that the daemon decided: a job waits out its back-off while
//! `runs_ended > restarts`. Both only grow, and each change names the count it
//! expects, so a message told twice (before and after a daemon restart) changes
//! nothing the second time.

use super::{end_str, history, parse_end, EndRecord, Result, Store};
use crate::wire::End;
use rusqlite::params;

/// Where a job with a restart policy is in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartState {
    pub max_restarts: u32,
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
    /// The starts again decided so far (each one admitted).
    pub restarts: u32,
    /// The runs whose end was recorded here (the last run's end is the record's).
    pub runs_ended: u32,
    pub last_end: Option<End>,
    pub last_exit_code: Option<i32>,
    pub last_signal: Option<i32>,
    pub last_ended_at: Option<i64>,
    /// While it waits out its back-off: when it is tried again.
    pub next_at: Option<i64>,
    /// When its current run started (none: the record's start).
    pub run_started_at: Option<i64>,
    /// Why the last attempt was not admitted.
    pub refused: Option<String>,
}

impl RestartState {
    /// A run has ended and the job waits to be started again.
    pub fn waiting(&self) -> bool {
        self.runs_ended > self.restarts
    }
}

impl super::Record {
    /// When its current run started: its start, or the latest start again of its
    /// restart policy.
    pub fn run_started_at(&self) -> i64 {
        self.restart
            .as_ref()
            .and_then(|state| state.run_started_at)
            .unwrap_or(self.started_at)
    }
}

/// The one column [`super::RECORD_COLUMNS`] selects (a JSON array, or NULL).
pub(super) fn parse(column: usize, text: &str) -> rusqlite::Result<RestartState> {
    let bad = |why: &str| {
        rusqlite::Error::FromSqlConversionFailure(
            column,
            rusqlite::types::Type::Text,
            format!("restart state {text:?}: {why}").into(),
        )
    };
    let values: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|_| bad("not JSON"))?;
    if values.len() != 12 {
        return Err(bad("not 12 values"));
    }
    let int = |i: usize| values[i].as_i64();
    let count = |i: usize| int(i).and_then(|n| u32::try_from(n).ok());
    let ms = |i: usize| int(i).map(|n| n.max(0) as u64);
    let last_end = match values[5].as_str() {
        Some(end) => Some(parse_end(column, end)?),
        None => None,
    };
    Ok(RestartState {
        max_restarts: count(0).ok_or_else(|| bad("max_restarts"))?,
        backoff_min_ms: ms(1).ok_or_else(|| bad("backoff_min_ms"))?,
        backoff_max_ms: ms(2).ok_or_else(|| bad("backoff_max_ms"))?,
        restarts: count(3).ok_or_else(|| bad("restarts"))?,
        runs_ended: count(4).ok_or_else(|| bad("runs_ended"))?,
        last_end,
        last_exit_code: int(6).and_then(|n| i32::try_from(n).ok()),
        last_signal: int(7).and_then(|n| i32::try_from(n).ok()),
        last_ended_at: int(8),
        next_at: int(9),
        run_started_at: int(10),
        refused: values[11].as_str().map(str::to_string),
    })
}

/// Whether `row` waits out its back-off (inside a transaction).
pub(super) fn waiting_in(tx: &rusqlite::Transaction, row: i64) -> Result<bool> {
    use rusqlite::OptionalExtension;
    let waiting: Option<bool> = tx
        .prepare_cached("SELECT runs_ended > restarts FROM restarts WHERE row = ?1")?
        .query_row([row], |r| r.get(0))
        .optional()?;
    Ok(waiting.unwrap_or(false))
}

impl Store {
    /// Gives `row` its restart policy (when its record is written).
    pub fn set_restart_policy(
        &mut self,
        row: i64,
        max_restarts: u32,
        backoff_min_ms: u64,
        backoff_max_ms: u64,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO restarts(row, max_restarts, backoff_min_ms, backoff_max_ms)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                row,
                max_restarts,
                backoff_min_ms as i64,
                backoff_max_ms as i64
            ])?;
        Ok(())
    }

    /// Records that run `run` (0 for the first) of `row` ended as `settlement` says and
    /// will be started again at `next_at`: its run of the history and its last end,
    /// in one transaction. False when it was recorded already (or `row` has no
    /// policy, or has ended). Counts behind `run` (a database that was lost and
    /// rebuilt from the job's folder) take the supervisor's.
    pub fn run_ended(
        &mut self,
        row: i64,
        run: u32,
        settlement: &EndRecord,
        next_at: i64,
    ) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let changed = tx
            .prepare_cached(
                "UPDATE restarts SET runs_ended = ?2 + 1, restarts = ?2, last_end = ?3, last_exit_code = ?4,
                    last_signal = ?5, last_ended_at = ?6, next_at = ?7, refused = NULL
                 WHERE row = ?1 AND runs_ended <= ?2 AND restarts <= ?2
                   AND EXISTS (SELECT 1 FROM items WHERE items.row = ?1 AND state != 'ended')",
            )?
            .execute(params![
                row,
                run,
                end_str(settlement.end),
                settlement.exit_code,
                settlement.signal,
                settlement.ended_at,
                next_at,
            ])?;
        if changed == 1 {
            // Still timed from this run's start: `run_started_at` moves at the rerun.
            history::add_run(&tx, row, settlement)?;
            super::withdraw_running_long(&tx, row)?;
            tx.prepare_cached("UPDATE items SET pid = NULL WHERE row = ?1")?
                .execute([row])?;
        }
        tx.commit()?;
        Ok(changed == 1)
    }

    /// Records that run `run` of `row` was admitted and is being started (at `now`).
    /// False when it was already, or `row` does not wait for it.
    pub fn rerun_decided(&mut self, row: i64, run: u32, now: i64) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE restarts SET restarts = ?2, next_at = NULL, run_started_at = ?3,
                    refused = NULL
                 WHERE row = ?1 AND restarts = ?2 - 1 AND runs_ended = ?2",
            )?
            .execute(params![row, run, now])?;
        Ok(changed == 1)
    }

    /// Times the next attempt of `row` at `next_at`, with no refusal (one told by an
    /// earlier daemon, whose counts are gone).
    pub fn rerun_retimed(&mut self, row: i64, next_at: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE restarts SET refused = NULL, next_at = ?2 WHERE row = ?1")?
            .execute(params![row, next_at])?;
        Ok(())
    }

    /// Records why an attempt was not admitted, and when the next one is.
    pub fn rerun_refused(&mut self, row: i64, reason: &str, next_at: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE restarts SET refused = ?2, next_at = ?3 WHERE row = ?1")?
            .execute(params![row, reason, next_at])?;
        Ok(())
    }
}
