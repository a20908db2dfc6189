//! Sending a request and printing its reply: text for people and models, or `--json`.
//!
//! Every text in a reply came from a caller or a job (names, commands, output, reports,
//! even errors that quote an argument). Printed as text, each goes through [`inert`] or
//! [`inert_lines`] first, so that no escape sequence reaches the reader's terminal: none
//! sets its title, clears its screen or forges a line (contract §8). `--json` prints exact
//! JSON, whose escaping is enough.

mod history;
mod list;
mod read;
mod run;
mod terminal;
mod wait;

use super::notices::pull_notices;
use crate::client::Client;
use crate::observe;
use crate::wire::{
    self, Ack, Envelope, GcReply, Item, ListReply, NoticesReply, ReadReply, Request, RestartReply,
    SessionReply, StartReply, State, StatusReply, WaitReply, WireError,
};
use base64::Engine;
use history::history_text;
use list::{expected_line, list_text, listening_line, logout_line, restart_line, sessions_text};
use read::{grep_text, print_read, read_status_line};
pub use run::feed_main;
use run::run;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::Write;
use std::process::ExitCode;
pub(super) use terminal::print_text;
use terminal::{indent, label};
pub(crate) use terminal::{inert, inert_lines};
pub use wait::{follow_output, wait};
use wait::{wait_code, wait_text};

pub fn call_and_print(
    client: &mut Client,
    envelope: Envelope,
    json: bool,
) -> Result<ExitCode, WireError> {
    match &envelope.request {
        Request::Start(_) | Request::AgentStart(_) => print(client, &envelope, json, start_text),
        Request::Monitor(_) => print(client, &envelope, json, |item: &Item| {
            format!(
                "{} {}: {}",
                inert(&item.id),
                wire::name_of(&item.state),
                inert(&item.command)
            )
        }),
        Request::List { all_sessions, .. } => {
            let reply: ListReply = client.call(&envelope)?;
            if json {
                print_text(&wire::to_json_text(&reply));
            } else if *all_sessions {
                print_text(&sessions_text(&reply));
            } else if reply.items.is_empty() {
                // Nothing here: say where the work is, if some other session has some.
                let status = Envelope {
                    session: envelope.session.clone(),
                    request: Request::Status,
                };
                let others = client.call::<StatusReply>(&status).map(|s| s.running);
                print_text(&match others {
                    Ok(n) if n > 0 => format!(
                        "no work in session {}; {} run in other sessions: \
                         `bgwork list --all-sessions`",
                        inert(&envelope.session),
                        crate::history::plural(n as usize, "item")
                    ),
                    _ => "no work".to_string(),
                });
            } else {
                print_text(&list_text(&reply));
            }
            Ok(ExitCode::SUCCESS)
        }
        Request::Read(args) if args.grep.is_some() => {
            print(client, &envelope, json, |reply: &wire::GrepReply| {
                grep_text(reply, args.grep.as_deref().unwrap_or(""))
            })
        }
        Request::Read(args) => {
            let mut reply: ReadReply = client.call(&envelope)?;
            let mut frame = match reply.output_bytes {
                Some(n) => Some(client.read_frame(n)?),
                None => None,
            };
            if let Some(bytes) = frame.take_if(|_| !args.raw) {
                // The daemon sent text: valid UTF-8 unless damaged on the way.
                reply.output = String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            }
            if json {
                print_text(&wire::to_json_text(&reply));
            } else if args.screen {
                print_text(&inert_lines(&reply.output));
                // A pane that waits (or is between two runs) has no screen yet: say so.
                if reply.report.is_none() && reply.live.is_some() {
                    eprintln!("{}", read_status_line(&reply));
                }
            } else if args.raw {
                let bytes = frame.unwrap_or_else(|| {
                    base64::engine::general_purpose::STANDARD
                        .decode(reply.output_base64.as_deref().unwrap_or(""))
                        .unwrap_or_default()
                });
                let _ = std::io::stdout().write_all(&bytes);
                eprintln!("{}", read_status_line(&reply));
            } else {
                print_read(&reply);
            }
            Ok(ExitCode::SUCCESS)
        }
        Request::Run(_) => run(client, &envelope, json),
        Request::Send(_)
        | Request::Dismiss { .. }
        | Request::Shutdown { .. }
        | Request::Ack { .. }
        | Request::BindHarness { .. }
        | Request::Resize { .. }
        | Request::Ping => print(client, &envelope, json, |ack: &Ack| {
            inert(&ack.message).into_owned()
        }),
        Request::Stop(_) => print(client, &envelope, json, stop_text),
        Request::Wait(_) => {
            let reply: WaitReply = client.call(&envelope)?;
            print_text(&wait_text(&reply, None, None));
            Ok(wait_code(&reply))
        }
        Request::Restart(_) => print(client, &envelope, json, |reply: &RestartReply| {
            format!(
                "restart of {}: {}",
                inert(&reply.restarted),
                start_text(&reply.start)
            )
        }),
        Request::NewSession { .. } => print(client, &envelope, json, |reply: &SessionReply| {
            inert(&reply.session).into_owned()
        }),
        Request::Notices { ack: true, .. } => pull_notices(client, &envelope, json, notices_text),
        Request::Notices { .. } => print(client, &envelope, json, notices_text),
        Request::Gc { .. } => print(client, &envelope, json, |gc: &GcReply| {
            format!(
                "removed {}, freed {} bytes",
                crate::history::plural(gc.removed as usize, "ended record"),
                gc.freed_bytes
            )
        }),
        Request::Status => print(client, &envelope, json, status_text),
        Request::Close { .. } => print(client, &envelope, json, |item: &Item| {
            match (item.already_ended, &item.queued) {
                (Some(true), _) => format!("{} had already ended", inert(&item.id)),
                (_, Some(queued)) => inert(queued).into_owned(),
                _ => format!("{}: its terminal was hung up", inert(&item.id)),
            }
        }),
        Request::Ui { .. } => print(client, &envelope, json, |reply: &wire::UiReply| {
            reply.url.clone()
        }),
        Request::History { .. } => print(client, &envelope, json, |reply| {
            history_text(reply, &envelope.session)
        }),
    }
}

fn print<T: DeserializeOwned + Serialize>(
    client: &mut Client,
    envelope: &Envelope,
    json: bool,
    text: impl Fn(&T) -> String,
) -> Result<ExitCode, WireError> {
    let reply: T = client.call(envelope)?;
    if json {
        print_text(&wire::to_json_text(&reply));
    } else {
        print_text(&text(&reply));
    }
    Ok(ExitCode::SUCCESS)
}

/// `status` with no daemon: says so, and exits with [`NO_DAEMON`].
pub fn no_daemon(paths: &crate::paths::Paths, json: bool) -> ExitCode {
    let message = format!(
        "no daemon is running for {} (any bgwork command that needs one starts it)",
        paths.home.display()
    );
    if json {
        let reply = wire::NoDaemonReply {
            daemon: false,
            home: paths.home.display().to_string(),
            socket: paths.socket.display().to_string(),
            message,
        };
        print_text(&wire::to_json_text(&reply));
    } else {
        print_text(&message);
    }
    ExitCode::from(NO_DAEMON)
}

/// The exit code of `status` when no daemon runs (as `systemctl status`, LSB's
/// "program is not running").
pub const NO_DAEMON: u8 = 3;

/// Prints a plain message (or `{"message":…}` with `--json`). Printing never panics:
/// a reader that closed its end (`| head`) just gets no more.
pub fn say(json: bool, message: &str) {
    if json {
        print_text(&wire::to_json_text(&Ack {
            ok: true,
            message: message.to_string(),
        }));
    } else {
        print_text(&inert_lines(message));
    }
}

fn start_text(reply: &StartReply) -> String {
    let item = &reply.item;
    if reply.already_running == Some(true) {
        let id = inert(&item.id);
        let mut text = match item.not_running_words() {
            Some(words) => format!(
                "already running as {id}, {}: {}",
                inert(&words),
                label(item)
            ),
            None => format!("already running as {id}: {}", label(item)),
        };
        if let Some(pid) = item.pid {
            text.push_str(&format!(" (pid {pid})"));
        }
        text.push('\n');
        if let Some(line) = listening_line(item, "") {
            text.push_str(&line);
            text.push('\n');
        }
        text.push_str(&format!(
            "[no new job: `bgwork read {id}` for its output; `bgwork start --allow-duplicate …` starts a second one]"
        ));
        return text;
    }
    // With `--window 0` the reply comes before the process runs: no pid yet.
    let started = match (item.pid, item.state) {
        (Some(pid), _) => format!("started (pid {pid})"),
        (None, State::Starting) => "starting (its pid shows in `bgwork list`)".to_string(),
        (None, State::Waiting) => {
            inert(item.waiting_for.as_deref().unwrap_or("waiting")).to_string()
        }
        (None, State::Queued) => match &item.slurm_job_id {
            Some(job) => format!("queued on Slurm (job {job})"),
            None => "queued on Slurm".to_string(),
        },
        (None, _) => "started".to_string(),
    };
    let mut text = format!("{} {started}: {}\n", inert(&item.id), label(item));
    text.push_str(&inert_lines(&reply.output));
    if !reply.output.is_empty() && !reply.output.ends_with('\n') {
        text.push('\n');
    }
    let id = inert(&item.id);
    if let Some(line) = expected_line(item, "") {
        text.push_str(&line);
        text.push('\n');
    }
    if let Some(line) = restart_line(item, "", std::time::SystemTime::now()) {
        text.push_str(&line);
        text.push('\n');
    }
    if let Some(line) = logout_line(item, "") {
        text.push_str(&line);
        text.push('\n');
    }
    match &item.report {
        Some(report) => text.push_str(&inert(report)),
        None if item.state == State::Waiting => text.push_str(&format!(
            "[nothing runs until then; a notice comes if it can no longer start; \
             `bgwork stop {id}` cancels it]"
        )),
        None if item.notify => text.push_str(&format!(
            "[{id} runs on: `bgwork read {id}` for its output; a notice will come when it ends]"
        )),
        None => text.push_str(&format!(
            "[{id} runs on: `bgwork read {id}` for new output, `bgwork wait {id}` to wait]"
        )),
    }
    if let Some(line) = listening_line(item, "") {
        text.push('\n');
        text.push_str(&line);
    }
    text
}

fn stop_text(item: &Item) -> String {
    let id = inert(&item.id);
    match (&item.report, &item.queued) {
        (Some(report), _) => inert(report).into_owned(),
        (None, Some(queued)) => inert(queued).into_owned(),
        (None, None) => {
            format!("stop requested: {id} has not ended yet; `bgwork wait {id}` to see it end")
        }
    }
}

pub(super) fn notice_text(notice: &wire::Notice) -> String {
    format!(
        "{} [{}]\n{}",
        inert(&notice.text),
        inert(&notice.id),
        indent(&notice.tail)
    )
}

fn notices_text(reply: &NoticesReply) -> String {
    if reply.notices.is_empty() {
        return "no pending notices".to_string();
    }
    reply
        .notices
        .iter()
        .map(notice_text)
        .collect::<Vec<_>>()
        .join("")
}
fn status_text(status: &StatusReply) -> String {
    let mut text = format!(
        "daemon pid {} (bgwork {})\nhome    {}\nsocket  {}\nrunning {}",
        status.pid, status.version, status.home, status.socket, status.running
    );

    if !status.sessions.is_empty() {
        text.push_str(&format!(
            " in {} (`bgwork list --all-sessions` lists them):",
            crate::history::plural(status.sessions.len(), "session")
        ));
        let mut sessions: Vec<(&String, &u64)> = status.sessions.iter().collect();
        sessions.sort_by_key(|(session, _)| session.split('/').collect::<Vec<_>>());
        for (session, count) in sessions {
            let depth = session.matches('/').count();
            let name = session.rsplit('/').next().unwrap_or(session);
            let name = format!("{}{}", "  ".repeat(depth), inert(name));
            text.push_str(&format!("\n  {name:<30} {count}"));
        }
    }
    if !status.restarting.is_empty() {
        text.push_str("\nrestarting (waiting out their back-off):");
        for item in &status.restarting {
            text.push_str(&format!("\n  {}", inert(item)));
        }
    }
    if status.waiting > 0 {
        text.push_str(&format!(
            "\nwaiting {} (started with --after: nothing runs yet; `bgwork list` says for what)",
            status.waiting
        ));
    }
    if let (Some(cpu), Some(rss), true) = (status.cpu_ms, status.rss_bytes, status.running > 0) {
        text.push_str(&format!(
            "\nusing   cpu {}, memory {} (the running items' processes together)",
            observe::cpu_text(cpu),
            observe::bytes_text(rss)
        ));
    }
    for why in &status.hosts_unreachable {
        text.push_str(&format!("\n{}", inert(why)));
    }
    for refused in &status.settings_refused {
        text.push_str(&format!("\nsetting {}", inert(refused)));
    }
    text
}
