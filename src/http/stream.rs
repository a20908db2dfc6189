//! Server-Sent Events: a record changed (the page asks for the list again), an item's
//! output grew (the new bytes, read from the log by offset), a pane's screen changed.
//! Each stream sleeps until the daemon wakes it; nothing polls. A stream ends when its
//! page goes (the next event cannot be sent), at the latest one keep-alive later.

use super::{json, Target, Web};
use crate::wire::{decode_reply, ReadArgs, ReadReply, Request};
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::Stream;
use serde::Deserialize;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The session the strip lists every session's work as.
pub(super) const VIEWER: &str = "person";
/// How much of a log a page is shown first (the rest is "load earlier").
const FIRST_BYTES: u64 = 64 << 10;
/// The most of a log one output event carries.
const EVENT_BYTES: usize = 256 << 10;
/// The least time between two list updates (a burst of changes is one update; every
/// open page lists everything again on each) and between two screens of a pane.
const COALESCE: Duration = Duration::from_millis(250);
/// How often a quiet stream checks that its page is still there.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

type Boxed = std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>>;
type Events = Sse<axum::response::sse::KeepAliveStream<Boxed>>;

/// Events sent by a task into a channel, as a stream for axum.
fn events(receiver: mpsc::Receiver<Event>) -> Events {
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (Ok(event), receiver))
    });
    let stream: Boxed = Box::pin(stream);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// `changed` whenever a record changes: an item started, ended, was dismissed.
pub(super) async fn changes(State(web): State<Arc<Web>>) -> Events {
    let (sender, receiver) = mpsc::channel(4);
    let mut changes = web.daemon.changes();
    tokio::spawn(async move {
        loop {
            if sender
                .send(Event::default().event("changed").data("{}"))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(COALESCE).await;
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = sender.closed() => return,
            }
        }
    });
    events(receiver)
}

#[derive(Deserialize)]
pub(super) struct From {
    session: String,
    id: String,
    /// Where to go on (a page that reconnects); else the last [`FIRST_BYTES`].
    #[serde(default)]
    from: Option<u64>,
}

/// An item's output as it grows: `output` events with `from`, `to`, `dropped_bytes`
/// and the bytes (base64), then one `end` with the report.
pub(super) async fn output(State(web): State<Arc<Web>>, Query(at): Query<From>) -> Response {
    let mut grew = match web.daemon.output_changes(&at.session, &at.id) {
        Ok(grew) => grew,
        Err(e) => return json(crate::wire::encode_result::<()>(&Err(e))),
    };
    let mut changes = web.daemon.changes();
    let (sender, receiver) = mpsc::channel(2);
    tokio::spawn(async move {
        let mut from = match at.from {
            Some(from) => from,
            None => match read(&web, &at.session, &at.id, u64::MAX).await {
                Ok(reply) => reply.to.saturating_sub(FIRST_BYTES),
                Err(_) => 0,
            },
        };
        loop {
            let reply = match read(&web, &at.session, &at.id, from).await {
                Ok(reply) => reply,
                Err(message) => {
                    let _ = sender
                        .send(Event::default().event("failed").data(message))
                        .await;
                    return;
                }
            };
            let fresh = reply.to > from || reply.from > from;
            if fresh {
                let data = json!({
                    "from": reply.from,
                    "to": reply.to,
                    "dropped_bytes": reply.dropped_bytes,
                    "bytes": reply.output_base64.unwrap_or_default(),
                });
                if sender
                    .send(Event::default().event("output").data(data.to_string()))
                    .await
                    .is_err()
                {
                    return;
                }
                from = reply.to;
                continue;
            }
            if !reply.running {
                let data = json!({ "report": reply.report, "to": reply.to });
                let _ = sender
                    .send(Event::default().event("end").data(data.to_string()))
                    .await;
                return;
            }
            tokio::select! {
                _ = grew.changed() => {}
                // An end does not grow the output.
                _ = changes.changed() => {}
                _ = sender.closed() => return,
            }
        }
    });
    events(receiver).into_response()
}

/// A pane's screen as it changes: `screen` events with its text, then `end`.
pub(super) async fn screen(State(web): State<Arc<Web>>, Query(target): Query<Target>) -> Response {
    let mut grew = match web.daemon.output_changes(&target.session, &target.id) {
        Ok(grew) => grew,
        Err(e) => return json(crate::wire::encode_result::<()>(&Err(e))),
    };
    let mut changes = web.daemon.changes();
    let (sender, receiver) = mpsc::channel(2);
    tokio::spawn(async move {
        let mut shown = None;
        loop {
            let request = Request::Read(ReadArgs {
                id: target.id.clone(),
                screen: true,
                ..ReadArgs::default()
            });
            let line = web.ask(&target.session, request).await;
            let reply = match decode_reply::<ReadReply>(&line) {
                Ok(reply) => reply,
                Err(e) => {
                    let _ = sender
                        .send(Event::default().event("failed").data(e.message))
                        .await;
                    return;
                }
            };
            if shown.as_ref() != Some(&reply.output) {
                let data = json!({ "text": reply.output });
                if sender
                    .send(Event::default().event("screen").data(data.to_string()))
                    .await
                    .is_err()
                {
                    return;
                }
                shown = Some(reply.output);
            }
            if !reply.running {
                let data = json!({ "report": reply.report });
                let _ = sender
                    .send(Event::default().event("end").data(data.to_string()))
                    .await;
                return;
            }
            tokio::time::sleep(COALESCE).await;
            tokio::select! {
                _ = grew.changed() => {}
                _ = changes.changed() => {}
                _ = sender.closed() => return,
            }
        }
    });
    events(receiver).into_response()
}

/// Bytes of a log from `from` (clamped to its length), as `read --raw --from` gives them.
async fn read(web: &Web, session: &str, id: &str, from: u64) -> Result<ReadReply, String> {
    let request = Request::Read(ReadArgs {
        id: id.to_string(),
        from: Some(from),
        raw: true,
        max_bytes: Some(EVENT_BYTES),
        ..ReadArgs::default()
    });
    decode_reply::<ReadReply>(&web.ask(session, request).await).map_err(|e| e.message)
}
