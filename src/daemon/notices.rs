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
    pub(crate) fn notices(&self, session: &str, peek: bool) -> Result<NoticesReply, WireError> {
        let mut inner = self.lock();
        let rows = inner.store.pending_notices(session)?;
        if !peek {
            let nrows: Vec<i64> = rows.iter().map(|n| n.nrow).collect();
            inner.store.mark_delivered(&nrows, now_ms())?;
        }
        Ok(NoticesReply {
            notices: rows.iter().map(notice).collect(),
        })
    }

    /// Like [`Daemon::notices`], first blocking up to `wait_s` while none is pending.
    pub(crate) async fn wait_notices(
        &self,
        session: &str,
        peek: bool,
        wait_s: Option<f64>,
    ) -> Result<NoticesReply, WireError> {
        if let Some(seconds) = wait_s {
            if !seconds.is_finite() || seconds < 0.0 {
                return Err(WireError::bad_request("--wait takes seconds, 0 or more"));
            }
            let timeout = std::time::Duration::from_secs_f64(seconds.min(86_400.0));
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
                    let _ = self.lock().store.mark_delivered(&[row.nrow], now_ms());
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
    }
}
