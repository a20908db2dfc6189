//! The notices that ride on tool results, delivered with acknowledgement.
//!
//! How it works: one daemon connection, kept for the server's life, takes the pending
//! notices for each result (`notices` with `ack`: claimed by this connection, so no
//! other puller gets them). The next message of the MCP client shows that the result
//! arrived, and only then are its notices acknowledged (`ack`), which marks them
//! delivered. If this server dies first, its connection closes and the daemon releases
//! them: the next puller gets them again, with the same ids.

use crate::delivery::{max_notices_per_turn, Claimed, Delivery};
use crate::paths::Paths;
use crate::wire::{ErrorCode, WireError, MAX_ACK_IDS};
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// The notices that ride on one result.
pub struct Taken {
    pub notices: Value,
    empty: bool,
    /// Some of them are news of work that still runs (no end).
    running: bool,
    /// Pending beyond the bound: left for a later result.
    pub more: u64,
}

impl Default for Taken {
    fn default() -> Taken {
        Taken {
            notices: Value::Array(Vec::new()),
            empty: true,
            running: false,
            more: 0,
        }
    }
}

impl Taken {
    /// What the model is told beside the notices: that they are reports, and how many
    /// more wait (none when there is nothing to say).
    pub fn note(&self) -> Option<String> {
        if self.empty && self.more == 0 {
            return None;
        }
        Some(crate::delivery::notices_note(self.running, self.more))
    }
}

pub struct NoticeBox {
    paths: Arc<Paths>,
    session: String,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    conn: Option<Delivery>,
    /// Ids of notices sent on results and not acknowledged yet.
    riding: Vec<String>,
}

impl NoticeBox {
    pub fn new(paths: Arc<Paths>, session: String) -> NoticeBox {
        NoticeBox {
            paths,
            session,
            state: Arc::default(),
        }
    }

    /// A message of the MCP client arrived: the results sent before it were received,
    /// so their notices are delivered.
    pub async fn arrived(&self) {
        self.with_state(|state, paths, session| {
            if state.riding.is_empty() {
                return;
            }
            // Kept when the daemon cannot be reached: acknowledged on a later message.
            while !state.riding.is_empty() {
                let n = state.riding.len().min(MAX_ACK_IDS);
                let ids = state.riding[..n].to_vec();
                let ack = with_delivery(state, paths, session, |d| d.acknowledge(&ids));
                if ack.is_err_and(|e| e.code == ErrorCode::Unavailable) {
                    return;
                }
                state.riding.drain(..n);
            }
        })
        .await;
    }

    /// Takes the session's pending notices for a result, at most
    /// [`crate::delivery::max_notices_per_turn`] of them (none when the daemon cannot be
    /// reached), and how many stay pending beyond that bound.
    pub async fn take(&self) -> Taken {
        self.with_state(|state, paths, session| {
            let claim = |d: &mut Delivery| d.claim(max_notices_per_turn(), None);
            match with_delivery::<Claimed>(state, paths, session, claim) {
                Ok(reply) => {
                    state
                        .riding
                        .extend(reply.notices.iter().map(|n| n.id.clone()));
                    Taken {
                        empty: reply.notices.is_empty(),
                        running: reply.notices.iter().any(|n| n.end.is_none()),
                        notices: serde_json::to_value(reply.notices).unwrap_or_default(),
                        more: reply.more,
                    }
                }
                Err(_) => Taken::default(),
            }
        })
        .await
        .unwrap_or_default()
    }

    /// The result that was to carry the notices just taken will not be sent (its call
    /// was cancelled): they go back to pending. Only this call's notices ride at this
    /// point (those of earlier results were acknowledged when it arrived), so closing
    /// the connection, which releases its claims, gives back exactly them.
    pub async fn give_back(&self) {
        self.with_state(|state, _, _| {
            state.riding.clear();
            state.conn = None;
        })
        .await;
    }

    /// Runs `work` on a blocking thread (the client is synchronous), one at a time.
    async fn with_state<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut State, &Paths, &str) -> T + Send + 'static,
    ) -> Option<T> {
        let (state, paths, session) =
            (self.state.clone(), self.paths.clone(), self.session.clone());
        tokio::task::spawn_blocking(move || {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            work(&mut state, &paths, &session)
        })
        .await
        .ok()
    }
}

/// Does `work` on the kept connection, connecting again once if it broke (an idle
/// timeout, a restarted daemon).
fn with_delivery<T>(
    state: &mut State,
    paths: &Paths,
    session: &str,
    mut work: impl FnMut(&mut Delivery) -> Result<T, WireError>,
) -> Result<T, WireError> {
    let mut last = None;
    for _ in 0..2 {
        let delivery = match state.conn.as_mut() {
            Some(delivery) => delivery,
            None => state.conn.insert(Delivery::connect(paths, session)?),
        };
        match work(delivery) {
            Err(e) if e.code == ErrorCode::Unavailable => {
                state.conn = None;
                last = Some(e);
            }
            done => return done,
        }
    }
    Err(last.unwrap_or_else(|| WireError::new(ErrorCode::Unavailable, "no daemon")))
}
