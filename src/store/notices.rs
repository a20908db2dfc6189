//! The notices outbox: pending notices, claims and delivery (the vocabulary of
//! `daemon/delivery.rs`: claim, deliver, acknowledge, release).
//!
//! How it works: a pending notice (`delivered_at IS NULL`) is taken by a CLAIM, one
//! `UPDATE … RETURNING` that stamps it with the token of the daemon connection that
//! sends it, so two concurrent pulls never take the same notice. A claim ends in one of
//! two ways: the notice is marked delivered (after its reply was written, or when the
//! client acknowledged it), or the claim is released (the write failed, the connection
//! closed) and the notice is pending again, with the same id. Claims are cleared when a
//! daemon opens the store: they belong to connections of a daemon that is gone.

use super::{parse_end, sessions, NoticeRow, Result, Store, EVENT_NOTICE, MATCH_NOTICE};
use rusqlite::{params, OptionalExtension, Row};

/// The columns of a notice as session `?1` sees it: the item of a notice that comes
/// from a sub-agent's session is named with its path (`sub-1/bg-2`), in its text too.
fn notice_columns() -> String {
    let prefix = "substr(session, length(?1) + 2) || '/'";
    format!(
        "nrow, session,
         CASE WHEN session = ?1 THEN item ELSE {prefix} || item END,
         end_kind, exit_code, signal,
         CASE WHEN session = ?1 OR substr(text, 1, length(item)) != item THEN text
              ELSE {prefix} || text END,
         tail, created_at, count"
    )
}

/// SQL: not an end notice of the records `shown` (row numbers, so the list is safe
/// to write into the statement).
fn not_shown(shown: &[i64]) -> String {
    if shown.is_empty() {
        return "1".into();
    }
    let rows: Vec<String> = shown.iter().map(i64::to_string).collect();
    format!("NOT (key LIKE 'end:%' AND row IN ({}))", rows.join(","))
}

/// The notices that go to session `?1` (see [`sessions::recipients`]).
fn for_session() -> String {
    format!("session IN {}", sessions::recipients("?1"))
}

impl Store {
    /// Notices of the session (and its sub-agents) not yet delivered, oldest first,
    /// claimed or not (for `--peek`).
    pub fn pending_notices(&self, session: &str) -> Result<Vec<NoticeRow>> {
        let sql = format!(
            "SELECT {} FROM notices WHERE {} AND delivered_at IS NULL ORDER BY nrow",
            notice_columns(),
            for_session()
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([session], notice_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Whether the session has a pending notice that nobody has claimed (leaving out
    /// the end notices of `shown`, as [`Store::claim_notices`] does).
    pub fn has_claimable(&self, session: &str, shown: &[i64]) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS(SELECT 1 FROM notices
             WHERE {} AND delivered_at IS NULL AND claim IS NULL AND {})",
            for_session(),
            not_shown(shown)
        );
        Ok(self
            .conn
            .prepare_cached(&sql)?
            .query_row([session], |r| r.get(0))?)
    }

    /// Claims the pending, unclaimed notices of the session for `claim`, oldest first:
    /// every one, or the `limit` oldest. One statement: a notice is claimed by one
    /// caller only.
    /// The end notices of the records in `shown` are left alone: a reply that is about
    /// to show their end delivers them.
    pub fn claim_notices(
        &mut self,
        session: &str,
        claim: i64,
        shown: &[i64],
        limit: Option<u32>,
    ) -> Result<Vec<NoticeRow>> {
        let sql = format!(
            "UPDATE notices SET claim = ?2
             WHERE nrow IN (SELECT nrow FROM notices
                            WHERE {} AND delivered_at IS NULL AND claim IS NULL
                                  AND {}
                            ORDER BY nrow LIMIT ?3)
             RETURNING {}",
            for_session(),
            not_shown(shown),
            notice_columns()
        );
        // SQLite: a negative LIMIT is no limit.
        let limit = limit.map_or(-1, i64::from);
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![session, claim, limit], notice_row)?;
        let mut rows: Vec<NoticeRow> = rows.collect::<rusqlite::Result<_>>()?;
        rows.sort_by_key(|n| n.nrow);
        Ok(rows)
    }

    /// How many notices of the session are pending and not held by `claim` (those a
    /// bounded take left behind, and any another connection holds).
    pub fn pending_beyond(&self, session: &str, claim: i64) -> Result<u64> {
        let sql = format!(
            "SELECT count(*) FROM notices
             WHERE {} AND delivered_at IS NULL AND (claim IS NULL OR claim != ?2)",
            for_session()
        );
        Ok(self
            .conn
            .prepare_cached(&sql)?
            .query_row(params![session, claim], |r| r.get(0))?)
    }

    /// Claims the end notice of a record for `claim` when it is pending, unclaimed and
    /// goes to `session` (a reply to `session` shows the end; a parent seeing the end
    /// of a live sub-agent's job leaves the sub-agent its notice); returns its row.
    pub fn claim_end_notice(&mut self, row: i64, session: &str, claim: i64) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "UPDATE notices SET claim = ?2
                     WHERE key = 'end:' || ?1 AND session IN {}
                           AND delivered_at IS NULL AND claim IS NULL
                     RETURNING nrow",
                sessions::recipients("?3")
            ))?
            .query_row(params![row, claim, session], |r| r.get(0))
            .optional()?)
    }

    /// Marks delivered the notices among `nrows` that `claim` holds.
    pub fn deliver_claimed(&mut self, claim: i64, nrows: &[i64], at: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        for nrow in nrows {
            tx.prepare_cached(
                "UPDATE notices SET delivered_at = ?3, claim = NULL
                 WHERE nrow = ?1 AND claim = ?2 AND delivered_at IS NULL",
            )?
            .execute(params![nrow, claim, at])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// An acknowledgement: marks delivered the notices among `nrows` that the session
    /// sees and that `claim` holds or nobody holds (a client acknowledging, after a
    /// daemon restart, what an earlier daemon sent it). Returns how many it marked.
    pub fn acknowledge(
        &mut self,
        session: &str,
        claim: i64,
        nrows: &[i64],
        at: i64,
    ) -> Result<usize> {
        let sql = format!(
            "UPDATE notices SET delivered_at = ?4, claim = NULL
             WHERE nrow = ?2 AND {} AND delivered_at IS NULL
                   AND (claim IS NULL OR claim = ?3)",
            for_session()
        );
        let tx = self.conn.transaction()?;
        let mut marked = 0;
        for nrow in nrows {
            marked += tx
                .prepare_cached(&sql)?
                .execute(params![session, nrow, claim, at])?;
        }
        tx.commit()?;
        Ok(marked)
    }

    /// Releases the claims `claim` holds among `nrows`: they are pending again.
    pub fn release_claims(&mut self, claim: i64, nrows: &[i64]) -> Result<()> {
        let tx = self.conn.transaction()?;
        for nrow in nrows {
            tx.prepare_cached("UPDATE notices SET claim = NULL WHERE nrow = ?1 AND claim = ?2")?
                .execute(params![nrow, claim])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Releases every claim `claim` holds (its connection closed).
    pub fn release_connection(&mut self, claim: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE notices SET claim = NULL WHERE claim = ?1")?
            .execute([claim])?;
        Ok(())
    }

    /// Whether `claim` holds notices not yet acknowledged.
    pub fn holds_claims(&self, claim: i64) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM notices WHERE claim = ?1)")?
            .query_row([claim], |r| r.get(0))?)
    }

    /// Releases every claim (a daemon starts: the connections that held them are gone).
    pub fn release_all_claims(&mut self) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE notices SET claim = NULL WHERE claim IS NOT NULL")?
            .execute([])?;
        Ok(())
    }
}

fn notice_row(r: &Row) -> rusqlite::Result<NoticeRow> {
    Ok(NoticeRow {
        nrow: r.get(0)?,
        session: r.get(1)?,
        item: r.get(2)?,
        end: Some(r.get::<_, String>(3)?)
            .filter(|e| e != MATCH_NOTICE && e != EVENT_NOTICE)
            .map(|e| parse_end(3, &e))
            .transpose()?,
        exit_code: r.get(4)?,
        signal: r.get(5)?,
        text: r.get(6)?,
        tail: r.get(7)?,
        created_at: r.get(8)?,
        count: r.get::<_, i64>(9)? as u64,
    })
}
