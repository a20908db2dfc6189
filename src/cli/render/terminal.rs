//! Texts from callers and jobs made inert for a terminal, and printed.

use crate::wire::Item;
use std::borrow::Cow;
use std::io::Write;

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

pub(crate) fn print_text(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.is_empty() && !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
}

pub(super) fn label(item: &Item) -> String {
    inert(item.name.as_deref().unwrap_or(&item.command)).into_owned()
}

pub(super) fn indent(text: &str) -> String {
    let mut out: String = text
        .lines()
        .map(|line| format!("  | {}\n", inert(line)))
        .collect();
    if out.is_empty() && !text.is_empty() {
        out.push('\n');
    }
    out
}
