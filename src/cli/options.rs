//! The options that several commands share or that need a parser of their own: what
//! starts work (`JobCmd`, `StartCmd`, where it runs, its restart policy), monitors,
//! hooks, agents, `run`, `read` and `wait`, and the parsers of their durations.

use crate::wire;
use clap::{Args, Subcommand};

// (Not a doc comment: clap takes a flattened struct's doc as the command's about.)
// What every command that starts work takes: the command and where it runs.
#[derive(Args, Debug)]
pub struct JobCmd {
    /// Fire one notice when it ends (delivered by `notices`, MCP results and hooks)
    #[arg(long)]
    pub notify: bool,
    /// A name shown in lists and notices [default: the command]
    #[arg(long)]
    pub name: Option<String>,
    /// Working directory [default: the current one]
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Set a variable for the job; its name is recorded, its value never, and a value of
    /// 8 bytes or more is masked in its output as [secret K] (repeatable)
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<std::ffi::OsString>,
    /// A variable of your environment that holds a secret: the job gets it, and its
    /// value (and base64 / URL-encoded forms) is written as [secret NAME] in the log and
    /// every reply (repeatable; --env values of 8 bytes or more are masked too)
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Also keep the unmasked output on disk, in output.raw.log beside the log (a job
    /// with nothing to mask has only its log, unmasked)
    #[arg(long)]
    pub keep_raw_log: bool,
    /// The command: one argument is a shell line (bash -c), several an exact argv
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StartCmd {
    #[command(flatten)]
    pub job: JobCmd,
    /// Milliseconds to wait for first output; 0 answers at once [default: 1000]
    #[arg(long, value_name = "MS")]
    pub window: Option<u64>,
    /// Run on a pseudo-terminal (a pane): a screen, keystrokes, a size
    #[arg(long)]
    pub pty: bool,
    /// The pane's width in columns, 2 to 500 [default: 120]
    #[arg(long, requires = "pty")]
    pub cols: Option<u16>,
    /// The pane's height in rows, 2 to 200 [default: 40]
    #[arg(long, requires = "pty")]
    pub rows: Option<u16>,
    /// Start even when the same command already runs in this session and folder
    /// (otherwise the reply is the running item)
    #[arg(long)]
    pub allow_duplicate: bool,
    /// Fire a notice when the job has printed nothing for DURATION (once per quiet
    /// spell), saying whether it is busy, idle or waiting at a prompt
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    pub quiet_after: Option<f64>,
    /// Stop the job (as the agent) once it has run for DURATION
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    pub max_runtime: Option<f64>,
    /// Wait (state `waiting`) until ID ends succeeded, or COND holds: `ended`, `output
    /// RE` (a line of its output), `port` (it listens on one); repeatable, all required
    #[arg(long, value_name = "ID[:COND]")]
    pub after: Vec<String>,
    #[command(flatten)]
    pub on: OnCmd,
    #[command(flatten)]
    pub restart: RestartPolicyCmd,
}

// (Not a doc comment: clap takes a flattened struct's doc as the command's about.)
// A job's restart policy (`start --restart on-failure`).
#[derive(Args, Debug, Default)]
pub struct RestartPolicyCmd {
    /// Start the job again, as the same item, when it ends FAILED or killed by a
    /// signal from elsewhere (never after a stop, nor past --max-runtime); its one
    /// notice comes when it gives up
    #[arg(long, value_name = "POLICY", value_parser = ["on-failure"])]
    pub restart: Option<String>,
    /// With --restart: how often it is started again at most, 1 to 1000 [default: 5]
    #[arg(long, value_name = "N", requires = "restart")]
    pub max_restarts: Option<u32>,
    /// With --restart: the wait before each new start, MIN..MAX, doubling from MIN
    /// up to MAX [default: 1s..60s]
    #[arg(long, value_name = "MIN..MAX", requires = "restart")]
    pub backoff: Option<String>,
}

// (Not a doc comment: clap takes a flattened struct's doc as the command's about.)
// Where a job runs: this machine, or a Slurm cluster.
#[derive(Args, Debug, Default)]
pub struct OnCmd {
    /// Where it runs: `local` (this machine), `slurm` (submitted with sbatch; its
    /// folder must be on a filesystem the nodes share) or `ssh:HOST` (a host as ssh
    /// knows it; bgwork copies itself there) [default: $BGWORK_EXECUTOR, else local]
    #[arg(long, value_name = "EXECUTOR")]
    pub on: Option<String>,
    /// With --on slurm: the partition
    #[arg(long, value_name = "P")]
    pub partition: Option<String>,
    /// With --on slurm: the time limit, in Slurm's words (30, 0:05, 1:00:00, 2-0)
    #[arg(long, value_name = "T")]
    pub time: Option<String>,
    /// With --on slurm: CPUs for the job
    #[arg(long, value_name = "N")]
    pub cpus: Option<u32>,
    /// With --on slurm: memory, in Slurm's words (500M, 4G)
    #[arg(long, value_name = "M")]
    pub mem: Option<String>,
    /// With --on slurm: GPUs for the job
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// With --on slurm: nodes for the job (the command runs on the first; srun reaches
    /// the others)
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// With --on slurm: one more sbatch option, as one argument, e.g.
    /// --sbatch-arg=--constraint=a100 (repeatable)
    #[arg(long = "sbatch-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub sbatch_args: Vec<String>,
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum MonitorCmd {
    /// mon-N: one notice when the condition holds (or the timeout passes)
    #[command(after_help = "\
Examples:
  bgwork monitor wait --until-port localhost:8080 --timeout 120
  bgwork monitor wait --until-port --of bg-3 --timeout 60
  bgwork monitor wait --until-output bg-1 'Compiled successfully'
  bgwork monitor wait --until-file dist/app.js")]
    Wait {
        /// A line of ID's output matches REGEX
        #[arg(long, num_args = 2, value_names = ["ID", "REGEX"])]
        until_output: Option<Vec<String>>,
        /// Something accepts connections on HOST:PORT (or, with --of ID, ID's
        /// processes listen on a TCP port, whatever it is)
        #[arg(long, value_name = "HOST:PORT", num_args = 0..=1)]
        until_port: Option<Option<String>>,
        /// With --until-port: the item whose port is waited for
        #[arg(long, value_name = "ID", requires = "until_port")]
        of: Option<String>,
        /// The file exists
        #[arg(long, value_name = "PATH")]
        until_file: Option<String>,
        /// The item ended
        #[arg(long, value_name = "ID")]
        until_end: Option<String>,
        /// Fail when the condition has not held after S seconds [default: no limit]
        #[arg(long, value_name = "S", value_parser = seconds_arg)]
        timeout: Option<f64>,
        /// Fire no notice when the condition holds (a monitor notifies by default)
        #[arg(long)]
        no_notify: bool,
        /// Kept for older scripts: a monitor notifies anyway
        #[arg(long, hide = true, conflicts_with = "no_notify")]
        notify: bool,
        /// A name shown in lists and notices [default: the condition]
        #[arg(long)]
        name: Option<String>,
    },
    /// mon-N: every matching line goes to its log (`read mon-N`); notices in batches
    #[command(after_help = "\
Examples:
  bgwork monitor watch --output bg-1 --regex 'ERROR|panic'
  bgwork monitor watch --file /var/log/app.log --regex 5[0-9][0-9]")]
    Watch {
        /// Lines of ID's output
        #[arg(long, value_name = "ID")]
        output: Option<String>,
        /// Lines appended to PATH
        #[arg(long, value_name = "PATH")]
        file: Option<String>,
        /// Only lines matching REGEX [default: every line]
        #[arg(long)]
        regex: Option<String>,
        /// A name shown in lists and notices [default: the condition]
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum HookCmd {
    /// Claude Code: reads a hook event on stdin, prints pending notices as context
    #[command(after_help = "\
Example, in .claude/settings.json, as the hook of the events UserPromptSubmit,
PostToolUse, SessionStart and (with --wait-on-stop) Stop:
  {\"type\": \"command\", \"command\": \"bgwork hook claude-code\"}
With --rewake, as a Stop hook that runs in the background and wakes the idle agent
when armed work ends (stderr + exit 2):
  {\"type\": \"command\", \"command\": \"bgwork hook claude-code --rewake\",
   \"asyncRewake\": true, \"timeout\": 86400}
See docs/harnesses.md.")]
    ClaudeCode {
        /// On Stop, ask the agent to wait for work armed with --notify that still runs
        #[arg(long, conflicts_with = "rewake")]
        wait_on_stop: bool,
        /// Wait for the session's next notice, write it on stderr and exit 2 (a Stop
        /// hook with asyncRewake); exit 0 when nothing is armed or the wait runs out
        #[arg(long)]
        rewake: bool,
        /// With --rewake: the longest wait, in seconds (keep it under the hook's timeout)
        #[arg(
            long,
            value_name = "SECONDS",
            default_value_t = 43200.0,
            requires = "rewake"
        )]
        max_wait: f64,
    },
    /// Codex CLI: reads a hook event on stdin, prints pending notices as context
    #[command(after_help = "\
Example, in ~/.codex/hooks.json, as the hook of the events SessionStart,
UserPromptSubmit, PostToolUse and (with --wait-on-stop) Stop:
  {\"type\": \"command\", \"command\": \"bgwork hook codex\", \"timeout\": 10}
See docs/harnesses.md.")]
    Codex {
        /// On Stop, ask the agent to wait for work armed with --notify that still runs
        #[arg(long)]
        wait_on_stop: bool,
    },
    /// Gemini CLI: reads a hook event on stdin, prints pending notices as context
    #[command(after_help = "\
Example, in .gemini/settings.json, as the hook of the events SessionStart,
BeforeAgent, AfterTool and (with --wait-on-stop) AfterAgent:
  {\"type\": \"command\", \"command\": \"bgwork hook gemini\", \"timeout\": 10000}
See docs/harnesses.md.")]
    Gemini {
        /// On AfterAgent, ask the agent to wait for work armed with --notify that still runs
        #[arg(long)]
        wait_on_stop: bool,
    },
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum AgentCmd {
    /// sub-N: run a child agent; its work is filed under this session
    #[command(after_help = "\
The child gets BGWORK_SESSION=SESSION/sub-N (its own work is filed there, visible to the
parent) and BGWORK_REPORT, a file whose text comes back as the notice of its end.

Example:
  bgwork agent start --name review -- claude -p 'review the diff; write to $BGWORK_REPORT'")]
    Start(JobCmd),
}

#[derive(Args, Debug)]
pub struct RunCmd {
    /// Seconds in the foreground before moving to the background [default: 60]; `auto`:
    /// from the command's history here (background at once when it usually takes longer
    /// than 15 s, else wait up to 3 times its usual time)
    #[arg(long, value_name = "S|auto", value_parser = timeout_arg)]
    pub timeout: Option<TimeoutArg>,
    /// Where it runs: `local` (this machine) or `ssh:HOST` (a host as ssh knows it;
    /// its output streams here as it comes) [default: local, whatever $BGWORK_EXECUTOR
    /// says]
    #[arg(long, value_name = "EXECUTOR")]
    pub on: Option<String>,
    #[command(flatten)]
    pub job: JobCmd,
}

#[derive(Args, Debug)]
pub struct ReadCmd {
    /// The item to read (a job, pane, monitor or sub-agent)
    pub id: String,
    /// The last N lines (does not move the read cursor)
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// From this byte offset (does not move the read cursor)
    #[arg(long, value_name = "BYTE")]
    pub from: Option<u64>,
    /// The whole output (does not move the read cursor)
    #[arg(long)]
    pub all: bool,
    /// The exact bytes, escapes and all, but secrets and token shapes masked in what
    /// the bytes show (also when escapes, NULs, \r, backspaces or cursor moves within a
    /// line split them); not masked: a value put together only by vertical cursor moves
    /// on a pane's screen
    #[arg(long)]
    pub raw: bool,
    /// Clip the reply to about this many bytes, head and tail kept [default: 32768; with
    /// --grep, the text of the matches: 1048576]
    #[arg(long, value_name = "N")]
    pub max_bytes: Option<usize>,
    /// A pane's visible screen, as text
    #[arg(long)]
    pub screen: bool,
    /// Show token shapes (sk-..., ghp_..., AKIA..., xoxb-..., private keys) instead of masking
    /// them; values given with --env/--secret are masked in the log itself
    #[arg(long)]
    pub no_redact: bool,
    /// Keep printing new output until the item ends, then exit with its end's code
    #[arg(long, short, conflicts_with_all = ["tail", "from", "all", "screen", "raw"])]
    pub follow: bool,
    /// Search the whole kept log for lines matching REGEX: prints LINE:BYTE:TEXT for
    /// each (does not move the read cursor)
    #[arg(long, value_name = "REGEX", conflicts_with_all = ["tail", "all", "screen", "raw", "follow"])]
    pub grep: Option<String>,
    /// With --grep: N lines of context before and after each match (printed LINE-BYTE-TEXT)
    #[arg(long, short = 'C', value_name = "N", requires = "grep")]
    pub context: Option<usize>,
    /// With --grep: at most N matches in the reply [default: 1000]
    #[arg(long, value_name = "N", requires = "grep")]
    pub max_matches: Option<usize>,
}

#[derive(Args, Debug)]
pub struct WaitCmd {
    /// The items to wait for
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// Return when the first item ends (the default)
    #[arg(long, conflicts_with = "all")]
    pub any: bool,
    /// Return when every item has ended
    #[arg(long)]
    pub all: bool,
    /// Return when a new line of output matches REGEX
    #[arg(long, value_name = "REGEX")]
    pub until: Option<String>,
    /// Seconds to wait at most (90, 1.5, 5m, 2h), or `none` [default: 50]
    #[arg(long, value_name = "S", value_parser = parse_timeout)]
    pub timeout: Option<Timeout>,
    /// Print nothing: the exit code says it (0 ended well or matched, 1 otherwise)
    #[arg(long, short)]
    pub quiet: bool,
}

/// `wait --timeout`: seconds, or no limit.
#[derive(Clone, Copy, Debug)]
pub enum Timeout {
    Seconds(f64),
    Unlimited,
}

pub(super) fn parse_timeout(text: &str) -> Result<Timeout, String> {
    match text {
        "none" | "never" => Ok(Timeout::Unlimited),
        _ => parse_duration(text).map(Timeout::Seconds),
    }
}

/// Seconds as a number (`90`, `1.5`) or a duration (`30m`, `2h`, `1h 30m`).
pub(super) fn parse_duration(text: &str) -> Result<f64, String> {
    if text.trim().parse::<f64>().is_ok() {
        return seconds_arg(text);
    }
    let seconds = humantime::parse_duration(text.trim())
        .map(|d| d.as_secs_f64())
        .map_err(|_| {
            format!("{text:?} is not a duration: give seconds (90, 1.5) or 30m, 2h, 3d")
        })?;
    wire::seconds("it", seconds).map_err(|e| e.message.replacen("it ", "", 1))?;
    Ok(seconds)
}

/// A job's span (`--quiet-after`, `--max-runtime`): a duration as [`parse_duration`]
/// reads it, whose range the daemon checks (they go past the day of a `--timeout`).
pub(super) fn parse_span(text: &str) -> Result<f64, String> {
    let seconds = match text.trim().parse::<f64>() {
        Ok(seconds) => seconds,
        Err(_) => humantime::parse_duration(text.trim())
            .map(|d| d.as_secs_f64())
            .map_err(|_| {
                format!("{text:?} is not a duration: give seconds (90, 1.5) or 30m, 2h, 3d")
            })?,
    };
    match seconds.is_finite() && seconds >= 0.0 {
        true => Ok(seconds),
        false => Err(format!(
            "{text:?} is not a duration: give seconds (90, 1.5) or 30m, 2h, 3d"
        )),
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ActorArg {
    Agent,
    Person,
}

/// A number of seconds (`--timeout`, `--grace`, `--wait`), checked as the daemon checks
/// it; NaN and infinity are refused here, before JSON could turn them into `null`.
/// `run --timeout`: seconds, or `auto`.
#[derive(Debug, Clone, Copy)]
pub enum TimeoutArg {
    Seconds(f64),
    Auto,
}

pub(super) fn timeout_arg(text: &str) -> Result<TimeoutArg, String> {
    match text.trim() {
        "auto" => Ok(TimeoutArg::Auto),
        _ => seconds_arg(text)
            .map(TimeoutArg::Seconds)
            .map_err(|e| format!("{e} (or `auto`: from the command's history)")),
    }
}

pub(super) fn seconds_arg(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("takes a number of seconds, e.g. 30 or 0.5, not {text:?}"))?;
    wire::seconds("it", value).map_err(|e| e.message.replacen("it ", "", 1))?;
    Ok(value)
}
