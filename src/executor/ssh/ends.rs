//! `Ends`: the ends of a host's jobs, heard through one `wait` per host and session
//! kept open on the host's daemon, whatever the number of jobs.
//!
//! How it works: each job's task, once the host gave its id, joins the watcher of its
//! link and session ([`Ends::watch`]; the guard leaves it). The watcher asks the host's
//! daemon one `wait` of all the ids it holds (the first end answers, `END_WAIT_S` at
//! most), hands every ended item of the reply to its job's task and asks again. When
//! the set changes (a job joins or leaves) the `wait` in flight is cancelled on the
//! host (`Link::request_or`: the relay closes its connection there) and asked again
//! with the new set, a moment later so that a burst of starts costs one ask. So the
//! host's daemon serves one connection for the ends of a session's hundred jobs, not a
//! hundred; the job's own looks at its pace remain the backstop when the link is down
//! or a `wait` is refused.

use super::link::Link;
use crate::wire::{Envelope, Item, Request, State, WaitArgs, WaitReply};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How long one `wait` for the ends stays open on the host.
const END_WAIT_S: f64 = 30.0;
/// How long a watcher lets its set settle after a change before it asks again.
const SETTLE: Duration = Duration::from_millis(20);
/// How long a watcher waits after a refused or failed `wait` (or a change, if sooner).
const PAUSE: Duration = Duration::from_secs(1);

/// Who hears of an end: the job's task.
pub type EndSender = mpsc::UnboundedSender<Item>;

/// The watchers of a daemon, one per host and session that has jobs being watched.
#[derive(Default)]
pub struct Ends {
    watchers: Mutex<HashMap<(String, String), Arc<Watcher>>>,
}

/// The jobs of one host and session whose ends are awaited, by their id there.
struct Watcher {
    jobs: Mutex<HashMap<String, EndSender>>,
    /// Counts the changes of `jobs`, so the `wait` in flight is asked again.
    changes: watch::Sender<u64>,
}

/// A job watched for its end while this lives.
pub struct EndWatch {
    watcher: Arc<Watcher>,
    id: String,
}

impl Drop for EndWatch {
    fn drop(&mut self) {
        if lock(&self.watcher.jobs).remove(&self.id).is_some() {
            self.watcher.changes.send_modify(|n| *n += 1);
        }
    }
}

impl Ends {
    /// Watches the job `id` of `session` on `link`'s host: its ended item (as the host
    /// recorded it) is sent to `ended` once.
    pub fn watch(
        self: &Arc<Self>,
        link: Arc<Link>,
        session: &str,
        id: &str,
        ended: EndSender,
    ) -> EndWatch {
        let key = (link.call.host.clone(), session.to_string());
        let mut watchers = lock(&self.watchers);
        let watcher = match watchers.get(&key) {
            Some(watcher) => watcher.clone(),
            None => {
                let watcher = Arc::new(Watcher {
                    jobs: Mutex::default(),
                    changes: watch::Sender::new(0),
                });
                watchers.insert(key.clone(), watcher.clone());
                tokio::spawn(self.clone().run(key, link, watcher.clone()));
                watcher
            }
        };
        lock(&watcher.jobs).insert(id.to_string(), ended);
        watcher.changes.send_modify(|n| *n += 1);
        EndWatch {
            watcher,
            id: id.to_string(),
        }
    }

    /// One watcher's loop: a `wait` of all its ids at a time, until it has none (then
    /// it is forgotten; the next job to join makes a new one).
    async fn run(self: Arc<Self>, key: (String, String), link: Arc<Link>, watcher: Arc<Watcher>) {
        let mut changes = watcher.changes.subscribe();
        let takes = Duration::from_secs_f64(END_WAIT_S);
        loop {
            changes.borrow_and_update();
            let ids: Vec<String> = {
                let mut watchers = lock(&self.watchers);
                let jobs = lock(&watcher.jobs);
                if jobs.is_empty() {
                    // Under the watchers' lock: no job joins this one as it goes.
                    if watchers.get(&key).is_some_and(|w| Arc::ptr_eq(w, &watcher)) {
                        watchers.remove(&key);
                    }
                    return;
                }
                let mut ids: Vec<String> = jobs.keys().cloned().collect();
                ids.sort();
                ids
            };
            let envelope = Envelope {
                session: key.1.clone(),
                request: Request::Wait(WaitArgs {
                    ids,
                    all: false,
                    until: None,
                    timeout_s: Some(END_WAIT_S),
                }),
            };
            let changed = async {
                let _ = changes.changed().await;
            };
            let answered = link.request_or(&envelope, takes, changed).await;
            let reply = match answered {
                // The set changed: asked again once it settles.
                Ok(None) => {
                    tokio::time::sleep(SETTLE).await;
                    continue;
                }
                Ok(Some((line, _))) => crate::wire::decode_reply::<WaitReply>(&line).ok(),
                Err(_) => None,
            };
            let Some(reply) = reply else {
                // Refused there (a job the host no longer knows: its task finds that out
                // and leaves), or the link is down: asked again after a pause.
                tokio::select! {
                    _ = tokio::time::sleep(PAUSE) => {}
                    _ = changes.changed() => {}
                }
                continue;
            };
            let mut jobs = lock(&watcher.jobs);
            for item in reply.items {
                if item.state != State::Ended {
                    continue;
                }
                if let Some(ended) = jobs.remove(&item.id) {
                    let _ = ended.send(item);
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
