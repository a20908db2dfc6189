//! Delivery of notices, the daemon's side: claiming, delivering, releasing and
//! acknowledging, in one place and one vocabulary (the clients' side is
//! [`crate::delivery`], the outbox `store/notices.rs`).
//!
//! - **claim**: pending notices are taken for the connection that sends them
//!   (`Store::claim_notices`, one statement), so two connections never take the same
//!   one: a pull (`notices`, [`Daemon::notices`]), a stream (`--follow`,
//!   [`Daemon::follow_notices`]), and the end notices of records a reply shows
//!   ([`Daemon::claim_shown_ends`]: `start`, `wait`, `run`, `read`);
//! - **deliver**: a plain reply's claims are delivered once it has been written
//!   ([`Daemon::deliver`]);
//! - **acknowledge** (`ack`): a client that claimed with `ack` (the CLI's pull, a
//!   follower, the MCP server, the hooks) says which notices it showed, and they are
//!   delivered ([`Daemon::acknowledge`]);
//! - **release**: claims of a reply that could not be written ([`Daemon::release`]),
//!   or that a connection still holds when it closes ([`Daemon::release_connection`]),
//!   are pending again, with the same id, for the next claim.

use super::connection::{write_reply, FrameReader};
use super::Daemon;
use crate::paths::{now_ms, rfc3339};
use crate::store::NoticeRow;
use crate::wire::{self, Ack, Envelope, Notice, NoticesReply, Request, WireError};
use std::collections::HashSet;
use tokio::net::unix::OwnedWriteHalf;

impl Daemon {
    /// The pending notices, claimed for `token` (all undelivered ones, unclaimed, with
    /// `peek`), and the rows claimed.
    pub(crate) fn notices(
        &self,
        session: &str,
        peek: bool,
        limit: Option<u32>,
        token: i64,
    ) -> Result<(NoticesReply, Vec<i64>), WireError> {
        let (rows, more) = if peek {
            (self.lock().store.pending_notices(session)?, 0)
        } else {
            let shown = self.showing_rows();
            let mut inner = self.lock();
            let rows = inner.store.claim_notices(session, token, &shown, limit)?;
            // Counted only under a bound: an unbounded take leaves nothing behind
            // that the caller should hear of.
            let more = match limit {
                Some(_) => inner.store.pending_beyond(session, token)?,
                None => 0,
            };
            (rows, more)
        };
        let claimed = if peek {
            Vec::new()
        } else {
            rows.iter().map(|n| n.nrow).collect()
        };
        let reply = NoticesReply {
            notices: rows.iter().map(notice).collect(),
            more,
            unbound: None,
        };
        Ok((reply, claimed))
    }

    /// Like [`Daemon::notices`], first blocking up to `wait_s` while none is pending.
    pub(crate) async fn wait_notices(
        &self,
        session: &str,
        peek: bool,
        wait_s: Option<f64>,
        limit: Option<u32>,
        token: i64,
    ) -> Result<(NoticesReply, Vec<i64>), WireError> {
        if let Some(seconds) = wait_s {
            let timeout = crate::wire::seconds("--wait", seconds)?;
            self.wait_for(timeout, |daemon| {
                let store = &daemon.lock().store;
                let pending = if peek {
                    store.pending_notices(session).map(|rows| !rows.is_empty())
                } else {
                    store.has_claimable(session, &daemon.showing_rows())
                };
                pending.unwrap_or(true)
            })
            .await;
        }
        self.notices(session, peek, limit, token)
    }

    /// Claims for `token` the end notices of records a reply shows (`start`, `wait`,
    /// `run`, `read`): the reply delivers them once written.
    pub(crate) fn claim_shown_ends(&self, session: &str, token: i64, rows: &[i64]) -> Vec<i64> {
        if rows.is_empty() {
            return Vec::new();
        }
        let mut inner = self.lock();
        let mut claimed = Vec::new();
        for &row in rows {
            match inner.store.claim_end_notice(row, session, token) {
                Ok(Some(nrow)) => claimed.push(nrow),
                Ok(None) => {}
                Err(e) => crate::note!("bgwork daemon: could not claim an end notice: {e}"),
            }
        }
        claimed
    }

    /// Delivers the notices that `token` claimed (their reply was written).
    pub(crate) fn deliver(&self, token: i64, nrows: &[i64]) {
        if nrows.is_empty() {
            return;
        }
        if let Err(e) = self.lock().store.deliver_claimed(token, nrows, now_ms()) {
            crate::note!("bgwork daemon: could not mark notices delivered: {e}");
        }
    }

    /// Makes notices that `token` claimed pending again (their reply was not written).
    pub(crate) fn release(&self, token: i64, nrows: &[i64]) {
        if nrows.is_empty() {
            return;
        }
        if let Err(e) = self.lock().store.release_claims(token, nrows) {
            crate::note!("bgwork daemon: could not release notices: {e}");
        }
        // Pending again: a waiter that looked while they were claimed looks again.
        self.records_changed();
    }

    /// Releases every claim of a connection that closed.
    pub(crate) fn release_connection(&self, token: i64) {
        if let Err(e) = self.lock().store.release_connection(token) {
            crate::note!("bgwork daemon: could not release a connection's notices: {e}");
        }
    }

    /// Whether a connection holds notices it has not acknowledged yet.
    pub(crate) fn holds_claims(&self, token: i64) -> bool {
        self.lock().store.holds_claims(token).unwrap_or(false)
    }

    /// `ack`: the client has shown these notices.
    pub(crate) fn acknowledge(
        &self,
        session: &str,
        token: i64,
        ids: &[String],
    ) -> Result<Ack, WireError> {
        if ids.len() > wire::MAX_ACK_IDS {
            return Err(WireError::bad_request(format!(
                "ack takes at most {} ids at once: send several",
                wire::MAX_ACK_IDS
            )));
        }
        let nrows = ids
            .iter()
            .map(|id| parse_notice_id(id))
            .collect::<Result<Vec<i64>, WireError>>()?;
        let marked = self
            .lock()
            .store
            .acknowledge(session, token, &nrows, now_ms())?;
        Ok(Ack {
            ok: true,
            message: format!(
                "{} marked delivered",
                crate::history::plural(marked, "notice")
            ),
        })
    }

    /// Streams notices, one JSON object a line, until the client goes away. Each one is
    /// claimed for this connection and delivered when the client acknowledges it (not
    /// with `peek`: then every pending one is shown once, and nothing is claimed).
    pub(crate) async fn follow_notices(
        &self,
        session: &str,
        peek: bool,
        token: i64,
        reader: &mut FrameReader,
        writer: &mut OwnedWriteHalf,
    ) {
        let mut changes = self.changes();
        let mut sent: HashSet<i64> = HashSet::new();
        loop {
            let fresh: Result<Vec<NoticeRow>, WireError> = if peek {
                self.lock()
                    .store
                    .pending_notices(session)
                    .map(|rows| {
                        rows.into_iter()
                            .filter(|n| !sent.contains(&n.nrow))
                            .collect()
                    })
                    .map_err(WireError::from)
            } else {
                self.claim_for_stream(session, token)
            };
            let fresh = match fresh {
                Ok(rows) => rows,
                Err(error) => {
                    let line = wire::encode_result::<()>(&Err(error));
                    let _ = write_reply(writer, &line, self.config.write_stall).await;
                    return;
                }
            };
            for row in fresh {
                let line = wire::encode_line(&notice(&row));
                if write_reply(writer, &line, self.config.write_stall)
                    .await
                    .is_err()
                {
                    // The follower went away: it may have acknowledged some first.
                    self.last_acks(session, token, reader).await;
                    return;
                }
                sent.insert(row.nrow);
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                frame = reader.next() => {
                    let Ok(Some(line)) = frame else { return };
                    if let Err(error) = self.follow_ack(session, token, &line) {
                        let line = wire::encode_result::<()>(&Err(error));
                        let _ = write_reply(writer, &line, self.config.write_stall).await;
                        return;
                    }
                }
            }
        }
    }

    /// Reads the acks a closed follower sent before it went (they are in the socket
    /// still), so that what it showed is not delivered again.
    async fn last_acks(&self, session: &str, token: i64, reader: &mut FrameReader) {
        let pause = std::time::Duration::from_millis(100);
        while let Ok(Ok(Some(line))) = tokio::time::timeout(pause, reader.next()).await {
            let _ = self.follow_ack(session, token, &line);
        }
    }

    fn claim_for_stream(&self, session: &str, token: i64) -> Result<Vec<NoticeRow>, WireError> {
        Ok({
            let shown = self.showing_rows();
            self.lock()
                .store
                .claim_notices(session, token, &shown, None)?
        })
    }

    /// A line a follower sent: only `ack` is understood (it gets no reply).
    fn follow_ack(&self, session: &str, token: i64, line: &[u8]) -> Result<(), WireError> {
        let envelope: Envelope = serde_json::from_slice(line)
            .map_err(|e| WireError::bad_request(format!("malformed request: {e}")))?;
        match envelope.request {
            Request::Ack { ids } => self.acknowledge(session, token, &ids).map(|_| ()),
            _ => Err(WireError::bad_request(
                "a `notices --follow` connection takes only `ack` lines: open another connection for other requests",
            )),
        }
    }
}

/// `ntc-7` → 7.
fn parse_notice_id(id: &str) -> Result<i64, WireError> {
    id.strip_prefix("ntc-")
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            WireError::bad_request(format!(
                "ack takes notice ids such as ntc-7, and {id:?} is not one"
            ))
        })
}

pub(crate) fn notice(row: &NoticeRow) -> Notice {
    Notice {
        id: format!("ntc-{}", row.nrow),
        item: row.item.clone(),
        end: row.end,
        exit_code: row.exit_code,
        signal: row.signal,
        text: row.text.clone(),
        tail: row.tail.clone(),
        created_at: rfc3339(row.created_at),
        count: row.count,
    }
}
