//! The command line: clap definitions, turning each command into one request, and
//! printing the reply as text or `--json`. It holds no logic the daemon owns.

mod commands;
mod demo;
pub(crate) mod follow;
mod notices;
mod options;
mod render;
mod request;
mod shell;

use commands::{Cli, Commands};
use options::{ActorArg, AgentCmd, HookCmd, OnCmd, RestartPolicyCmd, StartCmd, TimeoutArg};
use request::{env_pairs, monitor_args, start_args};

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::{self, Actor, Envelope, ErrorCode, Request, WireError};
use clap::Parser;
use std::process::ExitCode;

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
    // To every harness a hook's exit 2 means "block" (or, from a rewake hook, "wake the
    // model with stderr"): a hook's bad command line is an error for the person (1).
    let is_hook = args.iter().take_while(|a| *a != "--").any(|a| a == "hook");
    let usage_code = ExitCode::from(if is_hook { 1 } else { 2 });
    if let Some((line, sub)) = missing_dashes.then(|| with_dashes(&args)).flatten() {
        eprintln!(
            "error: the command to run goes after `--` (bgwork's options come before it):\n\n  \
             {line}\n\nFor more, try 'bgwork {sub} --help'."
        );
        return ExitCode::from(2);
    }
    if let Some((flag, value)) = negative_value(&error, &args) {
        // clap's tip for it (`-- -1`) would make the number the command to run.
        let usage = match error.get(clap::error::ContextKind::Usage) {
            Some(clap::error::ContextValue::StyledStr(usage)) => format!("\n\n{usage}"),
            _ => String::new(),
        };
        eprintln!(
            "error: {flag} {value}: a negative number is no value of {flag}: give 0 or more{usage}"
        );
        return usage_code;
    }
    let _ = error.print();
    let code = match () {
        _ if !error.use_stderr() => 0,
        _ if is_hook => 1,
        _ => 2,
    };
    ExitCode::from(code)
}

/// The option and the negative number clap took for an unknown argument (`--timeout
/// -1`), when that is what it refused.
fn negative_value(error: &clap::Error, args: &[String]) -> Option<(String, String)> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(value)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    // clap names the first short flag it saw in `-1.5`: `-1`.
    let negative =
        |a: &String| a.starts_with(value.as_str()) && a.parse::<f64>().is_ok_and(|n| n < 0.0);
    let at = args.iter().take_while(|a| *a != "--").position(negative)?;
    let flag = args[..at].last().filter(|f| f.starts_with("--"))?;
    Some((flag.clone(), args[at].clone()))
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
        Commands::Daemon {
            http, on_demand, ..
        } => return Ok(run_daemon(http, on_demand)),
        Commands::Ui { port, no_open } => return ui(&paths, &session, port, no_open, json),
        Commands::Close { id } => Request::Close { id },
        Commands::Supervise { spec_file, cgroup } => match spec_file {
            // A job started from a spec file (by Slurm) takes its commands from its folder.
            Some(spec_file) => crate::executor::slurm::supervise(spec_file),
            None => crate::supervisor::run(crate::supervisor::Launch::Socket { cgroup }),
        },
        Commands::Keep { dir } => return Ok(crate::keeper::main(&dir)),
        Commands::RunFeed { fd, control } => return Ok(render::feed_main(fd, control)),
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
                plain_env: false,
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
            announce: true,
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

fn run_daemon(http: Option<u16>, on_demand: bool) -> ExitCode {
    match crate::daemon::main(http) {
        Ok(()) => ExitCode::SUCCESS,
        // Two clients found no daemon and started one each: the other serves.
        Err(e) if on_demand && e.downcast_ref::<crate::daemon::AlreadyServed>().is_some() => {
            ExitCode::SUCCESS
        }
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
