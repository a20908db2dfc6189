//! Monitor records (what a monitor watches and how far it got) and the coalesced notices
//! of watches.

use super::{Result, Store, MATCH_NOTICE};
use crate::wire::MonitorMode;
use rusqlite::{params, OptionalExtension, Transaction};

/// What a monitor watches, as its record keeps it: the kind of the wire's `Condition`
/// (its target is kept beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// Lines of an item's output.
    Output,
    /// A HOST:PORT accepting connections.
    Port,
    /// Any TCP port the processes of an item listen on.
    PortOf,
    /// A file (its existence for a wait, its new lines for a watch).
    File,
    /// An item's end.
    End,
}

impl Watched {
    const ALL: [Watched; 5] = [
        Watched::Output,
        Watched::Port,
        Watched::PortOf,
        Watched::File,
        Watched::End,
    ];

    /// The text stored (and shown in a monitor's command).
    pub fn as_str(self) -> &'static str {
        match self {
            Watched::Output => "output",
            Watched::Port => "port",
            Watched::PortOf => "port_of",
            Watched::File => "file",
            Watched::End => "end",
        }
    }
}

impl std::fmt::Display for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text stored for a monitor's mode.
pub fn mode_text(mode: MonitorMode) -> &'static str {
    match mode {
        MonitorMode::Wait => "wait",
        MonitorMode::Watch => "watch",
    }
}

/// A stored text as `T`, or an error naming the column: unknown text is never mapped
/// to a default.
fn parse_column<T: Copy>(
    column: usize,
    text: &str,
    known: &[T],
    name: impl Fn(T) -> &'static str,
) -> rusqlite::Result<T> {
    known
        .iter()
        .copied()
        .find(|k| name(*k) == text)
        .ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                column,
                rusqlite::types::Type::Text,
                format!("unknown monitor value {text:?}").into(),
            )
        })
}

/// A monitor's durable state, beside its work record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorRow {
    pub mode: MonitorMode,
    pub condition: Watched,
    /// The item id, HOST:PORT or path it watches.
    pub target: String,
    /// The record of the item it watches (output and end conditions).
    pub target_row: Option<i64>,
    pub regex: Option<String>,
    /// When a wait gives up (ms since the epoch). Compared with the wall clock only when
    /// a monitor (re)starts; while it runs, its deadline follows the monotonic clock.
    pub deadline_at: Option<i64>,
    pub progress: ScanProgress,
    pub matches: u64,
}

/// How far a monitor has read, and (for a watch) what it has recorded so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanProgress {
    /// Where the first line not yet handled begins in the watched output or file.
    pub offset: u64,
    /// The followed file (device, inode) that `offset` is in, when known.
    pub file: Option<(u64, u64)>,
    /// The last bytes of that file before `offset`: when they are no longer there, the
    /// file was rewritten while nobody followed it.
    pub file_tail: Option<Vec<u8>>,
    /// The length of the watch's event log that goes with `offset`; a longer log holds
    /// lines written but never recorded (a crash between the two), which are cut off.
    pub log_len: Option<u64>,
    /// Bytes the log cap has released from the event log.
    pub dropped: u64,
}

impl Store {
    pub fn insert_monitor(&mut self, row: i64, monitor: &MonitorRow) -> Result<()> {
        let progress = &monitor.progress;
        self.conn
            .prepare_cached(
                "INSERT INTO monitors(row, mode, condition, target, target_row, regex, deadline_at,
                                  offset, matches, file_dev, file_ino, log_len, file_tail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                row,
                mode_text(monitor.mode),
                monitor.condition.as_str(),
                monitor.target,
                monitor.target_row,
                monitor.regex,
                monitor.deadline_at,
                progress.offset as i64,
                monitor.matches as i64,
                progress.file.map(|f| f.0 as i64),
                progress.file.map(|f| f.1 as i64),
                progress.log_len.map(|n| n as i64),
                progress.file_tail,
            ])?;
        Ok(())
    }

    pub fn monitor(&self, row: i64) -> Result<Option<MonitorRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT m.mode, m.condition, m.target, m.target_row, m.regex, m.deadline_at,
                        m.offset, m.matches, m.file_dev, m.file_ino, m.log_len, i.dropped,
                        m.file_tail
                 FROM monitors m JOIN items i ON i.row = m.row WHERE m.row = ?1",
            )?
            .query_row([row], |r| {
                let dev: Option<i64> = r.get(8)?;
                let ino: Option<i64> = r.get(9)?;
                let mode: String = r.get(0)?;
                let condition: String = r.get(1)?;
                Ok(MonitorRow {
                    mode: parse_column(
                        0,
                        &mode,
                        &[MonitorMode::Wait, MonitorMode::Watch],
                        mode_text,
                    )?,
                    condition: parse_column(1, &condition, &Watched::ALL, Watched::as_str)?,
                    target: r.get(2)?,
                    target_row: r.get(3)?,
                    regex: r.get(4)?,
                    deadline_at: r.get(5)?,
                    progress: ScanProgress {
                        offset: r.get::<_, i64>(6)? as u64,
                        file: dev.zip(ino).map(|(d, i)| (d as u64, i as u64)),
                        file_tail: r.get(12)?,
                        log_len: r.get::<_, Option<i64>>(10)?.map(|n| n as u64),
                        dropped: r.get::<_, i64>(11)? as u64,
                    },
                    matches: r.get::<_, i64>(7)? as u64,
                })
            })
            .optional()?)
    }

    /// Saves how far a monitor has read (no new matches).
    pub fn set_monitor_progress(&mut self, row: i64, progress: &ScanProgress) -> Result<()> {
        let tx = self.conn.transaction()?;
        save_progress(&tx, row, progress, None)?;
        tx.commit()?;
        Ok(())
    }

    /// Adds `count` matches to the watch's pending notice, or makes one: a watch has at
    /// most one notice pending and unclaimed (one being sent is left as it was sent),
    /// carrying the newest lines. With the progress it saves,
    /// in one transaction.
    pub fn add_watch_matches(
        &mut self,
        row: i64,
        count: u64,
        tail: &str,
        at: i64,
        progress: &ScanProgress,
        matches: u64,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        let pending: Option<(i64, i64, String)> = tx
            .prepare_cached(
                "SELECT nrow, count, tail FROM notices
                 WHERE row = ?1 AND end_kind = ?2 AND delivered_at IS NULL AND claim IS NULL",
            )?
            .query_row(params![row, MATCH_NOTICE], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        match pending {
            Some((nrow, before, earlier)) => {
                let total = before as u64 + count;
                // The notice carries the lines it counts: the earlier ones and these,
                // the newest kept when they pass the bound.
                let tail = newest_within(&(earlier + tail), tail.len().max(TAIL_MAX));
                tx.prepare_cached(
                    "UPDATE notices SET count = ?2, tail = ?3, created_at = ?4,
                            text = (SELECT id FROM items WHERE row = ?5)
                                   || ' matched ' || ?2 || ' new line(s)'
                     WHERE nrow = ?1",
                )?
                .execute(params![nrow, total as i64, tail, at, row])?;
            }
            None => {
                // The running total is unique to this batch of this watch.
                let key = format!("watch:{row}:{matches}");
                tx.prepare_cached(
                    "INSERT INTO notices(key, row, session, item, end_kind, text, tail,
                                         created_at, count)
                     SELECT ?2, row, session, id, ?3, id || ' matched ' || ?4 || ' new line(s)',
                            ?5, ?6, ?4
                     FROM items WHERE row = ?1",
                )?
                .execute(params![
                    row,
                    key,
                    MATCH_NOTICE,
                    count as i64,
                    tail,
                    at
                ])?;
            }
        }
        save_progress(&tx, row, progress, Some(matches))?;
        tx.commit()?;
        self.keep_reserve()
    }
}

fn save_progress(
    tx: &Transaction<'_>,
    row: i64,
    progress: &ScanProgress,
    matches: Option<u64>,
) -> Result<()> {
    tx.prepare_cached(
        "UPDATE monitors SET offset = ?2, file_dev = ?3, file_ino = ?4, log_len = ?5,
                matches = coalesce(?6, matches), file_tail = ?7
         WHERE row = ?1",
    )?
    .execute(params![
        row,
        progress.offset as i64,
        progress.file.map(|f| f.0 as i64),
        progress.file.map(|f| f.1 as i64),
        progress.log_len.map(|n| n as i64),
        matches.map(|n| n as i64),
        progress.file_tail,
    ])?;
    if let Some(log_len) = progress.log_len {
        tx.prepare_cached("UPDATE items SET dropped = ?2, log_len = ?3 WHERE row = ?1")?
            .execute(params![row, progress.dropped as i64, log_len as i64])?;
    }
    Ok(())
}

/// The most a watch's notice carries of the lines it counts.
const TAIL_MAX: usize = 2048;

/// The newest whole lines of `text` within `max` bytes.
fn newest_within(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let cut = &text[start..];
    match cut.find('\n') {
        Some(at) if at + 1 < cut.len() => cut[at + 1..].to_string(),
        _ => cut.to_string(),
    }
}
