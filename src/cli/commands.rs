//! The command line as clap reads it: `Cli` and its subcommands (`Commands`), with
//! their help, examples and the environment they read.

use super::options::{
    parse_duration, seconds_arg, ActorArg, AgentCmd, HookCmd, MonitorCmd, ReadCmd, RunCmd,
    StartCmd, WaitCmd,
};
use clap::{Parser, Subcommand};

pub(super) const ENVIRONMENT: &str = "\
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
        /// Started by a client that found no daemon: when another one serves the home
        /// by then (two clients started one each), leave without a word
        #[arg(long, hide = true)]
        on_demand: bool,
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
    /// The rest of a run's stdin passed on after the run is promoted (started by `run`)
    #[command(hide = true)]
    RunFeed {
        /// The run's connection to the daemon
        #[arg(long)]
        fd: i32,
        /// A pipe from `run`: a line asks for the background now (stdout failed)
        #[arg(long)]
        control: i32,
    },
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
        /// Make the job's cgroup while waiting for the spec
        #[arg(long)]
        cgroup: bool,
    },
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
