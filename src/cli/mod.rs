//! The command line: clap definitions, turning each command into one request, and
//! printing the reply as text or `--json`. It holds no logic the daemon owns.

mod demo;
pub(crate) mod follow;
mod notices;
mod render;
mod shell;

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::{self, Actor, Envelope, ErrorCode, Request, WireError};
use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;
use std::process::ExitCode;

const ENVIRONMENT: &str = "\
Environment:
  BGWORK_HOME               where the daemon keeps its socket, database and logs
                            (default $XDG_DATA_HOME/bgwork, i.e. ~/.local/share/bgwork)
  BGWORK_SESSION            the session that owns the work (as --session; default `default`)
  BGWORK_ANSWER_TIMEOUT_MS  how long the CLI waits for the daemon to answer (default 30000)
  BGWORK_MAX_RUNNING        running jobs, panes and monitors per session (default 10)
  BGWORK_MAX_RUNNING_TOTAL  running items of all sessions together (default 64; 0: no cap)
  BGWORK_MAX_STARTS_PER_MINUTE  starts per session in any minute (default 60; 0: no guard)
  BGWORK_LOG_CAP            bytes of output kept per job (default 268435456: 256 MiB)
  BGWORK_LOG_HEAD           bytes kept from the start of a capped log (default 1048576)
  BGWORK_RETAIN_S           seconds ended records are kept before gc (default 86400)
  BGWORK_GC_TOTAL_BYTES     log bytes of ended records gc keeps (default 1073741824)
  BGWORK_LINGER_MS          grace for leftover processes of an ended job (default 2000)
  BGWORK_CGROUPS            0: no cgroup per job (default: one where the kernel allows)
  BGWORK_PORTS              0: list and read do not look for the ports jobs listen on
  BGWORK_MCP_PROGRESS_MS    how often `bgwork mcp` reports progress of a long call (default 5000)
The BGWORK_* limits are read by the daemon when it starts.
Every job receives BGWORK_SESSION (its session) and BGWORK_ITEM (its id).

Exit codes: 0 success; 1 the item or the call failed; 2 usage error; 3 `status` found no
daemon; `run` exits with the command's own status when it ended in time.

Examples:
  bgwork start --notify -- make test      run in the background, hear when it ends
  bgwork read bg-1                        what it wrote since the last read
  bgwork wait bg-1 --until 'listening'    block until a line matches (or it ends)
  bgwork list --all-sessions              every session's work";

#[derive(Parser, Debug)]
#[command(
    name = "bgwork",
    version,
    about = "Background work for AI agents: start now, read later, hear when it ends",
    long_about = None,
    after_help = ENVIRONMENT
)]
pub struct Cli {
    /// The session that owns the work: one agent conversation [default: default; `bgwork
    /// mcp` names its own]
    #[arg(
        long,
        global = true,
        env = "BGWORK_SESSION",
        hide_env_values = true,
        value_name = "NAME"
    )]
    pub session: Option<String>,
    /// Print the reply as JSON (the objects of the socket API)
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Commands,
}

// `defer`: each subcommand's arguments are built only when it is invoked (or its help,
// the manual or a completion script is asked for), not on every call.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum Commands {
    /// Run COMMAND in the background: prints its id at once, then its first output
    #[command(after_help = "\
One argument after `--` is a shell command line (run by bash -c); several are the exact
arguments of a program (each quoted for the shell, so the job gets them as given).

Examples:
  bgwork start -- 'npm run dev'                  a shell line (pipes, globs, $VARS)
  bgwork start --notify --name tests -- cargo test --workspace
  bgwork start --pty --cols 100 -- python3       a pane: keystrokes and a screen
  bgwork start --secret API_TOKEN -- ./deploy.sh its output shows [secret API_TOKEN]
  bgwork start --restart on-failure -- 'npm run dev'  started again if it crashes
  bgwork start --after bg-1 -- ./deploy.sh       once bg-1 succeeded (waiting until then)
  bgwork start --after 'bg-2:output listening' -- npm test")]
    Start(Box<StartCmd>),
    /// Run COMMAND in the foreground with a deadline; past it, it moves to the background
    #[command(after_help = "\
Output streams as it comes. Ended in time: exits with the command's own status. Still
running at the deadline: promoted to a background job (its id is printed, and a notice
comes when it ends), or killed when the session has no room under its limit. Ctrl-C
stops it.

`--timeout auto` chooses from the command's history in this folder (`bgwork history`):
background at once (its notice armed) when it usually takes longer than 15 s
(BGWORK_AUTO_BACKGROUND_S), else wait up to 3 times its usual time; the plain 60 s without
history. It says which it chose and why.

Examples:
  bgwork run -- cargo build
  bgwork run --timeout auto -- cargo test
  bgwork run --timeout 300 -- ./migrate.sh
  bgwork run --on ssh:gpu-box -- nvidia-smi")]
    Run(RunCmd),
    /// List the session's running work, one line per item (--all adds ended records)
    #[command(after_help = "\
Each line: id, state (an ended one with its exit code), age, pid and command.

Examples:
  bgwork list
  bgwork list --all --json
  bgwork list --all-sessions")]
    List {
        /// Ended records too (until dismissed or collected; kept 24 h by default)
        #[arg(long)]
        all: bool,
        /// Every session's work, grouped by session, sub-agents under their parent
        #[arg(long)]
        all_sessions: bool,
    },
    /// Read ID's output written since this session's last read of it (never blocks)
    #[command(after_help = "\
Escape sequences are stripped and invalid UTF-8 replaced unless --raw. Large output is
clipped head and tail, with a line that names the full log file.

Examples:
  bgwork read bg-1
  bgwork read bg-1 --tail 50
  bgwork read bg-1 --follow               like tail -f, until it ends
  bgwork read bg-1 --grep 'error|panic' -C 2
  bgwork read bg-2 --screen              a pane's visible screen")]
    Read(ReadCmd),
    /// Write input to a job's stdin or keystrokes to a pane
    #[command(after_help = "\
Examples:
  bgwork send bg-2 'print(1+1)\\n'
  bgwork send bg-2 --key C-c
  bgwork send bg-2 ':wq' --key Enter")]
    Send {
        /// The job or pane
        id: String,
        /// Text to write; \n, \t and \xHH are understood [default: none]
        text: Option<String>,
        /// A named key to send after the text: C-c, C-d, Enter, Tab, Esc, Up, Down, Left,
        /// Right, ... (repeatable)
        #[arg(long = "key", value_name = "KEY")]
        keys: Vec<String>,
    },
    /// Stop ID: TERM to its whole process tree, KILL after the grace
    #[command(after_help = "\
Waits until the item is gone (at most the grace + 2 s) and prints its end. A stop is not a
failure: it exits 0, also for an item that had already ended (and says so).

Examples:
  bgwork stop bg-1
  bgwork stop bg-1 --grace 0             KILL at once")]
    Stop {
        /// The item to stop (a job, pane, monitor or sub-agent)
        id: String,
        /// Seconds between TERM and KILL [default: 5]
        #[arg(long, value_name = "S", value_parser = seconds_arg)]
        grace: Option<f64>,
        /// Who stops it: the end reads `stopped_by_agent` or `stopped_by_person` (a
        /// person's stop fires a notice: the agent did not see this reply)
        #[arg(long = "as", value_enum, default_value = "agent")]
        actor: ActorArg,
    },
    /// Block until items end, a pattern appears in new output, or the timeout passes
    #[command(after_help = "\
Exits 0 when the item(s) ended well or the pattern matched; 1 on a timeout or a failed end.

Examples:
  bgwork wait bg-1
  bgwork wait bg-1 --until 'Listening on' --timeout 120
  bgwork wait bg-1 bg-2 --all --timeout none --quiet")]
    Wait(WaitCmd),
    /// Pending exit notices of the session, each delivered once
    #[command(after_help = "\
Examples:
  bgwork notices
  bgwork notices --peek
  bgwork notices --follow --json          one notice per line, as each arrives")]
    Notices {
        /// Show without marking them delivered
        #[arg(long)]
        peek: bool,
        /// Stream notices as they are created (until interrupted)
        #[arg(long)]
        follow: bool,
        /// When none is pending, wait up to S seconds for the first one [default: 0]
        #[arg(long, value_name = "S", conflicts_with = "follow", value_parser = seconds_arg)]
        wait: Option<f64>,
    },
    /// Monitors: wait until a condition holds, or watch for matching lines
    #[command(subcommand)]
    Monitor(MonitorCmd),
    /// Sub-agents: child agents whose report comes back as a notice
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Resize a pane's terminal
    #[command(after_help = "\
Example:
  bgwork resize bg-2 --cols 160 --rows 50")]
    Resize {
        /// The pane
        id: String,
        /// New width in columns (2 to 1000)
        #[arg(long)]
        cols: u16,
        /// New height in rows (2 to 1000)
        #[arg(long)]
        rows: u16,
    },
    /// Drop ended records from lists (they stay on disk until gc)
    #[command(after_help = "\
Example:
  bgwork dismiss bg-1 bg-2 mon-1")]
    Dismiss {
        /// The ended items to drop (all or none: a running one is refused)
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
    /// Delete ended records and their logs: older than the retention, then by total size
    #[command(after_help = "\
A record whose notice has not been delivered is never deleted.

Examples:
  bgwork gc
  bgwork gc --older-than 2h
  bgwork gc --all-ended")]
    Gc {
        /// Delete ended records older than this (e.g. 30m, 2h, 3d) [default: the
        /// retention, BGWORK_RETAIN_S, 24 h]
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "all_ended")]
        older_than: Option<f64>,
        /// Delete every ended record, whatever its age
        #[arg(long)]
        all_ended: bool,
    },
    /// Start an item again: same command, folder, name, --env names and options
    #[command(after_help = "\
The old record keeps its end; a running item is stopped first. --env values are never
recorded: they come from --env here, else from your environment.

Examples:
  bgwork restart bg-3
  bgwork restart bg-3 --env TOKEN=$TOKEN")]
    Restart {
        /// The item to start again
        id: String,
        /// A value for a variable the item was started with (repeatable)
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<std::ffi::OsString>,
        /// Milliseconds to wait for first output [default: 1000]
        #[arg(long, value_name = "MS")]
        window: Option<u64>,
    },
    /// Run the daemon (the CLI starts it on demand)
    #[command(after_help = "\
Example:
  BGWORK_HOME=/tmp/bgw bgwork daemon --foreground")]
    Daemon {
        /// Stay attached to the terminal (the daemon never forks itself anyway)
        #[arg(long)]
        foreground: bool,
        /// Serve the work strip at start, on 127.0.0.1:PORT (or PORT; 0 for a free one)
        #[arg(long, value_name = "ADDR", value_parser = crate::http::parse_addr)]
        http: Option<u16>,
    },
    /// Open the work strip: a web page of every session's work, live, with Stop
    #[command(after_help = "\
Makes sure the daemon serves the page on loopback (127.0.0.1) and prints its address
with the token that every request needs (kept in $BGWORK_HOME/http.token). The first
load turns the token into a cookie. With a display, the page is opened with xdg-open.

Examples:
  bgwork ui
  bgwork ui --port 8750 --no-open")]
    Ui {
        /// The port to serve on [default: the one served before, else a free one]
        #[arg(long)]
        port: Option<u16>,
        /// Print the address only; do not open a browser
        #[arg(long)]
        no_open: bool,
    },
    /// Close a pane as closing its terminal window does: it ends `cancelled`
    #[command(after_help = "\
Its processes are hung up (SIGHUP); one that ignores the hang-up runs on: `bgwork stop`.

Example:
  bgwork close bg-2")]
    Close {
        /// The pane to close
        id: String,
    },
    /// How long commands took in this folder: median, p90 and the last ends of each
    #[command(after_help = "\
Every job or pane that ended is kept under its folder and its command (blanks collapsed,
lines trimmed; the newest 20 runs of each, at most 20,000 in all), across daemon restarts
and `gc`. The median and p90 count the runs that ended by themselves (succeeded or
failed); `start`, `list` and `run --timeout auto` use them.

Examples:
  bgwork history                        every command run in this folder
  bgwork history -- cargo test          that command's runs
  bgwork history --cwd ~/proj --json")]
    History {
        /// The folder [default: the current one]
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// The command (after `--`; one argument is a shell line, several are quoted as
        /// `start` quotes them) [default: every command of the folder]
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// The daemon's pid, version, home, socket and running work per session
    #[command(after_help = "\
Never starts a daemon: with none running it says so and exits 3.

Example:
  bgwork status --json")]
    Status,
    /// An MCP server on stdio exposing the same calls as tools
    #[command(after_help = "\
Its session is --session or BGWORK_SESSION when set; otherwise its harness's: the session
the harness's hooks speak for, else one of its own, named after the client and the folder
(e.g. claude-code@myproject), which `bgwork list --all-sessions` shows and which a server
the same harness starts again takes over.

Example (Claude Code):
  claude mcp add bgwork -- bgwork mcp")]
    Mcp,
    /// Turn-boundary hooks of agent harnesses
    #[command(subcommand)]
    Hook(HookCmd),
    /// Stop the daemon; running work goes on unless --stop-work
    #[command(after_help = "\
Example:
  bgwork shutdown --stop-work")]
    Shutdown {
        /// Stop every running item first (TERM, KILL after 5 s)
        #[arg(long)]
        stop_work: bool,
    },
    /// Print a shell completion script
    #[command(after_help = "\
Examples:
  bgwork completions bash > ~/.local/share/bash-completion/completions/bgwork
  bgwork completions zsh > ~/.zfunc/_bgwork
  bgwork completions fish > ~/.config/fish/completions/bgwork.fish")]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff)
    #[command(after_help = "\
Example:
  bgwork man > ~/.local/share/man/man1/bgwork.1")]
    Man,
    /// A short guided run of start, read, wait, notices and stop on real jobs
    Demo,
    /// The relay to this host's daemon (started over ssh by a daemon elsewhere)
    #[command(hide = true)]
    SshRelay,
    /// The keeper of a waiting item's start arguments (started by the daemon)
    #[command(hide = true)]
    Keep {
        /// The waiting item's folder
        dir: std::path::PathBuf,
    },
    /// The per-job supervisor (started by the daemon)
    #[command(hide = true)]
    Supervise {
        /// The job's spec in a file (a job started by Slurm) instead of on stdin
        #[arg(long, value_name = "PATH")]
        spec_file: Option<std::path::PathBuf>,
    },
}

/// What every command that starts work takes: the command and where it runs.
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

/// A job's restart policy (`start --restart on-failure`).
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

/// Where a job runs: this machine, or a Slurm cluster.
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

fn parse_timeout(text: &str) -> Result<Timeout, String> {
    match text {
        "none" | "never" => Ok(Timeout::Unlimited),
        _ => parse_duration(text).map(Timeout::Seconds),
    }
}

/// Seconds as a number (`90`, `1.5`) or a duration (`30m`, `2h`, `1h 30m`).
fn parse_duration(text: &str) -> Result<f64, String> {
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
fn parse_span(text: &str) -> Result<f64, String> {
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

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    execute(cli)
}

/// A command line clap refused: a start whose command came without `--` gets the line
/// that works; anything else clap's own message.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let missing_dashes = matches!(
        error.kind(),
        ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument
    );
    if let Some((line, sub)) = missing_dashes.then(|| with_dashes(&args)).flatten() {
        eprintln!(
            "error: the command to run goes after `--` (bgwork's options come before it):\n\n  \
             {line}\n\nFor more, try 'bgwork {sub} --help'."
        );
        return ExitCode::from(2);
    }
    let _ = error.print();
    // To every harness a hook's exit 2 means "block" (or, from a rewake hook, "wake the
    // model with stderr"): a hook's bad command line is an error for the person (1).
    let is_hook = args.iter().take_while(|a| *a != "--").any(|a| a == "hook");
    let code = match () {
        _ if !error.use_stderr() => 0,
        _ if is_hook => 1,
        _ => 2,
    };
    ExitCode::from(code)
}

/// `bgwork start echo hi` as `bgwork start -- echo hi`: `--` goes before the first
/// word that is neither an option nor an option's value. None when the line is not a
/// start, run or agent start, or already has `--`.
fn with_dashes(args: &[String]) -> Option<(String, String)> {
    const TAKES_VALUE: &[&str] = &[
        "--session",
        "--name",
        "--cwd",
        "--env",
        "--window",
        "--cols",
        "--rows",
        "--timeout",
    ];
    const FLAGS: &[&str] = &["--json", "--notify", "--pty", "-h", "--help"];
    if args.iter().any(|a| a == "--") {
        return None;
    }
    let mut words = Vec::new();
    let mut expecting_value = false;
    let mut starts = false;
    for (index, arg) in args.iter().enumerate() {
        let is_option = arg.starts_with('-') && arg.len() > 1;
        if expecting_value {
            expecting_value = false;
        } else if is_option {
            // A misspelt option is the real mistake: clap says so, not this.
            let name = arg.split('=').next().unwrap_or(arg);
            if !TAKES_VALUE.contains(&name) && !FLAGS.contains(&name) {
                return None;
            }
            expecting_value = TAKES_VALUE.contains(&arg.as_str());
        } else if !starts {
            words.push(arg.as_str());
            let sub = words.join(" ");
            starts = matches!(sub.as_str(), "start" | "run" | "agent start" | "history");
            if !starts && !matches!(sub.as_str(), "agent") {
                return None;
            }
        } else {
            let mut line = vec!["bgwork".to_string()];
            line.extend(args[..index].iter().map(|a| shell::quote(a)));
            line.push("--".into());
            line.extend(args[index..].iter().map(|a| shell::quote(a)));
            return Some((line.join(" "), words.join(" ")));
        }
    }
    None
}

/// Runs one parsed command; returns the process's exit code.
pub fn execute(cli: Cli) -> ExitCode {
    let json = cli.json;
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            if json {
                println!(
                    "{}",
                    wire::to_json_text(&wire::ErrorReply {
                        error: error.clone()
                    })
                );
            } else {
                eprintln!("bgwork: {}", render::inert_lines(&error.message));
            }
            match error.code {
                ErrorCode::BadRequest => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, WireError> {
    let paths = Paths::from_env();
    let json = cli.json;
    // An empty BGWORK_SESSION is no session: the default one.
    let session = cli
        .session
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let request = match cli.command {
        Commands::Daemon { http, .. } => return Ok(run_daemon(http)),
        Commands::Ui { port, no_open } => return ui(&paths, &session, port, no_open, json),
        Commands::Close { id } => Request::Close { id },
        Commands::Supervise { spec_file } => match spec_file {
            // A job started from a spec file (by Slurm) takes its commands from its folder.
            Some(spec_file) => crate::executor::slurm::supervise(spec_file),
            None => crate::supervisor::run(crate::supervisor::Launch::Socket),
        },
        Commands::Keep { dir } => return Ok(crate::keeper::main(&dir)),
        Commands::Demo => return demo::run(),
        Commands::SshRelay => return Ok(crate::executor::ssh::relay::main()),
        Commands::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            // `generate` builds every (deferred) subcommand first.
            clap_complete::generate(shell, &mut command, "bgwork", &mut std::io::stdout());
            return Ok(ExitCode::SUCCESS);
        }
        Commands::Man => return man_page(),
        Commands::Mcp => {
            return crate::mcp::main(cli.session)
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| WireError::internal(format!("the MCP server stopped: {e}")))
        }
        Commands::Hook(HookCmd::ClaudeCode {
            rewake: true,
            max_wait,
            ..
        }) => {
            // Not a usage error (exit 2 would wake the model with it): exit 1.
            return Ok(match wire::seconds("--max-wait", max_wait) {
                Ok(max_wait) => crate::hook::rewake(&paths, max_wait),
                Err(e) => {
                    crate::note!("bgwork hook --rewake: {}", e.message);
                    ExitCode::FAILURE
                }
            });
        }
        Commands::Hook(hook) => {
            use crate::hook::Harness;
            let (harness, wait_on_stop) = match hook {
                HookCmd::ClaudeCode { wait_on_stop, .. } => (Harness::ClaudeCode, wait_on_stop),
                HookCmd::Codex { wait_on_stop } => (Harness::Codex, wait_on_stop),
                HookCmd::Gemini { wait_on_stop } => (Harness::Gemini, wait_on_stop),
            };
            return Ok(crate::hook::run(&paths, harness, wait_on_stop));
        }
        Commands::Start(start) => Request::Start(start_args(*start)?),
        Commands::List { all, all_sessions } => Request::List { all, all_sessions },
        Commands::Read(read) if read.follow => {
            return render::follow_output(
                &paths,
                &session,
                &read.id,
                read.max_bytes,
                read.no_redact,
                json,
            )
        }
        Commands::Read(read) => Request::Read(wire::ReadArgs {
            id: read.id,
            tail: read.tail,
            from: read.from,
            all: read.all,
            raw: read.raw,
            max_bytes: read.max_bytes,
            screen: read.screen,
            grep: read.grep,
            context: read.context,
            max_matches: read.max_matches,
            no_redact: read.no_redact,
            // The output comes after the reply's line, unescaped, unless the reply is
            // printed as JSON.
            output_frame: !json,
        }),
        Commands::Send { id, text, keys } => Request::Send(wire::SendArgs {
            id,
            text: text.unwrap_or_default(),
            keys,
        }),
        Commands::Stop { id, grace, actor } => Request::Stop(wire::StopArgs {
            id,
            grace_s: grace,
            actor: match actor {
                ActorArg::Agent => Actor::Agent,
                ActorArg::Person => Actor::Person,
            },
        }),
        Commands::Wait(wait) => {
            return render::wait(&paths, &session, wait, json);
        }
        Commands::Notices { peek, follow, wait } => Request::Notices {
            peek,
            follow,
            wait_s: wait,
            // A pull acknowledges what it could print (see `notices::pull_notices`).
            ack: !peek && !follow,
            limit: None,
            bind_harness: None,
        },
        Commands::Dismiss { ids } => Request::Dismiss { id: None, ids },
        Commands::Restart { id, env, window } => {
            let caller = crate::environ::CallerEnv::of_this_process();
            Request::Restart(wire::RestartArgs {
                id,
                env: env_pairs(&env)?,
                inherit_env: Some(caller.text),
                inherit_env_bytes: caller.bytes,
                window_ms: window,
            })
        }
        Commands::Resize { id, cols, rows } => Request::Resize { id, cols, rows },
        Commands::Monitor(monitor) => Request::Monitor(monitor_args(monitor)?),
        Commands::Agent(AgentCmd::Start(job)) => Request::AgentStart(start_args(StartCmd {
            job,
            window: Some(0),
            pty: false,
            cols: None,
            rows: None,
            allow_duplicate: true,
            quiet_after: None,
            max_runtime: None,
            after: Vec::new(),
            on: OnCmd::local(),
            restart: RestartPolicyCmd::default(),
        })?),
        Commands::Run(run) => Request::Run(wire::RunArgs {
            start: start_args(StartCmd {
                job: run.job,
                window: None,
                pty: false,
                cols: None,
                rows: None,
                allow_duplicate: true,
                quiet_after: None,
                max_runtime: None,
                after: Vec::new(),
                on: match run.on {
                    Some(on) => OnCmd {
                        on: Some(on),
                        ..OnCmd::default()
                    },
                    None => OnCmd::local(),
                },
                restart: RestartPolicyCmd::default(),
            })?,
            timeout_s: match run.timeout {
                Some(TimeoutArg::Seconds(s)) => Some(s),
                _ => None,
            },
            timeout: matches!(run.timeout, Some(TimeoutArg::Auto))
                .then_some(wire::TimeoutMode::Auto),
            stream: !json,
            // As a shell does: the command reads this process's stdin.
            stdin: wire::RunStdin::Forward,
        }),
        Commands::History { cwd, command } => Request::History {
            cwd: crate::paths::resolve(cwd.as_deref().unwrap_or("."), "--cwd")?,
            command: (!command.is_empty()).then(|| shell::command_line(&command)),
        },
        Commands::Gc {
            older_than,
            all_ended,
        } => Request::Gc {
            older_than_s: older_than,
            all_ended,
        },
        Commands::Status => {
            // `status` looks; it never starts a daemon (a stuck one is there all the same).
            if let Err(e) = Client::connect_existing(&paths) {
                if e.kind() != std::io::ErrorKind::TimedOut {
                    return Ok(render::no_daemon(&paths, json));
                }
            }
            Request::Status
        }
        Commands::Shutdown { stop_work } => {
            // A daemon that accepts no connection is there all the same (stuck); a socket
            // that is not this user's is refused, never taken for none.
            if let Err(e) = Client::connect_existing(&paths) {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    return Err(WireError::new(ErrorCode::Unavailable, e.to_string()));
                }
                if e.kind() != std::io::ErrorKind::TimedOut {
                    render::say(json, "no daemon is running for this home");
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Request::Shutdown { stop_work }
        }
    };
    let envelope = Envelope { session, request };
    let mut client = Client::connect(&paths)?;
    if let Request::Notices { follow: true, .. } = &envelope.request {
        return follow::follow(&mut client, &envelope, json);
    }
    render::call_and_print(&mut client, envelope, json)
}

/// `bgwork ui`: the strip's address, opened in a browser when there is a display.
fn ui(
    paths: &Paths,
    session: &str,
    port: Option<u16>,
    no_open: bool,
    json: bool,
) -> Result<ExitCode, WireError> {
    let envelope = Envelope {
        session: session.to_string(),
        request: Request::Ui { port },
    };
    let reply: wire::UiReply = Client::connect(paths)?.call(&envelope)?;
    if let Some(old) = reply.moved_from {
        eprintln!(
            "bgwork: the work strip moved from port {old} (taken by another program) to \
             {}, with a new token: a page left open on port {old} no longer works; open \
             the address below",
            reply.port
        );
    }
    if json {
        render::print_text(&wire::to_json_text(&reply));
    } else {
        render::print_text(&reply.url);
    }
    let display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    if display && !no_open {
        // The token stays off every command line (which other users may read): the
        // browser opens a private file of the home that leads it to the address.
        let door = paths.home.join("ui.html");
        let page = format!(
            "<!doctype html><meta http-equiv=\"refresh\" content=\"0;url={}\">",
            reply.url
        );
        use std::os::unix::fs::OpenOptionsExt;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&door)
            .and_then(|mut file| std::io::Write::write_all(&mut file, page.as_bytes()));
        if let Err(e) = written {
            eprintln!("bgwork: could not open a browser ({e}): open the address above");
            return Ok(ExitCode::SUCCESS);
        }
        // The browser is the person's: it must outlive this call and not write here.
        let opened = std::process::Command::new("xdg-open")
            .arg(&door)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if let Err(e) = opened {
            eprintln!("bgwork: could not open a browser ({e}): open the address above");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_daemon(http: Option<u16>) -> ExitCode {
    match crate::daemon::main(http) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bgwork daemon: {e}");
            // A home this daemon will not serve as it is (its database is broken): the
            // client that started it says why at once instead of starting another.
            let refused = e
                .downcast_ref::<crate::store::StoreError>()
                .is_some_and(|e| {
                    matches!(
                        e,
                        crate::store::StoreError::Corrupt { .. }
                            | crate::store::StoreError::TooNew { .. }
                    )
                });
            ExitCode::from(if refused {
                crate::client::DAEMON_REFUSED
            } else {
                1
            })
        }
    }
}

/// `bgwork man`: the manual page of every command, as roff.
fn man_page() -> Result<ExitCode, WireError> {
    let mut command = <Cli as clap::CommandFactory>::command();
    // The subcommands' arguments are deferred until built (see `Commands`).
    command.build();
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(command.clone())
        .render(&mut out)
        .map_err(|e| WireError::internal(format!("could not write the manual: {e}")))?;
    // Each subcommand's own sections follow the main page (nested ones too).
    fn sections(
        command: &clap::Command,
        prefix: &str,
        out: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            let name = format!("{prefix}-{}", sub.get_name());
            if sub.has_subcommands() {
                sections(sub, &name, out)?;
                continue;
            }
            let man = clap_mangen::Man::new(sub.clone().name(name));
            man.render_name_section(out)?;
            man.render_synopsis_section(out)?;
            man.render_description_section(out)?;
            man.render_options_section(out)?;
            man.render_extra_section(out)?;
        }
        Ok(())
    }
    sections(&command, "bgwork", &mut out)
        .map_err(|e| WireError::internal(format!("could not write the manual: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// `--env K=V` pairs, as UTF-8 text.
fn env_pairs(pairs: &[std::ffi::OsString]) -> Result<BTreeMap<String, String>, WireError> {
    let mut env = BTreeMap::new();
    for pair in pairs {
        let pair = pair.to_str().ok_or_else(|| {
            WireError::bad_request(format!(
                "--env {}: not UTF-8, which --env cannot carry; set the variable in bgwork's own \
                 environment instead (inherited variables reach the job as they are)",
                pair.to_string_lossy()
            ))
        })?;
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            WireError::bad_request("--env takes NAME=VALUE and one was given without '='")
        })?;
        env.insert(key.to_string(), value.to_string());
    }
    Ok(env)
}

/// Adds the value of each `--secret NAME` from this process's environment to `env`
/// (a value given with `--env NAME=…` is taken as it is).
fn secret_values(names: &[String], env: &mut BTreeMap<String, String>) -> Result<(), WireError> {
    for name in names {
        if env.contains_key(name) {
            continue;
        }
        let value = match std::env::var(name) {
            Ok(value) => value,
            Err(std::env::VarError::NotPresent) => {
                return Err(WireError::bad_request(format!(
                    "--secret {name}: no such variable in your environment; export it first \
                     (or give its value with --env {name}=VALUE)"
                )))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(WireError::bad_request(format!(
                    "--secret {name}: its value is not UTF-8, which bgwork cannot mask; \
                     the job still inherits it, unmasked, if you leave out --secret"
                )))
            }
        };
        env.insert(name.clone(), value);
    }
    Ok(())
}

fn start_args(start: StartCmd) -> Result<wire::StartArgs, WireError> {
    let job = start.job;
    let mut env = env_pairs(&job.env)?;
    secret_values(&job.secrets, &mut env)?;
    let ssh = crate::executor::ssh::choose(start.on.on.as_deref(), "--")?;
    let cwd = match &ssh {
        // A folder on the host, as it is there (none: the remote user's home).
        Some(_) => match job.cwd {
            Some(cwd) => {
                crate::executor::ssh::check_cwd(&cwd, "--cwd")?;
                Some(cwd)
            }
            None => None,
        },
        None => Some(crate::paths::resolve(
            job.cwd.as_deref().unwrap_or("."),
            "--cwd",
        )?),
    };
    let caller = crate::environ::CallerEnv::of_this_process();
    let slurm = slurm_args(start.on, start.pty)?;
    Ok(wire::StartArgs {
        command: shell::command_line(&job.command),
        cwd,
        env,
        inherit_env: Some(caller.text),
        inherit_env_bytes: caller.bytes,
        name: job.name,
        notify: job.notify,
        window_ms: start.window,
        pty: start.pty,
        cols: start.cols,
        rows: start.rows,
        allow_duplicate: start.allow_duplicate,
        quiet_after_s: start.quiet_after,
        max_runtime_s: start.max_runtime,
        secrets: job.secrets,
        keep_raw_log: job.keep_raw_log,
        slurm,
        ssh,
        restart: start.restart.restart.map(|on| wire::RestartPolicyArgs {
            on,
            max_restarts: start.restart.max_restarts,
            backoff: start.restart.backoff,
        }),
        after: start
            .after
            .iter()
            .map(|text| wire::after::After::parse(text))
            .collect::<Result<_, _>>()
            .map_err(WireError::bad_request)?,
    })
}

impl OnCmd {
    /// This machine, whatever `BGWORK_EXECUTOR` says (sub-agents, and `run` without
    /// `--on`).
    fn local() -> OnCmd {
        OnCmd {
            on: Some("local".into()),
            ..OnCmd::default()
        }
    }
}

/// Where a `start` runs: `--on`, else `BGWORK_EXECUTOR`, else this machine.
fn slurm_args(on: OnCmd, pty: bool) -> Result<Option<wire::SlurmArgs>, WireError> {
    let asked = wire::SlurmArgs {
        partition: on.partition,
        time: on.time,
        cpus: on.cpus,
        mem: on.mem,
        gpus: on.gpus,
        nodes: on.nodes,
        sbatch_args: on.sbatch_args,
    };
    crate::executor::slurm::choose(on.on.as_deref(), asked, pty, "--")
}

/// A path as the caller means it: a relative one is resolved against the caller's
/// directory here, because the daemon's directory means nothing to the caller.
fn absolute(path: &str, flag: &str) -> Result<String, WireError> {
    if path.is_empty() {
        return Err(WireError::bad_request(format!(
            "{flag} takes a path to a file"
        )));
    }
    let path = std::path::Path::new(path);
    if path.is_absolute() {
        return Ok(path.display().to_string());
    }
    let here = std::env::current_dir().map_err(|e| {
        WireError::bad_request(format!(
            "{flag} {}: a relative path needs the current directory, which cannot be read ({e}); give an absolute path",
            path.display()
        ))
    })?;
    let joined = here.join(path);
    joined.to_str().map(String::from).ok_or_else(|| {
        WireError::bad_request(format!(
            "{flag} {}: the path is not valid UTF-8",
            joined.display()
        ))
    })
}

/// A number of seconds (`--timeout`, `--grace`, `--wait`), checked as the daemon checks
/// it; NaN and infinity are refused here, before JSON could turn them into `null`.
/// `run --timeout`: seconds, or `auto`.
#[derive(Debug, Clone, Copy)]
pub enum TimeoutArg {
    Seconds(f64),
    Auto,
}

fn timeout_arg(text: &str) -> Result<TimeoutArg, String> {
    match text.trim() {
        "auto" => Ok(TimeoutArg::Auto),
        _ => seconds_arg(text)
            .map(TimeoutArg::Seconds)
            .map_err(|e| format!("{e} (or `auto`: from the command's history)")),
    }
}

fn seconds_arg(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("takes a number of seconds, e.g. 30 or 0.5, not {text:?}"))?;
    wire::seconds("it", value).map_err(|e| e.message.replacen("it ", "", 1))?;
    Ok(value)
}

fn monitor_args(monitor: MonitorCmd) -> Result<wire::MonitorArgs, WireError> {
    use wire::{Condition, MonitorMode};
    let one_of = "give exactly one condition";
    match monitor {
        MonitorCmd::Wait {
            until_output,
            until_port,
            of,
            until_file,
            until_end,
            timeout,
            no_notify,
            name,
            ..
        } => {
            let mut regex = None;
            let mut conditions = Vec::new();
            if let Some(pair) = until_output {
                regex = pair.get(1).cloned();
                conditions.push(Condition::Output {
                    id: pair[0].clone(),
                });
            }
            match (until_port, of) {
                (Some(_), Some(id)) => conditions.push(Condition::PortOf { id }),
                (Some(Some(address)), None) => conditions.push(Condition::Port { address }),
                (Some(None), None) => {
                    return Err(WireError::bad_request(
                        "--until-port takes HOST:PORT, or --of ID for the port an item opens",
                    ))
                }
                (None, _) => {}
            }
            if let Some(path) = until_file {
                conditions.push(Condition::File {
                    path: absolute(&path, "--until-file")?,
                });
            }
            conditions.extend(until_end.map(|id| Condition::End { id }));
            if conditions.len() != 1 {
                return Err(WireError::bad_request(format!(
                    "monitor wait: {one_of} of --until-output, --until-port, --until-file, --until-end"
                )));
            }
            Ok(wire::MonitorArgs {
                mode: MonitorMode::Wait,
                condition: conditions.remove(0),
                regex,
                timeout_s: timeout,
                notify: !no_notify,
                name,
            })
        }
        MonitorCmd::Watch {
            output,
            file,
            regex,
            name,
        } => {
            let condition = match (output, file) {
                (Some(id), None) => Condition::Output { id },
                (None, Some(path)) => Condition::File {
                    path: absolute(&path, "--file")?,
                },
                _ => {
                    return Err(WireError::bad_request(format!(
                        "monitor watch: {one_of} of --output ID, --file PATH"
                    )))
                }
            };
            Ok(wire::MonitorArgs {
                mode: MonitorMode::Watch,
                condition,
                regex,
                timeout_s: None,
                notify: true,
                name,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of every command says what it is for.
    #[test]
    fn every_option_of_every_subcommand_has_a_description() {
        fn check(command: &clap::Command, path: &str) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(arg.get_help().is_some(), "{path} {id} has no description");
            }
            for sub in command.get_subcommands() {
                assert!(
                    sub.get_about().is_some(),
                    "{path} {} has no purpose",
                    sub.get_name()
                );
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        let mut command = Cli::command();
        // Deferred subcommands have no arguments until built.
        command.build();
        command.clone().debug_assert();
        check(&command, "bgwork");
    }
}
