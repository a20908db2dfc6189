//! Who watches which item's output, and how promptly that item's supervisor reports it.
//!
//! A supervisor tells the daemon how far its log has grown at a pace the daemon sets:
//! [`Pace::Prompt`] while a person or a stream shows that output as it comes (a `run`,
//! a follower in the strip, a `start`'s window), [`Pace::Waiting`] while someone waits
//! for a line of it (a `wait --until`, a monitor of the output: an agent that hears of
//! it at its next turn), [`Pace::Relaxed`] otherwise, which is enough for the daemon's
//! own watch of each job (quiet spells, a port in use) and costs it almost nothing for
//! output nobody waits on. The fastest pace among an item's watchers is the one told.
//! Output after a quiet spell is reported at once whatever the pace, so a pace only
//! spaces the reports of output that streams. Reads never depend on it: they take a
//! log's length from the file.
//!
//! Output of an item wakes only its own watchers. The pace a supervisor was told is
//! decided here alone, under this registry's lock, so a watcher that comes and one that
//! goes cannot leave it at the wrong pace.

use crate::executor::JobHandle;
use crate::wire::control::ToSupervisor;
use std::collections::HashMap;
use tokio::sync::watch;

/// The progress interval of a job whose output is shown as it comes. Output after a
/// quiet spell is reported at once; output that streams, at most this often: 20 times
/// a second looks live to a person, and a job printing 1,000 lines a second costs the
/// daemon 20 reports a second, not 500.
pub(crate) const PROMPT_MS: u64 = 50;
/// The progress interval of a job someone waits on for a line (`wait --until`, a
/// monitor): a line that streams in is found within a quarter of a second, well inside
/// an agent's turn, and 50 such waits on chatty jobs cost the daemon 200 reports a
/// second, not 1,000.
pub(crate) const WAITING_MS: u64 = 250;
/// The progress interval of a job nobody waits on: its quiet spells are told apart
/// from the log's own length when they end, and a port in use a second later is soon
/// enough; a hundred such jobs cost the daemon a hundred reports a second.
pub(crate) const RELAXED_MS: u64 = 1000;

/// How soon a watcher needs to hear of new output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pace {
    /// Within milliseconds: it is shown as it comes.
    Prompt,
    /// Within a quarter of a second: someone waits for a line of it.
    Waiting,
    /// Within a second: the daemon's own background watch.
    Relaxed,
}

impl Pace {
    fn every_ms(self) -> u64 {
        match self {
            Pace::Prompt => PROMPT_MS,
            Pace::Waiting => WAITING_MS,
            Pace::Relaxed => RELAXED_MS,
        }
    }
}

/// The watchers of one item, and the connection to its supervisor while it runs.
#[derive(Default)]
struct Item {
    watchers: Vec<(watch::Sender<()>, Pace)>,
    handle: Option<JobHandle>,
    /// The interval the supervisor was last told (none yet: the relaxed one it starts
    /// with).
    told_ms: Option<u64>,
}

impl Item {
    /// The interval its live watchers need: the fastest of their paces.
    fn wanted_ms(&self) -> u64 {
        self.watchers
            .iter()
            .filter(|(sender, _)| !sender.is_closed())
            .map(|(_, pace)| pace.every_ms())
            .min()
            .unwrap_or(RELAXED_MS)
    }

    /// Tells the supervisor the pace its watchers need, when it changed (or `always`).
    fn tell(&mut self, always: bool) {
        let every_ms = self.wanted_ms();
        if self.told_ms.unwrap_or(RELAXED_MS) == every_ms && !always {
            return;
        }
        self.told_ms = Some(every_ms);
        if let Some(handle) = &self.handle {
            // Every executor takes the pace (one that looks at its jobs' folders on a
            // clock of its own has nothing to change); a gone connection needs none.
            let _ = handle.send(ToSupervisor::Pace { every_ms });
        }
    }

    fn is_idle(&self) -> bool {
        self.watchers.is_empty() && self.handle.is_none()
    }
}

/// The registry (one per daemon).
#[derive(Default)]
pub(crate) struct OutputWatchers {
    items: std::sync::Mutex<HashMap<i64, Item>>,
}

impl OutputWatchers {
    fn items(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Item>> {
        self.items
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A receiver that changes when the output of any of `rows` grows. Nothing else
    /// wakes it, and output of other items costs its holder nothing.
    pub(crate) fn watch(&self, rows: &[i64], pace: Pace) -> watch::Receiver<()> {
        let (sender, receiver) = watch::channel(());
        let mut items = self.items();
        for &row in rows {
            let item = items.entry(row).or_default();
            // Watchers of an item that writes nothing are let go here.
            item.watchers.retain(|(sender, _)| !sender.is_closed());
            item.watchers.push((sender.clone(), pace));
            item.tell(false);
        }
        receiver
    }

    /// The output of `row` grew: wakes whoever watches it, forgets watchers that have
    /// gone, and slows its supervisor down once no one waits at its pace any more.
    pub(crate) fn grew(&self, row: i64) {
        let mut items = self.items();
        let Some(item) = items.get_mut(&row) else {
            return;
        };
        item.watchers.retain(|(sender, _)| sender.send(()).is_ok());
        item.tell(false);
        if item.is_idle() {
            items.remove(&row);
        }
    }

    /// A running item's supervisor connection: it is told its pace at once.
    pub(crate) fn attach(&self, row: i64, handle: JobHandle) {
        let mut items = self.items();
        let item = items.entry(row).or_default();
        item.handle = Some(handle);
        item.tell(true);
    }

    /// The item's supervisor connection is gone (it ended, or it is being reconnected).
    pub(crate) fn detach(&self, row: i64) {
        let mut items = self.items();
        if let Some(item) = items.get_mut(&row) {
            item.handle = None;
            item.told_ms = None;
            if item.is_idle() {
                items.remove(&row);
            }
        }
    }
}
