//! Sending a request and printing its reply: text for people and models, or `--json`.
//!
//! Every text in a reply came from a caller or a job (names, commands, output, reports,
//! even errors that quote an argument). Printed as text, each goes through [`inert`] or
//! [`inert_lines`] first, so that no escape sequence reaches the reader's terminal: none
//! sets its title, clears its screen or forges a line (SPEC §8). `--json` prints exact
//! JSON, whose escaping is enough.

use crate::client::Client;
use crate::wire::{
    self, Ack, Envelope, GcReply, Item, ListReply, NoticesReply, ReadReply, Request, RunOutcome,
    RunReply, StartReply, State, StatusReply, WaitReason, WaitReply, WireError,
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
        Request::List { .. } => print(client, &envelope, json, list_text),
        Request::Read(args) => {
            let reply: ReadReply = client.call(&envelope)?;
            if json {
                println!("{}", wire::to_json_text(&reply));
            } else if args.screen {
                print_text(&inert_lines(&reply.output));
            } else if args.raw {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(reply.output_base64.as_deref().unwrap_or(""))
                    .unwrap_or_default();
                let _ = std::io::stdout().write_all(&bytes);
                eprintln!("{}", read_status_line(&reply));
            } else {
                print_text(&read_text(&reply));
            }
            Ok(ExitCode::SUCCESS)
        }
        Request::Run(_) => run(client, &envelope, json),
        Request::Send(_)
        | Request::Dismiss { .. }
        | Request::Shutdown { .. }
        | Request::Ack { .. }
        | Request::Resize { .. } => print(client, &envelope, json, |ack: &Ack| {
            inert(&ack.message).into_owned()
        }),
        Request::Stop(_) => print(client, &envelope, json, stop_text),
        Request::Wait(_) => {
            let reply: WaitReply = client.call(&envelope)?;
            if json {
                println!("{}", wire::to_json_text(&reply));
            } else {
                print_text(&wait_text(&reply));
            }
            let failed = reply.reason == WaitReason::Timeout
                || reply
                    .items
                    .iter()
                    .any(|i| i.end.is_some_and(crate::end::is_failure));
            Ok(if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Request::Notices { follow: true, .. } => super::follow::follow(client, &envelope, json),
        Request::Notices { .. } => print(client, &envelope, json, notices_text),
        Request::Gc => print(client, &envelope, json, |gc: &GcReply| {
            format!(
                "removed {} ended record(s), freed {} bytes",
                gc.removed, gc.freed_bytes
            )
        }),
        Request::Status => print(client, &envelope, json, status_text),
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
        println!("{}", wire::to_json_text(&reply));
    } else {
        print_text(&text(&reply));
    }
    Ok(ExitCode::SUCCESS)
}

/// `run`: streams output chunks, then exits with the command's own status when it
/// ended in time, 0 when it was promoted, 1 when it was killed.
fn run(client: &mut Client, envelope: &Envelope, json: bool) -> Result<ExitCode, WireError> {
    client.send(envelope)?;
    if matches!(&envelope.request, Request::Run(args) if args.stdin == wire::RunStdin::Forward) {
        let writer = client.writer()?;
        std::thread::spawn(move || forward_stdin(writer));
    }
    let mut out = std::io::stdout();
    let reply: RunReply = loop {
        let line = client.next_line()?.ok_or_else(|| {
            WireError::new(
                wire::ErrorCode::Unavailable,
                "the daemon closed the connection",
            )
        })?;
        if let Ok(chunk) = serde_json::from_slice::<wire::Chunk>(&line) {
            let _ = out.write_all(inert_lines(&chunk.chunk).as_bytes());
            let _ = out.flush();
            continue;
        }
        break wire::decode_reply(&line)?;
    };
    if json {
        println!("{}", wire::to_json_text(&reply));
    } else {
        let _ = out.write_all(inert_lines(&reply.output).as_bytes());
        if reply.outcome != RunOutcome::Ended {
            eprintln!("[{}]", inert(&reply.message));
        }
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
fn forward_stdin(mut writer: std::os::unix::net::UnixStream) {
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
        };
        if writer.write_all(&wire::encode_line(&frame)).is_err() || n == 0 {
            return;
        }
    }
}

/// Prints a plain message (or `{"message":…}` with `--json`).
pub fn say(json: bool, message: &str) {
    if json {
        println!(
            "{}",
            wire::to_json_text(&Ack {
                ok: true,
                message: message.to_string()
            })
        );
    } else {
        println!("{}", inert_lines(message));
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
    if !text.chars().any(acts) {
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

fn print_text(text: &str) {
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
    let mut text = format!(
        "{} started{}: {}\n",
        inert(&item.id),
        item.pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        label(item)
    );
    text.push_str(&inert_lines(&reply.output));
    if !reply.output.is_empty() && !reply.output.ends_with('\n') {
        text.push('\n');
    }
    let id = inert(&item.id);
    match &item.report {
        Some(report) => text.push_str(&inert(report)),
        None if item.notify => {
            text.push_str(&format!("[{id} runs on; a notice will come when it ends]"))
        }
        None => text.push_str(&format!(
            "[{id} runs on: `bgwork read {id}` for new output, `bgwork wait {id}` to wait]"
        )),
    }
    text
}

fn list_text(reply: &ListReply) -> String {
    if reply.items.is_empty() {
        return "no work".to_string();
    }
    // Ids of sub-agents' items (`sub-1/bg-2`) are longer: the column fits the longest.
    let width = reply
        .items
        .iter()
        .map(|item| inert(&item.id).chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    reply
        .items
        .iter()
        .map(|item| {
            let state = match (&item.state, &item.end) {
                (State::Ended, Some(end)) => wire::name_of(end),
                (state, _) => wire::name_of(state),
            };
            // A sub-agent's item says whose it is in its id (`sub-1/bg-2`).
            let id = inert(&item.id);
            format!("{id:<width$} {state:<16} {}", label(item))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn read_status_line(reply: &ReadReply) -> String {
    let id = inert(&reply.id);
    match (&reply.report, reply.running) {
        (Some(report), _) => format!("[{}]", inert(report)),
        (None, true) if reply.output.is_empty() => {
            format!("[{id} is still running; no new output yet]")
        }
        (None, _) => format!("[{id} is still running]"),
    }
}

fn read_text(reply: &ReadReply) -> String {
    let mut text = inert_lines(&reply.output).into_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&read_status_line(reply));
    text
}

fn stop_text(item: &Item) -> String {
    let id = inert(&item.id);
    match &item.report {
        Some(report) => inert(report).into_owned(),
        None => format!("stop requested: {id} has not ended yet; `bgwork wait {id}` to see it end"),
    }
}

fn wait_text(reply: &WaitReply) -> String {
    let mut text = match (&reply.reason, &reply.matched) {
        (WaitReason::Matched, Some(line)) => format!("matched: {}\n", inert(line)),
        (WaitReason::Timeout, _) => "timed out; still running:\n".to_string(),
        _ => String::new(),
    };
    for item in &reply.items {
        let head = match &item.report {
            Some(report) => inert(report).into_owned(),
            None => format!("{} is still running", inert(&item.id)),
        };
        text.push_str(&head);
        text.push('\n');
        if let Some(tail) = reply.tails.get(&item.id).filter(|t| !t.is_empty()) {
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
    format!(
        "daemon pid {} (bgwork {})\nhome    {}\nsocket  {}\nrunning {}",
        status.pid, status.version, status.home, status.socket, status.running
    )
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
