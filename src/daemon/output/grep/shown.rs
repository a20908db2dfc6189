//! How a line found by `read --grep` is shown in its reply: as `read` shows it
//! (escapes stripped, `\r` rewrites collapsed, bad UTF-8 replaced), clipped around its
//! match when long, and what it costs of the reply's text.

use crate::output;
use crate::wire::GrepLine;
use memchr::memchr;
use std::borrow::Cow;
use std::ops::Range;

/// A line shown longer than this is clipped around its match.
pub(super) const SHOWN: usize = 2 << 10;

/// The text of a line as `read` shows it: escapes stripped, `\r` rewrites collapsed,
/// bad UTF-8 replaced (plain text is borrowed).
pub(super) fn render(bytes: &[u8]) -> Cow<'_, str> {
    match first_unplain(bytes) {
        None => String::from_utf8_lossy(bytes),
        Some(_) => Cow::Owned(strip_colors(bytes).unwrap_or_else(|| output::readable(bytes))),
    }
}

/// Appends the text of a line as [`render`] makes it to `out`, without a copy of its own
/// in the common cases (plain text, colors).
pub(super) fn render_into(out: &mut String, bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let mark = out.len();
        if strip_into(out, text) {
            return;
        }
        out.truncate(mark);
    }
    out.push_str(&render(bytes));
}

/// The text of a line whose only escapes are CSI sequences (colors, the common case of
/// a terminal's output), as [`output::readable`] makes it but without its parser; none
/// when the line holds anything else that `readable` would rewrite, or bad UTF-8.
pub(super) fn strip_colors(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut out = String::with_capacity(text.len());
    strip_into(&mut out, text).then_some(out)
}

/// Appends `text` to `out` with its CSI sequences left out; false (and `out` partly
/// written) when `text` holds anything else that `readable` would rewrite.
fn strip_into(out: &mut String, text: &str) -> bool {
    let mut rest = text;
    while let Some(esc) = memchr(0x1b, rest.as_bytes()) {
        let before = &rest[..esc];
        if first_unplain(before.as_bytes()).is_some() {
            return false;
        }
        out.push_str(before);
        // ESC [, parameters, intermediates, a final byte.
        let seq = &rest.as_bytes()[esc..];
        if seq.get(1) != Some(&b'[') {
            return false;
        }
        let mut i = 2;
        while seq.get(i).is_some_and(|b| (0x30..=0x3f).contains(b)) {
            i += 1;
        }
        while seq.get(i).is_some_and(|b| (0x20..=0x2f).contains(b)) {
            i += 1;
        }
        if !seq.get(i).is_some_and(|b| (0x40..=0x7e).contains(b)) {
            return false;
        }
        rest = &rest[esc + i + 1..];
    }
    if first_unplain(rest.as_bytes()).is_some() {
        return false;
    }
    out.push_str(rest);
    true
}

/// Whether `b` (followed by `next`) is a byte `read` rewrites: a control byte other
/// than `\n` and `\t`, DEL, or a C1 control written as UTF-8.
fn unplain_at(bytes: &[u8], i: usize) -> bool {
    let b = bytes[i];
    (b < 0x20 && b != b'\n' && b != b'\t')
        || b == 0x7f
        || (b == 0xc2 && bytes.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)))
}

/// The index of the first byte `read` rewrites, if any. Looks at blocks of 256 bytes
/// with a test the compiler vectorises, then finds the byte in a block that has one.
pub(super) fn first_unplain(bytes: &[u8]) -> Option<usize> {
    let mut start = 0;
    for block in bytes.chunks(256) {
        let suspect = block.iter().fold(false, |any, &b| {
            any | ((b < 0x20) & (b != b'\n') & (b != b'\t')) | (b == 0x7f) | (b == 0xc2)
        });
        if suspect {
            if let Some(i) = (start..start + block.len()).find(|&i| unplain_at(bytes, i)) {
                return Some(i);
            }
        }
        start += block.len();
    }
    None
}

/// What a line shown costs a reply: its text and the fields around it (its number,
/// offset and the JSON of them), so that a log of empty lines with `--context 100`
/// cannot make a reply a hundred times the size `--max-bytes` allows.
pub(super) fn cost(line: &GrepLine) -> usize {
    line.text.len() + LINE_COST
}

/// About what the fields of a line shown take besides its text.
const LINE_COST: usize = 48;

/// Clips a shown line to about [`SHOWN`] bytes, around `around` (the match) if given.
pub(super) fn shown(text: &str, around: Option<Range<usize>>) -> String {
    if text.len() <= SHOWN {
        return text.to_string();
    }
    let (start, end) = match around {
        Some(m) => {
            let pad = SHOWN.saturating_sub(m.len()) / 2;
            let start = m.start.saturating_sub(pad);
            (start, (start + SHOWN).max(m.end.min(m.start + SHOWN)))
        }
        None => (0, SHOWN),
    };
    let start = floor_boundary(text, start);
    let end = floor_boundary(text, end.min(text.len()));
    let mut out = String::new();
    if start > 0 {
        out.push_str(&format!("[... {start} bytes] "));
    }
    out.push_str(&text[start..end]);
    if end < text.len() {
        out.push_str(&format!(" [... {} bytes]", text.len() - end));
    }
    out
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}
