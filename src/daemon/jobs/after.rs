//! Work that waits for work (`start --after ID[:COND]`, contract §14).
//!
//! How it works: `start` with `after` checks the conditions (each awaited item found
//! as the session addresses it, a regex compiled within a size bound, a condition that
//! already cannot hold refused), writes the record `waiting` with its folder, the
//! conditions in `after.json` (rows, not ids: a row is never given twice), and hands
//! the start's arguments to a `bgwork keep` process of its own (`crate::keeper`), so
//! that no value of its environment is written anywhere and a restarted daemon still
//! has them. One task per waiting item then looks again at each change of the records
//! (an end), each growth of an awaited output (a `scan` of what readers are shown, as
//! monitors read it) and, for ports and a refused admission, on a back-off up to 1 s.
//! When every condition holds, the one admission (`Daemon::admit`) decides under the
//! lock that moves the record to `starting`; a refusal (a limit, the start rate, a
//! shutdown) keeps it waiting, saying why, and it is tried again. When one can no
//! longer hold, the item ends `cancelled` with the reason and a notice (armed or not:
//! nobody saw it end). A stop ends it at once, nothing having run.

use super::held_values::{self, Checked};
use crate::daemon::admission::{Admission, Newcomer};
use crate::daemon::monitor::{LineMonitor, LineOutcome};
use crate::daemon::{Daemon, Pace};
use crate::executor::{On, Which};
use crate::paths::now_ms;
use crate::store::{EndRecord, NewNotice, NewRecord, Record};
use crate::wire::after::{AfterFile, Awaited, KeepRequest, Kept, Until, MAX_AFTER, MAX_PATTERN};
use crate::wire::{Actor, End, ErrorCode, Kind, StartArgs, StartReply, State, WireError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Items a session (with its sub-agents) may have waiting at once.
pub(crate) const MAX_WAITING: usize = 32;
/// Items every session together may have waiting at once (each has a keeper process).
pub(crate) const MAX_WAITING_TOTAL: usize = 256;
/// The file in a waiting item's folder that says what it waits for.
const AFTER_FILE: &str = "after.json";
/// The compiled size of an `output` regex, at most.
const REGEX_SIZE: usize = 1 << 20;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a new keeper has to say it listens.
const KEEPER_READY: Duration = Duration::from_secs(10);
/// How often a waiting item with nothing to poll looks whether its folder is there.
const FOLDER_CHECK: Duration = Duration::from_secs(2);

/// What each waiting item waits for now, in words (`list`, `status`, the strip), and
/// what its task knows of its conditions (so that the oldest whose conditions hold
/// starts first).
#[derive(Default)]
pub(crate) struct Board(Mutex<HashMap<i64, String>>, Mutex<HashMap<i64, Judged>>);

/// A waiting item's conditions, as its task holds them, and whether all held at its
/// last look.
struct Judged {
    awaited: Vec<Awaited>,
    ready: bool,
}

impl Board {
    fn set(&self, row: i64, text: String) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(row, text);
    }
    fn forget(&self, row: i64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&row);
        self.judged().remove(&row);
    }
    fn judged(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Judged>> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn judge(&self, row: i64, awaited: &[Awaited], ready: bool) {
        let awaited = awaited.to_vec();
        self.judged().insert(row, Judged { awaited, ready });
    }
    pub(crate) fn get(&self, row: i64) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&row)
            .cloned()
    }
}

/// One condition as the task checks it.
struct Cond {
    awaited: Awaited,
    /// An `output` condition's scan of the awaited item's log.
    lines: Option<Box<LineMonitor>>,
    /// It held once (a line printed, a port listened on): it holds for good.
    held: bool,
}

/// What one look at a condition found.
enum Look {
    Holds,
    Pending,
    /// It can no longer hold, for this reason.
    Never(String),
}

impl Daemon {
    /// `start` with `after`: the item made `waiting` (or, when every condition holds
    /// already, started as any other).
    pub(crate) async fn start_after(
        self: &Arc<Self>,
        session: &str,
        mut args: StartArgs,
        shown: &mut crate::daemon::Shown<'_>,
    ) -> Result<StartReply, WireError> {
        tokio::task::block_in_place(|| crate::daemon::jobs::new_item::check_start(&args))?;
        if args.restart.is_some() {
            return Err(WireError::bad_request(
                "--restart and --after together are not supported yet: start it with --after \
                 alone, or with --restart once what it waits for holds",
            ));
        }
        let limits = crate::daemon::jobs::new_item::limits_of(&args)?;
        let (cwd, pane) = crate::daemon::jobs::new_item::place(&args)?;
        // A condition given twice is one condition.
        let mut once = Vec::with_capacity(args.after.len());
        for after in std::mem::take(&mut args.after) {
            if !once.contains(&after) {
                once.push(after);
            }
        }
        args.after = once;
        if args.after.len() > MAX_AFTER {
            return Err(WireError::bad_request(format!(
                "{} --after conditions: at most {MAX_AFTER} for one start",
                args.after.len()
            )));
        }
        let awaited = {
            let inner = self.lock();
            let mut awaited = Vec::new();
            let mut records = Vec::new();
            for after in &args.after {
                records.push(Self::find(&inner, session, &after.id)?);
            }
            drop(inner);
            for after in &args.after {
                if let Until::Output { regex } = &after.until {
                    compile(regex)?;
                }
            }
            // A pattern holding the value of a secret of the awaited item (as the caller
            // holds it: the daemon keeps no value) could never match its masked output.
            tokio::task::block_in_place(|| check_awaited_secrets(&args, &records))?;
            for (after, record) in args.after.iter().zip(records) {
                check_target(&record, &after.id, &after.until)?;
                let here = self.executors.which(record.row, &record.job_dir) == Which::Local;
                if after.until == Until::Port && !here {
                    return Err(WireError::refused(format!(
                        "{} runs on another machine, whose ports this daemon does not see: wait \
                         for the line it prints instead (--after '{}:output listening on')",
                        after.id, after.id
                    )));
                }
                awaited.push(Awaited {
                    row: record.row,
                    id: after.id.clone(),
                    until: after.until.clone(),
                });
            }
            awaited
        };
        // An `output` condition on an item that ended: its whole output is there to
        // look at now; no such line means it can never hold (refused, nothing recorded).
        for a in &awaited {
            if let Some(reason) = self.ended_without_line(a).await {
                return Err(WireError::refused(format!(
                    "{reason}, so --after '{}:output ...' can never hold: nothing was \
                     started. Start it without --after, or after another item",
                    a.id
                )));
            }
        }
        // Every condition holds already (each on an ended item): it starts as any job.
        let ends_only = awaited
            .iter()
            .all(|a| matches!(a.until, Until::Succeeded | Until::Ended));
        if ends_only && awaited.iter().all(|a| self.look_end(a) == Some(true)) {
            args.after.clear();
            return self.start(session, args, shown).await;
        }
        let kind = match pane {
            Some(_) => Kind::Pane,
            None => Kind::Job,
        };
        let new = crate::daemon::jobs::new_item::new_record(session, kind, &args, &cwd, pane);
        let record = self.record_waiting(&new, limits)?;
        let owner = crate::daemon::jobs::settle::owner(&record);
        if let Err(reason) = self
            .make_waiting_folder(&record, &args, &owner, &awaited)
            .await
        {
            self.end_never_ran(&record, End::SpawnFailed, &reason, false);
            return Err(WireError::new(
                ErrorCode::SpawnFailed,
                format!("{} could not be made to wait: {reason}", record.id),
            ));
        }
        let record = self.lock().store.get(record.row)?.unwrap_or(record);
        if record.state != State::Waiting {
            // Stopped while its keeper was being started: let the keeper go.
            forget_keeper(Path::new(&record.job_dir)).await;
            let mut item = self.item(&record);
            self.expect_items(std::slice::from_mut(&mut item), &[record]);
            return Ok(StartReply {
                item,
                output: String::new(),
                already_running: None,
            });
        }
        self.waiting.set(record.row, waiting_text(&awaited));
        tokio::spawn(self.clone().run_waiting(record.row, args, awaited));
        let mut item = self.item(&record);
        self.expect_items(std::slice::from_mut(&mut item), &[record]);
        Ok(StartReply {
            item,
            output: String::new(),
            already_running: None,
        })
    }

    /// Under the one lock: the session's room for another waiting item (and no
    /// shutdown begun), then the record, `waiting`.
    fn record_waiting(
        &self,
        new: &NewRecord,
        limits: (Option<u64>, Option<u64>),
    ) -> Result<Record, WireError> {
        let mut inner = self.lock();
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                "the daemon is shutting down: nothing was started; run the command again \
                 once it is back",
            ));
        }
        let root = inner.store.root_of(&new.session)?;
        let waiting: Vec<String> = inner
            .store
            .list(&root, false)?
            .into_iter()
            .filter(|r| r.state == State::Waiting)
            .map(|r| id_as_seen(&new.session, &r))
            .collect();
        if waiting.len() >= MAX_WAITING {
            return Err(WireError::new(
                ErrorCode::Limit,
                format!(
                    "this session already has {MAX_WAITING} items waiting, its limit: {}. \
                     Stop one (`bgwork stop ID`) or let one start first",
                    waiting.join(", ")
                ),
            ));
        }
        if inner.store.count_waiting()? >= MAX_WAITING_TOTAL {
            return Err(WireError::new(
                ErrorCode::Limit,
                format!(
                    "{MAX_WAITING_TOTAL} items of all sessions wait for other work already, \
                     the daemon's limit: start this one once some have started"
                ),
            ));
        }
        let record = inner.store.insert_waiting(new)?;
        if limits != (None, None) {
            inner.store.set_limits(record.row, limits.0, limits.1)?;
        }
        drop(inner);
        self.records_changed();
        Ok(record)
    }

    /// The waiting item's folder: its `job.json`, `after.json`, and its keeper.
    async fn make_waiting_folder(
        &self,
        record: &Record,
        args: &StartArgs,
        owner: &str,
        awaited: &[Awaited],
    ) -> Result<(), String> {
        let job_dir = self.paths.job_dir(record.row);
        crate::daemon::jobs::new_item::make_job_dir(&self.paths.jobs, &job_dir)?;
        crate::daemon::jobs::new_item::write_job_record(&job_dir, record, args)?;
        let file = AfterFile {
            owner: owner.to_string(),
            awaited: awaited.to_vec(),
        };
        let text = serde_json::to_vec(&file).map_err(|e| e.to_string())?;
        std::fs::write(job_dir.join(AFTER_FILE), text)
            .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))?;
        let dir = job_dir.display().to_string();
        self.lock()
            .store
            .set_job_dir(record.row, &dir)
            .map_err(|e| e.to_string())?;
        let kept = Kept {
            owner: owner.to_string(),
            args: args.clone(),
        };
        spawn_keeper(&job_dir, &kept).await
    }

    /// Waits until every condition of a waiting item holds (then starts it through the
    /// one admission) or one can no longer hold (then cancels it).
    async fn run_waiting(self: Arc<Self>, row: i64, args: StartArgs, awaited: Vec<Awaited>) {
        self.waiting.judge(row, &awaited, false);
        let mut conds: Vec<Cond> = awaited.into_iter().map(|a| self.cond(row, a)).collect();
        let outputs: Vec<i64> = conds
            .iter()
            .filter(|c| c.lines.is_some())
            .map(|c| c.awaited.row)
            .collect();
        let mut output = (!outputs.is_empty()).then(|| self.watch_output(&outputs, Pace::Prompt));
        let mut changes = self.changes();
        let mut backoff = FIRST_BACKOFF;
        let mut keeper_looked = std::time::Instant::now();
        loop {
            let waits =
                matches!(self.lock().store.get(row), Ok(Some(r)) if r.state == State::Waiting);
            if !waits {
                self.waiting.forget(row);
                return;
            }
            if let Some(reason) = self.folder_gone(row) {
                self.lose_waiting(row, &reason);
                return;
            }
            if keeper_looked.elapsed() >= FOLDER_CHECK {
                keeper_looked = std::time::Instant::now();
                self.keep_keeper(row, &args).await;
            }
            let mut pending = Vec::new();
            let mut never = None;
            let mut behind = false;
            for cond in &mut conds {
                match self.look(cond, &mut behind).await {
                    Look::Holds => {}
                    Look::Pending => pending.push(cond.awaited.clone()),
                    Look::Never(reason) => {
                        never = Some(reason);
                        break;
                    }
                }
            }
            if let Some(reason) = never {
                self.cancel_waiting(row, &reason);
                return;
            }
            let mut polls = conds
                .iter()
                .any(|c| !c.held && c.awaited.until == Until::Port);
            let all: Vec<Awaited> = conds.iter().map(|c| c.awaited.clone()).collect();
            self.waiting.judge(row, &all, pending.is_empty());
            if pending.is_empty() {
                match self.start_waited(row, &args).await {
                    Ok(()) => {
                        self.waiting.forget(row);
                        return;
                    }
                    Err(refused) => {
                        let why = crate::daemon::admission::guard::without_advice(&refused.message);
                        self.waiting.set(row, format!("room to start: {why}"));
                        polls = true;
                    }
                }
            } else {
                self.waiting.set(row, waiting_text(&pending));
            }
            if behind {
                tokio::task::yield_now().await;
                continue;
            }
            // Its folder is looked at even when nothing else would wake it.
            let poll = if polls { backoff } else { FOLDER_CHECK };
            backoff = (backoff * 2).min(MAX_BACKOFF);
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = crate::daemon::output_changed(&mut output) => {}
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// Starts the keeper of waiting `row` again if it is gone (killed, say), from the
    /// arguments this daemon holds: they outlive a daemon restart only in a keeper.
    async fn keep_keeper(&self, row: i64, args: &StartArgs) {
        let record = match self.lock().store.get(row) {
            Ok(Some(record)) if record.state == State::Waiting => record,
            _ => return,
        };
        let job_dir = PathBuf::from(&record.job_dir);
        let folder = job_dir.clone();
        let answers = tokio::task::spawn_blocking(move || crate::keeper::answers(&folder))
            .await
            .unwrap_or(true);
        if answers {
            return;
        }
        let kept = Kept {
            owner: crate::daemon::jobs::settle::owner(&record),
            args: args.clone(),
        };
        // One that no longer answers (its socket removed) ends before another starts.
        forget_keeper(&job_dir).await;
        match spawn_keeper(&job_dir, &kept).await {
            Ok(()) => crate::note!(
                "bgwork daemon: the keeper of waiting {} was gone: started again",
                record.id
            ),
            Err(e) => crate::note!(
                "bgwork daemon: the keeper of waiting {} was gone and could not be started \
                 again ({e}): a daemon restart before it starts would lose its arguments",
                record.id
            ),
        }
        // Stopped (or started) meanwhile: that keeper has nothing to keep.
        let waits = matches!(self.lock().store.get(row), Ok(Some(r)) if r.state == State::Waiting);
        if !waits {
            forget_keeper(&job_dir).await;
        }
    }

    /// A condition's task state: an `output` one gets its scan of the awaited log.
    fn cond(&self, row: i64, awaited: Awaited) -> Cond {
        let lines = match &awaited.until {
            Until::Output { regex } => compile(regex).ok().map(|regex| {
                Box::new(LineMonitor::of_output(row, awaited.row, &awaited.id, regex))
            }),
            _ => None,
        };
        Cond {
            awaited,
            lines,
            held: false,
        }
    }

    /// Whether an end condition holds now: `None` while the item runs, `Some(false)`
    /// when it ended otherwise (or is gone).
    fn look_end(&self, awaited: &Awaited) -> Option<bool> {
        let record = self.lock().store.get(awaited.row).ok().flatten();
        let Some(record) = record else {
            return Some(false);
        };
        match (record.state, &awaited.until) {
            (State::Ended, Until::Succeeded) => Some(record.end == Some(End::Succeeded)),
            (State::Ended, _) => Some(true),
            _ => None,
        }
    }

    /// For an `output` condition on an item that has ended: why it can never hold (its
    /// whole output scanned, as a waiter would scan it), or `None` (a line matched, or
    /// the item still runs).
    async fn ended_without_line(self: &Arc<Self>, awaited: &Awaited) -> Option<String> {
        let Until::Output { regex } = &awaited.until else {
            return None;
        };
        let record = self.lock().store.get(awaited.row).ok().flatten()?;
        if record.state != State::Ended {
            return None;
        }
        let regex = compile(regex).ok()?;
        let mut lines = LineMonitor::of_output(0, awaited.row, &awaited.id, regex);
        let daemon = self.clone();
        tokio::task::spawn_blocking(move || loop {
            match lines.step_output(&daemon) {
                LineOutcome::Never(detail) => return Some(detail),
                LineOutcome::Pending { behind: true } => continue,
                // A match, or a log that cannot be read now: the waiter decides.
                LineOutcome::Matched | LineOutcome::Pending { behind: false } => return None,
            }
        })
        .await
        .ok()
        .flatten()
    }

    async fn look(self: &Arc<Self>, cond: &mut Cond, behind: &mut bool) -> Look {
        if cond.held {
            return Look::Holds;
        }
        let awaited = &cond.awaited;
        let record = self.lock().store.get(awaited.row).ok().flatten();
        let Some(record) = record else {
            return Look::Never(format!(
                "{} is no longer known (its record was removed), and it waited for {}",
                awaited.id,
                describe(awaited)
            ));
        };
        let ended = record.state == State::Ended;
        let look = match &awaited.until {
            Until::Succeeded if ended && record.end == Some(End::Succeeded) => Look::Holds,
            Until::Succeeded if ended => Look::Never(ended_otherwise(&record, awaited)),
            Until::Ended if ended => Look::Holds,
            Until::Succeeded | Until::Ended => Look::Pending,
            Until::Output { .. } => self.look_output(cond, behind).await,
            Until::Port => {
                let listening = self.listening_of(&record).await;
                match (listening.is_empty(), ended) {
                    (false, _) => Look::Holds,
                    (true, true) => Look::Never(format!(
                        "{} ended without listening on a TCP port ({})",
                        awaited.id,
                        crate::end::report(
                            &awaited.id,
                            record.end.unwrap_or(End::Lost),
                            record.exit_code,
                            record.signal
                        )
                    )),
                    (true, false) => Look::Pending,
                }
            }
        };
        if matches!(look, Look::Holds) {
            cond.held = true;
        }
        look
    }

    /// One bounded step of an `output` condition's scan, off the lock.
    async fn look_output(self: &Arc<Self>, cond: &mut Cond, behind: &mut bool) -> Look {
        let Some(mut lines) = cond.lines.take() else {
            return Look::Never(format!("{}: its pattern is not valid", cond.awaited.id));
        };
        let daemon = self.clone();
        let step = tokio::task::spawn_blocking(move || {
            let outcome = lines.step_output(&daemon);
            (lines, outcome)
        });
        match step.await {
            Ok((lines, outcome)) => {
                cond.lines = Some(lines);
                match outcome {
                    LineOutcome::Matched => Look::Holds,
                    LineOutcome::Pending { behind: more } => {
                        *behind |= more;
                        Look::Pending
                    }
                    LineOutcome::Never(detail) => Look::Never(format!(
                        "{detail}, and it waited for {}",
                        describe(&cond.awaited)
                    )),
                }
            }
            Err(e) => Look::Never(format!("its scan of {} failed: {e}", cond.awaited.id)),
        }
    }

    /// Every condition holds: the one admission, under the lock that moves the record
    /// to `starting`, then the job handed to its executor. `Err`: refused for now (it
    /// keeps waiting). A start that fails after the admission ends the item.
    async fn start_waited(&self, row: i64, args: &StartArgs) -> Result<(), WireError> {
        let on = On::of(args);
        if let Some(older) = self.older_ready(row)? {
            return Err(WireError::new(
                ErrorCode::Limit,
                format!("{older} waited longer and starts first"),
            ));
        }
        if let Some(twin) = self.twin_of_waiting(row, args).await? {
            // As `start` answers with a running twin instead of starting a second server.
            let reason = format!(
                "the same command already runs as {twin} and listens on a port, so no second \
                 copy was started (start it with --allow-duplicate for one)"
            );
            self.cancel_waiting(row, &reason);
            return Ok(());
        }
        let record = {
            let mut inner = self.lock();
            let Some(record) = inner.store.get(row)? else {
                return Ok(());
            };
            if record.state != State::Waiting {
                return Ok(());
            }
            let admission = Admission {
                newcomer: Newcomer::Job(on.which()),
                checked_at_promotion: false,
                held: false,
                again: None,
            };
            let root = self.admit(&mut inner, &record.session, admission)?;
            if !inner.store.start_waiting(row, now_ms())? {
                return Ok(());
            }
            self.count_start(&mut inner, &root);
            self.executors.claim(row, &on);
            inner.store.get(row)?.unwrap_or(record)
        };
        self.records_changed();
        let job_dir = PathBuf::from(&record.job_dir);
        // Its arguments are here: the start waits for no keeper.
        let folder = job_dir.clone();
        tokio::spawn(async move { forget_keeper(&folder).await });
        let _ = std::fs::remove_file(job_dir.join(AFTER_FILE));
        // Its job.json says when it started.
        if let Err(reason) =
            crate::daemon::jobs::new_item::write_job_record(&job_dir, &record, args)
        {
            let _ = self.spawn_failed_told(row, &record.id, reason, true);
            return Ok(());
        }
        let cwd = record.cwd.clone();
        if args.ssh.is_none() && !Path::new(&cwd).is_dir() {
            let reason = format!(
                "the working directory {cwd} no longer exists (it did when it began to wait)"
            );
            let _ = self.spawn_failed_told(row, &record.id, reason, true);
            return Ok(());
        }
        let (_, pane) = crate::daemon::jobs::new_item::place(args)?;
        let limits = (record.quiet_after_ms, record.max_runtime_ms);
        let spec = self.job_spec(&record, args, &job_dir, None, pane, limits);
        match self.executors.start(row, &spec, &on).await {
            Ok(handle) => self.live_unless_ended(row, handle)?,
            Err(reason) => {
                let _ = self.spawn_failed_told(row, &record.id, reason, true);
            }
        }
        Ok(())
    }

    /// The oldest waiting item of `row`'s session tree, made before it, whose conditions
    /// hold (ends looked at in the records now; others as its task last found them):
    /// waiters are admitted oldest first, not as their tasks happen to wake.
    fn older_ready(&self, row: i64) -> Result<Option<String>, WireError> {
        let inner = self.lock();
        let Some(record) = inner.store.get(row)? else {
            return Ok(None);
        };
        let root = inner.store.root_of(&record.session)?;
        let mut older: Vec<Record> = inner
            .store
            .list(&root, false)?
            .into_iter()
            .filter(|r| r.state == State::Waiting && r.row < row)
            .collect();
        drop(inner);
        older.sort_by_key(|r| r.row);
        for other in older {
            let ready = {
                let judged = self.waiting.judged();
                match judged.get(&other.row) {
                    None => false,
                    Some(j) if j.ready => true,
                    Some(j) => {
                        let ends: Vec<Awaited> = j.awaited.clone();
                        drop(judged);
                        ends.iter()
                            .all(|a| matches!(a.until, Until::Succeeded | Until::Ended))
                            && ends.iter().all(|a| self.look_end(a) == Some(true))
                    }
                }
            };
            if ready {
                return Ok(Some(id_as_seen(&record.session, &other)));
            }
        }
        Ok(None)
    }

    /// The running twin of a waiting item's command (`start`'s rule, unless
    /// `allow_duplicate`): the same command, folder, kind and environment, listening.
    async fn twin_of_waiting(
        &self,
        row: i64,
        args: &StartArgs,
    ) -> Result<Option<String>, WireError> {
        if args.allow_duplicate {
            return Ok(None);
        }
        let Some(record) = self.lock().store.get(row)? else {
            return Ok(None);
        };
        let twin = crate::daemon::processes::Twin {
            kind: record.kind,
            command: &record.command,
            cwd: &record.cwd,
            env_names: record.env_names.clone(),
            env: crate::daemon::jobs::new_item::job_env(args),
        };
        let listening = self.listening_twins(&record.session, &twin).await;
        let inner = self.lock();
        let found = Self::running_twin(&inner, &record.session, &twin, &listening)?;
        Ok(found.map(|r| r.id))
    }

    /// Why a waiting item cannot start any more because its folder (its `after.json`,
    /// its keeper's socket, where its log would be) was removed: none while it is there.
    fn folder_gone(&self, row: i64) -> Option<String> {
        let record = self.lock().store.get(row).ok().flatten()?;
        let dir = Path::new(&record.job_dir);
        let kept = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(dir.join(AFTER_FILE)).is_ok();
        (!kept).then(|| {
            format!(
                "its folder {} was removed while it waited; nothing ran: start it again",
                record.job_dir
            )
        })
    }

    /// Its folder is gone: the item ends `lost`, with the reason and a notice.
    fn lose_waiting(&self, row: i64, reason: &str) {
        let Ok(Some(record)) = self.lock().store.get(row) else {
            return;
        };
        self.end_never_ran(&record, End::Lost, reason, true);
    }

    /// A condition can no longer hold: the item ends `cancelled`, with a notice.
    fn cancel_waiting(&self, row: i64, reason: &str) {
        let Ok(Some(record)) = self.lock().store.get(row) else {
            return;
        };
        self.end_never_ran(&record, End::Cancelled, reason, true);
    }

    /// `stop` of a waiting item: it ends stopped, nothing having run; a person's stop
    /// tells the agent (as for any item).
    /// False when it no longer waited (it began to start at that moment).
    pub(crate) fn stop_waiting(&self, row: i64, actor: Actor) -> bool {
        let Ok(Some(record)) = self.lock().store.get(row) else {
            return true;
        };
        let end = match actor {
            Actor::Agent => End::StoppedByAgent,
            Actor::Person => End::StoppedByPerson,
        };
        let what = self
            .waiting
            .get(row)
            .map(|w| format!(" for {w}"))
            .unwrap_or_default();
        let reason = format!("while it waited{what}; nothing ran");
        self.end_never_ran(&record, end, &reason, actor == Actor::Person)
    }

    /// Ends a record that never ran (still `waiting`), once, and lets its keeper go.
    fn end_never_ran(&self, record: &Record, end: End, reason: &str, notify: bool) -> bool {
        // Its reason may quote what it waited for: token shapes masked, as listed.
        let reason = &crate::redact::mask_shapes(reason.to_string());
        let text = match end {
            End::Cancelled => format!("{} was cancelled: {reason}", record.id),
            End::Lost => format!("{} was lost: {reason}", record.id),
            _ => format!(
                "{}: {reason}",
                crate::end::report(&record.id, end, None, None)
            ),
        };
        let settlement = EndRecord {
            end,
            exit_code: None,
            signal: None,
            ended_at: now_ms(),
            log_len: 0,
            dropped: 0,
            end_detail: Some(reason.to_string()),
            notice: notify.then(|| NewNotice {
                text,
                tail: String::new(),
            }),
            pid: None,
            unwritten: 0,
            unwritten_at: 0,
            cpu_ms: None,
            peak_rss: None,
        };
        let ended = match self.lock().store.end_waiting(record.row, &settlement) {
            Ok(ended) => ended,
            Err(e) => {
                crate::note!("bgwork daemon: could not end {}: {e}", record.id);
                false
            }
        };
        if !ended {
            return false;
        }
        self.waiting.forget(record.row);
        if !record.job_dir.is_empty() {
            let job_dir = PathBuf::from(&record.job_dir);
            tokio::spawn(async move { forget_keeper(&job_dir).await });
        }
        self.records_changed();
        true
    }

    /// After a daemon start: each waiting item's conditions from its folder and its
    /// arguments from its keeper; one that lost either is cancelled, saying so.
    pub(crate) fn resume_waiting(self: &Arc<Self>) {
        let waiting: Vec<Record> = match self.lock().store.unsettled() {
            Ok(records) => records
                .into_iter()
                .filter(|r| r.state == State::Waiting)
                .collect(),
            Err(_) => return,
        };
        // A keeper whose item no longer waits (its daemon went before it let it go):
        // let it go now.
        if let Ok(folders) = std::fs::read_dir(&self.paths.jobs) {
            for folder in folders.flatten().map(|f| f.path()) {
                let waits = waiting.iter().any(|r| Path::new(&r.job_dir) == folder);
                if !waits && crate::keeper::socket_of(&folder).exists() {
                    tokio::spawn(async move { forget_keeper(&folder).await });
                }
            }
        }
        for record in waiting {
            // What it waits for is listed from the first request on.
            if let Ok(file) = read_after_file(Path::new(&record.job_dir)) {
                self.waiting.set(record.row, waiting_text(&file.awaited));
            }
            let daemon = self.clone();
            tokio::spawn(async move {
                if let Some(reason) = daemon.folder_gone(record.row) {
                    daemon.lose_waiting(record.row, &reason);
                    return;
                }
                match taken_back(&record).await {
                    Ok((args, awaited)) => {
                        daemon.run_waiting(record.row, args, awaited).await;
                    }
                    Err(reason) => {
                        let reason = format!(
                            "{reason} when the daemon took it back after a restart: nothing \
                             ran; start it again"
                        );
                        daemon.cancel_waiting(record.row, &reason);
                    }
                }
            });
        }
    }
}

/// The rows every waiting item awaits (from their `after.json`): `gc` keeps them, so
/// that a waiter judges the real end of what it waits for, however long the daemon
/// was down (contract §14).
pub(crate) fn awaited_rows(store: &crate::store::Store) -> std::collections::HashSet<i64> {
    let waiting = store.unsettled().unwrap_or_default();
    waiting
        .iter()
        .filter(|r| r.state == State::Waiting && !r.job_dir.is_empty())
        .filter_map(|r| read_after_file(Path::new(&r.job_dir)).ok())
        .flat_map(|file| file.awaited.into_iter().map(|a| a.row))
        .collect()
}

/// An item's id as session `viewer` addresses it (`bg-2`, `sub-1/bg-2`), or, for an
/// item of its tree it cannot address (its parent's, a sibling's), with its session
/// named (`bg-2 of session default`), so no id reads as another item's.
fn id_as_seen(viewer: &str, record: &Record) -> String {
    let under = record.session == viewer
        || record
            .session
            .strip_prefix(viewer)
            .is_some_and(|rest| rest.starts_with('/'));
    match under {
        true => crate::daemon::display_id(viewer, record),
        false => format!("{} of session {}", record.id, record.session),
    }
}

/// What a waiting item waits for, in words: "bg-3 to succeed and bg-4 to end".
fn waiting_text(awaited: &[Awaited]) -> String {
    let parts: Vec<String> = awaited.iter().map(describe).collect();
    parts.join(" and ")
}

/// One condition in words: "bg-3 to succeed".
fn describe(awaited: &Awaited) -> String {
    crate::wire::after::After {
        id: awaited.id.clone(),
        until: awaited.until.clone(),
    }
    .describe(&awaited.id)
}

/// Why an awaited item that ended otherwise than `succeeded` cancels its waiter.
fn ended_otherwise(record: &Record, awaited: &Awaited) -> String {
    let end = record.end.unwrap_or(End::Lost);
    let how = match (end, record.pid, record.end_detail.as_deref()) {
        // A waiting item that never ran, cancelled down a chain: the chain's root cause
        // and the link above only, so a report stays one line however long the chain.
        (End::Cancelled, None, Some(detail)) => {
            format!("{}; so {} was cancelled", root_cause(detail), awaited.id)
        }
        _ => crate::end::report(&awaited.id, end, record.exit_code, record.signal),
    };
    format!("{how}{WAITED_FOR}{}", describe(awaited))
}

/// The root cause in a cancelled waiter's reason (`bg-1 FAILED (exit 3)` of `bg-1
/// FAILED (exit 3); so bg-2 was cancelled, and it waited for bg-2 to succeed`).
fn root_cause(detail: &str) -> &str {
    if let Some((root, _)) = detail.split_once(CHAIN) {
        return root;
    }
    match detail.rsplit_once(WAITED_FOR) {
        Some((root, _)) => root,
        None => detail,
    }
}

/// Between a chain's root cause and the link that passed it on.
const CHAIN: &str = "; so ";
/// Between what happened and the condition it broke.
const WAITED_FOR: &str = ", and it waited for ";

/// Refuses `--after` output patterns that hold the value of a `--secret` of an awaited
/// item, or of an `--env` value long enough to be masked, as the caller's environment
/// (or `--env`) holds it: the awaited item's values are known to its supervisor only,
/// their names to its record and its secrets' names to its `job.json`.
fn check_awaited_secrets(args: &StartArgs, records: &[Record]) -> Result<(), WireError> {
    if !args
        .after
        .iter()
        .any(|a| matches!(a.until, Until::Output { .. }))
    {
        return Ok(());
    }
    check_values_of(args, records, Checked::Awaited)
}

/// Refuses a monitor whose `--regex` or name shows a value the watched item's output
/// masks, as the caller's environment holds it (the same rule as an `--after` pattern's).
pub(crate) fn check_watched_secrets(
    args: &crate::wire::MonitorArgs,
    watched: &crate::store::Record,
) -> Result<(), WireError> {
    let start = StartArgs {
        name: args.name.clone(),
        after: args
            .regex
            .iter()
            .map(|regex| crate::wire::after::After {
                id: String::new(),
                until: crate::wire::after::Until::Output {
                    regex: regex.clone(),
                },
            })
            .collect(),
        inherit_env: args.inherit_env.clone(),
        ..StartArgs::default()
    };
    check_values_of(&start, std::slice::from_ref(watched), Checked::Monitor)
}

/// The caller's values of `records`' secrets and masked `--env` values, checked against
/// what `args` shows.
pub(crate) fn check_values_of(
    args: &StartArgs,
    records: &[crate::store::Record],
    checked: Checked,
) -> Result<(), WireError> {
    let mut pairs = Vec::new();
    let mut names = Vec::new();
    for record in records {
        let (secret_names, _) = crate::daemon::jobs::new_item::described_options(&record.job_dir);
        // Its secrets, however short, and its --env values long enough to be masked.
        let mut all: Vec<(String, bool)> =
            secret_names.into_iter().map(|name| (name, true)).collect();
        for name in &record.env_names {
            if !all.iter().any(|(known, _)| known == name) {
                all.push((name.clone(), false));
            }
        }
        for (name, secret) in all {
            let least = match secret {
                true => crate::redact::MIN_SECRET_LEN,
                false => crate::redact::MIN_ENV_SECRET_LEN,
            };
            let value = args
                .env
                .get(&name)
                .or_else(|| args.inherit_env.as_ref().and_then(|e| e.get(&name)));
            if let Some(value) = value.filter(|v| v.trim().len() >= least) {
                pairs.push([name.clone(), value.clone()]);
                if secret {
                    names.push(name);
                }
            }
        }
    }
    held_values::check_held_values(args, &pairs, &names, checked)
}

impl crate::daemon::Daemon {
    /// Refuses a monitor whose `--regex` or name shows a value that the output of the
    /// item it watches masks (contract §8), or whose name is longer than a start's may be.
    pub(crate) fn check_monitor_shows(
        &self,
        session: &str,
        args: &crate::wire::MonitorArgs,
    ) -> Result<(), WireError> {
        use crate::wire::Condition;
        let max = crate::daemon::jobs::new_item::MAX_NAME_BYTES;
        if let Some(name) = args.name.as_ref().filter(|n| n.len() > max) {
            return Err(WireError::bad_request(format!(
                "the --name is {} bytes long: at most {max}",
                name.len()
            )));
        }
        let id = match &args.condition {
            Condition::Output { id } | Condition::End { id } | Condition::PortOf { id } => id,
            Condition::Port { .. } | Condition::File { .. } => return Ok(()),
        };
        // An unknown id is the monitor's own refusal to make.
        let Ok(watched) = Self::find(&self.lock(), session, id) else {
            return Ok(());
        };
        tokio::task::block_in_place(|| check_watched_secrets(args, &watched))
    }
}

/// Refuses a condition that names what it cannot be about, or that cannot hold any
/// more: the caller hears it now, and nothing waits for ever.
fn check_target(record: &Record, id: &str, until: &Until) -> Result<(), WireError> {
    let kind_ok = match until {
        Until::Succeeded | Until::Ended => true,
        Until::Output { .. } => record.kind != Kind::Monitor,
        Until::Port => matches!(record.kind, Kind::Job | Kind::Pane),
    };
    if !kind_ok {
        return Err(WireError::refused(format!(
            "{id} is a {}, which has no {}: wait for it with --after {id}:ended",
            crate::wire::name_of(&record.kind).replace('_', "-"),
            match until {
                Until::Port => "processes listening on a port",
                _ => "output of its own",
            }
        )));
    }
    if record.state != State::Ended {
        return Ok(());
    }
    let end = record.end.unwrap_or(End::Lost);
    let report = crate::end::report(id, end, record.exit_code, record.signal);
    let never = match until {
        Until::Succeeded => end != End::Succeeded,
        Until::Port => true,
        Until::Ended | Until::Output { .. } => false,
    };
    if never {
        return Err(WireError::refused(format!(
            "{report}, so --after {id}{} can never hold: nothing was started. Start it \
             without --after, or after another item",
            match until {
                Until::Port => ":port",
                _ => "",
            }
        )));
    }
    Ok(())
}

/// An `output` condition's regex, compiled within a bound.
fn compile(pattern: &str) -> Result<regex::Regex, WireError> {
    if pattern.len() > MAX_PATTERN {
        return Err(WireError::bad_request(format!(
            "the --after output pattern is {} bytes long: at most {MAX_PATTERN}",
            pattern.len()
        )));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE)
        .build()
        .map_err(|e| {
            WireError::bad_request(format!(
                "--after output {pattern:?} is not a valid regex (Rust regex syntax): {e}"
            ))
        })
}

/// Starts the keeper of a waiting item and hands it the arguments; returns once it
/// listens.
async fn spawn_keeper(job_dir: &Path, kept: &Kept) -> Result<(), String> {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let exe = std::env::current_exe().map_err(|e| format!("no path to bgwork: {e}"))?;
    let mut child = tokio::process::Command::new(exe)
        .arg("keep")
        .arg(job_dir)
        .env_clear()
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not start its keeper: {e}"))?;
    let mut line = serde_json::to_vec(kept).map_err(|e| e.to_string())?;
    line.push(b'\n');
    let mut stdin = child.stdin.take().ok_or("no stdin for its keeper")?;
    let stdout = child.stdout.take().ok_or("no stdout for its keeper")?;
    let ready = async move {
        stdin.write_all(&line).await.map_err(|e| e.to_string())?;
        drop(stdin);
        let mut word = String::new();
        tokio::io::BufReader::new(stdout)
            .read_line(&mut word)
            .await
            .map_err(|e| e.to_string())?;
        match word.trim() {
            "ready" => Ok(()),
            _ => Err("its keeper did not start".to_string()),
        }
    };
    let result = match tokio::time::timeout(KEEPER_READY, ready).await {
        Ok(result) => result,
        Err(_) => Err("its keeper did not answer in time".to_string()),
    };
    if let Some(pid) = child.id() {
        crate::keeper::write_pid(job_dir, pid);
    }
    // Reap it whenever it ends (it outlives this daemon if the daemon goes first).
    tokio::spawn(async move { child.wait().await });
    result
}

/// Lets a waiting item's keeper go (it started, or ended).
pub(crate) async fn forget_keeper(job_dir: &Path) {
    let job_dir = job_dir.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || crate::keeper::end(&job_dir)).await;
}

/// A waiting item after a restart: its conditions (`after.json`) and its arguments
/// (from its keeper, which must keep them for this very item).
async fn taken_back(record: &Record) -> Result<(StartArgs, Vec<Awaited>), String> {
    let job_dir = PathBuf::from(&record.job_dir);
    let owner = crate::daemon::jobs::settle::owner(record);
    tokio::task::spawn_blocking(move || {
        let file = read_after_file(&job_dir)?;
        let kept = crate::keeper::ask(&job_dir, KeepRequest::Get).map_err(|e| {
            format!(
                "its keeper, the process that held its arguments (and its --env and \
                 --secret values) while it waited, was gone ({e}), and they with it,"
            )
        })?;
        if file.owner != owner || kept.owner != owner {
            return Err("its folder names another item".to_string());
        }
        Ok((kept.args, file.awaited))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// The `--env` and `--secret` values a waiting item's keeper holds for it (none when
/// it does not answer, or answers for another item): `restart` takes them from there.
pub(crate) async fn kept_env(record: &Record) -> std::collections::BTreeMap<String, String> {
    let job_dir = PathBuf::from(&record.job_dir);
    let owner = crate::daemon::jobs::settle::owner(record);
    let kept = tokio::task::spawn_blocking(move || crate::keeper::ask(&job_dir, KeepRequest::Get))
        .await
        .ok()
        .and_then(Result::ok);
    match kept {
        Some(kept) if kept.owner == owner => kept.args.env,
        _ => Default::default(),
    }
}

/// A waiting item's `after.json` (its folder is outside input: no link followed).
fn read_after_file(job_dir: &Path) -> Result<AfterFile, String> {
    let bytes = crate::paths::read_untrusted(&job_dir.join(AFTER_FILE), 1 << 20)
        .map_err(|e| format!("what it waited for could not be read ({e})"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("what it waited for could not be read ({e})"))
}
