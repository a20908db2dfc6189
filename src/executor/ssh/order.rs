//! A job on a host: the stop, resize and hang-up the host has not taken yet, kept in
//! order with its input (`Order`), and sent again until the host answers.

use super::link::{self, LinkError};
use super::{lock, read_ssh_file, write_ssh_file};
use crate::wire::{Envelope, Request, StopArgs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A stop, and a pane's resize and hang-up, not yet taken by the host (its link was
/// down, or the request in doubt): sent again after each look until the host answers
/// (each may be carried out twice, never lost), and always before input asked after
/// them: input and these take turns ([`Order::turn`]), each turn sending what is
/// pending first.
#[derive(Default)]
pub(super) struct Order {
    pub(super) pending: Mutex<Pending>,
    pub(super) turns: tokio::sync::Mutex<()>,
    /// A retry waits for its turn (one at a time).
    pub(super) retrying: std::sync::atomic::AtomicBool,
    /// What a turn needs to send them.
    pub(super) to: Mutex<Option<(Arc<link::Link>, String, String)>>,
    /// The job's folder, whose `ssh.json` keeps what is pending.
    pub(super) folder: Mutex<Option<PathBuf>>,
}

/// What is pending, kept in the job's `ssh.json` too (`SshJob::unsent`), so that a
/// daemon restarted before the host answers sends it still.
pub(super) type Pending = crate::wire::ssh::Unsent;

impl Order {
    /// Waits for this caller's turn, then sends what is pending; the turn lasts while
    /// the guard lives.
    pub(super) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        let turn = self.turns.lock().await;
        let to = lock(&self.to).clone();
        let Some((link, session, id)) = to else {
            return turn;
        };
        let (stop, resize, hang_up) = {
            let mut pending = lock(&self.pending);
            let hang_up = std::mem::take(&mut pending.hang_up);
            (pending.stop.take(), pending.resize.take(), hang_up)
        };
        let envelope = |request| Envelope {
            session: session.clone(),
            request,
        };
        if let Some((grace_ms, actor)) = stop {
            let request = Request::Stop(StopArgs {
                id: id.clone(),
                grace_s: Some(grace_ms as f64 / 1000.0),
                actor,
            });
            // The host answers once the job is gone, which may take its grace.
            let grace = Duration::from_millis(grace_ms);
            if !tell(&link, &envelope(request), grace).await {
                lock(&self.pending).stop.get_or_insert((grace_ms, actor));
            }
        }
        if let Some((cols, rows)) = resize {
            let id = id.clone();
            let taken = tell(
                &link,
                &envelope(Request::Resize { id, cols, rows }),
                Duration::ZERO,
            )
            .await;
            let mut pending = lock(&self.pending);
            if !taken && pending.resize.is_none() {
                pending.resize = Some((cols, rows));
            }
        }
        if hang_up && !tell(&link, &envelope(Request::Close { id }), Duration::ZERO).await {
            lock(&self.pending).hang_up = true;
        }
        if stop.is_some() || resize.is_some() || hang_up {
            self.keep();
        }
        turn
    }

    /// Writes what is pending into the job's `ssh.json`.
    pub(super) fn keep(&self) {
        let Some(folder) = lock(&self.folder).clone() else {
            return;
        };
        let Some(mut job) = read_ssh_file(&folder) else {
            return;
        };
        let unsent = *lock(&self.pending);
        if job.unsent != unsent {
            job.unsent = unsent;
            if let Err(e) = write_ssh_file(&folder, &job) {
                crate::note!("bgwork daemon: {e}");
            }
        }
    }

    pub(super) fn has_pending(&self) -> bool {
        !lock(&self.pending).is_empty()
    }
}

/// Sends a request (that `takes` so long there) whose answer only the daemon's log
/// hears of; false when the host did not answer (to be sent again), true when it did
/// (a refusal is noted).
async fn tell(link: &link::Link, envelope: &Envelope, takes: Duration) -> bool {
    match link.request(envelope, takes).await {
        Ok(line) => {
            if let Err(e) = crate::wire::decode_reply::<serde_json::Value>(&line) {
                crate::note!("bgwork daemon: the host refused a request: {}", e.message);
            }
            true
        }
        Err(LinkError::Refused(e)) => {
            crate::note!("bgwork daemon: the host refused a request: {}", e.message);
            true
        }
        Err(LinkError::Down(_) | LinkError::InDoubt(_)) => false,
    }
}
