//! Waiting items (`start --after`, contract §14): a record made `waiting`, started
//! from there only while it still waits, and ended from there without a run.

use super::{end_str, EndRecord, NewRecord, Record, Result, Store};

impl Record {
    /// Whether it ended while it still waited (`start --after`), nothing having run.
    pub fn never_ran(&self) -> bool {
        self.started_at == 0 && self.created_at.is_some()
    }

    /// When it started running: none while it waits, or when it ended so.
    pub fn ran_from(&self) -> Option<i64> {
        (self.state != crate::wire::State::Waiting && !self.never_ran()).then_some(self.started_at)
    }
}
use rusqlite::params;

impl Store {
    /// Writes a new record in the state `waiting`, with the session's next id.
    pub fn insert_waiting(&mut self, new: &NewRecord) -> Result<Record> {
        self.insert_with(new, |tx, row, _| {
            tx.prepare_cached("UPDATE items SET state = 'waiting' WHERE row = ?1")?
                .execute([row])?;
            Ok(())
        })
    }

    /// How many records of every session wait.
    pub fn count_waiting(&self) -> Result<usize> {
        let n: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM items WHERE state = 'waiting'")?
            .query_row([], |r| r.get(0))?;
        Ok(n as usize)
    }

    /// Moves a waiting record to `starting`, its start time now (its run is timed from
    /// here). False when it no longer waits (a stop ended it meanwhile).
    pub fn start_waiting(&mut self, row: i64, started_at: i64) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE items SET state = 'starting', created_at = started_at, started_at = ?2
                 WHERE row = ?1 AND state = 'waiting'",
            )?
            .execute(params![row, started_at])?;
        Ok(changed == 1)
    }

    /// Ends a record that is still waiting, with its notice, in one transaction. It
    /// never ran, so no run joins its command's history, and it has no start time
    /// (`started_at` 0, its making kept as `created_at`: [`Record::never_ran`]). False when it no longer
    /// waits (it started, or ended, meanwhile).
    pub fn end_waiting(&mut self, row: i64, settlement: &EndRecord) -> Result<bool> {
        let tx = self.conn.transaction()?;
        let changed = tx
            .prepare_cached(
                "UPDATE items SET state = 'ended', end_kind = ?2, ended_at = ?3, lost_reason = ?4,
                    created_at = started_at, started_at = 0
                 WHERE row = ?1 AND state = 'waiting'",
            )?
            .execute(params![
                row,
                end_str(settlement.end),
                settlement.ended_at,
                settlement.end_detail
            ])?;
        if changed == 1 {
            if let Some(notice) = &settlement.notice {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO notices(key, row, session, item, end_kind, exit_code,
                                                   signal, text, tail, created_at)
                     SELECT 'end:' || row, row, session, id, ?2, NULL, NULL, ?3, ?4, ?5
                     FROM items WHERE row = ?1",
                )?
                .execute(params![
                    row,
                    end_str(settlement.end),
                    notice.text,
                    notice.tail,
                    settlement.ended_at,
                ])?;
            }
        }
        tx.commit()?;
        Ok(changed == 1)
    }
}
