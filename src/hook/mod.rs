//! `bgwork hook HARNESS`: delivers the session's pending notices at an agent harness's
//! turn boundaries, as the additional context its hooks may return (Claude Code, Codex
//! CLI and Gemini CLI speak the same shape: `hookSpecificOutput.additionalContext`).
//!
//! Reads one hook event (JSON) on stdin. On the harness's context events (Claude Code
//! and Codex: `SessionStart`, `UserPromptSubmit`, `PostToolUse`; Gemini: `SessionStart`,
//! `BeforeAgent`, `AfterTool`) it prints the notices, at most
//! [`max_notices_per_turn`] of them (marking them delivered; the rest stay pending and
//! the text ends with how many). With nothing pending it prints nothing (Gemini: `{}`).
//! On the end of a turn (`Stop`; Gemini: `AfterAgent`), with `--wait-on-stop`, it
//! blocks the stop while work armed with `--notify` still runs (jobs, panes, sub-agents
//! and monitor waits; never a watch, which has no end to await).
//! A hook must never break the harness: every failure prints nothing and exits 0, and
//! it answers within `HOOK_DEADLINE` whatever the daemon does (stopped, hung, slow to
//! start): past it, it says one line on stderr and leaves the notices for a later turn.
//! `--rewake` (Claude Code) is the other kind: see [`rewake`].

mod rewake;

pub use rewake::rewake;

use crate::client::{self, Client};
use crate::delivery::{max_notices_per_turn, notices_note, Claimed, Delivery};
use crate::paths::Paths;
use crate::wire::{Envelope, Item, Kind, ListReply, Notice, Request, WireError};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;
use std::time::Duration;

/// How long the hook works at most (a harness waits on its hooks; under 2 s in all).
const HOOK_DEADLINE: Duration = Duration::from_millis(1250);
/// The most of a hook event read (events are small; a prompt is its largest part).
const MAX_EVENT: u64 = 16 << 20;
/// The most characters of context one turn boundary delivers (Claude Code's cap on
/// additional context is 10,000).
const CONTEXT_BUDGET: usize = 9_000;

/// The session the hook speaks for: `BGWORK_SESSION`, else the harness's session id.
pub fn session_of(event: &Value) -> String {
    named_session(event).unwrap_or_else(|| "default".to_string())
}

/// `BGWORK_SESSION`, else the harness's session id; `None` when neither says.
fn named_session(event: &Value) -> Option<String> {
    std::env::var("BGWORK_SESSION")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| event["session_id"].as_str().map(String::from))
}

/// The harnesses whose hooks bgwork answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Harness {
    ClaudeCode,
    Codex,
    Gemini,
}

impl Harness {
    /// Whether the event may carry additional context for the model.
    fn takes_context(self, event: &str) -> bool {
        match self {
            Harness::ClaudeCode | Harness::Codex => {
                matches!(event, "SessionStart" | "UserPromptSubmit" | "PostToolUse")
            }
            Harness::Gemini => matches!(event, "SessionStart" | "BeforeAgent" | "AfterTool"),
        }
    }

    /// The event that ends a turn, and the word of its output that blocks the end.
    fn stop(self) -> (&'static str, &'static str) {
        match self {
            Harness::ClaudeCode | Harness::Codex => ("Stop", "block"),
            Harness::Gemini => ("AfterAgent", "deny"),
        }
    }

    /// What the hook prints with nothing to say: Gemini parses stdout as JSON.
    fn nothing(self) -> Option<Value> {
        (self == Harness::Gemini).then(|| json!({}))
    }
}

/// What a hook prints, and the notices it shows, claimed for its connection until it
/// acknowledges them once printed.
struct Reply {
    output: Option<Value>,
    shown: Option<(Delivery, Vec<String>)>,
}

/// `bgwork hook claude-code|codex|gemini`.
pub fn run(paths: &Paths, harness: Harness, wait_on_stop: bool) -> ExitCode {
    let (answer, answered) = std::sync::mpsc::channel();
    let worker_paths = paths.clone();
    let event_read = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let read = event_read.clone();
    // The work runs on a thread that is simply left behind (and ends with the process)
    // when it takes too long: nothing it could be blocked in is allowed to hold the hook.
    // Notices it took and did not print are released when the process ends.
    std::thread::spawn(move || {
        let event = read_event();
        read.store(true, std::sync::atomic::Ordering::SeqCst);
        let event = event.unwrap_or(Value::Null);
        let session = session_of(&event);
        let name = event["hook_event_name"].as_str().unwrap_or("");
        let reply = respond(&worker_paths, harness, &session, name, &event, wait_on_stop);
        let _ = answer.send(reply);
    });
    let started = std::time::Instant::now();
    let reply = match answered.recv_timeout(HOOK_DEADLINE) {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => {
            crate::note!("bgwork hook: {}", e.message);
            Reply {
                output: None,
                shown: None,
            }
        }
        Err(_) if !event_read.load(std::sync::atomic::Ordering::SeqCst) => {
            crate::note!(
                "bgwork hook: no hook event on stdin within {:.2} s (it must end with EOF); nothing to say",
                HOOK_DEADLINE.as_secs_f64()
            );
            Reply {
                output: None,
                shown: None,
            }
        }
        Err(_) => {
            crate::note!(
                "bgwork hook: no answer within {:.2} s from the daemon of {} ({}); notices wait for a later turn",
                HOOK_DEADLINE.as_secs_f64(),
                paths.home.display(),
                client::describe_daemon(paths)
            );
            Reply {
                output: None,
                shown: None,
            }
        }
    };
    let Some(output) = reply.output.or_else(|| harness.nothing()) else {
        return ExitCode::SUCCESS;
    };
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "{output}")
        .and_then(|()| stdout.flush())
        .is_ok()
    {
        if let Some((delivery, ids)) = reply.shown {
            acknowledge(
                delivery,
                ids,
                HOOK_DEADLINE.saturating_sub(started.elapsed()),
            );
        }
    }
    ExitCode::SUCCESS
}

/// Marks the printed notices delivered, waiting for the daemon at most `patience` (past
/// it, the hook ends and they are released: at worst shown again, never lost).
fn acknowledge(mut delivery: Delivery, ids: Vec<String>, patience: Duration) {
    let (done, acked) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(delivery.acknowledge(&ids).is_ok());
    });
    let patience = patience.max(Duration::from_millis(250));
    if !matches!(acked.recv_timeout(patience), Ok(true)) {
        crate::note!(
            "bgwork hook: the daemon did not confirm the notices shown; they may come again"
        );
    }
}

/// The hook event on stdin (at most `MAX_EVENT` bytes), if it is a JSON object.
fn read_event() -> Option<Value> {
    let mut input = Vec::new();
    let _ = std::io::stdin().take(MAX_EVENT).read_to_end(&mut input);
    serde_json::from_slice::<Value>(&input)
        .ok()
        .filter(Value::is_object)
}

fn respond(
    paths: &Paths,
    harness: Harness,
    session: &str,
    name: &str,
    event: &Value,
    wait_on_stop: bool,
) -> Result<Reply, WireError> {
    let (stop, block) = harness.stop();
    if harness.takes_context(name) {
        if name == "SessionStart" && harness == Harness::ClaudeCode {
            remember_session(session);
        }
        let mut delivery = Delivery::connect(paths, session)?;
        let taken = claim(&mut delivery, named_session(event).is_some())?;
        if taken.is_empty() {
            return Ok(Reply {
                output: None,
                shown: None,
            });
        }
        let output = json!({
            "hookSpecificOutput": {
                "hookEventName": name,
                "additionalContext": context(&taken.notices, taken.more),
            }
        });
        return Ok(Reply {
            output: Some(output),
            shown: Some((delivery, taken.ids())),
        });
    }
    let mut output = None;
    if name == stop && wait_on_stop && !event["stop_hook_active"].as_bool().unwrap_or(false) {
        let armed = armed_and_running(paths, session)?;
        output = (!armed.is_empty()).then(|| {
            json!({
                "decision": block,
                "reason": format!(
                    "Work you asked to hear about has not ended yet: {}. Call `bgwork wait {}` \
                     (it blocks until they end) before finishing, or stop them if they are \
                     no longer needed.",
                    armed.join(", "),
                    armed.iter().map(|a| a.split(' ').next().unwrap_or("")).collect::<Vec<_>>().join(" ")
                ),
            })
        });
    }
    Ok(Reply {
        output,
        shown: None,
    })
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

/// Claims the session's notices for this turn boundary. With `bind` (a session the
/// harness or `BGWORK_SESSION` named), the same request tells the daemon that the
/// session is the conversation of the hook's harness process, which the harness's MCP
/// servers then join (contract §11). A hook that cannot say so still delivers.
fn claim(delivery: &mut Delivery, bind: bool) -> Result<Claimed, WireError> {
    let harness = bind.then(crate::harness::harness_of_this_process).flatten();
    let Some(harness) = harness else {
        return delivery.claim(max_notices_per_turn(), None);
    };
    let (taken, unbound) = delivery.bind_and_claim(harness, max_notices_per_turn())?;
    if let Some(reason) = unbound {
        crate::note!("bgwork hook: could not bind the harness's session: {reason}");
    }
    Ok(taken)
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
            let what = item.name.as_deref().unwrap_or(&item.command);
            match item.not_running_words() {
                // Waiting, or between two runs: said as it is, not as running.
                Some(words) => format!("{} ({what}; {words})", item.id),
                None => format!("{} ({what})", item.id),
            }
        })
        .collect())
}

/// Whether an item is a watch (`monitor watch`), whose record's command the daemon
/// writes as `watch output ID …` or `watch file PATH …`.
fn is_watch(item: &Item) -> bool {
    item.kind == Kind::Monitor && item.command.starts_with("watch ")
}

/// The notices as context for the model: one report per notice, with its last lines,
/// then [`notices_note`]. The whole stays under `CONTEXT_BUDGET` characters (Claude
/// Code moves longer context to a file and shows the model a preview): the tails share
/// what the reports leave, each keeping its newest lines.
pub fn context(notices: &[Notice], more: u64) -> String {
    let head = "bgwork: background work ended since your last turn.\n";
    let reports: Vec<String> = notices
        .iter()
        .map(|notice| {
            format!(
                "- {}: `bgwork read {}` for its output [{}]\n",
                notice.text, notice.item, notice.id
            )
        })
        .collect();
    let note = notices_note(more);
    let fixed = head.chars().count()
        + reports.iter().map(|r| r.chars().count()).sum::<usize>()
        + note.chars().count()
        + 1;
    let tails: usize = notices
        .iter()
        .map(|n| tail_lines(&n.tail, usize::MAX).0.chars().count())
        .sum();
    let share = if fixed + tails <= CONTEXT_BUDGET {
        usize::MAX
    } else {
        CONTEXT_BUDGET.saturating_sub(fixed) / notices.len().max(1)
    };
    let mut text = String::from(head);
    let mut shortened = false;
    for (notice, report) in notices.iter().zip(&reports) {
        text.push_str(report);
        let (lines, cut) = tail_lines(&notice.tail, share);
        text.push_str(&lines);
        shortened |= cut;
    }
    if shortened {
        text.push_str("(last lines shortened: `bgwork read ID --tail 50` shows more)\n");
    }
    text.push_str(&note);
    text.push('\n');
    text
}

/// A notice's tail as indented lines, the newest that fit in `budget` characters, and
/// whether older lines were left out.
fn tail_lines(tail: &str, budget: usize) -> (String, bool) {
    let mut kept: Vec<String> = Vec::new();
    let mut used = 0;
    for line in tail.lines().rev() {
        let line = format!("    | {line}\n");
        let len = line.chars().count();
        if used + len > budget {
            if kept.is_empty() {
                // Even the newest line is too long: its end.
                let room = budget.saturating_sub(8);
                let end: String = line.trim_end().chars().rev().take(room).collect();
                let end: String = end.chars().rev().collect();
                kept.push(format!("    | …{end}\n"));
            }
            return (kept.into_iter().rev().collect(), true);
        }
        used += len;
        kept.push(line);
    }
    (kept.into_iter().rev().collect(), false)
}
