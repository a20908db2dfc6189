//! `SshExecutor`: jobs on another machine reached with the system's OpenSSH client
//! (`start --on ssh:HOST`). On the host runs bgwork itself (the same version, found on
//! its PATH or copied there: [`deploy`]), and the job is an ordinary job of the host's
//! own daemon: its own supervisor, whole-tree stop, real ends and exit codes, durable
//! status on the host's disk. The local daemon keeps the record and talks to the
//! host's daemon with bgwork's own requests over one connection per host ([`link`]).
//!
//! One task per job mirrors the host's log into the local job folder by offset (so
//! `read`, `--grep`, `wait --until`, notices' tails work as for a local job and keep
//! working while the host is down), learns the job's pid and end from the host, and
//! carries `stop` and `send` there. `ssh.json` in the job's folder names the host and
//! the job's name there (`bgw-<home-id>-<row>`), written before the job is handed over,
//! then its id there: a daemon restarted after a `kill -9`, or a link that dropped,
//! finds the job again by it and takes it back, never starting it again.

pub mod call;
pub mod deploy;
pub mod ends;
pub mod link;
pub mod logout;
pub mod relay;

use super::{
    Command, ExecEvent, Executor, JobHandle, On, Reattach, Running, View, Which, WriteRefused,
};
use crate::job_dir::JobDir;
use crate::paths::now_ms;
use crate::wire::control::{self, ExitStatus, JobSpec, ToSupervisor, PROTOCOL};
use crate::wire::ssh::SshJob;
use crate::wire::{
    Actor, End, Envelope, ErrorCode, Item, ListReply, ReadArgs, ReadReply, Request, SendArgs,
    StartArgs, StartReply, StopArgs, WaitArgs, WaitReply, WireError,
};
use link::{LinkError, Links};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The file in a job's folder that says it runs on a host, and as which job there.
pub const SSH_FILE: &str = "ssh.json";
/// How often a job's task asks the host for new output until the daemon sets a pace
/// (`Pace`: 50 ms while someone waits on the output, else 1 s), and the bounds of it.
/// At 1 s, a hundred jobs on one host cost its daemon a hundred reads a second.
const MIRROR_EVERY: Duration = Duration::from_millis(100);
const MIRROR_FASTEST: Duration = Duration::from_millis(50);
const MIRROR_SLOWEST: Duration = Duration::from_secs(1);
/// The most output one request brings over.
const CHUNK: usize = 4 << 20;
/// How many reads of a job's output are in flight at once while the mirror is behind
/// (the host reads the next chunk while this one crosses the link), the extra ones
/// within the link's own bound (`Link::extra_read`).
const WINDOW: usize = 4;

/// Where a `start` (a job or a pane) runs when it names a host: `ssh:HOST` from `on`
/// (else `BGWORK_EXECUTOR`); `None`: not on a host. `prefix`: how options are named to
/// the caller (`--` on the command line, none in MCP).
pub fn choose(on: Option<&str>, prefix: &str) -> Result<Option<String>, WireError> {
    let from_env = std::env::var("BGWORK_EXECUTOR")
        .ok()
        .filter(|v| !v.is_empty());
    let Some(executor) = on.map(str::to_string).or(from_env) else {
        return Ok(None);
    };
    let Some(host) = executor.strip_prefix("ssh:") else {
        return Ok(None);
    };
    let bad = host.is_empty()
        || host.starts_with('-')
        || host.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad {
        return Err(WireError::bad_request(format!(
            "{prefix}on {executor:?}: give a host as ssh knows it, e.g. {prefix}on ssh:build-box \
             or {prefix}on ssh:me@10.0.0.5 (a port or key goes in your ssh config)"
        )));
    }
    Ok(Some(host.to_string()))
}

/// What the daemon checks of a start on a host, whoever sent it.
pub fn check(args: &StartArgs) -> Result<(), WireError> {
    let Some(host) = &args.ssh else {
        return Ok(());
    };
    if args.slurm.is_some() {
        return Err(WireError::bad_request(
            "a job runs on Slurm or on an ssh host, not both: choose one --on",
        ));
    }
    choose(Some(&format!("ssh:{host}")), "--").map(|_| ())?;
    // `~`: the remote home, as the record of a job started without a folder says (its
    // restart).
    if let Some(cwd) = args.cwd.as_deref().filter(|&cwd| cwd != "~") {
        check_cwd(cwd, "cwd")?;
    }
    Ok(())
}

/// A folder on a host is an absolute path there (none: the remote user's home).
pub fn check_cwd(cwd: &str, flag: &str) -> Result<(), WireError> {
    match cwd.starts_with('/') {
        true => Ok(()),
        false => Err(WireError::bad_request(format!(
            "{flag} {cwd:?}: on an ssh host the folder is a path there, given whole (e.g. \
             /home/me/project); leave it out for the remote user's home"
        ))),
    }
}

/// What the host's daemon is asked for a job's record there.
fn session_of(home_id: &str, spec: &JobSpec) -> String {
    let local = spec
        .env
        .get("BGWORK_SESSION")
        .map(String::as_str)
        .unwrap_or("default");
    let mut session = format!("ssh-{home_id}.{}", local.replace('/', "."));
    session.truncate(120);
    session
}

pub struct SshExecutor {
    events: mpsc::UnboundedSender<ExecEvent>,
    home_id: String,
    links: Arc<Links>,
    /// The ends of every host's jobs, one `wait` per host and session.
    ends: Arc<ends::Ends>,
    /// Rows known to run (or to have run) on a host, and which; `None`: known not to.
    views: Arc<Mutex<HashMap<i64, Option<String>>>>,
    /// Rows whose host said they die at logout there (`SshJob::logout`).
    logouts: Arc<Mutex<HashMap<i64, String>>>,
}

impl SshExecutor {
    pub fn new(events: mpsc::UnboundedSender<ExecEvent>, home: &Path) -> SshExecutor {
        let home_id = super::slurm::home_id(home);
        SshExecutor {
            events,
            links: Arc::new(Links::new(home, &home_id)),
            ends: Arc::default(),
            home_id,
            views: Arc::default(),
            logouts: Arc::default(),
        }
    }

    /// "host H unreachable since T: …" of each host with work running that cannot be
    /// reached now.
    pub fn unreachable(&self) -> Vec<String> {
        self.links
            .busy()
            .iter()
            .filter_map(|l| l.unreachable())
            .collect()
    }

    fn host_of(&self, row: i64, job_dir: &str) -> Option<String> {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(host) = views.get(&row) {
            return host.clone();
        }
        let job = (!job_dir.is_empty())
            .then(|| read_ssh_file(Path::new(job_dir)))
            .flatten();
        let found = job.as_ref().map(|job| job.host.clone());
        views.insert(row, found.clone());
        drop(views);
        if let Some(logout) = job.and_then(|job| job.logout) {
            self.set_logout(row, Some(logout));
        }
        found
    }

    fn set_logout(&self, row: i64, logout: Option<String>) {
        let mut logouts = self.logouts.lock().unwrap_or_else(|p| p.into_inner());
        match logout {
            Some(logout) => logouts.insert(row, logout),
            None => logouts.remove(&row),
        };
    }

    fn set_host(&self, row: i64, host: &str) {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(row, Some(host.to_string()));
    }

    async fn hand_over(&self, row: i64, spec: &JobSpec, host: &str) -> Result<JobHandle, String> {
        let job_dir = PathBuf::from(&spec.job_dir);
        let mut job = SshJob {
            host: host.to_string(),
            name: format!("bgw-{}-{row}", self.home_id),
            session: session_of(&self.home_id, spec),
            remote_id: None,
            max_runtime_ms: spec.max_runtime_ms,
            logout: None,
            unsent: Default::default(),
        };
        write_ssh_file(&job_dir, &job)?;
        self.set_host(row, host);
        // The mirror: the host's log, by offset.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(JobDir(&job_dir).log())
            .map_err(|e| format!("could not make its log: {e}"))?;
        let mut env = spec.env.clone();
        env.remove("BGWORK_SESSION");
        env.remove("BGWORK_ITEM");
        let args = StartArgs {
            command: spec.command.clone(),
            // `~`: the remote user's home.
            cwd: (spec.cwd != "~").then(|| spec.cwd.clone()),
            env,
            name: Some(job.name.clone()),
            window_ms: Some(0),
            allow_duplicate: true,
            max_runtime_s: spec.max_runtime_ms.map(|ms| ms as f64 / 1000.0),
            secrets: spec.secrets.iter().map(|[name, _]| name.clone()).collect(),
            keep_raw_log: spec.keep_raw_log,
            // A pane: its terminal is made there, by the host's supervisor.
            pty: spec.pane.is_some(),
            cols: spec.pane.map(|p| p.cols),
            rows: spec.pane.map(|p| p.rows),
            ..StartArgs::default()
        };
        let link = self.links.of(host);
        link.try_now();
        let envelope = Envelope {
            session: job.session.clone(),
            request: Request::Start(args),
        };
        let reply: StartReply = match link.request(&envelope, Duration::ZERO).await {
            Ok(line) => crate::wire::decode_reply(&line)
                .map_err(|e| format!("{host} refused it: {}", host_words(host, &e.message)))?,
            // Sent, and no answer: the host may run it. Found by its name once the host
            // answers again (or lost, if the host never got it); never sent twice.
            Err(LinkError::InDoubt(why)) => {
                crate::note!("bgwork daemon: the start of row {row} is in doubt: {why}");
                return Ok(self.track(row, job_dir, job, spec.owner.clone(), false, 0));
            }
            Err(e) => return Err(e.to_string()),
        };
        job.remote_id = Some(reply.item.id.clone());
        // Said by the host's relay when the channel opened: this job dies at logout.
        job.logout = link.logout();
        self.set_logout(row, job.logout.clone());
        if let Err(e) = write_ssh_file(&job_dir, &job) {
            crate::note!("bgwork daemon: {e}");
        }
        Ok(self.track(row, job_dir, job, spec.owner.clone(), false, 0))
    }

    fn track(
        &self,
        row: i64,
        job_dir: PathBuf,
        job: SshJob,
        owner: String,
        spawned: bool,
        mirrored: u64,
    ) -> JobHandle {
        let (commands, incoming) = mpsc::unbounded_channel();
        let unanswered = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handle = JobHandle::new(commands, unanswered, refuses);
        // What an earlier daemon was asked and the host has not taken: sent after the
        // first look.
        let order = Order {
            pending: Mutex::new(job.unsent),
            folder: Mutex::new(Some(job_dir.clone())),
            ..Order::default()
        };
        let stop_actor = job.unsent.stop.map(|(_, actor)| actor);
        let tracker = Tracker {
            row,
            link: self.links.of(&job.host),
            ends: self.ends.clone(),
            job_dir,
            job,
            owner,
            events: self.events.clone(),
            spawned,
            pid: None,
            mirrored,
            stop_actor,
            order: Arc::new(order),
            ended_item: None,
        };
        tokio::spawn(tracker.run(incoming));
        handle
    }
}

impl Executor for SshExecutor {
    async fn start(&self, row: i64, spec: &JobSpec, on: &On) -> Result<JobHandle, String> {
        match on {
            On::Ssh(host) => self.hand_over(row, spec, host).await,
            _ => Err("a job for another executor was handed to the SSH executor".into()),
        }
    }

    async fn reattach(&self, row: i64, job_dir: &Path, owner: &str) -> Reattach {
        let Some(job) = read_ssh_file(job_dir) else {
            return Reattach::Lost(format!("its {SSH_FILE} is unreadable"));
        };
        self.set_host(row, &job.host);
        self.set_logout(row, job.logout.clone());
        let mirrored = std::fs::metadata(JobDir(job_dir).log()).map_or(0, |m| m.len());
        let pid = crate::supervisor::tree::TreeRecord::read(job_dir)
            .job
            .map_or(0, |(pid, _)| pid);
        let handle = self.track(
            row,
            job_dir.to_path_buf(),
            job,
            owner.to_string(),
            true,
            mirrored,
        );
        Reattach::Running(Running {
            pid,
            dropped: 0,
            unwritten: 0,
            unwritten_at: 0,
            handle,
            between: None,
        })
    }

    fn view(&self, row: i64, job_dir: &str) -> Option<View> {
        let host = self.host_of(row, job_dir)?;
        let unreachable = self.links.known(&host).and_then(|l| l.unreachable());
        let logout = self
            .logouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&row)
            .map(|why| format!("on {host}: {why}"));
        Some(View {
            which: Which::Ssh,
            host: Some(host),
            unreachable,
            logout,
            ..View::default()
        })
    }

    /// The job's supervisor lives on the host, asked through its daemon.
    fn supervisor_alive(&self, _job_dir: &Path) -> bool {
        true
    }

    /// Nothing of it runs on this machine; the host's daemon stops what is left there.
    fn sweep(&self, _key: &str, _job_dir: &Path) -> usize {
        0
    }

    fn claim(&self, row: i64) {
        self.views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(row, Some(String::new()));
    }
}

/// What a job on a host cannot be asked.
fn refuses(command: &ToSupervisor) -> Option<&'static str> {
    match command {
        // Input (a pane's keys too) goes as a write, answered by the host's daemon.
        ToSupervisor::Input { .. } => Some("input reaches a job on an ssh host as a write"),
        ToSupervisor::Signal { signal } if key_of(*signal).is_none() && !is_hangup(*signal) => {
            Some("a job on an ssh host takes the keys C-c, C-\\ and C-z, no other signal")
        }
        ToSupervisor::Hello { .. } => Some("a job on an ssh host is reached through its host"),
        ToSupervisor::Rerun { .. } => Some("restart policies are not supported on ssh hosts yet"),
        ToSupervisor::Signal { .. }
        | ToSupervisor::Resize { .. }
        | ToSupervisor::CloseInput
        | ToSupervisor::Stop { .. }
        | ToSupervisor::Write { .. }
        | ToSupervisor::Pace { .. } => None,
    }
}

/// SIGHUP, which only `close` sends (a pane's hang-up): `close` on the host.
fn is_hangup(signal: i32) -> bool {
    signal == nix::sys::signal::Signal::SIGHUP as i32
}

/// The key of `send --key` that makes the host's daemon send a plain job `signal`, as
/// `keys::plain_job_key` maps it.
fn key_of(signal: i32) -> Option<&'static str> {
    use nix::sys::signal::Signal;
    match signal {
        s if s == Signal::SIGINT as i32 => Some("C-c"),
        s if s == Signal::SIGQUIT as i32 => Some("C-\\"),
        s if s == Signal::SIGTSTP as i32 => Some("C-z"),
        _ => None,
    }
}

struct Tracker {
    row: i64,
    link: Arc<link::Link>,
    ends: Arc<ends::Ends>,
    job_dir: PathBuf,
    job: SshJob,
    owner: String,
    events: mpsc::UnboundedSender<ExecEvent>,
    /// The daemon knows its process runs (it was told `spawned`, or took it back).
    spawned: bool,
    pid: Option<i32>,
    /// The host's log offset mirrored so far.
    mirrored: u64,
    stop_actor: Option<Actor>,
    /// A stop, resize or hang-up the host has not taken yet, and the order of the
    /// input after them.
    order: Arc<Order>,
    /// The item the host's `wait` answered with when the job ended there.
    ended_item: Option<Item>,
}

/// A stop, and a pane's resize and hang-up, not yet taken by the host (its link was
/// down, or the request in doubt): sent again after each look until the host answers
/// (each may be carried out twice, never lost), and always before input asked after
/// them: input and these take turns ([`Order::turn`]), each turn sending what is
/// pending first.
#[derive(Default)]
struct Order {
    pending: Mutex<Pending>,
    turns: tokio::sync::Mutex<()>,
    /// A retry waits for its turn (one at a time).
    retrying: std::sync::atomic::AtomicBool,
    /// What a turn needs to send them.
    to: Mutex<Option<(Arc<link::Link>, String, String)>>,
    /// The job's folder, whose `ssh.json` keeps what is pending.
    folder: Mutex<Option<PathBuf>>,
}

/// What is pending, kept in the job's `ssh.json` too (`SshJob::unsent`), so that a
/// daemon restarted before the host answers sends it still.
type Pending = crate::wire::ssh::Unsent;

impl Order {
    /// Waits for this caller's turn, then sends what is pending; the turn lasts while
    /// the guard lives.
    async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
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
    fn keep(&self) {
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

    fn has_pending(&self) -> bool {
        !lock(&self.pending).is_empty()
    }
}

/// What one look at the host found.
enum Look {
    Going,
    Ended(Box<ExitStatus>),
}

impl Tracker {
    /// Mirrors at the pace the daemon asks, and at once when the host's daemon says
    /// the job ended (the `wait` of its host and session kept open there, `ends.rs`),
    /// so an end is known here within the link's round trip, not a poll's period.
    async fn run(mut self, mut incoming: mpsc::UnboundedReceiver<Command>) {
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

    fn envelope(&self, request: Request) -> Envelope {
        Envelope {
            session: self.job.session.clone(),
            request,
        }
    }

    async fn ask<T: serde::de::DeserializeOwned>(&self, request: Request) -> Result<T, LinkError> {
        let line = self
            .link
            .request(&self.envelope(request), Duration::ZERO)
            .await?;
        crate::wire::decode_reply(&line).map_err(LinkError::Refused)
    }

    /// The job's item on the host, found by its id there (or, when the daemon stopped
    /// before it heard the id, by its name).
    async fn item(&mut self) -> Result<Option<Item>, LinkError> {
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

    async fn look(&mut self) -> Look {
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

    async fn look_once(&mut self) -> Result<Look, LinkError> {
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

    /// Reads the host's log from the mirror's offset until a read comes back short (the
    /// mirror caught up), and writes each chunk at the same offset here, in order. One
    /// read at a time while each comes back short; once one was a whole chunk (the
    /// mirror is behind), up to `WINDOW` reads at consecutive offsets stay in flight,
    /// the next asked as each one lands (so the host reads, the link carries and this
    /// daemon writes at once, with no pause between batches), the extra ones within
    /// the link's bound. A chunk is taken only at the mirror's offset: after a short one
    /// (or a middle the host's cap dropped, `clipped`) the reads beyond it are left and
    /// asked again from the new offset. The last reply taken.
    async fn catch_up(&mut self, id: &str) -> Result<ReadReply, LinkError> {
        type Asked = tokio::task::JoinHandle<Result<link::Reply, LinkError>>;
        // Each read in flight: its offset, its task, whether it is the job's own read.
        let mut asked: std::collections::VecDeque<(u64, Asked, bool)> = Default::default();
        let mut wide = 1;
        loop {
            // Fill the window from where the reads in flight end.
            let mut own_asked = asked.iter().any(|(_, _, own)| *own);
            while asked.len() < wide {
                let permit = match own_asked {
                    false => None,
                    true => match self.link.extra_read() {
                        Some(permit) => Some(permit),
                        None => break,
                    },
                };
                let from = asked
                    .back()
                    .map_or(self.mirrored, |(from, _, _)| from + CHUNK as u64);
                let own = !own_asked;
                own_asked = true;
                let (link, envelope) = (self.link.clone(), self.mirror_read(id, from));
                let read = tokio::spawn(async move {
                    let _permit = permit;
                    link.request_frame(&envelope, Duration::ZERO).await
                });
                asked.push_back((from, read, own));
            }
            let Some((from, read, _)) = asked.pop_front() else {
                return Err(LinkError::Down("no read was made".into()));
            };
            let (line, bytes) = read
                .await
                .map_err(|e| LinkError::Down(format!("the read did not finish: {e}")))??;
            let reply: ReadReply = crate::wire::decode_reply(&line).map_err(LinkError::Refused)?;
            if from != self.mirrored {
                // Asked past a chunk that came back short: asked again from here.
                asked.clear();
                continue;
            }
            self.take_chunk(&reply, &bytes);
            // More is there when the chunk was whole, or when the read stopped short of
            // the log's end (`clipped`: a middle the host's cap dropped, read past in
            // steps, with the newest bytes after it).
            let full = bytes.len() >= CHUNK || reply.clipped;
            if !full {
                return Ok(reply);
            }
            wide = WINDOW;
            if asked
                .front()
                .is_some_and(|(from, _, _)| *from != self.mirrored)
            {
                // The chunk ended elsewhere than a whole one would (a dropped middle).
                asked.clear();
            }
        }
    }

    /// Writes one read's bytes at its offset here and tells the daemon the log grew.
    fn take_chunk(&mut self, reply: &ReadReply, bytes: &[u8]) {
        // A raw read's bytes are the last of `[from, to)`: all of it, or none when it
        // lay in the middle the host's cap dropped (a hole here too).
        let at = reply
            .to
            .saturating_sub(bytes.len() as u64)
            .max(self.mirrored);
        let skipped = at > self.mirrored;
        let grew = !bytes.is_empty();
        if grew {
            self.append(at, bytes);
        }
        self.mirrored = reply.to.max(self.mirrored);
        if grew || skipped {
            let log_len = std::fs::metadata(JobDir(&self.job_dir).log()).map_or(0, |m| m.len());
            let _ = self.events.send(ExecEvent::Output {
                row: self.row,
                log_len,
                // A mirror's dropped middles are its holes, found in the file by
                // every reader (`output::Holes`): no figure at this daemon's head.
                dropped: 0,
                unwritten: 0,
                unwritten_at: 0,
            });
        }
    }

    /// A read of the host's log from `from`: the exact bytes, raw after the reply's
    /// line (no base64, no JSON escapes), as the host's log holds them (token shapes
    /// are masked when read here, as for a local job's log, so every offset is the
    /// host's).
    fn mirror_read(&self, id: &str, from: u64) -> Envelope {
        self.envelope(Request::Read(ReadArgs {
            id: id.to_string(),
            from: Some(from),
            raw: true,
            max_bytes: Some(CHUNK),
            no_redact: true,
            output_frame: true,
            ..ReadArgs::default()
        }))
    }

    /// Writes `bytes` at the host's offset `at`: a middle the host's cap dropped stays
    /// a hole here too, so every byte keeps its offset (and a reattach resumes from
    /// the log's length). Readers find the holes in the file (`output::Holes`); one
    /// shorter than the rest of the block it begins in would be no hole but zeros, so
    /// that block's output before it (which the host's cap dropped too: its first
    /// middle is always more than a block) is dropped with it.
    fn append(&self, at: u64, bytes: &[u8]) {
        let log = JobDir(&self.job_dir).log();
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut file| {
                let meta = file.metadata()?;
                let len = meta.len();
                if len < at {
                    let block = std::os::unix::fs::MetadataExt::blksize(&meta).max(512);
                    let block_start = len - len % block;
                    if len % block != 0 && at <= block_start + block {
                        use nix::fcntl::{fallocate, FallocateFlags};
                        let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE
                            | FallocateFlags::FALLOC_FL_KEEP_SIZE;
                        fallocate(&file, flags, block_start as i64, (at - block_start) as i64)
                            .map_err(std::io::Error::from)?;
                    }
                    file.set_len(at)?;
                }
                file.write_all(bytes)
            });
        if let Err(e) = written {
            crate::note!(
                "bgwork daemon: could not mirror output into {}: {e}",
                log.display()
            );
        }
    }

    fn base_status(&self) -> ExitStatus {
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

    fn lost(&self, why: String) -> ExitStatus {
        ExitStatus {
            scheduler_end: Some(End::Lost),
            detail: Some(why),
            ..self.base_status()
        }
    }

    /// The end as the host's daemon recorded it.
    fn status_of(&self, item: &Item) -> ExitStatus {
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
    fn stop_figures(&self, status: &mut ExitStatus, detail: Option<&str>) {
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

    fn command(&mut self, command: Command) {
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
                let text = escaped(&data);
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
    fn send_pending(&self) {
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
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

/// Input bytes as `send` text, which the host's daemon turns back into the same bytes
/// (`\\`, and `\xHH` for every byte that is not printable ASCII).
fn escaped(data: &[u8]) -> String {
    let mut text = String::with_capacity(data.len());
    for &byte in data {
        match byte {
            b'\\' => text.push_str("\\\\"),
            0x20..=0x7e => text.push(byte as char),
            _ => text.push_str(&format!("\\x{byte:02x}")),
        }
    }
    text
}

/// Whether a job's folder says it runs on an ssh host.
pub fn host_of(job_dir: &Path) -> Option<String> {
    match job_dir.as_os_str().is_empty() {
        true => None,
        false => read_ssh_file(job_dir).map(|job| job.host),
    }
}

fn read_ssh_file(job_dir: &Path) -> Option<SshJob> {
    let bytes = crate::paths::read_untrusted(&job_dir.join(SSH_FILE), 1 << 16).ok()?;
    control::decode(&bytes).ok()
}

fn write_ssh_file(job_dir: &Path, job: &SshJob) -> Result<(), String> {
    crate::paths::write_whole(&job_dir.join(SSH_FILE), &control::encode(job))
        .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn input_crosses_as_send_text_byte_for_byte() {
        let data: Vec<u8> = (0..=255u8).chain(*b"a\\nb\\x41").collect();
        let text = super::escaped(&data);
        assert_eq!(crate::keys::unescape(&text).unwrap(), data);
    }

    #[test]
    fn hosts_and_folders_are_checked() {
        assert_eq!(
            super::choose(Some("ssh:me@box"), "--").unwrap(),
            Some("me@box".to_string())
        );
        assert_eq!(super::choose(Some("local"), "--").unwrap(), None);
        for bad in ["ssh:", "ssh:-oProxyCommand=x", "ssh:a b"] {
            assert!(super::choose(Some(bad), "--").is_err(), "{bad}");
        }
        assert!(super::check_cwd("/srv/x", "--cwd").is_ok());
        assert!(super::check_cwd("srv/x", "--cwd").is_err());
    }
}

/// A host daemon's words for a caller here: its own ids of items mean nothing here
/// (the caller knows the job by its id here), so "bg-23 could not start: …" at the
/// front is left to the reason, and any other id there is marked as the host's.
fn host_words(host: &str, message: &str) -> String {
    static ID: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let id = ID.get_or_init(|| {
        regex::Regex::new(r"\b(?:[A-Za-z0-9_.-]+/)?bg-[0-9]+\b").expect("a valid pattern")
    });
    let message = match message.split_once(" could not start: ") {
        Some((front, reason)) if id.find(front).is_some_and(|m| m.as_str() == front) => reason,
        _ => message,
    };
    id.replace_all(message, |m: &regex::Captures| {
        format!("{} (its id on {host})", &m[0])
    })
    .into_owned()
}

#[cfg(test)]
mod host_words_tests {
    use super::host_words;

    #[test]
    fn issue24_w3_the_hosts_ids_are_never_shown_as_ids_here() {
        assert_eq!(
            host_words("gpu", "bg-23 could not start: /nope: no such folder"),
            "/nope: no such folder"
        );
        assert_eq!(
            host_words("gpu", "bg-23 is not running"),
            "bg-23 (its id on gpu) is not running"
        );
        assert_eq!(host_words("gpu", "no id here"), "no id here");
    }
}
