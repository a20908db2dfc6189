//! `bgwork hook claude-code`: delivers the session's pending notices at Claude Code's
//! turn boundaries, as the additional context its hooks may return.
//!
//! Reads one hook event (JSON) on stdin. On `SessionStart`, `UserPromptSubmit` and
//! `PostToolUse` it prints `hookSpecificOutput.additionalContext` with the notices
//! (marking them delivered); with nothing pending it prints nothing. On `Stop`, with
//! `--wait-on-stop`, it blocks the stop while work armed with `--notify` still runs.
//! A hook must never break the harness: every failure prints nothing and exits 0.

use crate::client::Client;
use crate::paths::Paths;
use crate::wire::{Envelope, ListReply, Notice, NoticesReply, Request, WireError};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::ExitCode;

/// The session the hook speaks for: `BGWORK_SESSION`, else the harness's session id.
pub fn session_of(event: &Value) -> String {
    std::env::var("BGWORK_SESSION")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| event["session_id"].as_str().map(String::from))
        .unwrap_or_else(|| "default".to_string())
}

pub fn claude_code(paths: &Paths, wait_on_stop: bool) -> ExitCode {
    let mut input = String::new();
    let _ = std::io::stdin().read_to_string(&mut input);
    let event: Value = serde_json::from_str(&input).unwrap_or(Value::Null);
    let session = session_of(&event);
    let name = event["hook_event_name"].as_str().unwrap_or("");
    let reply = match respond(paths, &session, name, &event, wait_on_stop) {
        Ok(reply) => reply,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "bgwork hook: {}", e.message);
            None
        }
    };
    if let Some(reply) = reply {
        println!("{reply}");
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
    if let Ok(mut env) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
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
    let list: ListReply = call(paths, session, Request::List { all: false })?;
    Ok(list
        .items
        .iter()
        .filter(|item| item.notify)
        .map(|item| {
            format!(
                "{} ({})",
                item.id,
                item.name.as_deref().unwrap_or(&item.command)
            )
        })
        .collect())
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
