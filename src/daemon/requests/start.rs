//! `start` and `agent start`: the limits checked and the record written under one lock,
//! a job folder of its own, the job's spec handed to its executor, and the window in
//! which the reply waits for the first output or the end.

use crate::daemon::admission::{Admission, Launch, Newcomer};
use crate::daemon::jobs::new_item::{
    check_start, job_env, limits_of, make_job_dir, new_record, place, secret_pairs,
    write_job_record,
};
use crate::daemon::{Daemon, Live};
use crate::environ;
use crate::executor::{HereOnly, On};
use crate::output;
use crate::paths::now_ms;
use crate::store::{EndRecord, NewRecord, Record};
use crate::wire::control::{JobSpec, PaneSize, PROTOCOL};
use crate::wire::{End, ErrorCode, Item, Kind, StartArgs, StartReply, State, WireError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `start` waits to learn that a job's process started.
const SPAWN_WAIT: Duration = Duration::from_secs(10);
/// What the locked part of a launch did: recorded a new job (with a sub-agent's
/// session), or found its twin running (its row).
enum Recorded {
    New(Box<Record>, Option<String>),
    Twin(i64),
}

/// What a launch did: started a job (its row), or found its twin running.
pub(crate) enum Launched {
    New(i64),
    Twin(i64),
}

impl Daemon {
    /// Starts a job; records whose end the reply shows are added to `shown` (their
    /// notices are delivered with the reply).
    pub(crate) async fn start(
        &self,
        session: &str,
        args: StartArgs,
        shown: &mut crate::daemon::Shown<'_>,
    ) -> Result<StartReply, WireError> {
        self.start_held(session, args, shown, false).await
    }

    /// [`Daemon::start`] for a restart that holds a start of the rate guard (`held`).
    pub(crate) async fn start_held(
        &self,
        session: &str,
        args: StartArgs,
        shown: &mut crate::daemon::Shown<'_>,
        held: bool,
    ) -> Result<StartReply, WireError> {
        let window = args
            .window_ms
            .map(Duration::from_millis)
            .unwrap_or(self.config.default_window);
        // An end inside the window is shown by this reply: its notice waits for it.
        let watch = (!window.is_zero()).then_some(&mut *shown);
        let launch = Launch {
            refuse_duplicate: !args.allow_duplicate,
            held,
            ..Launch::default()
        };
        let row = match self.launch_checked(session, &args, launch, watch).await? {
            Launched::New(row) => row,
            Launched::Twin(row) => return self.twin_reply(session, row).await,
        };
        if window.is_zero() || On::of(&args).which().queues() {
            // No window (or a job handed to a scheduler, which starts it when it will):
            // the id at once (the job is `starting` until its process runs), and nothing
            // is shown, so nothing counts as read.
            let record = self.lock().store.get(row)?;
            let record = record.ok_or_else(|| WireError::internal("record vanished"))?;
            let mut item = self.item(&record);
            self.expect_items(std::slice::from_mut(&mut item), &[record]);
            return Ok(StartReply {
                item,
                output: String::new(),
                already_running: None,
            });
        }
        self.wait_for(SPAWN_WAIT, |d| d.state_of(row) != Some(State::Starting))
            .await;
        let failed = self
            .lock()
            .store
            .get(row)?
            .filter(|r| r.end == Some(End::SpawnFailed));
        if let Some(record) = failed {
            shown.push(row);
            let reason = record.end_detail.unwrap_or_default();
            let message = format!("{} could not start: {reason}", record.id);
            return Err(WireError::new(ErrorCode::SpawnFailed, message));
        }
        self.wait_for(window, |d| d.has_ended(row)).await;
        let (output, mut item) = self.window_output(session, row)?;
        if item.state == State::Ended {
            shown.push(row);
        }
        let record = self.lock().store.get(row)?;
        if let Some(record) = record.filter(|r| r.state != State::Ended) {
            self.observe_items(std::slice::from_mut(&mut item), &[record])
                .await;
        }
        Ok(StartReply {
            item,
            output,
            already_running: None,
        })
    }

    /// The reply to a `start` of a command that already runs: that item, with what its
    /// processes use and listen on.
    async fn twin_reply(&self, session: &str, row: i64) -> Result<StartReply, WireError> {
        let record = self
            .lock()
            .store
            .get(row)?
            .ok_or_else(|| WireError::internal("record vanished"))?;
        let mut item = self.item_as(session, &record);
        self.observe_items(std::slice::from_mut(&mut item), &[record])
            .await;
        Ok(StartReply {
            item,
            output: String::new(),
            already_running: Some(true),
        })
    }

    /// Checks the limit, writes the record and starts the job; returns its row.
    /// `shown`: the reply that may show this job's end, which keeps its end notice from
    /// the moment the record exists.
    pub(crate) async fn launch(
        &self,
        session: &str,
        args: &StartArgs,
        launch: Launch,
        shown: Option<&mut crate::daemon::Shown<'_>>,
    ) -> Result<i64, WireError> {
        match self.launch_checked(session, args, launch, shown).await? {
            Launched::New(row) | Launched::Twin(row) => Ok(row),
        }
    }

    /// [`Daemon::launch`], which finds a running twin instead of starting one when
    /// `launch.refuse_duplicate`: the same command in the same session and folder that
    /// already listens on a port or has run for 2 s (two identical starts at the same
    /// moment, before either listens, make two jobs).
    pub(crate) async fn launch_checked(
        &self,
        session: &str,
        args: &StartArgs,
        launch: Launch,
        shown: Option<&mut crate::daemon::Shown<'_>>,
    ) -> Result<Launched, WireError> {
        if !args.after.is_empty() {
            // `start` hands a start with conditions to `jobs/after.rs` before this.
            return Err(WireError::bad_request(
                "only `start` waits for other work (--after): a run or a sub-agent starts \
                 at once; start it with `bgwork start --after …`",
            ));
        }
        // The pattern and value checks may take a while: other tasks go on meanwhile.
        tokio::task::block_in_place(|| check_start(args))?;
        let policy = crate::daemon::jobs::restart_policy::Policy::of(args, &launch)?;
        let limits = limits_of(args)?;
        let (cwd, pane) = place(args)?;
        let twin = crate::daemon::processes::Twin {
            kind: if pane.is_some() {
                Kind::Pane
            } else {
                Kind::Job
            },
            command: &args.command,
            cwd: &cwd,
            env_names: args.env.keys().cloned().collect(),
            env: job_env(args),
        };
        let refuse_duplicate = launch.refuse_duplicate && !launch.sub_agent;
        let listening = match refuse_duplicate {
            true => self.listening_twins(session, &twin).await,
            false => Vec::new(),
        };
        let twin = refuse_duplicate.then_some((&twin, listening.as_slice()));
        let kind = match (launch.sub_agent, pane.is_some()) {
            (true, _) => Kind::SubAgent,
            (false, true) => Kind::Pane,
            (false, false) => Kind::Job,
        };
        let new = new_record(session, kind, args, &cwd, pane);
        let recorded = self.record_start(&new, args, &launch, twin, (limits, policy))?;
        let (record, sub_session) = match recorded {
            Recorded::New(record, sub_session) => (*record, sub_session),
            Recorded::Twin(row) => return Ok(Launched::Twin(row)),
        };
        if let Some(shown) = shown {
            shown.watch(&[record.row]);
        }
        let job_dir = self.prepare_folder(&record, args, &cwd)?;
        let mut spec = self.job_spec(&record, args, &job_dir, sub_session, pane, limits);
        spec.restart = policy.map(|policy| policy.rule());
        let started = self.executors.start(record.row, &spec, &On::of(args)).await;
        let handle = match started {
            Ok(handle) => handle,
            Err(reason) => return Err(self.spawn_failed(record.row, &record.id, reason)),
        };
        self.live_unless_ended(record.row, handle)?;
        Ok(Launched::New(record.row))
    }

    /// A job its executor started goes live, unless its record ended meanwhile (a stop
    /// that raced the start).
    pub(crate) fn live_unless_ended(
        &self,
        row: i64,
        handle: crate::executor::JobHandle,
    ) -> Result<(), WireError> {
        {
            let mut inner = self.lock();
            let still = inner
                .store
                .get(row)?
                .is_some_and(|r| r.state != State::Ended);
            if still {
                let live = Live {
                    handle,
                    dropped: 0,
                    input_closed: false,
                    unwritten: 0,
                    unwritten_at: 0,
                };
                self.go_live(&mut inner, row, live);
            }
        }
        self.records_changed();
        Ok(())
    }

    /// Under the one lock: a running twin (when `twin` is given), else the limits of
    /// the session (and of its root), then the record and the start counted.
    fn record_start(
        &self,
        new: &NewRecord,
        args: &StartArgs,
        launch: &Launch,
        twin: Option<(&crate::daemon::processes::Twin<'_>, &[i64])>,
        (limits, policy): (
            (Option<u64>, Option<u64>),
            Option<crate::daemon::jobs::restart_policy::Policy>,
        ),
    ) -> Result<Recorded, WireError> {
        let session = new.session.as_str();
        let mut inner = self.lock();
        if let Some((twin, listening)) = twin {
            if let Some(twin) = Self::running_twin(&inner, session, twin, listening)? {
                return Ok(Recorded::Twin(twin.row));
            }
        }
        // Limits hold for a root session and its sub-agents together.
        let newcomer = match launch.sub_agent {
            true => Newcomer::SubAgent,
            false => Newcomer::Job(On::of(args).which()),
        };
        let admission = Admission {
            newcomer,
            checked_at_promotion: launch.over_limit,
            held: launch.held,
            again: None,
        };
        let root = self.admit(&mut inner, session, admission)?;
        let (record, sub_session) = if launch.sub_agent {
            let (record, name) = inner.store.insert_sub_agent(new)?;
            (record, Some(name))
        } else {
            (inner.store.insert(new)?, None)
        };
        self.count_start(&mut inner, &root);
        if launch.over_limit {
            // A foreground run, from its first moment (see `Inner::foreground`).
            inner.foreground.insert(record.row);
        }
        // Counted under its executor by every admission from now on.
        self.executors.claim(record.row, &On::of(args));
        if limits != (None, None) {
            inner.store.set_limits(record.row, limits.0, limits.1)?;
        }
        self.record_policy(&mut inner, record.row, policy)?;
        // The record as it is now (with its policy).
        let record = inner.store.get(record.row)?.unwrap_or(record);
        Ok(Recorded::New(Box::new(record), sub_session))
    }

    /// The job's own folder, with its description, and its working directory checked;
    /// a start that fails here is settled `spawn_failed`.
    fn prepare_folder(
        &self,
        record: &Record,
        args: &StartArgs,
        cwd: &str,
    ) -> Result<PathBuf, WireError> {
        let job_dir = self.paths.job_dir(record.row);
        // A folder of its own, never one that exists already (rows are never reused, so
        // one that exists was put there by something else, maybe a symlink).
        let prepared = make_job_dir(&self.paths.jobs, &job_dir)
            .and_then(|()| write_job_record(&job_dir, record, args))
            .and_then(|()| {
                let dir = job_dir.display().to_string();
                self.lock()
                    .store
                    .set_job_dir(record.row, &dir)
                    .map_err(|e| e.to_string())
            });
        if let Err(reason) = prepared {
            return Err(self.spawn_failed(record.row, &record.id, reason));
        }
        // On an ssh host the folder is the host's (checked there).
        if args.ssh.is_none() && !Path::new(cwd).is_dir() {
            let what = match Path::new(cwd).exists() {
                true => "is not a folder",
                false => "does not exist",
            };
            let reason = format!("the working directory {cwd} {what}: pass an existing --cwd");
            return Err(self.spawn_failed(record.row, &record.id, reason));
        }
        Ok(job_dir)
    }

    /// What the job's supervisor is handed: its command and environment (with the
    /// session and id a `bgwork` call inside it needs), its log's cap and its limits.
    pub(crate) fn job_spec(
        &self,
        record: &Record,
        args: &StartArgs,
        job_dir: &Path,
        sub_session: Option<String>,
        pane: Option<PaneSize>,
        limits: (Option<u64>, Option<u64>),
    ) -> JobSpec {
        let (mut env, env_bytes) = job_env(args);
        // A job knows its session and its id, so that a `bgwork` call inside it files
        // its work under the same session (a sub-agent's own session is set below).
        env.insert("BGWORK_SESSION".into(), record.session.clone());
        env.insert("BGWORK_ITEM".into(), record.id.clone());
        if let Some(sub_session) = sub_session {
            let report = crate::job_dir::JobDir(job_dir).report();
            env.insert("BGWORK_SESSION".into(), sub_session);
            env.insert("BGWORK_REPORT".into(), report.display().to_string());
        }
        let env_bytes = environ::without_names(&env_bytes, &env);
        JobSpec {
            protocol: PROTOCOL,
            job_key: job_dir.display().to_string(),
            job_dir: job_dir.display().to_string(),
            command: args.command.clone(),
            cwd: record.cwd.clone(),
            env,
            env_bytes,
            log_cap: self.config.log_cap,
            log_head: self.config.log_head,
            linger_grace_ms: self.config.linger_grace.as_millis() as u64,
            pane,
            owner: crate::daemon::jobs::settle::owner(record),
            // Under Slurm the allocation has its own cgroup, the scheduler's.
            no_cgroup: !self.config.cgroups || !On::of(args).which().own_cgroup(),
            max_runtime_ms: limits.1,
            secrets: secret_pairs(args),
            keep_raw_log: args.keep_raw_log,
            // Prompt once someone waits on its output (see `output_watch`).
            progress_every_ms: Some(crate::daemon::output::watchers::RELAXED_MS),
            restart: None,
        }
    }

    /// The output written so far (which then counts as read) and the item.
    fn window_output(&self, session: &str, row: i64) -> Result<(String, Item), WireError> {
        let mut inner = self.lock();
        let record = inner
            .store
            .get(row)?
            .ok_or_else(|| WireError::internal("record vanished"))?;
        let path = output::log_path(&record.job_dir);
        let dropped = inner.dropped(&record);
        let mut len = output::log_len(&path);
        if record.state != State::Ended {
            // Not half a character: the rest comes with the next read; nor the start of
            // a token still being written (the read that follows shows it whole, masked).
            let head = self.config.log_head;
            let view = output::LogView {
                path: &path,
                len,
                head,
                dropped,
            };
            len = view.token_edges(0, len, true).1;
            len = output::text_end(&path, 0, len, head, dropped);
        }
        let max = output::DEFAULT_MAX_BYTES;
        let excerpt = output::excerpt(&path, 0, len, self.config.log_head, dropped, max);
        let (text, _) = excerpt.render(max, &path);
        inner.store.set_cursor(session, row, len)?;
        Ok((text, self.item(&record)))
    }

    /// Settles a record that could not start and returns the error for the caller.
    pub(crate) fn spawn_failed(&self, row: i64, id: &str, reason: String) -> WireError {
        self.spawn_failed_told(row, id, reason, false)
    }

    /// A failed start, with a notice when no caller hears the error (a waiting item
    /// that could not start when its conditions held: its `start` answered long ago).
    pub(crate) fn spawn_failed_told(
        &self,
        row: i64,
        id: &str,
        reason: String,
        notify: bool,
    ) -> WireError {
        let settlement = EndRecord {
            end: End::SpawnFailed,
            exit_code: None,
            signal: None,
            ended_at: now_ms(),
            log_len: 0,
            dropped: 0,
            end_detail: Some(reason.clone()),
            notice: notify.then(|| crate::store::NewNotice {
                text: format!("{id} could not start: {reason}"),
                tail: String::new(),
            }),
            pid: None,
            unwritten: 0,
            unwritten_at: 0,
            cpu_ms: None,
            peak_rss: None,
        };
        let mut inner = self.lock();
        if let Err(e) = inner.store.settle(row, &settlement) {
            crate::note!("bgwork daemon: could not record the failed start of {id}: {e}");
        }
        inner.screens.forget(row);
        drop(inner);
        self.records_changed();
        WireError::new(
            ErrorCode::SpawnFailed,
            format!("{id} could not start: {reason}"),
        )
    }

    /// `agent start`: a sub-agent, a job whose own work is filed under `SESSION/sub-N`
    /// and whose report comes back as a notice.
    pub(crate) async fn agent_start(
        &self,
        session: &str,
        args: StartArgs,
    ) -> Result<StartReply, WireError> {
        self.agent_start_held(session, args, false).await
    }

    /// [`Daemon::agent_start`] for a restart that holds a start of the rate guard.
    pub(crate) async fn agent_start_held(
        &self,
        session: &str,
        mut args: StartArgs,
        held: bool,
    ) -> Result<StartReply, WireError> {
        args.pty = false;
        args.notify = true;
        if let Some(refused) = On::of(&args).which().refuses_here_only(HereOnly::SubAgent) {
            return Err(WireError::bad_request(refused));
        }
        // Its own session is `SESSION/sub-N`, which must itself be a valid name.
        if session.len() + "/sub-".len() + 20 > crate::daemon::MAX_SESSION {
            return Err(WireError::bad_request(format!(
                "this session's name is too long to start a sub-agent under it (a sub-agent's \
                 session, `SESSION/sub-N`, must fit in {} bytes): use a shorter session name",
                crate::daemon::MAX_SESSION
            )));
        }
        let launch = Launch {
            sub_agent: true,
            held,
            ..Launch::default()
        };
        let row = self.launch(session, &args, launch, None).await?;
        let record = self.lock().store.get(row)?;
        let item = record
            .map(|r| self.item(&r))
            .ok_or_else(|| WireError::internal("record vanished"))?;
        Ok(StartReply {
            item,
            output: String::new(),
            already_running: None,
        })
    }
}
