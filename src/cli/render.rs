//! Sending a request and printing its reply: text for people and models, or `--json`.
//!
//! Every text in a reply came from a caller or a job (names, commands, output, reports,
//! even errors that quote an argument). Printed as text, each goes through [`inert`] or
//! [`inert_lines`] first, so that no escape sequence reaches the reader's terminal: none
//! sets its title, clears its screen or forges a line (contract §8). `--json` prints exact
//! JSON, whose escaping is enough.

use super::notices::pull_notices;
use crate::client::Client;
use crate::observe;
use crate::wire::{
    self, Ack, End, Envelope, GcReply, Item, ListReply, NoticesReply, ReadReply, Request,
    RestartReply, RunOutcome, RunReply, SessionReply, StartReply, State, StatusReply, WaitReason,
    WaitReply, WireError,
};
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::borrow::Cow;
use std::io::Write;
use std::process::ExitCode;

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
        | Request::Resize { .. } => print(client, &envelope, json, |ack: &Ack| {
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

/// `run`: streams output chunks, then exits with the command's own status when it
/// ended in time, 0 when it was promoted, 1 when it was killed.
fn run(client: &mut Client, envelope: &Envelope, json: bool) -> Result<ExitCode, WireError> {
    client.send(envelope)?;
    // Stdin frames and a detach frame share one writer, a whole line at a time.
    let writer = std::sync::Arc::new(std::sync::Mutex::new(client.writer()?));
    if matches!(&envelope.request, Request::Run(args) if args.stdin == wire::RunStdin::Forward) {
        let writer = writer.clone();
        std::thread::spawn(move || forward_stdin(&writer));
    }
    let mut out = std::io::stdout();
    // Why stdout could not take the output (a full disk): the run was asked to go on in
    // the background, and nothing more goes to stdout.
    let mut detached: Option<String> = None;
    // Whether the choice of `--timeout auto` was said before the wait.
    let mut said = false;
    // The run's job, once the daemon named it.
    let mut started: Option<String> = None;
    let reply: RunReply = loop {
        let line = match (client.next_line(), &started) {
            (Ok(Some(line)), _) => line,
            // The job lives on under its supervisor; a daemon started by the next call
            // takes it back.
            (Ok(None) | Err(_), Some(id)) => {
                return Err(WireError::new(
                    wire::ErrorCode::Unavailable,
                    format!(
                        "the daemon went away during the run of {id}, which goes on: \
                         `bgwork wait {id}` for its end, `bgwork read {id}` for its output"
                    ),
                ))
            }
            (Ok(None), None) => {
                return Err(WireError::new(
                    wire::ErrorCode::Unavailable,
                    "the daemon closed the connection",
                ))
            }
            (Err(e), None) => return Err(e),
        };
        if let Ok(chunk) = serde_json::from_slice::<wire::Chunk>(&line) {
            // The command's own bytes, as they are (its stdout is this one).
            let bytes = match &chunk.bytes {
                Some(encoded) => base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .unwrap_or_default(),
                None => inert_lines(&chunk.chunk).into_owned().into_bytes(),
            };
            if detached.is_some() {
                continue;
            }
            match out.write_all(&bytes).and_then(|()| out.flush()) {
                Ok(()) => {}
                // Whoever read this stdout went away (`run … | head`): so does the run,
                // and the daemon stops its job as the person's Ctrl-C would.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(ExitCode::from(141))
                }
                // A full disk (or a failing device) is no reader going away: the command
                // goes on in the background, and the caller is told so on stderr.
                Err(e) => {
                    let why = format!("the run's output could not be written to stdout ({e})");
                    let frame = wire::StdinFrame {
                        detach: Some(why.clone()),
                        ..wire::StdinFrame::default()
                    };
                    let mut writer = writer.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = writer.write_all(&wire::encode_line(&frame));
                    detached = Some(why);
                }
            }
            continue;
        }
        if let Ok(first) = serde_json::from_slice::<wire::RunStarted>(&line) {
            if let Some(note) = &first.note {
                // On stderr, `--json` or not: stdout keeps the reply alone.
                eprintln!("[{}]", inert(note));
                said = true;
            }
            started = Some(first.started).filter(|id| !id.is_empty());
            continue;
        }
        break wire::decode_reply(&line)?;
    };
    if detached.is_some() {
        // Stdout takes nothing: the end (or the promotion) is said on stderr.
        eprintln!("bgwork: {}", inert(&reply.message));
        let code = match (reply.outcome, reply.item.exit_code, reply.item.signal) {
            (RunOutcome::Ended, Some(code), _) => code,
            (RunOutcome::Ended, None, Some(signal)) => 128 + signal,
            _ => 1,
        };
        return Ok(ExitCode::from(code.clamp(0, 255) as u8));
    }
    let mut text = match json {
        true => wire::to_json_text(&reply),
        false => inert_lines(&reply.output).into_owned(),
    };
    if json && !text.ends_with('\n') {
        text.push('\n');
    }
    let printed = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if let Err(e) = printed {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            // A full disk: the reply is lost, which the caller must hear of.
            eprintln!(
                "bgwork: the run's reply could not be written to stdout ({e}): {}",
                inert(&reply.message)
            );
            return Ok(ExitCode::from(1));
        }
    }
    if let (false, false, Some(choice)) = (json, said, &reply.timeout_choice) {
        eprintln!("[{}]", inert(choice));
    }
    if !json && reply.outcome != RunOutcome::Ended {
        eprintln!("[{}]", inert(&reply.message));
    }
    let code = match reply.outcome {
        RunOutcome::Ended => match (reply.item.exit_code, reply.item.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        },
        RunOutcome::Promoted => 0,
        RunOutcome::Killed => 1,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Passes this process's stdin on to a run, until it ends (or cannot be read: a closed
/// or unreadable stdin is an ended one), then says end-of-input.
fn forward_stdin(writer: &std::sync::Mutex<std::os::unix::net::UnixStream>) {
    use std::io::Read;
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let n = match stdin.read(&mut buffer) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        let frame = wire::StdinFrame {
            stdin: base64::engine::general_purpose::STANDARD.encode(&buffer[..n]),
            eof: n == 0,
            detach: None,
        };
        let mut writer = writer.lock().unwrap_or_else(|p| p.into_inner());
        if writer.write_all(&wire::encode_line(&frame)).is_err() || n == 0 {
            return;
        }
    }
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

/// A text that came from a caller or a job, for one line of a terminal: every control
/// character (C0, DEL, C1, line and paragraph separators, bidirectional overrides) is
/// shown as an escape (`\x1b`, `\n`, `\u{9b}`), so it cannot act on the terminal or
/// start a line of its own.
pub(crate) fn inert(text: &str) -> Cow<'_, str> {
    visible(text, false)
}

/// Like [`inert`] for a text of several lines (output, a tail, a report, an error):
/// line breaks and tabs are kept.
pub(crate) fn inert_lines(text: &str) -> Cow<'_, str> {
    visible(text, true)
}

fn visible(text: &str, keep_lines: bool) -> Cow<'_, str> {
    let acts = |c: char| {
        c.is_control() && !(keep_lines && (c == '\n' || c == '\t'))
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !crate::rendered::maybe_controls(text.as_bytes(), keep_lines) || !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !acts(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

pub(super) fn print_text(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.is_empty() && !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
}

fn label(item: &Item) -> String {
    inert(item.name.as_deref().unwrap_or(&item.command)).into_owned()
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

fn list_text(reply: &ListReply) -> String {
    if reply.items.is_empty() {
        return "no work".to_string();
    }
    let now = std::time::SystemTime::now();
    let mut lines = vec![format!(
        "{:<8} {:<17} {:>5} {:>8} {:>7} {:>9}  {}",
        "ID", "STATE", "AGE", "PID", "CPU", "MEM", "COMMAND"
    )];
    for item in &reply.items {
        let owner = item
            .session
            .rsplit_once('/')
            .map(|(_, agent)| format!(" (by {agent})"))
            .unwrap_or_default();
        lines.push(format!("{}{owner}", row(item, now)));
        lines.extend(waiting_line(item, "         "));
        lines.extend(listening_line(item, "         "));
        lines.extend(expected_line(item, "         "));
        lines.extend(restart_line(item, "         ", now));
        lines.extend(unreachable_line(
            item.host_unreachable.as_deref(),
            "         ",
        ));
        lines.extend(logout_line(item, "         "));
    }
    lines.join("\n")
}

/// `list --all-sessions`: each session under a heading, its sub-agents' sessions
/// (`S/sub-N`) indented under it.
fn sessions_text(reply: &ListReply) -> String {
    if reply.items.is_empty() {
        return "no work in any session".to_string();
    }
    let now = std::time::SystemTime::now();
    let mut items: Vec<&Item> = reply.items.iter().collect();
    items.sort_by_key(|item| item.session.split('/').collect::<Vec<_>>());
    let mut lines = Vec::new();
    let mut shown: Vec<String> = Vec::new();
    for item in items {
        // The headings of the session and of each parent not shown yet.
        let parts: Vec<&str> = item.session.split('/').collect();
        for depth in 0..parts.len() {
            let session = parts[..=depth].join("/");
            if shown.contains(&session) {
                continue;
            }
            let pad = "  ".repeat(depth);
            lines.push(match depth {
                0 => format!("session {}", inert(&session)),
                _ => format!("{pad}sub-agent {}", inert(parts[depth])),
            });
            shown.push(session);
        }
        let pad = "  ".repeat(parts.len() - 1);
        lines.push(format!("{pad}  {}", row(item, now)));
        lines.extend(waiting_line(item, &format!("{pad}           ")));
        lines.extend(listening_line(item, &format!("{pad}           ")));
        lines.extend(expected_line(item, &format!("{pad}           ")));
        lines.extend(restart_line(item, &format!("{pad}           "), now));
        lines.extend(unreachable_line(
            item.host_unreachable.as_deref(),
            &format!("{pad}           "),
        ));
    }
    lines.join("\n")
}

/// Under an item with a restart policy: its restarts, how its last run ended, and
/// when it starts again (or why it was not).
fn restart_line(item: &Item, pad: &str, now: std::time::SystemTime) -> Option<String> {
    let restart = item.restart.as_ref()?;
    let mut line = match (restart.restarts, restart.last_end) {
        (0, None) => format!(
            "{pad}restarts on failure: at most {} (--restart {}, back-off {})",
            restart.max_restarts, restart.policy, restart.backoff
        ),
        _ => format!(
            "{pad}{} (--restart {}, back-off {})",
            wire::restart_count(restart.restarts, restart.max_restarts),
            restart.policy,
            restart.backoff
        ),
    };
    if let Some(end) = restart.last_end {
        line.push_str("; last run ");
        line.push_str(&match (restart.last_exit_code, restart.last_signal) {
            (_, Some(signal)) => format!("{} (sig {signal})", wire::name_of(&end)),
            (Some(code), None) => format!("{} ({code})", wire::name_of(&end)),
            (None, None) => wire::name_of(&end),
        });
    }
    if let Some(at) = &restart.next_attempt_at {
        let left = humantime::parse_rfc3339(at)
            .ok()
            .map(|at| at.duration_since(now).unwrap_or_default());
        match left {
            Some(left) => line.push_str(&format!("; next start {}", countdown(left))),
            None => line.push_str(&format!("; next start at {}", inert(at))),
        }
    }
    if let Some(refused) = &restart.refused {
        line.push_str(&format!(" ({})", inert(refused)));
    }
    Some(line)
}

/// One item on one line: id, state (with its exit), age, pid, what it runs.
fn row(item: &Item, now: std::time::SystemTime) -> String {
    // An exit code or signal where it tells something (a stop's own signal does not).
    let state = match (&item.state, &item.end) {
        (State::Ended, Some(end @ (End::Succeeded | End::Failed | End::Signaled))) => {
            match (item.exit_code, item.signal) {
                (_, Some(signal)) => format!("{} (sig {signal})", wire::name_of(end)),
                (Some(code), None) => format!("{} ({code})", wire::name_of(end)),
                (None, None) => wire::name_of(end),
            }
        }
        (State::Ended, Some(end)) => wire::name_of(end),
        (state, _) => wire::name_of(state),
    };
    // Counted from its start: a waiting item has none yet.
    let age = item
        .started_at
        .as_deref()
        .and_then(|at| humantime::parse_rfc3339(at).ok())
        .and_then(|start| now.duration_since(start).ok())
        .map(short_duration)
        .unwrap_or_else(|| "-".into());
    let pid = item
        .pid
        .map(|p| p.to_string())
        .unwrap_or_else(|| "-".into());
    let mut what = label(item);
    if what.chars().count() > 100 {
        what = what.chars().take(99).collect::<String>() + "…";
    }
    let (cpu, memory) = cost_cells(item);
    format!(
        "{:<8} {:<17} {:>5} {:>8} {cpu:>7} {memory:>9}  {what}",
        item.id, state, age, pid
    )
}

/// The CPU time and memory of an item as list cells: now (running) or its total and
/// peak (ended); `-` where unknown.
fn cost_cells(item: &Item) -> (String, String) {
    let cpu = item
        .cost
        .cpu_ms
        .map(observe::cpu_text)
        .unwrap_or_else(|| "-".into());
    let memory = item
        .cost
        .rss_bytes
        .or(item.cost.peak_rss_bytes)
        .map(observe::bytes_text)
        .unwrap_or_else(|| "-".into());
    (cpu, memory)
}

/// What history expects of an item not yet ended: `history: usually 41 s (5 runs)`, or
/// for a running one `history: running 1m20s, usually 41 s (5 runs)`.
/// While a job's host cannot be reached: since when, and ssh's words.
/// A job on an ssh host that dies at logout there: why, and the fix.
fn logout_line(item: &Item, pad: &str) -> Option<String> {
    let why = item.logout_warning.as_deref()?;
    Some(format!("{pad}warning: {}", inert(why)))
}

fn unreachable_line(unreachable: Option<&str>, pad: &str) -> Option<String> {
    unreachable.map(|why| format!("{pad}{}", inert(why)))
}

fn expected_line(item: &Item, pad: &str) -> Option<String> {
    let expected = item.expected.as_deref()?;
    let line = match (&item.progress, expected.find(" (")) {
        (Some(progress), Some(at)) => format!("{progress}{}", &expected[at..]),
        _ => expected.to_string(),
    };
    Some(format!("{pad}history: {}", inert(&line)))
}

/// How many commands `history`'s text shows, and how much of each (`--json` has all).
const HISTORY_SHOWN: usize = 50;
const HISTORY_COMMAND_SHOWN: usize = 300;

/// `history`: each command of the folder with its median, p90 and last ends (the session
/// of a run named when it is not the caller's, whose ids are another session's).
fn history_text(reply: &wire::HistoryReply, session: &str) -> String {
    if reply.commands.is_empty() {
        return match &reply.command {
            Some(command) => format!(
                "no history of `{}` in {}: `bgwork history --cwd {}` lists the commands \
                 run there",
                inert(&cut(command, HISTORY_COMMAND_SHOWN)),
                inert(&reply.cwd),
                inert(&reply.cwd)
            ),
            None => format!(
                "no history in {}: a job or pane that ends there is kept",
                inert(&reply.cwd)
            ),
        };
    }
    let mut lines = vec![format!("in {}", inert(&reply.cwd))];
    for command in reply.commands.iter().take(HISTORY_SHOWN) {
        let ms = |ms: Option<u64>| {
            ms.map(crate::history::human_ms)
                .unwrap_or_else(|| "-".into())
        };
        lines.push(format!(
            "{}\n  {}; median {}, p90 {}",
            inert(&cut(&command.command, HISTORY_COMMAND_SHOWN)),
            inert(&command.expected),
            ms(command.median_ms),
            ms(command.p90_ms)
        ));
        let ends: Vec<String> = command
            .last
            .iter()
            .take(crate::history::RECENT)
            .map(|run| {
                let end = match (run.end, run.exit_code, run.signal) {
                    (_, _, Some(signal)) => format!("{} (sig {signal})", wire::name_of(&run.end)),
                    (End::Succeeded | End::Failed, Some(code), None) => {
                        format!("{} ({code})", wire::name_of(&run.end))
                    }
                    _ => wire::name_of(&run.end),
                };
                let whose = match run.session == session {
                    true => String::new(),
                    false => format!(" of session {}", inert(&run.session)),
                };
                format!("{}{whose} {end} in {}", inert(&run.id), ms(run.duration_ms))
            })
            .collect();
        lines.push(format!("  last: {}", ends.join(", ")));
    }
    if let Some(more) = reply
        .commands
        .len()
        .checked_sub(HISTORY_SHOWN)
        .filter(|n| *n > 0)
    {
        lines.push(format!(
            "{more} more commands, run less recently: `bgwork history -- CMD` shows one, \
             `--json` all"
        ));
    }
    lines.join("\n")
}

/// `waiting for bg-3 to succeed` under a waiting item (`start --after`).
fn waiting_line(item: &Item, pad: &str) -> Option<String> {
    let waiting_for = item.waiting_for.as_deref()?;
    Some(format!("{pad}{}", inert(waiting_for)))
}

/// `text` cut to at most `max` bytes (on a character boundary), with "…" when cut.
fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &text[..end]))
}

/// `listening: 127.0.0.1:5173 → http://127.0.0.1:5173/` under an item that listens.
fn listening_line(item: &Item, pad: &str) -> Option<String> {
    (!item.cost.listening.is_empty()).then(|| {
        format!(
            "{pad}listening: {}",
            inert(&observe::describe_listening(&item.cost.listening))
        )
    })
}

/// What an item's processes use and listen on, in words (empty when unknown).
fn cost_words(cost: &wire::Cost) -> String {
    let mut words = Vec::new();
    if let Some(cpu) = cost.cpu_ms {
        words.push(format!("cpu {}", observe::cpu_text(cpu)));
    }
    if let Some(rss) = cost.rss_bytes {
        words.push(format!("memory {}", observe::bytes_text(rss)));
    }
    if let Some(peak) = cost.peak_rss_bytes {
        words.push(format!("peak memory {}", observe::bytes_text(peak)));
    }
    if !cost.listening.is_empty() {
        words.push(format!(
            "listening: {}",
            inert(&observe::describe_listening(&cost.listening))
        ));
    }
    words.join("; ")
}

/// A duration in its largest whole unit: `45s`, `12m`, `3h`, `2d`.
/// The time left until something due: rounded up (`in 1s` for 0.3 s left), `now` once
/// it is due.
fn countdown(left: std::time::Duration) -> String {
    match left.is_zero() {
        true => "now".to_string(),
        false => {
            let up = left.as_millis().div_ceil(1000).min(u64::MAX as u128) as u64;
            format!("in {}", short_duration(std::time::Duration::from_secs(up)))
        }
    }
}

fn short_duration(age: std::time::Duration) -> String {
    let s = age.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn read_status_line(reply: &ReadReply) -> String {
    let id = inert(&reply.id);
    let cost = cost_words(&reply.cost);
    // A raw read's bytes came in a frame, not in `output`.
    let nothing = reply.output.is_empty() && reply.output_bytes.unwrap_or(0) == 0;
    if let (None, Some(live)) = (&reply.report, &reply.live) {
        // Waiting, or between two runs: not "still running".
        let live = inert(live);
        return match (nothing, cost.is_empty()) {
            (true, true) => format!("[{id} is {live}; no new output yet]"),
            (true, false) => format!("[{id} is {live}; no new output yet; {cost}]"),
            (false, true) => format!("[{id} is {live}]"),
            (false, false) => format!("[{id} is {live}; {cost}]"),
        };
    }
    match (&reply.report, reply.running) {
        (Some(report), _) => format!("[{}]", inert(report)),
        (None, true) if nothing && cost.is_empty() => {
            format!("[{id} is still running; no new output yet]")
        }
        (None, true) if nothing => {
            format!("[{id} is still running; no new output yet; {cost}]")
        }
        (None, _) if cost.is_empty() => format!("[{id} is still running]"),
        (None, _) => format!("[{id} is still running; {cost}]"),
    }
}

/// Prints a read: its output made inert (no copy when nothing acts on a terminal),
/// then its status line.
fn print_read(reply: &ReadReply) {
    let output = inert_lines(&reply.output);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(output.as_bytes());
    if !output.is_empty() && !output.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.write_all(read_status_line(reply).as_bytes());
    let _ = out.write_all(b"\n");
    if let Some(line) = unreachable_line(reply.host_unreachable.as_deref(), "") {
        let _ = out.write_all(format!("[{line}: output so far]\n").as_bytes());
    }
}

/// `read --grep` as grep prints it: `LINE:BYTE:TEXT` for a match, `LINE-BYTE-TEXT`
/// for context, `--` between groups that do not touch; `≥LINE` past the dropped middle.
fn grep_text(reply: &wire::GrepReply, pattern: &str) -> String {
    let mut out = String::new();
    let mut last: Option<u64> = None;
    let mut past_gap = false;
    let mut put = |out: &mut String, line: &wire::GrepLine, mark: char| {
        if line.line_at_least && !past_gap {
            past_gap = true;
            let dropped = match reply.dropped_bytes {
                0 => "the log cap dropped the middle of the output before here".to_string(),
                n => format!(
                    "{n} bytes dropped by the log cap (the first and newest bytes are kept)"
                ),
            };
            out.push_str(&format!(
                "[... {dropped}; line numbers below count kept lines only, the real ones are at \
                 least that ...]\n"
            ));
        } else if last.is_some_and(|n| line.line > n + 1) {
            out.push_str("--\n");
        }
        last = Some(line.line);
        let at_least = if line.line_at_least { "≥" } else { "" };
        out.push_str(&format!(
            "{at_least}{}{mark}{}{mark}{}\n",
            line.line,
            line.offset,
            inert(&line.text)
        ));
    };
    for m in &reply.matches {
        for line in &m.before {
            put(&mut out, line, '-');
        }
        put(&mut out, &m.line, ':');
        for line in &m.after {
            put(&mut out, line, '-');
        }
    }
    let id = inert(&reply.id);
    let count = reply.matches.len();
    let pattern = match pattern.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", inert(&pattern[..cut])),
        None => inert(pattern).into_owned(),
    };
    let status = match &reply.message {
        Some(message) => format!("{id}: {count} matching lines shown; {}", inert(message)),
        None if count == 0 => format!(
            "{id}: no line matches /{pattern}/ in bytes {}..{}",
            reply.from, reply.to
        ),
        None => format!(
            "{id}: {} of /{pattern}/ in bytes {}..{}",
            crate::history::plural(count, "matching line"),
            reply.from,
            reply.to
        ),
    };
    out.push_str(&format!("[{status}; the read position did not move]"));
    out
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

/// `wait`: one call, or calls of a day each until something happens (`--timeout
/// none`); prints what happened unless `--quiet`.
pub fn wait(
    paths: &crate::paths::Paths,
    session: &str,
    cmd: super::options::WaitCmd,
    json: bool,
) -> Result<ExitCode, WireError> {
    use super::options::Timeout;
    let unlimited = matches!(cmd.timeout, Some(Timeout::Unlimited));
    let args = wire::WaitArgs {
        ids: cmd.ids,
        all: cmd.all,
        until: cmd.until,
        timeout_s: match cmd.timeout {
            Some(Timeout::Seconds(s)) => Some(s),
            Some(Timeout::Unlimited) => Some(86_400.0),
            None => None,
        },
    };
    let envelope = Envelope {
        session: session.to_string(),
        request: Request::Wait(args.clone()),
    };
    let reply: WaitReply = loop {
        let mut client = Client::connect(paths)?;
        let reply: WaitReply = client.call(&envelope)?;
        if !(unlimited && reply.reason == WaitReason::Timeout) {
            break reply;
        }
    };
    if cmd.quiet {
    } else if json {
        print_text(&wire::to_json_text(&reply));
    } else {
        let waited = args.timeout_s.unwrap_or(50.0);
        print_text(&wait_text(&reply, Some(waited), args.until.as_deref()));
    }
    Ok(wait_code(&reply))
}

/// `read --follow`: prints what is new, waits for a new line or the end, and again;
/// once the item has ended, prints its end (on stderr) and exits with its code.
pub fn follow_output(
    paths: &crate::paths::Paths,
    session: &str,
    id: &str,
    max_bytes: Option<usize>,
    no_redact: bool,
    json: bool,
) -> Result<ExitCode, WireError> {
    let call = |request: Request| -> Result<Vec<u8>, WireError> {
        let envelope = Envelope {
            session: session.to_string(),
            request,
        };
        let mut client = Client::connect(paths)?;
        client.send(&envelope)?;
        client.next_line()?.ok_or_else(|| {
            WireError::new(
                wire::ErrorCode::Unavailable,
                "the daemon closed the connection",
            )
        })
    };
    let mut out = std::io::stdout();
    loop {
        let read: ReadReply = wire::decode_reply(&call(Request::Read(wire::ReadArgs {
            id: id.to_string(),
            max_bytes,
            no_redact,
            ..wire::ReadArgs::default()
        }))?)?;
        if json {
            let _ = writeln!(out, "{}", serde_json::to_string(&read).unwrap_or_default());
        } else {
            let _ = out.write_all(read.output.as_bytes());
        }
        let _ = out.flush();
        // Until a new line comes (any line matches) or the item ends.
        let waited: WaitReply = wire::decode_reply(&call(Request::Wait(wire::WaitArgs {
            ids: vec![id.to_string()],
            all: false,
            until: read.running.then(String::new),
            timeout_s: Some(if read.running { 50.0 } else { 0.0 }),
        }))?)?;
        if read.running || waited.reason != WaitReason::Ended {
            continue;
        }
        let item = waited.items.first();
        if let Some(report) = item.and_then(|i| i.report.as_ref()) {
            if !json {
                eprintln!("[{report}]");
            }
        }
        let code = match item.map(|i| (i.exit_code, i.signal, i.end)) {
            Some((Some(code), _, _)) => code,
            Some((None, Some(signal), _)) => 128 + signal,
            Some((None, None, Some(end))) if crate::end::is_failure(end) => 1,
            _ => 0,
        };
        return Ok(ExitCode::from(code.clamp(0, 255) as u8));
    }
}

/// 0 when the items ended well or the pattern matched; 1 on a timeout or a failure.
fn wait_code(reply: &WaitReply) -> ExitCode {
    let failed = reply.reason == WaitReason::Timeout
        || reply
            .items
            .iter()
            .any(|i| i.end.is_some_and(crate::end::is_failure) || never_ran(i));
    match failed {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    }
}

/// A job cancelled while it waited (`start --after`; only a waiting job ends so): what
/// it was to run never ran, which a `wait` on it reports as a failure (a pane closed by
/// its person, also `cancelled`, ran and is not one).
fn never_ran(item: &Item) -> bool {
    item.end == Some(End::Cancelled) && item.kind == wire::Kind::Job
}

fn wait_text(reply: &WaitReply, waited_s: Option<f64>, until: Option<&str>) -> String {
    // What has not ended, each as it is: "bg-2 is waiting for bg-1 to succeed".
    let running: Vec<String> = reply
        .items
        .iter()
        .filter(|i| i.report.is_none())
        .map(|i| match i.not_running_words() {
            Some(words) => format!("{} is {}", inert(&i.id), inert(&words)),
            None => inert(&i.id).into_owned(),
        })
        .collect();
    let all_running = reply
        .items
        .iter()
        .all(|i| i.report.is_some() || i.not_running_words().is_none());
    let mut text = match (&reply.reason, &reply.matched) {
        (WaitReason::Matched, Some(line)) => format!("matched: {}\n", inert(line)),
        (WaitReason::Timeout, _) => {
            let mut head = match waited_s {
                Some(s) => format!("timed out after {s} s"),
                None => "timed out".to_string(),
            };
            if let Some(pattern) = until {
                head.push_str(&format!(
                    ": /{}/ was not seen in new output",
                    inert(pattern)
                ));
            }
            match running.as_slice() {
                [] => {}
                many if !all_running => head.push_str(&format!("; {}", many.join("; "))),
                [one] => head.push_str(&format!("; {one} is still running")),
                many => head.push_str(&format!("; {} are still running", many.join(", "))),
            }
            head + "\n"
        }
        _ => String::new(),
    };
    let one = reply.items.len() == 1;
    for item in &reply.items {
        let tail = reply.tails.get(&item.id).filter(|t| !t.is_empty());
        match (&item.report, reply.reason) {
            (Some(report), _) => {
                text.push_str(&inert(report));
                text.push('\n');
            }
            // A timeout already named what still runs; a match names it here.
            (None, WaitReason::Timeout) if one => {}
            (None, WaitReason::Timeout) if tail.is_some() => {
                text.push_str(&format!("{}:\n", inert(&item.id)));
            }
            (None, WaitReason::Timeout) => {}
            (None, _) => text.push_str(&format!(
                "{} is {}\n",
                inert(&item.id),
                inert(&item.live_words().unwrap_or_else(|| "still running".into()))
            )),
        }
        if let Some(tail) = tail {
            text.push_str(&indent(tail));
        }
    }
    text
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

fn indent(text: &str) -> String {
    let mut out: String = text
        .lines()
        .map(|line| format!("  | {}\n", inert(line)))
        .collect();
    if out.is_empty() && !text.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::countdown;
    use std::time::Duration;

    #[test]
    fn a_countdown_rounds_up_and_says_now_once_due() {
        assert_eq!(countdown(Duration::from_millis(300)), "in 1s");
        assert_eq!(countdown(Duration::from_millis(4_001)), "in 5s");
        assert_eq!(countdown(Duration::from_secs(4)), "in 4s");
        assert_eq!(countdown(Duration::ZERO), "now");
    }
}
