//! `list` as text: one row an item, and the lines under it (what it waits for, listens
//! on, is expected to take, its restarts), which `start` shows too.

use super::terminal::{inert, label};
use crate::observe;
use crate::wire::{self, End, Item, ListReply, State};

pub(super) fn list_text(reply: &ListReply) -> String {
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
pub(super) fn sessions_text(reply: &ListReply) -> String {
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
pub(super) fn restart_line(item: &Item, pad: &str, now: std::time::SystemTime) -> Option<String> {
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
pub(super) fn logout_line(item: &Item, pad: &str) -> Option<String> {
    let why = item.logout_warning.as_deref()?;
    Some(format!("{pad}warning: {}", inert(why)))
}

pub(super) fn unreachable_line(unreachable: Option<&str>, pad: &str) -> Option<String> {
    unreachable.map(|why| format!("{pad}{}", inert(why)))
}

pub(super) fn expected_line(item: &Item, pad: &str) -> Option<String> {
    let expected = item.expected.as_deref()?;
    let line = match (&item.progress, expected.find(" (")) {
        (Some(progress), Some(at)) => format!("{progress}{}", &expected[at..]),
        _ => expected.to_string(),
    };
    Some(format!("{pad}history: {}", inert(&line)))
}

/// `waiting for bg-3 to succeed` under a waiting item (`start --after`).
fn waiting_line(item: &Item, pad: &str) -> Option<String> {
    let waiting_for = item.waiting_for.as_deref()?;
    Some(format!("{pad}{}", inert(waiting_for)))
}

/// `listening: 127.0.0.1:5173 → http://127.0.0.1:5173/` under an item that listens.
pub(super) fn listening_line(item: &Item, pad: &str) -> Option<String> {
    (!item.cost.listening.is_empty()).then(|| {
        format!(
            "{pad}listening: {}",
            inert(&observe::describe_listening(&item.cost.listening))
        )
    })
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
