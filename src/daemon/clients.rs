//! Serving one client connection: its place under the connection cap, its uid, its
//! requests and replies.
//!
//! A request is read with a hard bound ([`wire::MAX_FRAME`]) before any parsing; a peer of
//! another uid is refused; a malformed request gets a `bad_request` reply and the
//! connection goes on. `notices --follow` and `wait` watch the client's side of the
//! connection, so a client that goes away ends them and leaves everything else as it was.
//!
//! Bounds: at most `max_connections` clients at once (at the cap the oldest idle
//! connection is closed for the next one, which gets a refusal line only when none is
//! idle); a connection with no request in flight is closed after `idle_timeout`; a
//! reply is written in chunks, and a client that takes no byte of it for `write_stall`
//! is dropped.

use super::connection::{write_reply, FrameReader};
use super::Daemon;
use crate::wire::{self, Envelope, ErrorCode, Request, WireError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixStream;

/// How long a connection at the cap waits for the idle one that gives way to close.
const GIVE_WAY_WAIT: Duration = Duration::from_secs(2);

/// Serves a connection just accepted, in a task of its own.
pub(super) fn hand_over(daemon: &Arc<Daemon>, stream: UnixStream, me: u32, cap: usize) {
    let daemon = daemon.clone();
    match Slot::take(&daemon, cap) {
        Some(slot) => {
            tokio::spawn(async move { serve_client(daemon, stream, me, slot).await });
        }
        // At the cap the oldest idle connection gives way, so that idle connections (one
        // client's hundreds) never lock others out.
        None => {
            tokio::spawn(async move {
                match Slot::make_room(&daemon, cap, GIVE_WAY_WAIT).await {
                    Some(slot) => serve_client(daemon, stream, me, slot).await,
                    None => refuse(stream, cap).await,
                }
            });
        }
    }
}

/// One of the `max_connections` places; given back when the connection ends.
struct Slot(Arc<Daemon>);

impl Slot {
    fn take(daemon: &Arc<Daemon>, cap: usize) -> Option<Slot> {
        let taken = daemon
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            });
        taken.ok().map(|_| Slot(daemon.clone()))
    }
}

impl Slot {
    /// A slot at the cap: the oldest idle connection is asked to give way, and hands its
    /// slot over to this one (so that no other caller waiting at the cap takes it); a
    /// connection just accepted may not wait for its request yet, so asking goes on
    /// until one is idle. None after `patience` (every connection is busy).
    async fn make_room(daemon: &Arc<Daemon>, cap: usize, patience: Duration) -> Option<Slot> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(slot) = Slot::take(daemon, cap) {
                return Some(slot);
            }
            if let Some(handed) = daemon.idle.close_oldest() {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if let Ok(Ok(slot)) = tokio::time::timeout(left, handed).await {
                    return Some(slot);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Where an idle connection told to give way sends its slot.
type Handover = tokio::sync::oneshot::Sender<Slot>;

/// The connections that wait for a request (no request in flight, no claim held), by
/// when they began to wait: at the connection cap the oldest is closed for a new one.
#[derive(Default)]
pub(crate) struct IdleConnections {
    waiting: std::sync::Mutex<(
        u64,
        std::collections::BTreeMap<u64, tokio::sync::oneshot::Sender<Handover>>,
    )>,
}

impl IdleConnections {
    /// Registers a connection that begins to wait; it is idle while the guard lives.
    fn begin(&self) -> IdleGuard<'_> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let seq = waiting.0;
        waiting.0 += 1;
        let (tell, told) = tokio::sync::oneshot::channel();
        waiting.1.insert(seq, tell);
        IdleGuard {
            list: self,
            seq,
            told: Some(told),
        }
    }

    /// Tells the oldest idle connection to close and hand its slot over: the slot
    /// comes on the receiver; none when no connection is idle.
    fn close_oldest(&self) -> Option<tokio::sync::oneshot::Receiver<Slot>> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((_, tell)) = waiting.1.pop_first() {
            let (handover, handed) = tokio::sync::oneshot::channel();
            if tell.send(handover).is_ok() {
                return Some(handed);
            }
        }
        None
    }
}

struct IdleGuard<'a> {
    list: &'a IdleConnections,
    seq: u64,
    told: Option<tokio::sync::oneshot::Receiver<Handover>>,
}

impl IdleGuard<'_> {
    /// Resolves, with where its slot goes, when this connection must give way.
    async fn told_to_close(&mut self) -> Handover {
        match self.told.as_mut() {
            Some(told) => match told.await {
                Ok(handover) => handover,
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

impl Drop for IdleGuard<'_> {
    fn drop(&mut self) {
        let mut waiting = self.list.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.1.remove(&self.seq);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The claims of one connection: whatever it still holds when it ends is released.
struct Claims {
    daemon: Arc<Daemon>,
    token: i64,
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.daemon.release_connection(self.token);
    }
}

/// Tells a client past the connection cap why it is refused, and closes.
async fn refuse(stream: UnixStream, cap: usize) {
    let (_, mut writer) = stream.into_split();
    let refusal = WireError::new(
        ErrorCode::Unavailable,
        format!(
            "refused: the daemon already serves {cap} connections, its cap; try again when \
             some close (idle ones close after a while; each `notices --follow`, `wait` and \
             MCP server holds one)"
        ),
    );
    let line = wire::encode_result::<()>(&Err(refusal));
    let _ = write_reply(&mut writer, &line, Duration::from_secs(1)).await;
}

async fn serve_client(daemon: Arc<Daemon>, stream: UnixStream, me: u32, slot: Slot) {
    let mut slot = Some(slot);
    let peer = stream.peer_cred().map(|c| c.uid());
    let (read_half, mut writer) = stream.into_split();
    let stall = daemon.config.write_stall;
    if peer.ok() != Some(me) {
        // Not a usage error of the caller's (exit 2): this daemon is not theirs to use.
        let refusal = WireError::new(
            ErrorCode::Unavailable,
            "refused: this daemon serves only its own user",
        );
        let _ = write_reply(
            &mut writer,
            &wire::encode_result::<()>(&Err(refusal)),
            stall,
        )
        .await;
        return;
    }
    let claims = Claims {
        daemon: daemon.clone(),
        token: daemon.new_token(),
    };
    let token = claims.token;
    let mut reader = FrameReader::new(read_half);
    loop {
        // Idle: no request in flight. A connection that holds notices awaiting its
        // `ack` (an MCP server between two calls) is not idle.
        let frame = if daemon.holds_claims(token) {
            reader.next().await
        } else {
            let mut idle = daemon.idle.begin();
            tokio::select! {
                waited = tokio::time::timeout(daemon.config.idle_timeout, reader.next()) => {
                    match waited {
                        Ok(frame) => frame,
                        Err(_) => return,
                    }
                }
                // The cap is reached and this is the oldest idle connection: its slot
                // goes to the new one.
                handover = idle.told_to_close() => {
                    if let Some(slot) = slot.take() {
                        let _ = handover.send(slot);
                    }
                    return;
                }
            }
        };
        let line = match frame {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error) => {
                let _ =
                    write_reply(&mut writer, &wire::encode_result::<()>(&Err(error)), stall).await;
                return;
            }
        };
        let envelope: Envelope = match serde_json::from_slice(&line) {
            Ok(envelope) => envelope,
            Err(e) => {
                let error = WireError::bad_request(format!(
                    "malformed request: {e}; send one JSON object per line with \"session\" and \"op\""
                ));
                let line = wire::encode_result::<()>(&Err(error));
                if write_reply(&mut writer, &line, stall).await.is_err() {
                    return;
                }
                continue;
            }
        };
        // Input passed on is answered before a daemon that shuts down goes (the guard
        // lives until the reply is out): its sender, a promoted run's feeder, knows
        // whether the job took it.
        let _passing = matches!(envelope.request, Request::Send(_)).then(|| daemon.passing_input());
        let answer = match envelope.request {
            Request::Notices {
                peek, follow: true, ..
            } => {
                let session = envelope.session.clone();
                if let Err(error) = daemon.check_session(&session) {
                    let line = wire::encode_result::<()>(&Err(error));
                    let _ = write_reply(&mut writer, &line, stall).await;
                    return;
                }
                daemon
                    .follow_notices(&session, peek, token, &mut reader, &mut writer)
                    .await;
                return;
            }
            Request::Run(args) => {
                // The connection is the run's: its output, and the caller's stdin.
                let forward = args.stdin == wire::RunStdin::Forward;
                let mut shown = super::Shown::new(&daemon);
                let mut rest = None;
                let result = match daemon.check_session(&envelope.session) {
                    Ok(()) => {
                        let caller = super::requests::run::Caller {
                            reader: &mut reader,
                            writer: &mut writer,
                            rest: &mut rest,
                        };
                        daemon
                            .run(&envelope.session, args, caller, &mut shown)
                            .await
                    }
                    Err(e) => Err(e),
                };
                // A reply that shows the end delivers its notice, once written.
                let deliver = daemon.claim_shown_ends(&envelope.session, token, &shown.rows);
                drop(shown);
                let line = wire::encode_result(&result);
                if write_reply(&mut writer, &line, stall).await.is_err() {
                    daemon.release(token, &deliver);
                    return;
                }
                daemon.deliver(token, &deliver);
                if forward {
                    // What the caller sends after the reply is the rest of its stdin: a
                    // promoted run's job takes it, a run that ended none.
                    if let Some(rest) = rest {
                        daemon
                            .pass_rest(rest, &mut reader, &mut writer, stall)
                            .await;
                    }
                    return;
                }
                continue;
            }
            Request::Wait(_)
            | Request::Notices {
                wait_s: Some(_), ..
            } => {
                tokio::select! {
                    answer = daemon.dispatch(envelope, token) => answer,
                    _ = reader.closed() => return,
                }
            }
            _ => daemon.dispatch(envelope, token).await,
        };
        let written = write_reply(&mut writer, &answer.line, stall).await;
        // The reply is out (or its client dropped): room for another big one.
        drop(answer.permit);
        if written.is_err() {
            daemon.release(token, &answer.deliver);
            return;
        }
        daemon.deliver(token, &answer.deliver);
    }
}
