//! `run`: a foreground run with a deadline. It ends in time (its output and status), or
//! it is promoted to a background job when the session has room, or killed when not.
//!
//! The job is an ordinary job record from its first byte, so promotion loses nothing:
//! the output is all in its log, and its notice (if armed) fires as for any job.
//!
//! The command's stdin is closed at once, or is the caller's own: the caller sends it
//! as [`StdinFrame`] lines on the connection while the run lasts (end-of-input when its
//! stdin ends), as a shell passes its stdin to a foreground command. A caller that goes
//! away stops the run, as Ctrl-C in a terminal would.
//!
//! A run on an ssh host (`run --on ssh:HOST`) is the same: its job is a job of the
//! host's daemon, its output streamed from the mirror in its local folder, its stdin,
//! stop and promotion carried by the ssh executor; it counts at promotion against the
//! session's limit for work on hosts.

use crate::daemon::admission::Launch;
use crate::daemon::connection::{write_reply, FrameReader};
use crate::daemon::history::AutoDeadline;
use crate::daemon::Daemon;
use crate::executor::{HereOnly, On, WriteRefused};
use crate::output;
use crate::wire::control::ToSupervisor;
use crate::wire::{
    self, Actor, Chunk, RunArgs, RunOutcome, RunReply, RunStdin, State, StdinFrame, TimeoutMode,
    WireError,
};
use base64::Engine;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;

/// How the detail of a run killed at its deadline begins (its report says so).
pub(crate) const KILLED_AT_DEADLINE: &str = "killed at its";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a killed run may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(3);
/// How long a run stopped because its caller went away gets before KILL.
const CALLER_GONE_GRACE: Duration = Duration::from_secs(2);

/// The connection of a foreground run: streamed output and the reply go to `writer`;
/// the caller's stdin (and its going away) come from `reader`.
pub(crate) struct Caller<'a> {
    pub reader: &'a mut FrameReader,
    pub writer: &'a mut OwnedWriteHalf,
    /// Set when the run was promoted while the caller's stdin had not ended: the rest of
    /// it is passed on after the reply ([`Daemon::pass_rest`]), so no input is lost.
    pub rest: &'a mut Option<StdinRest>,
}

/// What is left to pass of a promoted run's stdin: the job's row, and the input the
/// job had not taken yet at the promotion.
pub(crate) struct StdinRest {
    row: i64,
    unwritten: Vec<u8>,
    /// The caller's stdin ended after `unwritten`.
    eof: bool,
}

/// How a run's wait ended, besides the job ending or the deadline.
enum Interrupt {
    /// The caller closed the connection.
    Gone,
    /// The caller sent something that is not a stdin frame.
    Bad(WireError),
    /// The caller can no longer show the output and asks for the background now.
    Detach(String),
}

impl Daemon {
    /// Runs on the caller's connection (see [`Caller`]). A run that ended is added to
    /// `ends_shown`: its notice is delivered with the reply.
    pub(crate) async fn run(
        &self,
        session: &str,
        args: RunArgs,
        caller: Caller<'_>,
        ends_shown: &mut crate::daemon::Shown<'_>,
    ) -> Result<RunReply, WireError> {
        let mut args = args;
        let (mut timeout, mut auto) =
            match (args.timeout, args.timeout_s) {
                (Some(_), Some(_)) => return Err(WireError::bad_request(
                    "a run takes a timeout of `auto` or a number of seconds (timeout_s), not both",
                )),
                (Some(TimeoutMode::Auto), None) => {
                    let cwd = crate::daemon::jobs::new_item::place(&args.start)?.0;
                    match self.auto_deadline(&cwd, &args.start.command, DEFAULT_TIMEOUT) {
                        AutoDeadline::Foreground(deadline, reason, wait) => {
                            (deadline, Some(AutoChoice::Foreground { reason, wait }))
                        }
                        AutoDeadline::Background(reason) => {
                            // Its notice is armed: the caller is not waiting for its end.
                            args.start.notify = true;
                            (Duration::ZERO, Some(AutoChoice::Background(reason)))
                        }
                    }
                }
                (None, Some(s)) => (crate::wire::seconds("--timeout", s)?, None),
                (None, None) => (DEFAULT_TIMEOUT, None),
            };
        let which = On::of(&args.start).which();
        if let Some(refused) = which.refuses_here_only(HereOnly::Run) {
            return Err(WireError::bad_request(refused));
        }
        let launch = Launch {
            over_limit: true,
            ..Launch::default()
        };
        // An end before the deadline is shown by this run's reply.
        let row = self
            .launch(session, &args.start, launch, Some(&mut *ends_shown))
            .await?;
        let _in_the_foreground = InTheForeground::take(self, row);
        if let Some(AutoChoice::Background(reason)) = &auto {
            let mut inner = self.lock();
            match self.promotion_refused(&inner, session, which, row)? {
                // Promoted at once, it would be killed: it waits as with no history.
                Some(full) => {
                    timeout = DEFAULT_TIMEOUT;
                    auto = Some(AutoChoice::Foreground {
                        reason: format!("{reason}, but {full}"),
                        wait: format!("the plain {} s instead", DEFAULT_TIMEOUT.as_secs()),
                    });
                }
                // The room is its own from now on: a run deciding at the same moment
                // counts it.
                None => {
                    inner.foreground.remove(&row);
                }
            }
        }
        if args.stream || args.announce {
            // Its id, and the choice of `--timeout auto`, before the wait (a caller that
            // loses the daemon meanwhile can still name the job that goes on); a caller
            // gone is seen below.
            let id = self.lock().store.get(row).ok().flatten().map(|r| r.id);
            let started = wire::RunStarted {
                started: id.unwrap_or_default(),
                note: auto.as_ref().and_then(AutoChoice::before),
            };
            let _ = caller.writer.write_all(&wire::encode_line(&started)).await;
        }
        let forward = args.stdin == RunStdin::Forward;
        let mut stdin_open = forward;
        // Input received that the job had not taken by the deadline: kept for it.
        let (mut unwritten, mut unwritten_eof): (Vec<u8>, bool) = (Vec::new(), false);
        if !forward {
            self.to_job(row, ToSupervisor::CloseInput);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        // Output shown so far, and the log's length when last looked at.
        let (mut shown, mut seen) = (0, 0);
        let interrupt = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let stream = args.stream;
            let more = move |d: &Daemon| d.has_ended(row) || (stream && d.log_len_of(row) > seen);
            tokio::select! {
                _ = self.wait_for_item(row, left, more) => {}
                frame = next_frame(caller.reader) => match frame {
                    Ok(Some(line)) => {
                        let frame = match stdin_frame(&line) {
                            Ok(frame) => frame,
                            Err(e) => break Some(Interrupt::Bad(e)),
                        };
                        if let Some(why) = frame.detach {
                            break Some(Interrupt::Detach(why));
                        }
                        if !forward {
                            // Stdin of a run that takes none goes nowhere.
                            continue;
                        }
                        let eof = frame.eof;
                        let took = self
                            .take_stdin(row, frame, &mut stdin_open, Some(deadline), Some(&*caller.reader))
                            .await;
                        match took {
                            Ok(Some(left)) => (unwritten, unwritten_eof) = (left, eof),
                            Ok(None) => break Some(Interrupt::Gone),
                            Err(e) => break Some(Interrupt::Bad(e)),
                        }
                        if unwritten.is_empty() {
                            continue;
                        }
                    }
                    Ok(None) => break Some(Interrupt::Gone),
                    Err(e) => break Some(Interrupt::Bad(e)),
                },
            }
            if stream {
                seen = self.log_len_of(row);
                match self.stream_bytes(row, shown, seen, caller.writer).await {
                    Some(to) => shown = to,
                    None => break Some(Interrupt::Gone),
                }
            }
            if self.has_ended(row) || tokio::time::Instant::now() >= deadline {
                break None;
            }
        };
        match interrupt {
            None => {
                if args.stream {
                    // The rest, to the last byte, before the reply.
                    let len = self.log_len_of(row);
                    if let Some(to) = self.stream_bytes(row, shown, len, caller.writer).await {
                        shown = to;
                    }
                }
                let mut reply = self.finish_run(session, row, shown, timeout, None).await?;
                if reply.outcome == RunOutcome::Ended {
                    ends_shown.push(row);
                }
                if reply.outcome == RunOutcome::Promoted && stdin_open {
                    *caller.rest = Some(StdinRest {
                        row,
                        unwritten,
                        eof: unwritten_eof,
                    });
                }
                auto_choice(&mut reply, auto);
                Ok(reply)
            }
            Some(Interrupt::Detach(why)) => {
                // Not a Ctrl-C: the caller only cannot show the output (a full disk).
                // The run is decided as at its deadline, now.
                let mut reply = self
                    .finish_run(session, row, shown, timeout, Some(why))
                    .await?;
                if reply.outcome == RunOutcome::Ended {
                    ends_shown.push(row);
                }
                if reply.outcome == RunOutcome::Promoted && stdin_open {
                    *caller.rest = Some(StdinRest {
                        row,
                        unwritten,
                        eof: unwritten_eof,
                    });
                }
                auto_choice(&mut reply, auto);
                Ok(reply)
            }
            Some(interrupt) => {
                // The caller went away from a foreground run (or broke its protocol):
                // stop it, as Ctrl-C in its terminal would.
                self.stop_now(row, CALLER_GONE_GRACE, Actor::Person);
                Err(match interrupt {
                    Interrupt::Bad(e) => e,
                    Interrupt::Gone | Interrupt::Detach(_) => {
                        WireError::bad_request("the caller went away")
                    }
                })
            }
        }
    }

    /// Passes one stdin frame of the caller on to the job. While the job has not read
    /// what waits, this waits too (and so the caller's connection is not read, and the
    /// caller stops reading its stdin): input never piles up in the daemon. Past the
    /// `deadline` (none: until the job takes it or ends) the input the job has not
    /// taken is given back, for the run's promotion to keep. `None` when the `caller`
    /// went away meanwhile (a Ctrl-C).
    async fn take_stdin(
        &self,
        row: i64,
        frame: StdinFrame,
        open: &mut bool,
        deadline: Option<tokio::time::Instant>,
        caller: Option<&FrameReader>,
    ) -> Result<Option<Vec<u8>>, WireError> {
        let data = decoded(&frame)?;
        if !*open {
            // Input after end-of-input (or to a run whose stdin was closed) goes nowhere.
            return Ok(Some(Vec::new()));
        }
        let Some(left) = self.write_stdin(row, data, open, deadline, caller).await else {
            return Ok(None);
        };
        if frame.eof && left.is_empty() {
            *open = false;
            self.to_job(row, ToSupervisor::CloseInput);
        }
        Ok(Some(left))
    }

    /// Writes `data` into the job's input, waiting while its queue is full, until the
    /// `deadline`; what is left unwritten then (nothing once written, or when the job
    /// ended or its input closed). `None` when the `caller` whose input it is went away
    /// meanwhile.
    async fn write_stdin(
        &self,
        row: i64,
        data: Vec<u8>,
        open: &mut bool,
        deadline: Option<tokio::time::Instant>,
        caller: Option<&FrameReader>,
    ) -> Option<Vec<u8>> {
        let handle = self.lock().live.get(&row).map(|live| live.handle.clone());
        let (Some(handle), false) = (handle, data.is_empty()) else {
            return Some(Vec::new());
        };
        let mut delay = std::time::Duration::from_millis(5);
        loop {
            match handle.write(data.clone()).await {
                Ok(_) => return Some(Vec::new()),
                Err(WriteRefused::Full(_)) => {
                    if self.has_ended(row) {
                        return Some(Vec::new());
                    }
                    if caller.is_some_and(FrameReader::peer_gone) {
                        return None;
                    }
                    // A daemon that shuts down holds it for a while only.
                    let deadline = deadline.or_else(|| self.hand_over_by());
                    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        return Some(data);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_millis(200));
                }
                Err(WriteRefused::Closed) => {
                    *open = false;
                    return Some(Vec::new());
                }
                Err(WriteRefused::Unreachable(_)) => return Some(Vec::new()),
            }
        }
    }

    /// After a promoted run's reply: passes the rest of the caller's stdin on to the
    /// job as it comes (the input the job had not taken first), until end-of-input
    /// (then the job's input is closed), the job's end, or the caller's going away
    /// (then its input stays open, for `send`); then tells the caller what it needs
    /// to know ([`Passed`]). A daemon that shuts down shuts the caller's way of the
    /// connection, passes on what the caller had sent while the job takes it (for
    /// a few seconds), and gives back the rest.
    pub(crate) async fn pass_rest(
        &self,
        rest: StdinRest,
        reader: &mut FrameReader,
        writer: &mut OwnedWriteHalf,
        stall: Duration,
    ) {
        let _passing = self.passing_input();
        let lines = match self.pass_frames(rest, reader).await {
            Passed::NoMore => vec![wire::STDIN_TAKEN_NO_MORE.to_vec()],
            Passed::Returned(bytes) => bytes
                .chunks(RETURNED_CHUNK)
                .map(|piece| {
                    wire::encode_line(&wire::ReturnedStdin {
                        returned: base64::engine::general_purpose::STANDARD.encode(piece),
                    })
                })
                .collect(),
            Passed::Gone => Vec::new(),
        };
        for line in lines {
            if write_reply(writer, &line, stall).await.is_err() {
                return;
            }
        }
    }

    async fn pass_frames(&self, rest: StdinRest, reader: &mut FrameReader) -> Passed {
        let mut shutdown = self.shutdown_signal();
        let mut shut = false;
        let StdinRest {
            row,
            unwritten,
            eof,
        } = rest;
        let mut open = true;
        let mut returned = self
            .write_stdin(row, unwritten, &mut open, None, None)
            .await
            .unwrap_or_default();
        if !open {
            return Passed::NoMore;
        }
        if eof {
            // Its caller has sent everything and gone: what the job did not take by a
            // shutdown's hand-over cannot be given back.
            if returned.is_empty() {
                self.to_job(row, ToSupervisor::CloseInput);
            }
            return Passed::NoMore;
        }
        loop {
            if !returned.is_empty() {
                // Giving back: everything the caller sent after it too, to the end of
                // the stream (its way is shut: nothing more comes). A last line cut by
                // that shut is not whole: its caller sends that piece again.
                if !shut {
                    reader.shut();
                    shut = true;
                }
                match next_frame(reader).await {
                    Ok(Some(line)) => {
                        if let Ok(bytes) = stdin_frame(&line).and_then(|frame| decoded(&frame)) {
                            returned.extend(bytes);
                        }
                        continue;
                    }
                    _ => return Passed::Returned(returned),
                }
            }
            let frame = tokio::select! {
                _ = self.wait_for_item(row, Duration::from_secs(3600), |d| d.has_ended(row)) => {
                    if self.has_ended(row) {
                        return Passed::NoMore;
                    }
                    continue;
                }
                _ = shutdown.wait_for(|going| *going), if !shut => {
                    reader.shut();
                    shut = true;
                    continue;
                }
                frame = next_frame(reader) => frame,
            };
            let Ok(Some(line)) = frame else {
                return Passed::Gone;
            };
            let Ok(frame) = stdin_frame(&line) else {
                // After the shut, a last line cut short; before it, a caller astray.
                match shut {
                    true => continue,
                    false => return Passed::Gone,
                }
            };
            if frame.detach.is_some() {
                continue;
            }
            match self.take_stdin(row, frame, &mut open, None, None).await {
                Ok(left) if open => returned = left.unwrap_or_default(),
                Ok(_) => return Passed::NoMore,
                Err(_) => return Passed::Gone,
            }
        }
    }

    /// Sends a command to a job's supervisor, when it is connected (a run runs on
    /// this machine or an ssh host, whose executors carry a stop and the end of input).
    fn to_job(&self, row: i64, command: ToSupervisor) {
        if let Some(live) = self.lock().live.get(&row) {
            let _ = live.handle.send(command);
        }
    }

    /// Where text shown of `[from, len)` may end: all of it once the job ended, else
    /// before a character or escape sequence whose rest has not arrived.
    fn shown_until(&self, row: i64, from: u64, len: u64) -> u64 {
        let (path, dropped, ended) = {
            let inner = self.lock();
            let Ok(Some(record)) = inner.store.get(row) else {
                return len;
            };
            let dropped = inner.dropped(&record);
            let ended = record.state == State::Ended;
            (output::log_path(&record.job_dir), dropped, ended)
        };
        if ended {
            len
        } else {
            output::text_end(&path, from, len, self.config.log_head, dropped)
        }
    }

    async fn finish_run(
        &self,
        session: &str,
        row: i64,
        shown: u64,
        timeout: Duration,
        detached: Option<String>,
    ) -> Result<RunReply, WireError> {
        // A deadline never wins over an end that already happened.
        let mut full = String::new();
        let outcome = if self.ended_now(row) {
            RunOutcome::Ended
        } else {
            let mut inner = self.lock();
            // Counted where it runs: this machine, or ssh hosts together.
            let which = match inner.store.get(row)? {
                Some(record) => self.executors.which(row, &record.job_dir),
                None => crate::executor::Which::Local,
            };
            match self.promotion_refused(&inner, session, which, row)? {
                Some(why) => {
                    full = why;
                    RunOutcome::Killed
                }
                // The caller was waiting for this result: its end comes as a notice
                // (armed under the lock an end is settled in, so none is missed); from
                // now on it counts against the next run's promotion.
                None if inner.store.arm_notice(row)? => {
                    inner.foreground.remove(&row);
                    RunOutcome::Promoted
                }
                // It ended between the look and the lock: the reply shows the end.
                None => RunOutcome::Ended,
            }
        };
        // One formatter of durations (`1.7 s`, `1m00s`), as every reply words them.
        let deadline_text = crate::history::human_ms(crate::daemon::history::millis(timeout));
        if outcome == RunOutcome::Killed {
            self.stop_now(row, Duration::ZERO, Actor::Agent);
            if self.wait_for(KILL_WAIT, |d| d.has_ended(row)).await {
                // Its end is a stop by the agent's own deadline; its report says so.
                let detail = match &detached {
                    Some(_) => {
                        format!("killed since its caller could not show its output and {full}")
                    }
                    None => format!("{KILLED_AT_DEADLINE} {deadline_text} deadline: {full}"),
                };
                self.lock().store.set_detail(row, &detail)?;
            }
        }
        let len = self.log_len_of(row);
        let len = self.shown_until(row, shown, len);
        let output = self.text_between(row, shown, len);
        let mut inner = self.lock();
        // Output streamed to a caller that could not show it is still unread.
        if detached.is_none() {
            inner.store.set_cursor(session, row, len)?;
        }
        let record = inner
            .store
            .get(row)?
            .ok_or_else(|| WireError::internal("record vanished"))?;
        drop(inner);
        let mut item = self.item(&record);
        // A promoted run is a job not yet ended: what history expects of it, as `list`
        // shows it (§10).
        self.expect_items(
            std::slice::from_mut(&mut item),
            std::slice::from_ref(&record),
        );
        let when = match &detached {
            Some(why) => format!("{why}; {} still runs", item.id),
            None => format!("{} still runs after {deadline_text}", item.id),
        };
        let message = match outcome {
            RunOutcome::Ended => item.report.clone().unwrap_or_default(),
            RunOutcome::Promoted => format!(
                "{when}: promoted to the background; a notice will come when it ends \
                 (`bgwork read {}`, `bgwork wait {}`)",
                item.id, item.id
            ),
            RunOutcome::Killed => match &detached {
                Some(why) => format!(
                    "{why}; it could not go on in the background and was killed: {}",
                    full.replacen(" was at ", " is at ", 1)
                ),
                None => format!(
                    "{} ran past {deadline_text} and was killed: {}",
                    item.id,
                    full.replacen(" was at ", " is at ", 1)
                ),
            },
        };
        debug_assert!(outcome != RunOutcome::Ended || record.state == State::Ended);
        Ok(RunReply {
            outcome,
            item,
            output,
            message,
            timeout_choice: None,
        })
    }

    /// Asks a job's supervisor to stop it now (TERM, KILL after `grace`).
    fn stop_now(&self, row: i64, grace: Duration, actor: Actor) {
        let mut inner = self.lock();
        if let Some(live) = inner.live.get(&row) {
            // A run's executor (this machine's, or an ssh host's) carries every stop.
            let _ = live.handle.send(ToSupervisor::Stop {
                grace_ms: grace.as_millis() as u64,
                actor,
            });
        }
        let _ = inner.store.set_stop_actor(row, actor);
    }

    pub(crate) fn log_len_of(&self, row: i64) -> u64 {
        let inner = self.lock();
        match inner.store.get(row) {
            Ok(Some(record)) => output::log_len(&output::log_path(&record.job_dir)),
            _ => 0,
        }
    }

    /// Readable text of `[from, to)` of a job's log, clipped to the default size.
    /// Streams the exact bytes of `[from, to)` of a job's log to the caller, a bounded
    /// piece at a time; returns how far it got, `None` when the caller is gone.
    async fn stream_bytes(
        &self,
        row: i64,
        from: u64,
        to: u64,
        writer: &mut OwnedWriteHalf,
    ) -> Option<u64> {
        const PIECE: u64 = 1 << 20;
        let (path, dropped, running) = {
            let inner = self.lock();
            let Ok(Some(record)) = inner.store.get(row) else {
                return Some(from);
            };
            let running = record.state != State::Ended;
            (
                output::log_path(&record.job_dir),
                inner.dropped(&record),
                running,
            )
        };
        let head = self.config.log_head;
        let mut at = from;
        while at < to {
            let (path, piece_at) = (path.clone(), at);
            // Token shapes are masked, and no piece ends inside one (nor before the end
            // of one that more output may finish while the job runs).
            let piece = tokio::task::spawn_blocking(move || {
                let log = output::LogView {
                    path: &path,
                    len: to,
                    head,
                    dropped,
                };
                let (_, end) = log.token_edges(piece_at, to.min(piece_at + PIECE), running);
                let bytes = output::read_range(&path, piece_at, end, head, dropped).0;
                (crate::redact::mask_shapes_shown(&bytes).into_owned(), end)
            })
            .await;
            let Ok((bytes, end)) = piece else {
                return Some(at);
            };
            if end <= at {
                break;
            }
            let chunk = Chunk {
                chunk: String::new(),
                bytes: Some(base64::engine::general_purpose::STANDARD.encode(&bytes)),
            };
            if writer.write_all(&wire::encode_line(&chunk)).await.is_err() {
                return None;
            }
            at = end;
        }
        Some(at)
    }

    fn text_between(&self, row: i64, from: u64, to: u64) -> String {
        let inner = self.lock();
        let Ok(Some(record)) = inner.store.get(row) else {
            return String::new();
        };
        let dropped = inner.dropped(&record);
        let path = output::log_path(&record.job_dir);
        let max = output::DEFAULT_MAX_BYTES;
        let excerpt = output::excerpt(&path, from, to, self.config.log_head, dropped, max);
        excerpt.render(max, &path).0
    }
}

/// What a promoted run's caller is told once its rest of stdin is passed on.
enum Passed {
    /// The job takes no more input (it ended, or its input closed).
    NoMore,
    /// A daemon that shuts down gives back what the job did not take.
    Returned(Vec<u8>),
    /// Nothing (the caller went, or the connection ended with nothing to give back).
    Gone,
}

/// Returned input is written in lines of this many bytes (before base64).
const RETURNED_CHUNK: usize = 48 << 10;

/// A stdin frame's bytes.
fn decoded(frame: &StdinFrame) -> Result<Vec<u8>, WireError> {
    base64::engine::general_purpose::STANDARD
        .decode(frame.stdin.as_bytes())
        .map_err(|e| WireError::bad_request(format!("stdin of a run is not base64: {e}")))
}

/// One promoted run's connection counted in [`Daemon::passing`] while its rest is
/// passed on.
pub(crate) struct Passing<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Daemon {
    /// Counts input being passed on to a job until dropped: a daemon that shuts down
    /// waits for it (a few seconds at most).
    pub(crate) fn passing_input(&self) -> Passing<'_> {
        self.passing.send_modify(|n| *n += 1);
        Passing(&self.passing)
    }
}

impl Drop for Passing<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// The caller's next line (a [`StdinFrame`]); `None` when it closed the connection.
/// Cancel-safe (see [`FrameReader`]).
async fn next_frame(reader: &mut FrameReader) -> Result<Option<Vec<u8>>, WireError> {
    reader.next().await
}

fn stdin_frame(line: &[u8]) -> Result<StdinFrame, WireError> {
    serde_json::from_slice(line).map_err(|e| {
        WireError::bad_request(format!(
            "malformed stdin of a run: {e}; send {{\"stdin\":BASE64}} lines, the last with \"eof\":true"
        ))
    })
}

/// What `--timeout auto` chose, and why.
enum AutoChoice {
    /// Backgrounded at once, its notice armed.
    Background(String),
    /// Waited for in the foreground up to `wait` (in words), then decided as any run.
    Foreground { reason: String, wait: String },
}

impl AutoChoice {
    /// The choice of a wait, as said before it (a streamed run's first line); none
    /// when there is no wait to announce.
    fn before(&self) -> Option<String> {
        match self {
            AutoChoice::Background(_) => None,
            AutoChoice::Foreground { reason, wait } => Some(format!(
                "timeout auto: {reason}: waiting in the foreground up to {wait}; then, as any \
                 run, backgrounded if the session has room by then, else killed"
            )),
        }
    }

    /// The choice as said in the run's reply.
    fn after(&self) -> String {
        match self {
            AutoChoice::Background(reason) => {
                format!("timeout auto: {reason}: backgrounded at once, its notice armed")
            }
            AutoChoice::Foreground { reason, wait } => format!(
                "timeout auto: {reason}: waited in the foreground up to {wait} (then, as any \
                 run, backgrounded if the session has room by then, else killed)"
            ),
        }
    }
}

/// What `--timeout auto` chose, said in the reply of its run.
fn auto_choice(reply: &mut RunReply, auto: Option<AutoChoice>) {
    let Some(choice) = auto else {
        return;
    };
    if matches!(choice, AutoChoice::Background(_)) && reply.outcome == RunOutcome::Promoted {
        let id = &reply.item.id;
        reply.message = format!(
            "{id} runs in the background, its notice armed (`bgwork read {id}`, `bgwork wait {id}`)"
        );
    }
    reply.timeout_choice = Some(choice.after());
}

/// A run waiting in the foreground (see `Inner::foreground`, which its record joined
/// when it was made), until its call returns.
struct InTheForeground<'a> {
    daemon: &'a Daemon,
    row: i64,
}

impl<'a> InTheForeground<'a> {
    fn take(daemon: &'a Daemon, row: i64) -> InTheForeground<'a> {
        daemon.lock().foreground.insert(row);
        InTheForeground { daemon, row }
    }
}

impl Drop for InTheForeground<'_> {
    fn drop(&mut self) {
        self.daemon.lock().foreground.remove(&self.row);
    }
}
