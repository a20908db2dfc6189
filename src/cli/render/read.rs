//! `read` as text: its output and status line, and `read --grep`'s matching lines.

use super::list::unreachable_line;
use super::terminal::{inert, inert_lines};
use crate::observe;
use crate::wire::{self, ReadReply};
use std::io::Write;

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

pub(super) fn read_status_line(reply: &ReadReply) -> String {
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
pub(super) fn print_read(reply: &ReadReply) {
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
pub(super) fn grep_text(reply: &wire::GrepReply, pattern: &str) -> String {
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
