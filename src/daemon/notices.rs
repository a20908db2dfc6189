//! `notices`: the session's pending exit notices, each delivered once (pull), and
//! `notices --follow`, which pushes each one as it is created.

use super::serve::write_line;
use super::Daemon;
use crate::paths::{now_ms, rfc3339};
use crate::store::NoticeRow;
use crate::wire::{self, Notice, NoticesReply, WireError};
use std::collections::HashSet;
use std::future::Future;
use tokio::net::unix::OwnedWriteHalf;

impl Daemon {
    /// The pending notices, and the rows to mark delivered once the reply is written
    /// (none with `peek`). Marking after the write makes delivery at-least-once: a
    /// reply lost in a crash is sent again, with the same notice ids.
    pub(crate) fn notices(
        &self,
        session: &str,
        peek: bool,
    ) -> Result<(NoticesReply, Vec<i64>), WireError> {
        let rows = self.lock().store.pending_notices(session)?;
        let deliver = if peek {
            Vec::new()
        } else {
            rows.iter().map(|n| n.nrow).collect()
        };
        let reply = NoticesReply {
            notices: rows.iter().map(notice).collect(),
        };
        Ok((reply, deliver))
    }

    /// Marks notices delivered (after the reply that carried them was written).
    pub(crate) fn delivered(&self, nrows: &[i64]) {
        if nrows.is_empty() {
            return;
        }
        if let Err(e) = self.lock().store.mark_delivered(nrows, now_ms()) {
            crate::note!("bgwork daemon: could not mark notices delivered: {e}");
        }
    }

    /// Like [`Daemon::notices`], first blocking up to `wait_s` while none is pending.
    pub(crate) async fn wait_notices(
        &self,
        session: &str,
        peek: bool,
        wait_s: Option<f64>,
    ) -> Result<(NoticesReply, Vec<i64>), WireError> {
        if let Some(seconds) = wait_s {
            let timeout = crate::wire::seconds("--wait", seconds)?;
            self.wait_for(timeout, |daemon| {
                let pending = daemon.lock().store.pending_notices(session);
                pending.map(|rows| !rows.is_empty()).unwrap_or(true)
            })
            .await;
        }
        self.notices(session, peek)
    }

    /// Streams notices, one JSON object a line, until the client goes away.
    pub(crate) async fn follow_notices(
        &self,
        session: &str,
        peek: bool,
        writer: &mut OwnedWriteHalf,
        gone: impl Future<Output = ()>,
    ) {
        let mut changes = self.changes();
        let mut sent: HashSet<i64> = HashSet::new();
        tokio::pin!(gone);
        loop {
            let pending = self.lock().store.pending_notices(session);
            let fresh: Vec<NoticeRow> = match pending {
                Ok(rows) => rows
                    .into_iter()
                    .filter(|n| !sent.contains(&n.nrow))
                    .collect(),
                Err(e) => {
                    let error = WireError::from(e);
                    let _ = write_line(writer, &wire::encode_result::<()>(&Err(error))).await;
                    return;
                }
            };
            for row in fresh {
                if !write_line(writer, &wire::encode_line(&notice(&row))).await {
                    return;
                }
                sent.insert(row.nrow);
                if !peek {
                    self.delivered(&[row.nrow]);
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = &mut gone => return,
            }
        }
    }
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
