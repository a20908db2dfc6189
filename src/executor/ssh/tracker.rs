//! A job on a host: the task that follows it (`Tracker`): its pid and end learnt from
//! the host, `stop` and `send` carried there, the mirror kept at the daemon's pace.

use super::link::{self, LinkError};
use super::{ends, host_words, is_hangup, key_of, lock, write_ssh_file, Order};
use crate::executor::{Command, ExecEvent, WriteRefused};
use crate::job_dir::JobDir;
use crate::paths::now_ms;
use crate::wire::control::{ExitStatus, ToSupervisor, PROTOCOL};
use crate::wire::ssh::SshJob;
use crate::wire::{
    Actor, End, Envelope, ErrorCode, Item, ListReply, ReadArgs, ReadReply, Request, SendArgs,
    WaitArgs, WaitReply, WireError,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often a job's task asks the host for new output until the daemon sets a pace
/// (`Pace`: 50 ms while someone waits on the output, else 1 s), and the bounds of it.
/// At 1 s, a hundred jobs on one host cost its daemon a hundred reads a second.
const MIRROR_EVERY: Duration = Duration::from_millis(100);
const MIRROR_FASTEST: Duration = Duration::from_millis(50);
const MIRROR_SLOWEST: Duration = Duration::from_secs(1);

pub(super) struct Tracker {
    pub(super) row: i64,
    pub(super) link: Arc<link::Link>,
    pub(super) ends: Arc<ends::Ends>,
    pub(super) job_dir: PathBuf,
    pub(super) job: SshJob,
    pub(super) owner: String,
    pub(super) events: mpsc::UnboundedSender<ExecEvent>,
    /// The daemon knows its process runs (it was told `spawned`, or took it back).
    pub(super) spawned: bool,
    pub(super) pid: Option<i32>,
    /// The host's log offset mirrored so far.
    pub(super) mirrored: u64,
    pub(super) stop_actor: Option<Actor>,
    /// A stop, resize or hang-up the host has not taken yet, and the order of the
    /// input after them.
    pub(super) order: Arc<Order>,
    /// The item the host's `wait` answered with when the job ended there.
    pub(super) ended_item: Option<Item>,
}

/// What one look at the host found.
pub(super) enum Look {
    Going,
    Ended(Box<ExitStatus>),
}

impl Tracker {
    /// Mirrors at the pace the daemon asks, and at once when the host's daemon says
    /// the job ended (the `wait` of its host and session kept open there, `ends.rs`),
    /// so an end is known here within the link's round trip, not a poll's period.
    pub(super) async fn run(mut self, mut incoming: mpsc::UnboundedReceiver<Command>) {
        let _busy = self.link.busy();
        let mut tick = tokio::time::interval(MIRROR_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut commands_open = true;
        let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<Item>();
        let mut end_watch: Option<ends::EndWatch> = None;
        loop {
            let look = tokio::select! {
                biased;
                command = incoming.recv(), if commands_open => {
                    match command {
                        Some(Command::Send(ToSupervisor::Pace { every_ms })) => {
                            let every = Duration::from_millis(every_ms)
                                .clamp(MIRROR_FASTEST, MIRROR_SLOWEST);
                            if every != tick.period() {
                                tick = tokio::time::interval(every);
                                tick.set_missed_tick_behavior(
                                    tokio::time::MissedTickBehavior::Delay,
                                );
                            }
                        }
                        Some(command) => self.command(command),
                        None => commands_open = false,
                    }
                    false
                }
                Some(item) = ended_rx.recv() => {
                    self.ended_item = Some(item);
                    true
                }
                _ = tick.tick() => true,
            };
            if !look {
                continue;
            }
            if let Look::Ended(status) = self.look().await {
                let _ = self.events.send(ExecEvent::Ended {
                    row: self.row,
                    status: *status,
                });
                return;
            }
            self.send_pending();
            // From the moment the host has its id (not once its pid is seen: a short job
            // would end before the next look at the slow pace, and its end wait for it).
            if end_watch.is_none() {
                if let Some(id) = &self.job.remote_id {
                    end_watch = Some(self.ends.watch(
                        self.link.clone(),
                        &self.job.session,
                        id,
                        ended_tx.clone(),
                    ));
                }
            }
        }
    }

    pub(super) fn envelope(&self, request: Request) -> Envelope {
        Envelope {
            session: self.job.session.clone(),
            request,
        }
    }

    pub(super) async fn ask<T: serde::de::DeserializeOwned>(
        &self,
        request: Request,
    ) -> Result<T, LinkError> {
        let line = self
            .link
            .request(&self.envelope(request), Duration::ZERO)
            .await?;
        crate::wire::decode_reply(&line).map_err(LinkError::Refused)
    }

    /// The job's item on the host, found by its id there (or, when the daemon stopped
    /// before it heard the id, by its name).
    pub(super) async fn item(&mut self) -> Result<Option<Item>, LinkError> {
        if let Some(id) = &self.job.remote_id {
            // By its id: a `wait` that does not wait brings that one item (a `list`
            // would bring every item of the session there, a hundred jobs' worth, for
            // each of a hundred jobs). One the host no longer knows is refused so.
            let reply: WaitReply = self
                .ask(Request::Wait(WaitArgs {
                    ids: vec![id.clone()],
                    all: false,
                    until: None,
                    timeout_s: Some(0.0),
                }))
                .await?;
            return Ok(reply.items.into_iter().find(|item| &item.id == id));
        }
        let list: ListReply = self
            .ask(Request::List {
                all: true,
                all_sessions: false,
            })
            .await?;
        let found = list
            .items
            .into_iter()
            .find(|item| match &self.job.remote_id {
                Some(id) => &item.id == id,
                None => item.name.as_deref() == Some(&self.job.name),
            });
        if let (None, Some(item)) = (&self.job.remote_id, &found) {
            self.job.remote_id = Some(item.id.clone());
            // With what is pending now (its own copy may be older).
            self.job.unsent = *lock(&self.order.pending);
            let _ = write_ssh_file(&self.job_dir, &self.job);
        }
        Ok(found)
    }

    pub(super) async fn look(&mut self) -> Look {
        match self.look_once().await {
            Ok(look) => look,
            // Down: shown in `list` by the link; asked again on the next tick.
            Err(LinkError::Down(_) | LinkError::InDoubt(_)) => Look::Going,
            Err(LinkError::Refused(e)) if e.code == ErrorCode::UnknownId => {
                Look::Ended(Box::new(self.lost(format!(
                    "{} no longer has it (was the host rebooted, or its bgwork home removed?)",
                    self.job.host
                ))))
            }
            Err(LinkError::Refused(e)) => {
                crate::note!("bgwork daemon: {}: {}", self.job.host, e.message);
                Look::Going
            }
        }
    }

    pub(super) async fn look_once(&mut self) -> Result<Look, LinkError> {
        // Its pid is asked for until it is known, a job taken back too (a daemon killed
        // just after the start never heard it).
        if self.job.remote_id.is_none() || !self.spawned || self.pid.is_none() {
            match self.item().await? {
                None if self.job.remote_id.is_none() => {
                    return Ok(Look::Ended(Box::new(self.lost(format!(
                        "it was being handed to {} when the daemon or the connection stopped, and \
                         the host does not know it (it never started)",
                        self.job.host
                    )))))
                }
                None => {
                    return Err(LinkError::Refused(WireError::new(
                        ErrorCode::UnknownId,
                        "gone",
                    )))
                }
                Some(item) => {
                    if let Some(pid) = item.pid.filter(|&p| p > 0) {
                        let row = self.row;
                        let event = match self.spawned {
                            false => ExecEvent::Spawned { row, pid },
                            true => ExecEvent::Pid { row, pid },
                        };
                        (self.pid, self.spawned) = (Some(pid), true);
                        let _ = self.events.send(event);
                    }
                    if item.state == crate::wire::State::Ended && item.pid.is_none() {
                        return Ok(Look::Ended(Box::new(self.status_of(&item))));
                    }
                    if !self.spawned {
                        return Ok(Look::Going);
                    }
                }
            }
        }
        let Some(id) = self.job.remote_id.clone() else {
            return Ok(Look::Going);
        };
        let reply = self.catch_up(&id).await?;
        if reply.running {
            return Ok(Look::Going);
        }
        // Ended there when that read was made, so its log was whole: the end the
        // host's `wait` brought needs no more asking.
        if let Some(item) = self.ended_item.take() {
            return Ok(Look::Ended(Box::new(self.status_of(&item))));
        }
        // Ended there, its output caught up: its end, from its item.
        match self.item().await? {
            Some(item) if item.state == crate::wire::State::Ended => {
                // Output written between the read and the end is read once more.
                let more: ReadReply = self
                    .ask(Request::Read(ReadArgs {
                        id: id.clone(),
                        from: Some(self.mirrored),
                        raw: true,
                        max_bytes: Some(64),
                        no_redact: true,
                        ..ReadArgs::default()
                    }))
                    .await?;
                if more.to > self.mirrored {
                    return Ok(Look::Going);
                }
                Ok(Look::Ended(Box::new(self.status_of(&item))))
            }
            Some(_) => Ok(Look::Going),
            None => Err(LinkError::Refused(WireError::new(
                ErrorCode::UnknownId,
                "gone",
            ))),
        }
    }

    pub(super) fn base_status(&self) -> ExitStatus {
        ExitStatus {
            protocol: PROTOCOL,
            owner: self.owner.clone(),
            ended_at_ms: now_ms(),
            log_len: std::fs::metadata(JobDir(&self.job_dir).log()).map_or(0, |m| m.len()),
            dropped: 0,
            pid: self.pid,
            ..ExitStatus::default()
        }
    }

    pub(super) fn lost(&self, why: String) -> ExitStatus {
        ExitStatus {
            scheduler_end: Some(End::Lost),
            detail: Some(why),
            ..self.base_status()
        }
    }

    /// The end as the host's daemon recorded it.
    pub(super) fn status_of(&self, item: &Item) -> ExitStatus {
        let mut status = self.base_status();
        status.exit_code = item.exit_code;
        status.signal = item.signal;
        status.cpu_ms = item.cost.cpu_ms;
        status.peak_rss_bytes = item.cost.peak_rss_bytes;
        let detail = item.end_detail.clone();
        match item.end {
            Some(end @ (End::StoppedByAgent | End::StoppedByPerson)) => {
                status.stop_actor = Some(match end {
                    End::StoppedByAgent => Actor::Agent,
                    _ => Actor::Person,
                });
                // The host's item says what its stop had to do in its report
                // ("bg-3 was stopped by the agent: did not stop on TERM; …").
                let said = item
                    .report
                    .as_deref()
                    .and_then(|r| r.split_once(": "))
                    .map(|(_, said)| said);
                self.stop_figures(&mut status, said);
            }
            Some(End::SpawnFailed) => {
                status.spawn_error = Some(format!(
                    "on {}: {}",
                    self.job.host,
                    detail.unwrap_or_else(|| "it could not start".into())
                ))
            }
            // A pane hung up there: its code and signal say so here as well.
            Some(End::Cancelled) if item.exit_code.is_some() || item.signal.is_some() => {}
            Some(end @ (End::Lost | End::Cancelled)) => {
                status.exit_code = None;
                status.signal = None;
                status.scheduler_end = Some(end);
                status.detail = Some(format!(
                    "on {}: {}",
                    self.job.host,
                    detail.unwrap_or_else(|| "its supervisor there left no status".into())
                ));
            }
            _ => {}
        }
        if status.stop_actor.is_none() {
            if let Some(actor) = self.stop_actor.filter(|_| {
                item.end
                    .is_some_and(|e| e != End::Succeeded && e != End::Failed)
            }) {
                status.stop_actor = Some(actor);
            }
        }
        status
    }

    /// What the host's stop had to do, from its end's report (the same bgwork wrote
    /// it: `settle::stop_detail`): killed after the grace, past `--max-runtime`.
    pub(super) fn stop_figures(&self, status: &mut ExitStatus, detail: Option<&str>) {
        let Some(detail) = detail else { return };
        // `settle::PAST_LIMIT`.
        if detail.starts_with("ran past its limit") {
            status.past_limit_ms = self.job.max_runtime_ms.or(Some(0));
        }
        if detail.contains("killed at once") {
            status.killed_after_ms = Some(0);
        } else if let Some(rest) = detail.split("killed after ").nth(1) {
            let seconds = rest.split(' ').next().and_then(|s| s.parse::<f64>().ok());
            status.killed_after_ms = seconds.map(|s| (s * 1000.0).round() as u64);
        }
    }

    pub(super) fn command(&mut self, command: Command) {
        let Some(id) = self.job.remote_id.clone() else {
            if let Command::Write { answer, .. } = command {
                let _ = answer.send(Err(WriteRefused::Unreachable(format!(
                    "it is still being handed to {}: try again in a moment",
                    self.job.host
                ))));
            }
            return;
        };
        let link = self.link.clone();
        match command {
            Command::Send(ToSupervisor::Stop { grace_ms, actor }) => {
                // The stop's end is seen by the mirror; one asked while the host is
                // down is sent when it answers. As a local supervisor does, the first
                // stop's actor is the end's, and the sooner KILL wins.
                let actor = *self.stop_actor.get_or_insert(actor);
                let mut pending = lock(&self.order.pending);
                let grace_ms = pending.stop.map_or(grace_ms, |(g, _)| g.min(grace_ms));
                pending.stop = Some((grace_ms, actor));
                drop(pending);
                self.order.keep();
                self.send_pending();
            }
            Command::Send(ToSupervisor::Signal { signal }) if is_hangup(signal) => {
                // A pane hung up (`close`): the host's daemon hangs its terminal up.
                lock(&self.order.pending).hang_up = true;
                self.order.keep();
                self.send_pending();
            }
            Command::Send(ToSupervisor::Resize { cols, rows }) => {
                lock(&self.order.pending).resize = Some((cols, rows));
                self.order.keep();
                self.send_pending();
            }
            Command::Send(command @ (ToSupervisor::Signal { .. } | ToSupervisor::CloseInput)) => {
                let key = match command {
                    ToSupervisor::Signal { signal } => key_of(signal).unwrap_or("C-c"),
                    _ => "C-d",
                };
                let closes = key == "C-d";
                let envelope = self.envelope(Request::Send(SendArgs {
                    id,
                    text: String::new(),
                    keys: vec![key.to_string()],
                }));
                let (events, row) = (self.events.clone(), self.row);
                tokio::spawn(async move {
                    match link.request(&envelope, Duration::ZERO).await {
                        Ok(line) => match crate::wire::decode_reply::<serde_json::Value>(&line) {
                            Ok(_) if closes => {
                                let _ = events.send(ExecEvent::InputClosed { row });
                            }
                            Ok(_) => {}
                            Err(e) => crate::note!(
                                "bgwork daemon: {key} was refused there: {}",
                                e.message
                            ),
                        },
                        Err(e) => crate::note!("bgwork daemon: {key} did not reach the host: {e}"),
                    }
                });
            }
            // Refused before they are sent (`refuses`), or taken by `run` (the pace):
            // named one by one, so a new command is a compile error here, never dropped.
            Command::Send(
                ToSupervisor::Hello { .. }
                | ToSupervisor::Input { .. }
                | ToSupervisor::Write { .. }
                | ToSupervisor::Pace { .. }
                | ToSupervisor::Rerun { .. },
            ) => {}
            Command::Write { data, answer } => {
                let text = crate::keys::escape(&data);
                let envelope = self.envelope(Request::Send(SendArgs {
                    id,
                    text,
                    keys: Vec::new(),
                }));
                let (order, host) = (self.order.clone(), self.job.host.clone());
                tokio::spawn(async move {
                    // After a resize or hang-up asked before it, as the caller asked them.
                    let _turn = order.turn().await;
                    let result = match link.request(&envelope, Duration::ZERO).await {
                        Ok(line) => match crate::wire::decode_reply::<serde_json::Value>(&line) {
                            Ok(_) => Ok(0),
                            Err(e) if e.code == ErrorCode::NotRunning => Err(WriteRefused::Closed),
                            Err(e) => Err(WriteRefused::Unreachable(host_words(&host, &e.message))),
                        },
                        Err(e) => Err(WriteRefused::Unreachable(e.to_string())),
                    };
                    let _ = answer.send(result);
                });
            }
        }
    }
}

impl Tracker {
    /// Sends the pane's pending resize and hang-up to the host in a turn of their own
    /// (one such at a time); what the link could not carry waits for the next look.
    pub(super) fn send_pending(&self) {
        let Some(id) = self.job.remote_id.clone() else {
            return;
        };
        *lock(&self.order.to) = Some((self.link.clone(), self.job.session.clone(), id));
        use std::sync::atomic::Ordering;
        if !self.order.has_pending() || self.order.retrying.swap(true, Ordering::SeqCst) {
            return;
        }
        let order = self.order.clone();
        tokio::spawn(async move {
            drop(order.turn().await);
            order.retrying.store(false, Ordering::SeqCst);
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn input_crosses_as_send_text_byte_for_byte() {
        let data: Vec<u8> = (0..=255u8).chain(*b"a\\nb\\x41").collect();
        let text = crate::keys::escape(&data);
        assert_eq!(crate::keys::unescape(&text).unwrap(), data);
    }
}
