//! The request and reply types every client speaks to the daemon, and their framing.
//!
//! One request is one line of JSON (an [`Envelope`]); one reply is one line of JSON:
//! either the reply object of contract §10 or `{"error":{"code","message"}}`. `notices
//! --follow` is the one request answered by many lines (and the client sends `ack`
//! lines on the same connection). This module (with
//! [`control`], the daemon ↔ supervisor protocol) is the only place that derives
//! `Serialize`: the CLI, the MCP server and the web page all build these same types.

pub mod after;
pub mod control;
pub mod frame;
pub mod ssh;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Requests larger than this are refused before they are parsed.
pub const MAX_FRAME: usize = 1 << 20;
/// The most notice ids one `ack` takes.
pub const MAX_ACK_IDS: usize = 1000;

/// One request with the session that makes it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Envelope {
    pub session: String,
    #[serde(flatten)]
    pub request: Request,
}

/// Every call the daemon serves.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Start(StartArgs),
    List {
        #[serde(default)]
        all: bool,
        /// Every session's work, not only the caller's (for a person at the terminal).
        #[serde(default)]
        all_sessions: bool,
    },
    Read(ReadArgs),
    Send(SendArgs),
    Stop(StopArgs),
    Wait(WaitArgs),
    Notices {
        #[serde(default)]
        peek: bool,
        #[serde(default)]
        follow: bool,
        /// When none is pending, block up to this many seconds for the first one.
        #[serde(default)]
        wait_s: Option<f64>,
        /// Acknowledged delivery: the notices stay claimed by this connection until it
        /// sends `ack` with their ids (released, pending again, if it closes first).
        /// `follow` is always acknowledged (unless `peek`).
        #[serde(default)]
        ack: bool,
        /// Take at most this many (oldest first); the rest stay pending, unclaimed,
        /// and the reply counts them in `more`. Unbounded when absent.
        #[serde(default)]
        limit: Option<u32>,
        /// First binds the session to this harness process, as `bind_harness` does (a
        /// hook's one request at a turn boundary); a bind that fails still claims, and
        /// the reply's `unbound` says why. Not read by `follow`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bind_harness: Option<ProcessKey>,
    },
    /// Marks notices sent on this connection (`notices` with `ack`, or `--follow`)
    /// delivered: the client has shown them. Answered with an `Ack`, except inside a
    /// `--follow` stream, where it gets no reply.
    Ack {
        ids: Vec<String>,
    },
    /// Drops ended records from lists: `id`, and each of `ids`.
    Dismiss {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        ids: Vec<String>,
    },
    Resize {
        id: String,
        cols: u16,
        rows: u16,
    },
    Run(RunArgs),
    Monitor(MonitorArgs),
    AgentStart(StartArgs),
    /// A new item with the command, folder, names and options of an earlier one.
    Restart(RestartArgs),
    /// Deletes ended records and their logs: those older than the retention (or
    /// `older_than_s`, or every one with `all_ended`), then the oldest past the size
    /// budget. Never a record whose notice was not delivered.
    Gc {
        #[serde(default)]
        older_than_s: Option<f64>,
        #[serde(default)]
        all_ended: bool,
    },
    /// A session name of its own for a new front end (an MCP server): `base`, or
    /// `base-2`, `base-3`… when that is in use. With `harness` (the harness process the
    /// server runs under) and `server` (the server's own process), the session of that
    /// harness: the one its hooks speak for, else the one an earlier server of it had
    /// (a restarted server), else a new one bound to it (contract §11).
    NewSession {
        base: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        harness: Option<ProcessKey>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<ProcessKey>,
    },
    /// A hook's word that the envelope's session is the conversation of the harness
    /// process `harness` (which its MCP servers then join).
    BindHarness {
        harness: ProcessKey,
    },
    Status,
    /// Answers at once and looks at nothing: a quiet client's check that the daemon
    /// still serves (a `notices --follow` or `wait` stream between two lines).
    Ping,
    /// Closes a pane as a person closes its terminal window: the pane's processes are
    /// hung up (SIGHUP), and a pane that ends so ends `cancelled`.
    Close {
        id: String,
    },
    /// Serves the work strip on loopback (`port`, else the port it had, else a free
    /// one) and answers its address.
    Ui {
        #[serde(default)]
        port: Option<u16>,
    },
    Shutdown {
        #[serde(default)]
        stop_work: bool,
    },
    /// The run history of a folder: every command run there, or `command`'s alone
    /// (contract §13).
    History {
        cwd: String,
        #[serde(default)]
        command: Option<String>,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct StartArgs {
    pub command: String,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Variables set with `--env`: their names are recorded, their values never.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The caller's whole environment, which the job inherits (never recorded).
    #[serde(default)]
    pub inherit_env: Option<BTreeMap<String, String>>,
    /// The caller's variables whose name or value is not UTF-8, inherited too: each a
    /// `[name, value]` pair of base64 texts (a job's environment is bytes; JSON is not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherit_env_bytes: Vec<[String; 2]>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub notify: bool,
    #[serde(default)]
    pub window_ms: Option<u64>,
    /// Run on a pseudo-terminal (a pane) of `cols`×`rows` (default 120×40).
    #[serde(default)]
    pub pty: bool,
    #[serde(default)]
    pub cols: Option<u16>,
    #[serde(default)]
    pub rows: Option<u16>,
    /// Start even when the same command already runs in the same session and folder
    /// (otherwise the reply is the running item, with `already_running`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_duplicate: bool,
    /// Fire a notice when the job has printed nothing for this many seconds (once per
    /// quiet spell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_after_s: Option<f64>,
    /// Stop the job (as the agent) once it has run this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime_s: Option<f64>,
    /// Names among `env` whose values are secrets (`--secret NAME`): refused when
    /// shorter than 4 bytes. Every `env` value of 8 bytes or more is masked too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Keep the unmasked output on disk as well (`output.raw.log`); readers still
    /// read the masked log.
    #[serde(default)]
    pub keep_raw_log: bool,
    /// Run it on a Slurm cluster (`--on slurm`) with these resources instead of on
    /// this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmArgs>,
    /// Run it on this ssh host (`--on ssh:HOST`) instead of on this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// Start it again, as the same item, when it fails (`--restart on-failure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicyArgs>,
    /// Start only once each of these holds (`--after ID[:COND]`, contract §14).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<after::After>,
}

/// A restart policy as a caller asks for it (`start --restart on-failure
/// [--max-restarts N] [--backoff MIN..MAX]`), checked by the daemon (contract §15).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct RestartPolicyArgs {
    /// The policy's name: `on-failure` (the only one).
    pub on: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// The back-off between an end and the next start, `MIN..MAX` (`1s..60s`),
    /// doubling from MIN up to MAX.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// Where an item with a restart policy is in it (contract §15).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct RestartView {
    pub policy: String,
    /// How often it was started again so far, and how often it may be.
    pub restarts: u32,
    pub max_restarts: u32,
    pub backoff: String,
    /// How the run before the latest start (or before the wait) ended. Each field is
    /// always there, null when there is nothing to say (as an item's `exit_code`).
    #[serde(default)]
    pub last_end: Option<End>,
    #[serde(default)]
    pub last_exit_code: Option<i32>,
    #[serde(default)]
    pub last_signal: Option<i32>,
    #[serde(default)]
    pub last_ended_at: Option<String>,
    /// While it waits out its back-off: when it starts again.
    #[serde(default)]
    pub next_attempt_at: Option<String>,
    /// Why the last attempt was not admitted (it is tried again at `next_attempt_at`).
    #[serde(default)]
    pub refused: Option<String>,
}

/// What a job run on Slurm asks of the cluster (each passed to `sbatch` as it is).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// A time limit in Slurm's words (`30`, `0:05`, `1:00:00`, `2-0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Memory in Slurm's words (`500M`, `4G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// More `sbatch` options, each one argument (`--constraint=a100`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch_args: Vec<String>,
}

/// `restart`: the item to start again, with the values of its `--env` variables
/// (never recorded) taken from `env`, else from the caller's environment.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct RestartArgs {
    pub id: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub inherit_env: Option<BTreeMap<String, String>>,
    /// `inherit_env` is a plain login environment, not a caller's own (the strip): no
    /// `--env` value is taken from it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain_env: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherit_env_bytes: Vec<[String; 2]>,
    #[serde(default)]
    pub window_ms: Option<u64>,
}

/// The reply of `restart`: the new item (as `start` gives it) and the one it repeats.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RestartReply {
    #[serde(flatten)]
    pub start: StartReply,
    pub restarted: String,
}

/// One process for its whole life: its pid, its start time (clock ticks after boot)
/// and the boot it belongs to (`/proc/sys/kernel/random/boot_id`), so that a pid used
/// again, or a reboot, never names it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProcessKey {
    pub pid: u32,
    pub started: u64,
    pub boot: String,
}

/// The reply of `new_session`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SessionReply {
    pub session: String,
}

/// A monitor: a durable wait (until a condition holds) or watch (every matching line).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct MonitorArgs {
    pub mode: MonitorMode,
    pub condition: Condition,
    /// Lines to match (`--until-output ID REGEX`, `watch --regex`).
    #[serde(default)]
    pub regex: Option<String>,
    /// A wait fails when its condition has not held after this many seconds.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    #[serde(default)]
    pub notify: bool,
    #[serde(default)]
    pub name: Option<String>,
    /// The caller's environment (never recorded): the values of the watched item's
    /// `--secret` and `--env` names as the caller holds them, so that a pattern or name
    /// that shows one is refused (contract §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherit_env: Option<BTreeMap<String, String>>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MonitorMode {
    Wait,
    Watch,
}

/// What a monitor watches.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Condition {
    /// A line of an item's output.
    Output { id: String },
    /// Something accepts connections on `address` (HOST:PORT).
    Port { address: String },
    /// The processes of item `id` listen on a TCP port, whatever it is.
    PortOf { id: String },
    /// The file exists (wait), or lines appended to it (watch).
    File { path: String },
    /// The item ended.
    End { id: String },
}

/// A foreground run with a deadline, promoted to the background past it.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct RunArgs {
    #[serde(flatten)]
    pub start: StartArgs,
    /// Seconds before promotion (default 60).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// `auto`: the deadline the command's history calls for (contract §13), instead
    /// of `timeout_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeoutMode>,
    /// Stream output as `{"chunk":…}` lines before the final reply.
    #[serde(default)]
    pub stream: bool,
    /// Send the [`RunStarted`] line first even when the output is not streamed (the
    /// CLI's `--json`: its note is said on stderr before the wait).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub announce: bool,
    /// The command's stdin: closed at once (the default), or the caller's own.
    #[serde(default)]
    pub stdin: RunStdin,
}

/// A deadline a `run` asks bgwork to choose.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutMode {
    /// From the command's history: background at once when it usually takes long,
    /// else up to 3× its usual time in the foreground, else the plain default.
    Auto,
}

/// What a foreground `run` gives the command as its stdin.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RunStdin {
    /// Closed at once: the command reads end-of-input (MCP, and any caller that sends
    /// nothing).
    #[default]
    Closed,
    /// The caller's stdin, sent as [`StdinFrame`] lines on the connection after the
    /// request, the last with `eof`. A promoted run keeps its stdin open for `send`.
    Forward,
}

/// The line a daemon writes on a promoted run's connection, after its reply, when the
/// job takes no more of the caller's stdin (it ended, or its input closed): the caller
/// has no rest to pass on, to this daemon or the next.
pub const STDIN_TAKEN_NO_MORE: &[u8] = b"{\"stdin\":\"taken no more\"}\n";

/// Input a daemon that shuts down gives back on a promoted run's connection, written
/// after its reply: what the caller sent that the job had not taken (the caller sends
/// it to the next daemon, first). One or more such lines, then the connection closes.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ReturnedStdin {
    /// The bytes, in base64.
    pub returned: String,
}

/// A piece of a `run` caller's stdin (after a `run` request with `"stdin":"forward"`).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct StdinFrame {
    /// The bytes, in base64.
    #[serde(default)]
    pub stdin: String,
    /// The caller's stdin ended after these bytes.
    #[serde(default)]
    pub eof: bool,
    /// The caller can no longer show the run's output (its stdout failed: a full disk)
    /// and asks that the run go on in the background now, as at its deadline; the text
    /// says why. A caller that does not forward its stdin may send this frame too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detach: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// Ended before the deadline.
    Ended,
    /// Still running at the deadline: now a background job.
    Promoted,
    /// Still running at the deadline with no room under the limit: killed.
    Killed,
}

/// The final reply of `run`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RunReply {
    pub outcome: RunOutcome,
    #[serde(flatten)]
    pub item: Item,
    /// The output not streamed yet (all of it when not streaming).
    pub output: String,
    pub message: String,
    /// With `timeout: auto`: which deadline history chose, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_choice: Option<String>,
}

/// One piece of streamed `run` output.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Chunk {
    /// Text (empty when `bytes` carries the output). Always present: it tells a
    /// chunk from the final reply.
    pub chunk: String,
    /// The output's exact bytes, base64-encoded: a streamed `run` passes them on as
    /// they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

/// What a streamed `run` says before its output: its job's id, and the deadline
/// `--timeout auto` chose and what happens at it (the reply's `timeout_choice` says it
/// again, in the past).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RunStarted {
    pub started: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ReadArgs {
    pub id: String,
    #[serde(default)]
    pub tail: Option<usize>,
    #[serde(default)]
    pub from: Option<u64>,
    #[serde(default)]
    pub all: bool,
    #[serde(default)]
    pub raw: bool,
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// A pane's visible screen, as text.
    #[serde(default)]
    pub screen: bool,
    /// Search the whole kept log for lines matching this regex (a [`GrepReply`]);
    /// the read cursor does not move.
    #[serde(default)]
    pub grep: Option<String>,
    /// With `grep`: lines of context shown before and after each match.
    #[serde(default)]
    pub context: Option<usize>,
    /// With `grep`: the most matches one reply carries.
    #[serde(default)]
    pub max_matches: Option<usize>,
    /// Show token shapes (`ghp_…`, `sk-…`) instead of masking them (for the person).
    #[serde(default)]
    pub no_redact: bool,
    /// Send the output after the reply's line, as its `output_bytes` bytes, instead of
    /// inside the JSON (`output`, or `output_base64` with `raw`): no escaping of the
    /// output on either side. A daemon that does not know this field ignores it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub output_frame: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct SendArgs {
    pub id: String,
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub keys: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct StopArgs {
    pub id: String,
    #[serde(default)]
    pub grace_s: Option<f64>,
    #[serde(default)]
    pub actor: Actor,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct WaitArgs {
    pub ids: Vec<String>,
    /// Wait for every item to end; the default is the first one.
    #[serde(default)]
    pub all: bool,
    #[serde(default)]
    pub until: Option<String>,
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// Who asked for a stop.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    #[default]
    Agent,
    Person,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Job,
    Pane,
    Monitor,
    SubAgent,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Starting,
    Running,
    Ended,
    /// Handed to a cluster's scheduler (Slurm), which has not started it yet.
    Queued,
    /// Its run failed and its restart policy starts it again after the back-off.
    Restarting,
    /// Started with `--after`: nothing runs until what it waits for holds (§14).
    Waiting,
}

/// How an item ended (contract §2). Exactly one per ended record.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum End {
    Succeeded,
    Failed,
    StoppedByAgent,
    StoppedByPerson,
    Signaled,
    Cancelled,
    SpawnFailed,
    Lost,
}

/// A work record as clients see it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Item {
    pub id: String,
    pub kind: Kind,
    pub state: State,
    pub end: Option<End>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub name: Option<String>,
    pub command: String,
    pub cwd: String,
    pub pid: Option<i32>,
    /// When it started running: null while it waits (`start --after`, contract §14).
    pub started_at: Option<String>,
    /// When the item was made (its `start`): its start, unless it waited first.
    pub created_at: String,
    pub ended_at: Option<String>,
    pub notify: bool,
    pub session: String,
    /// The one-line report of the end (contract §2), when ended.
    #[serde(default)]
    pub report: Option<String>,
    /// Names of the variables set with `--env` (never their values).
    #[serde(default)]
    pub env_names: Vec<String>,
    #[serde(default)]
    pub log_path: Option<String>,
    /// The item's folder (`jobs/N` of the home, numbered by its record's row, apart from
    /// its id): its log, status file and `job.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested: Option<bool>,
    /// Set in a stop's reply when the item had ended before the stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub already_ended: Option<bool>,
    /// Set in the reply of a stop or a close asked while the item's host cannot be
    /// reached: what was asked is kept and carried out when the host answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<String>,
    /// The detail of its end: why it was lost, what a monitor saw, what a stop had to
    /// do, Slurm's word (the JSON key is `lost_reason`, as it was first).
    #[serde(
        default,
        rename = "lost_reason",
        skip_serializing_if = "Option::is_none"
    )]
    pub end_detail: Option<String>,
    /// What its processes use and listen on.
    #[serde(flatten)]
    pub cost: Cost,
    /// Where it runs when not on this machine: `slurm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// The Slurm job id of an item run on Slurm (once submitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    /// Why Slurm has not started a queued item yet (`squeue`'s reason, e.g. `Resources`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_reason: Option<String>,
    /// What the run history says of an item not yet ended, in one line: "usually 41 s
    /// (5 runs; 2 of the last 5 failed)" (contract §13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// The median duration (ms) of its command's runs that ended by themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usual_ms: Option<u64>,
    /// A running item against its usual time: "running 1m20s, usually 41 s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// `--quiet-after` in seconds: the job fires a notice each quiet spell (armed or not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_after_s: Option<f64>,
    /// The ssh host a job runs on (`--on ssh:HOST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// While its host cannot be reached: since when, and ssh's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_unreachable: Option<String>,
    /// A job on an ssh host that will not outlive a logout there (systemd-logind's
    /// `KillUserProcesses=yes` with lingering off): why, and the fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout_warning: Option<String>,
    /// Its restart policy and where it is in it (`start --restart on-failure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartView>,
    /// A waiting item: what it waits for ("waiting for bg-3 to succeed", §14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

impl Item {
    /// Whether this item may still fire a notice: the one rule every client that asks
    /// "is anything coming?" uses (the rewake hook). Armed with `--notify` (a watch
    /// too), `--quiet-after` (its spells notify armed or not), a restart policy (it
    /// notifies when it gives up), a waiting item (it notifies when it is cancelled),
    /// and a job or pane with a usual time that listens on no port (it notifies when it
    /// runs long, contract §13).
    pub fn may_notify(&self) -> bool {
        self.state != State::Ended
            && (self.notify
                || self.quiet_after_s.is_some()
                || self.restart.is_some()
                || self.state == State::Waiting
                || (self.usual_ms.is_some()
                    && matches!(self.kind, Kind::Job | Kind::Pane)
                    && self.cost.listening.is_empty()))
    }

    /// What a live item is doing, in the words every reader uses: `waiting for bg-3
    /// to succeed`, `restarting (restart 2 of 5, next at …)`, or `still running`.
    /// None once it has ended.
    pub fn live_words(&self) -> Option<String> {
        live_words(
            self.state,
            self.waiting_for.as_deref(),
            self.restart.as_ref(),
        )
    }

    /// [`Item::live_words`] of an item that waits or restarts, and None for one that
    /// simply runs (or has ended).
    pub fn not_running_words(&self) -> Option<String> {
        matches!(self.state, State::Waiting | State::Restarting)
            .then(|| self.live_words())
            .flatten()
    }
}

/// How often an item with a restart policy was started again, in the one wording every
/// reader uses (`list`, `status`, `read`, `wait`, the strip): `restarted 1 of 5 times`.
pub fn restart_count(restarts: u32, max_restarts: u32) -> String {
    format!("restarted {restarts} of {max_restarts} times")
}

/// [`Item::live_words`] from the parts a reply carries.
pub fn live_words(
    state: State,
    waiting_for: Option<&str>,
    restart: Option<&RestartView>,
) -> Option<String> {
    Some(match state {
        State::Ended => return None,
        State::Waiting => waiting_for.unwrap_or("waiting").to_string(),
        State::Restarting => match restart {
            Some(restart) => {
                let mut words = format!(
                    "restarting ({}",
                    restart_count(restart.restarts, restart.max_restarts)
                );
                if let Some(at) = &restart.next_attempt_at {
                    words.push_str(&format!(", next at {at}"));
                }
                words.push(')');
                words
            }
            None => "restarting".to_string(),
        },
        _ => "still running".to_string(),
    })
}

/// What an item's processes use and listen on, each field left out when unknown or
/// empty (contract §10).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Cost {
    /// CPU time (user + system, ms) of every process of the job: so far while it runs,
    /// in total once it has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Resident memory of the job's whole process tree now (running items).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// The most resident memory the job's tree held (ended items).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// TCP addresses the job's processes listen on, e.g. `127.0.0.1:5173`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listening: Vec<String>,
}

impl Cost {
    /// The figures a record keeps: total CPU time and peak memory (of an ended job).
    pub fn recorded(cpu_ms: Option<u64>, peak_rss_bytes: Option<u64>) -> Cost {
        Cost {
            cpu_ms,
            peak_rss_bytes,
            ..Cost::default()
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct StartReply {
    #[serde(flatten)]
    pub item: Item,
    pub output: String,
    /// Set when no job was started: the same command already runs in the same session
    /// and folder, and `item` is that running one (`allow_duplicate` starts another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub already_running: Option<bool>,
}

/// The reply of `ui`: where the work strip is served.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct UiReply {
    /// The address with the token, to open once (it sets a cookie and drops the token).
    pub url: String,
    /// The address without the token.
    pub address: String,
    pub port: u16,
    /// The daemon served it already (this call started nothing).
    pub already_serving: bool,
    /// The port an earlier daemon of the home served it on, which was taken when this
    /// daemon started: the strip moved, with a new token (an open page must be reopened
    /// at `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<u16>,
}

/// `history`: the commands of a folder, the most recently run first.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct HistoryReply {
    pub cwd: String,
    /// The command asked for, as kept (absent when every command was asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    pub commands: Vec<CommandHistory>,
    /// Commands with runs in the folder past the most recent 200 listed here (ask for
    /// one by its command).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_commands: u64,
}

/// The kept runs of one command in a folder.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct CommandHistory {
    /// The command as kept: blanks collapsed, lines trimmed.
    pub command: String,
    /// Runs kept (the newest, at most 20).
    pub runs: usize,
    /// The median and p90 duration (ms) of the runs that ended by themselves
    /// (`succeeded` or `failed`); absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90_ms: Option<u64>,
    /// The one line a `start` reply shows.
    pub expected: String,
    /// The newest runs first.
    pub last: Vec<PastRun>,
}

/// One ended run of a command.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct PastRun {
    pub id: String,
    pub session: String,
    pub end: End,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Absent when unknown (a `lost` item).
    pub duration_ms: Option<u64>,
    pub started_at: String,
    pub ended_at: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ListReply {
    pub items: Vec<Item>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ReadReply {
    pub id: String,
    pub running: bool,
    /// While it has not ended, what it does when not simply running: `waiting for bg-3
    /// to succeed`, `restarting (restart 2 of 5, next at …)` ([`Item::live_words`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<String>,
    pub output: String,
    pub from: u64,
    pub to: u64,
    pub dropped_bytes: u64,
    pub clipped: bool,
    pub log_path: String,
    /// The item's folder, where its log lies (see [`Item::folder`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// The end's one-line report when the item has ended.
    #[serde(default)]
    pub report: Option<String>,
    /// With `raw`: the exact bytes, base64-encoded (JSON strings cannot hold any byte).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_base64: Option<String>,
    /// With `output_frame`: the output (text, or the exact bytes with `raw`) follows
    /// this line as this many bytes, and `output` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// What the item's processes use and listen on (as in [`Item`]).
    #[serde(flatten)]
    pub cost: Cost,
    /// While the host of a job on one cannot be reached (as in [`Item`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_unreachable: Option<String>,
}

/// `read --grep`: the lines of a log that match, with their context.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct GrepReply {
    pub id: String,
    pub running: bool,
    pub matches: Vec<GrepMatch>,
    /// More matches lie past the last one returned: search on from `next_from`.
    pub truncated: bool,
    /// Where a search that stopped early goes on (`--from`): the start of the first
    /// line it did not return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_from: Option<u64>,
    /// The byte range searched.
    pub from: u64,
    pub to: u64,
    /// Bytes of that range the log cap had dropped (not searched).
    pub dropped_bytes: u64,
    pub log_path: String,
    /// What to do when the reply stopped early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One line of a log as a search shows it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GrepLine {
    /// 1-based, counted from the start of the log; past the dropped middle it counts
    /// only the kept lines (the dropped middle as one line break), and `line_at_least`
    /// says so: the real line number is at least this.
    pub line: u64,
    /// The byte offset of the line's first byte (a line longer than 64 KiB is searched
    /// and shown in pieces of 64 KiB, each with its own offset).
    pub offset: u64,
    /// The line as `read` shows it (escapes stripped, bad UTF-8 replaced), clipped
    /// around the match past 2 KiB.
    pub text: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub line_at_least: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct GrepMatch {
    #[serde(flatten)]
    pub line: GrepLine,
    /// Context lines not already shown with an earlier match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<GrepLine>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<GrepLine>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    Ended,
    Matched,
    Timeout,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct WaitReply {
    pub reason: WaitReason,
    pub items: Vec<Item>,
    #[serde(rename = "match")]
    pub matched: Option<String>,
    /// The last lines of each item's output, by id.
    #[serde(default)]
    pub tails: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Notice {
    pub id: String,
    pub item: String,
    /// The end it reports; none for a watch's batch of matches.
    pub end: Option<End>,
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    pub text: String,
    pub tail: String,
    #[serde(default)]
    pub created_at: String,
    /// How many events the notice stands for (a watch's matches since the last one).
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NoticesReply {
    pub notices: Vec<Notice>,
    /// Notices still pending beyond a `limit` (not taken by this reply).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: u64,
    /// Why the `bind_harness` of the request did not bind (its notices were claimed
    /// all the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unbound: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct StatusReply {
    pub pid: u32,
    pub version: String,
    pub home: String,
    pub socket: String,
    pub running: u64,
    pub sessions: BTreeMap<String, u64>,
    /// Items waiting for other work (`start --after`), not counted in `running`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting: u64,
    /// CPU time (ms) and resident memory of every running item's processes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Items (`session/id`) that wait out a restart policy's back-off, with their count
    /// of restarts (`bg-3 restart 2 of 5`); among `running`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarting: Vec<String>,
    /// The ssh hosts of running work that cannot be reached now: since when, and
    /// ssh's words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts_unreachable: Vec<String>,
    /// The `BGWORK_*` settings of the daemon's environment it could not take as given,
    /// one sentence each (what was wrong, and what it uses instead).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings_refused: Vec<String>,
}

/// `status` when no daemon runs for the home (`status` never starts one).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NoDaemonReply {
    /// Always false.
    pub daemon: bool,
    pub home: String,
    pub socket: String,
    pub message: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct GcReply {
    pub removed: u64,
    pub freed_bytes: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Ack {
    pub ok: bool,
    pub message: String,
}

/// The error codes of contract §10.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    UnknownId,
    Limit,
    /// The command line is wrong whatever the items are (exit 2).
    BadRequest,
    /// The request does not apply to this item, of its kind or in its state (a running
    /// item dismissed, a monitor restarted, a job with no terminal resized): exit 1.
    Refused,
    SpawnFailed,
    NoInput,
    TooLarge,
    NotRunning,
    Unavailable,
    Internal,
}

#[derive(Serialize, Deserialize, Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }
    /// The request does not apply to the item it names (see [`ErrorCode::Refused`]).
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Refused, message)
    }
    pub fn unknown_id(id: &str) -> Self {
        Self::new(
            ErrorCode::UnknownId,
            format!("no item {id} in this session: `bgwork list --all` shows the ids it has"),
        )
    }
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::Internal, message.to_string())
    }
}

/// The id a mistyped one was meant to be: `bg4`, `BG-4`, `bg_4`, `bg 4` → `bg-4` (as for
/// `mon-` and `sub-`), and a bare number `4` → `bg-4`; none when it looks like no id.
pub fn id_meant(id: &str) -> Option<String> {
    let number = |text: &str| {
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        let plain = text.trim_start_matches('0');
        digits.then(|| if plain.is_empty() { "0" } else { plain }.to_string())
    };
    let id = id.trim();
    if let Some(n) = number(id) {
        return Some(format!("bg-{n}"));
    }
    let lower = id.to_ascii_lowercase();
    ["bg", "mon", "sub"].iter().find_map(|prefix| {
        let rest = lower.strip_prefix(prefix)?;
        let n = number(rest.trim_start_matches(['-', '_', ' ', '.', ':']))?;
        Some(format!("{prefix}-{n}"))
    })
}

/// The most seconds any `--timeout`, `--grace` or `notices --wait` takes (a day).
pub const MAX_SECONDS: f64 = 86_400.0;

/// Checks a number of seconds given as `flag` (`--timeout`, `--grace`, `--wait`): a
/// finite number from 0 to [`MAX_SECONDS`]. The one check of every such argument, in the
/// CLI (where NaN and infinity still exist: JSON turns them into `null`) and in the
/// daemon.
pub fn seconds(flag: &str, value: f64) -> Result<std::time::Duration, WireError> {
    if !(value.is_finite() && (0.0..=MAX_SECONDS).contains(&value)) {
        return Err(WireError::bad_request(format!(
            "{flag} takes a number of seconds from 0 to {MAX_SECONDS} (a day), not {value}"
        )));
    }
    // `-0.0` passes the range check; a Duration wants a positive zero.
    Ok(std::time::Duration::from_secs_f64(value.abs()))
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ErrorReply {
    pub error: WireError,
}

/// Encodes any reply object as one line (with the newline).
pub fn encode_line<T: Serialize>(value: &T) -> Vec<u8> {
    let mut line = Vec::with_capacity(4096);
    let encoded = serde_json::to_writer(&mut line, value);
    let mut line = encoded.map(|()| line).unwrap_or_else(|e| {
        serde_json::to_vec(&ErrorReply {
            error: WireError::internal(format!("reply could not be encoded: {e}")),
        })
        .expect("an error reply always encodes")
    });
    line.push(b'\n');
    line
}

/// Encodes a result: the object, or `{"error":…}`.
pub fn encode_result<T: Serialize>(result: &Result<T, WireError>) -> Vec<u8> {
    match result {
        Ok(value) => encode_line(value),
        Err(error) => encode_line(&ErrorReply {
            error: error.clone(),
        }),
    }
}

/// Decodes one reply line into the expected type, or the error it carries.
pub fn decode_reply<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, WireError> {
    // An error reply is `{"error":…}`: its key comes first, so a large reply is parsed
    // once, straight into its type.
    if line.starts_with(b"{\"error\"") {
        return Err(match serde_json::from_slice::<ErrorReply>(line) {
            Ok(reply) => reply.error,
            Err(e) => WireError::internal(format!("the daemon sent a malformed error: {e}")),
        });
    }
    serde_json::from_slice(line)
        .map_err(|e| WireError::internal(format!("the daemon sent an unexpected reply: {e}")))
}

/// Renders any wire value as pretty JSON (for `--json`).
pub fn to_json_text<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// The wire name of a unit enum value (`stopped_by_agent`, `running`, …).
pub fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}
