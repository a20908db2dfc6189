//! `bgwork hook claude-code`: delivers the session's pending notices at Claude Code's
//! turn boundaries, as the additional context its hooks may return.
//!
//! Reads one hook event (JSON) on stdin. On `SessionStart`, `UserPromptSubmit` and
//! `PostToolUse` it prints `hookSpecificOutput.additionalContext` with the notices
//! (marking them delivered); with nothing pending it prints nothing. On `Stop`, with
//! `--wait-on-stop`, it blocks the stop while work armed with `--notify` still runs
//! (jobs, panes, sub-agents and monitor waits; never a watch, which has no end to await).
//! A hook must never break the harness: every failure prints nothing and exits 0, and
//! it answers within `HOOK_DEADLINE` whatever the daemon does (stopped, hung, slow to
//! start): past it, it says one line on stderr and leaves the notices for a later turn.

use crate::client::{self, Client};
use crate::paths::Paths;
use crate::wire::{Envelope, Item, Kind, ListReply, Notice, NoticesReply, Request, WireError};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;
use std::time::Duration;

/// How long the hook works at most (a harness waits on its hooks; under 2 s in all).
const HOOK_DEADLINE: Duration = Duration::from_millis(1250);
/// The most of a hook event read (events are small; a prompt is its largest part).
const MAX_EVENT: u64 = 16 << 20;

/// The session the hook speaks for: `BGWORK_SESSION`, else the harness's session id.
pub fn session_of(event: &Value) -> String {
    std::env::var("BGWORK_SESSION")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| event["session_id"].as_str().map(String::from))
        .unwrap_or_else(|| "default".to_string())
}

pub fn claude_code(paths: &Paths, wait_on_stop: bool) -> ExitCode {
    let (answer, answered) = std::sync::mpsc::channel();
    let worker_paths = paths.clone();
    let event_read = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let read = event_read.clone();
    // The work runs on a thread that is simply left behind (and ends with the process)
    // when it takes too long: nothing it could be blocked in is allowed to hold the hook.
    std::thread::spawn(move || {
        let mut input = String::new();
        let _ = std::io::stdin().take(MAX_EVENT).read_to_string(&mut input);
        read.store(true, std::sync::atomic::Ordering::SeqCst);
        let event: Value = serde_json::from_str(&input).unwrap_or(Value::Null);
        let session = session_of(&event);
        let name = event["hook_event_name"].as_str().unwrap_or("");
        let _ = answer.send(respond(&worker_paths, &session, name, &event, wait_on_stop));
    });
    match answered.recv_timeout(HOOK_DEADLINE) {
        Ok(Ok(Some(reply))) => {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{reply}").and_then(|()| stdout.flush());
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => crate::note!("bgwork hook: {}", e.message),
        Err(_) if !event_read.load(std::sync::atomic::Ordering::SeqCst) => crate::note!(
            "bgwork hook: no hook event on stdin within {:.2} s (it must end with EOF); nothing to say",
            HOOK_DEADLINE.as_secs_f64()
        ),
        Err(_) => crate::note!(
            "bgwork hook: no answer within {:.2} s from the daemon of {} ({}); notices wait for a later turn",
            HOOK_DEADLINE.as_secs_f64(),
            paths.home.display(),
            client::describe_daemon(paths)
        ),
    }
    ExitCode::SUCCESS
}

fn respond(
    paths: &Paths,
    session: &str,
    name: &str,
    event: &Value,
    wait_on_stop: bool,
) -> Result<Option<Value>, WireError> {
    match name {
        "SessionStart" | "UserPromptSubmit" | "PostToolUse" => {
            if name == "SessionStart" {
                remember_session(session);
            }
            let notices = take_notices(paths, session)?;
            Ok((!notices.is_empty()).then(|| {
                json!({
                    "hookSpecificOutput": {
                        "hookEventName": name,
                        "additionalContext": context(&notices),
                    }
                })
            }))
        }
        "Stop" if wait_on_stop && !event["stop_hook_active"].as_bool().unwrap_or(false) => {
            let armed = armed_and_running(paths, session)?;
            Ok((!armed.is_empty()).then(|| {
                json!({
                    "decision": "block",
                    "reason": format!(
                        "Work you asked to hear about is still running: {}. Call `bgwork wait {}` \
                         (it blocks until they end) before finishing, or stop them if they are \
                         no longer needed.",
                        armed.join(", "),
                        armed.iter().map(|a| a.split(' ').next().unwrap_or("")).collect::<Vec<_>>().join(" ")
                    ),
                })
            }))
        }
        _ => Ok(None),
    }
}

/// Lets the agent's own `bgwork` calls use the hook's session, where the harness offers
/// an environment file for the commands it runs.
fn remember_session(session: &str) {
    let Some(file) = std::env::var_os("CLAUDE_ENV_FILE") else {
        return;
    };
    let quoted = session.replace('\'', r"'\''");
    // Non-blocking: a FIFO with no reader is refused rather than waited on.
    if let Ok(mut env) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(file)
    {
        let _ = writeln!(env, "export BGWORK_SESSION='{quoted}'");
    }
}

fn call<T: serde::de::DeserializeOwned>(
    paths: &Paths,
    session: &str,
    request: Request,
) -> Result<T, WireError> {
    let envelope = Envelope {
        session: session.to_string(),
        request,
    };
    Client::connect(paths)?.call(&envelope)
}

fn take_notices(paths: &Paths, session: &str) -> Result<Vec<Notice>, WireError> {
    let request = Request::Notices {
        peek: false,
        follow: false,
        wait_s: None,
        ack: false,
    };
    Ok(call::<NoticesReply>(paths, session, request)?.notices)
}

fn armed_and_running(paths: &Paths, session: &str) -> Result<Vec<String>, WireError> {
    let list: ListReply = call(
        paths,
        session,
        Request::List {
            all: false,
            all_sessions: false,
        },
    )?;
    Ok(list
        .items
        .iter()
        // A watch never ends by itself: waiting on it would block the stop for good.
        .filter(|item| item.notify && !is_watch(item))
        .map(|item| {
            format!(
                "{} ({})",
                item.id,
                item.name.as_deref().unwrap_or(&item.command)
            )
        })
        .collect())
}

/// Whether an item is a watch (`monitor watch`), whose record's command the daemon
/// writes as `watch output ID …` or `watch file PATH …`.
fn is_watch(item: &Item) -> bool {
    item.kind == Kind::Monitor && item.command.starts_with("watch ")
}

/// The notices as context for the model: one report per notice, with its last lines.
pub fn context(notices: &[Notice]) -> String {
    let mut text = String::from("bgwork: background work ended since your last turn.\n");
    for notice in notices {
        text.push_str(&format!("- {} [{}]\n", notice.text, notice.id));
        for line in notice.tail.lines() {
            text.push_str(&format!("    | {line}\n"));
        }
    }
    text
}
