//! Monitor records (what a monitor watches and how far it got) and the coalesced notices
//! of watches.

use super::{Result, Store, MATCH_NOTICE};
use rusqlite::{params, OptionalExtension};

/// A monitor's durable state, beside its work record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorRow {
    /// `wait` or `watch`.
    pub mode: String,
    /// `output`, `port`, `file` or `end`.
    pub condition: String,
    /// The item id, HOST:PORT or path it watches.
    pub target: String,
    /// The record of the item it watches (output and end conditions).
    pub target_row: Option<i64>,
    pub regex: Option<String>,
    /// When a wait gives up (ms since the epoch).
    pub deadline_at: Option<i64>,
    /// How far into the watched output or file it has read.
    pub offset: u64,
    pub matches: u64,
}

impl Store {
    pub fn insert_monitor(&mut self, row: i64, monitor: &MonitorRow) -> Result<()> {
        self.conn.execute(
            "INSERT INTO monitors(row, mode, condition, target, target_row, regex, deadline_at,
                                  offset, matches)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                row,
                monitor.mode,
                monitor.condition,
                monitor.target,
                monitor.target_row,
                monitor.regex,
                monitor.deadline_at,
                monitor.offset as i64,
                monitor.matches as i64,
            ],
        )?;
        Ok(())
    }

    pub fn monitor(&self, row: i64) -> Result<Option<MonitorRow>> {
        Ok(self
            .conn
            .query_row(
                "SELECT mode, condition, target, target_row, regex, deadline_at, offset, matches
                 FROM monitors WHERE row = ?1",
                [row],
                |r| {
                    Ok(MonitorRow {
                        mode: r.get(0)?,
                        condition: r.get(1)?,
                        target: r.get(2)?,
                        target_row: r.get(3)?,
                        regex: r.get(4)?,
                        deadline_at: r.get(5)?,
                        offset: r.get::<_, i64>(6)? as u64,
                        matches: r.get::<_, i64>(7)? as u64,
                    })
                },
            )
            .optional()?)
    }

    pub fn set_monitor_progress(&mut self, row: i64, offset: u64, matches: u64) -> Result<()> {
        self.conn.execute(
            "UPDATE monitors SET offset = ?2, matches = ?3 WHERE row = ?1",
            params![row, offset as i64, matches as i64],
        )?;
        Ok(())
    }

    /// Adds `count` matches to the watch's pending notice, or makes one: a watch has at
    /// most one notice pending, carrying the newest lines. With the progress it saves,
    /// in one transaction.
    pub fn add_watch_matches(
        &mut self,
        row: i64,
        count: u64,
        tail: &str,
        at: i64,
        progress: (u64, u64),
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        let pending: Option<(i64, i64)> = tx
            .query_row(
                "SELECT nrow, count FROM notices
                 WHERE row = ?1 AND end_kind = ?2 AND delivered_at IS NULL",
                params![row, MATCH_NOTICE],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match pending {
            Some((nrow, before)) => {
                let total = before as u64 + count;
                tx.execute(
                    "UPDATE notices SET count = ?2, tail = ?3, created_at = ?4,
                            text = (SELECT id FROM items WHERE row = ?5)
                                   || ' matched ' || ?2 || ' new line(s)'
                     WHERE nrow = ?1",
                    params![nrow, total as i64, tail, at, row],
                )?;
            }
            None => {
                // The running total is unique to this batch of this watch.
                let key = format!("watch:{row}:{}", progress.1);
                tx.execute(
                    "INSERT INTO notices(key, row, session, item, end_kind, text, tail,
                                         created_at, count)
                     SELECT ?2, row, session, id, ?3, id || ' matched ' || ?4 || ' new line(s)',
                            ?5, ?6, ?4
                     FROM items WHERE row = ?1",
                    params![row, key, MATCH_NOTICE, count as i64, tail, at],
                )?;
            }
        }
        tx.execute(
            "UPDATE monitors SET offset = ?2, matches = ?3 WHERE row = ?1",
            params![row, progress.0 as i64, progress.1 as i64],
        )?;
        tx.commit()?;
        self.keep_reserve()
    }
}
