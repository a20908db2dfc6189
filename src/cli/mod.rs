//! The command line: clap definitions, turning each command into one request, and
//! printing the reply as text or `--json`. It holds no logic the daemon owns.

mod demo;
mod render;
mod shell;

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::{self, Actor, Envelope, ErrorCode, Request, WireError};
use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "bgwork",
    version,
    about = "Background work for AI agents: start now, read later, hear when it ends",
    long_about = None
)]
pub struct Cli {
    /// The session that owns the work (one agent conversation).
    #[arg(long, global = true, env = "BGWORK_SESSION", default_value = "default")]
    pub session: String,
    /// Print the reply as JSON (the objects of the socket API).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Commands,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Run COMMAND in the background; prints its id at once, then its first output.
    Start(StartCmd),
    /// Run COMMAND in the foreground; past the deadline it moves to the background.
    Run(RunCmd),
    /// List the session's running work (--all adds ended records).
    List {
        /// Ended records too (until they are dismissed or collected).
        #[arg(long)]
        all: bool,
        /// Every session's work, grouped by session, sub-agents under their parent.
        #[arg(long)]
        all_sessions: bool,
    },
    /// Read output since this session's last read of ID (never blocks).
    Read(ReadCmd),
    /// Write input to a job's stdin (escapes \n \t \xHH understood).
    Send {
        id: String,
        text: Option<String>,
        /// A named key: C-c, C-d, Enter, Tab, Esc, Up, Down, Left, Right, ...
        #[arg(long = "key")]
        keys: Vec<String>,
    },
    /// Stop ID: TERM to its whole process tree, KILL after the grace.
    Stop {
        id: String,
        /// Seconds between TERM and KILL.
        #[arg(long)]
        grace: Option<f64>,
        /// Who stops it.
        #[arg(long = "as", value_enum, default_value = "agent")]
        actor: ActorArg,
    },
    /// Block until items end, a pattern appears in new output, or the timeout passes.
    Wait(WaitCmd),
    /// Pending exit notices of the session, each delivered once.
    Notices {
        /// Show without marking them delivered.
        #[arg(long)]
        peek: bool,
        /// Stream notices as they are created.
        #[arg(long)]
        follow: bool,
        /// When none is pending, wait up to S seconds for the first one.
        #[arg(long, value_name = "S", conflicts_with = "follow")]
        wait: Option<f64>,
    },
    /// Monitors: wait until a condition holds, or watch for matching lines.
    #[command(subcommand)]
    Monitor(MonitorCmd),
    /// Sub-agents: child agents whose report comes back as a notice.
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Resize a pane's terminal.
    Resize {
        id: String,
        #[arg(long)]
        cols: u16,
        #[arg(long)]
        rows: u16,
    },
    /// Drop an ended record from lists.
    Dismiss { id: String },
    /// Delete old ended records and their logs.
    Gc,
    /// Run the daemon (the CLI starts it on demand).
    Daemon {
        /// Stay attached to the terminal (the daemon never forks itself anyway).
        #[arg(long)]
        foreground: bool,
    },
    /// The daemon's pid, version, home, socket and running work.
    Status,
    /// An MCP server on stdio exposing the same calls as tools.
    Mcp,
    /// Turn-boundary hooks of agent harnesses.
    #[command(subcommand)]
    Hook(HookCmd),
    /// Stop the daemon; running work goes on unless --stop-work.
    Shutdown {
        #[arg(long)]
        stop_work: bool,
    },
    /// A short guided run of start, read, wait, notices and stop on real jobs.
    Demo,
    /// The per-job supervisor (started by the daemon).
    #[command(hide = true)]
    Supervise,
}

/// What every command that starts work takes: the command and where it runs.
#[derive(Args, Debug)]
pub struct JobCmd {
    /// Fire one notice when it ends.
    #[arg(long)]
    pub notify: bool,
    #[arg(long)]
    pub name: Option<String>,
    /// Working directory (default: the current one).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Set a variable for the job (its name is recorded, its value never).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<std::ffi::OsString>,
    /// The command, run by `bash -c`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StartCmd {
    #[command(flatten)]
    pub job: JobCmd,
    /// Milliseconds to wait for first output (default 1000).
    #[arg(long)]
    pub window: Option<u64>,
    /// Run on a pseudo-terminal (a pane): a screen, keystrokes, a size.
    #[arg(long)]
    pub pty: bool,
    /// The pane's width (default 120).
    #[arg(long, requires = "pty")]
    pub cols: Option<u16>,
    /// The pane's height (default 40).
    #[arg(long, requires = "pty")]
    pub rows: Option<u16>,
}

#[derive(Subcommand, Debug)]
pub enum MonitorCmd {
    /// mon-N: one notice when the condition holds (or the timeout passes).
    Wait {
        /// A line of ID's output matches REGEX.
        #[arg(long, num_args = 2, value_names = ["ID", "REGEX"])]
        until_output: Option<Vec<String>>,
        /// Something accepts connections on HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        until_port: Option<String>,
        /// The file exists.
        #[arg(long, value_name = "PATH")]
        until_file: Option<String>,
        /// The item ended.
        #[arg(long, value_name = "ID")]
        until_end: Option<String>,
        /// Fail when the condition has not held after S seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Fire a notice when it ends.
        #[arg(long)]
        notify: bool,
        #[arg(long)]
        name: Option<String>,
    },
    /// mon-N: every matching line goes to its log (`read mon-N`); notices in batches.
    Watch {
        /// Lines of ID's output.
        #[arg(long, value_name = "ID")]
        output: Option<String>,
        /// Lines appended to PATH.
        #[arg(long, value_name = "PATH")]
        file: Option<String>,
        /// Only lines matching REGEX.
        #[arg(long)]
        regex: Option<String>,
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum HookCmd {
    /// Claude Code: reads a hook event on stdin, prints pending notices as context.
    ClaudeCode {
        /// On Stop, ask the agent to wait for work armed with --notify that still runs.
        #[arg(long)]
        wait_on_stop: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum AgentCmd {
    /// sub-N: run a child agent; its work is filed under this session.
    Start(JobCmd),
}

#[derive(Args, Debug)]
pub struct RunCmd {
    /// Seconds to run in the foreground before moving to the background (default 60).
    #[arg(long)]
    pub timeout: Option<f64>,
    #[command(flatten)]
    pub job: JobCmd,
}

#[derive(Args, Debug)]
pub struct ReadCmd {
    pub id: String,
    /// The last N lines (does not move the read cursor).
    #[arg(long)]
    pub tail: Option<usize>,
    /// From this byte offset (does not move the read cursor).
    #[arg(long)]
    pub from: Option<u64>,
    /// The whole output (does not move the read cursor).
    #[arg(long)]
    pub all: bool,
    /// The exact bytes, escapes and all.
    #[arg(long)]
    pub raw: bool,
    /// Clip the reply to about this many bytes (head and tail kept).
    #[arg(long)]
    pub max_bytes: Option<usize>,
    /// A pane's visible screen, as text.
    #[arg(long)]
    pub screen: bool,
}

#[derive(Args, Debug)]
pub struct WaitCmd {
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Return when the first item ends (the default).
    #[arg(long, conflicts_with = "all")]
    pub any: bool,
    /// Return when every item has ended.
    #[arg(long)]
    pub all: bool,
    /// Return when a new line of output matches REGEX.
    #[arg(long)]
    pub until: Option<String>,
    /// Seconds to wait at most (default 50).
    #[arg(long)]
    pub timeout: Option<f64>,
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
    ExitCode::from(if error.use_stderr() { 2 } else { 0 })
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
            expecting_value = TAKES_VALUE.contains(&arg.as_str());
        } else if !starts {
            words.push(arg.as_str());
            let sub = words.join(" ");
            starts = matches!(sub.as_str(), "start" | "run" | "agent start");
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
                eprintln!("bgwork: {}", error.message);
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
    let session = cli.session.clone();
    let json = cli.json;
    let request = match cli.command {
        Commands::Daemon { .. } => return Ok(run_daemon()),
        Commands::Supervise => crate::supervisor::run(),
        Commands::Demo => return demo::run(),
        Commands::Mcp => {
            return crate::mcp::main()
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| WireError::internal(format!("the MCP server stopped: {e}")))
        }
        Commands::Hook(HookCmd::ClaudeCode { wait_on_stop }) => {
            return Ok(crate::hook::claude_code(&paths, wait_on_stop))
        }
        Commands::Start(start) => Request::Start(start_args(start)?),
        Commands::List { all, all_sessions } => Request::List { all, all_sessions },
        Commands::Read(read) => Request::Read(wire::ReadArgs {
            id: read.id,
            tail: read.tail,
            from: read.from,
            all: read.all,
            raw: read.raw,
            max_bytes: read.max_bytes,
            screen: read.screen,
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
        Commands::Wait(wait) => Request::Wait(wire::WaitArgs {
            ids: wait.ids,
            all: wait.all,
            until: wait.until,
            timeout_s: wait.timeout,
        }),
        Commands::Notices { peek, follow, wait } => Request::Notices {
            peek,
            follow,
            wait_s: wait,
        },
        Commands::Dismiss { id } => Request::Dismiss { id },
        Commands::Resize { id, cols, rows } => Request::Resize { id, cols, rows },
        Commands::Monitor(monitor) => Request::Monitor(monitor_args(monitor)?),
        Commands::Agent(AgentCmd::Start(job)) => Request::AgentStart(start_args(StartCmd {
            job,
            window: Some(0),
            pty: false,
            cols: None,
            rows: None,
        })?),
        Commands::Run(run) => Request::Run(wire::RunArgs {
            start: start_args(StartCmd {
                job: run.job,
                window: None,
                pty: false,
                cols: None,
                rows: None,
            })?,
            timeout_s: run.timeout,
            stream: !json,
        }),
        Commands::Gc => Request::Gc,
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
            // A daemon that accepts no connection is there all the same (stuck).
            if let Err(e) = Client::connect_existing(&paths) {
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
    render::call_and_print(&mut client, envelope, json)
}

fn run_daemon() -> ExitCode {
    match crate::daemon::main() {
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

fn start_args(start: StartCmd) -> Result<wire::StartArgs, WireError> {
    let mut env = BTreeMap::new();
    let job = start.job;
    for pair in &job.env {
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
    let cwd = Some(crate::paths::resolve(
        job.cwd.as_deref().unwrap_or("."),
        "--cwd",
    )?);
    let caller = crate::environ::CallerEnv::of_this_process();
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
    })
}

fn monitor_args(monitor: MonitorCmd) -> Result<wire::MonitorArgs, WireError> {
    use wire::{Condition, MonitorMode};
    let one_of = "give exactly one condition";
    match monitor {
        MonitorCmd::Wait {
            until_output,
            until_port,
            until_file,
            until_end,
            timeout,
            notify,
            name,
        } => {
            let mut regex = None;
            let mut conditions = Vec::new();
            if let Some(pair) = until_output {
                regex = pair.get(1).cloned();
                conditions.push(Condition::Output {
                    id: pair[0].clone(),
                });
            }
            conditions.extend(until_port.map(|address| Condition::Port { address }));
            conditions.extend(until_file.map(|path| Condition::File { path }));
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
                notify,
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
                (None, Some(path)) => Condition::File { path },
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
