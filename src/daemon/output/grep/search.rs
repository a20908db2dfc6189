//! The search of `read --grep` through a log: its lines that match, with their line
//! numbers, byte offsets and context.
//!
//! How it works: the log is read in buffers of [`BUF`] bytes (passing over the dropped
//! middle and any hole, `SEEK_DATA`), each ending at a line boundary. A stretch of a
//! buffer that is plain text (valid UTF-8, no control byte, nothing `read` would
//! rewrite) is searched as one haystack, so the regex's literal scans skip the lines
//! that cannot match; a match is then placed in its line. Anything else (escapes, `\r`,
//! bad UTF-8, binary) is searched line by line as `read` shows it. A pattern whose
//! match crosses a line break turns the whole search line by line, so it stays linear.
//! Lines longer than [`MAX_LINE`] are searched in pieces of that size.
//!
//! Line numbers count from the first byte of the log. Past the dropped middle they go
//! on as if the middle were one line break, and say so (`line_at_least`).
//!
//! This file holds the search itself; `lines.rs` where the lines lie (the log's
//! buffers, the pieces of a line, their numbers), `masked.rs` what masking changes
//! (the lines searched as shown, the text of a line as shown).

mod lines;
mod masked;

use super::shown::{cost, first_unplain, render_into, shown};
use super::Pattern;
use crate::output;
use crate::wire::{GrepLine, GrepMatch};
use lines::{count_lines, fill};
use memchr::memrchr;
use std::fs::File;
use std::ops::Range;

/// Bytes read at a time.
const BUF: usize = 4 << 20;
/// Bytes looked at around a cut for a token shape that crosses it.
const TOKEN_CONTEXT: usize = 2048;
/// Lines that are not plain text are rendered and searched this many bytes at a time.
const BLOCK: usize = 64 << 10;
/// Lines are searched in pieces of at most this many bytes.
pub(crate) const MAX_LINE: usize = 64 << 10;

/// What a search looks for and how much it returns.
pub(crate) struct Search<'a> {
    pub regex: &'a Pattern,
    pub from: u64,
    pub to: u64,
    /// The log's dropped middle, as the records know it.
    pub gap: Range<u64>,
    pub context: usize,
    pub max_matches: usize,
    pub max_text: usize,
    /// Token shapes masked in the lines shown, and a line that matches only through
    /// one is no match (unless the caller asked for `no_redact`).
    pub redact: bool,
}

/// What a search found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub matches: Vec<GrepMatch>,
    pub truncated: bool,
    pub next_from: Option<u64>,
    /// Why it stopped early, when it did.
    pub stopped_by: Option<&'static str>,
    /// Where the searched range ended (the log's length when the search began), and
    /// the bytes of it that were gone (the dropped middle, and holes punched since).
    pub to: u64,
    pub skipped: u64,
}

/// A piece of a line in the buffer: `[start, end)` of the buffer, and where the next
/// one starts (past the `\n` that ended it, if one did).
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: usize,
    end: usize,
    next: usize,
}

/// The state of a search as it goes through the log.
struct Scan<'s, 'r> {
    search: &'s Search<'r>,
    buf: Vec<u8>,
    /// The log offset of `buf[0]`, and the start of the line it lies in.
    base: u64,
    base_line_start: u64,
    /// Line numbers are known up to `counted` (an index of `buf`): the line there has
    /// number `line`, and began at log offset `line_start`.
    counted: usize,
    line: u64,
    line_start: u64,
    /// Past the dropped middle (or a hole): line numbers are lower bounds.
    after_gap: bool,
    /// Lines from this log offset on have not been shown.
    unshown: u64,
    /// The last lines before `buf` not shown, for the context of a match at its start.
    carried: Vec<GrepLine>,
    /// Context lines still owed to the last match.
    owed: usize,
    /// A match crossed a line break: search line by line from now on.
    by_line: bool,
    /// Where the plain stretch being searched ends: bad UTF-8 at `bad_utf8`, a byte
    /// `read` rewrites at `unplain` (indexes of `buf`; none: not looked for yet).
    bad_utf8: Option<usize>,
    unplain: Option<usize>,
    found: Found,
    text_used: usize,
    /// Where private keys lie in `buf` (found when a line of it is first shown).
    keys: std::cell::OnceCell<Vec<(usize, usize)>>,
    /// Where masking may change what `read` shows of `buf` (tokens, keys, a token cut
    /// by its start), so those lines are searched as shown (with `redact`).
    sensitive: std::cell::OnceCell<Vec<(usize, usize)>>,
    /// The bytes of the log just before `buf` (when it goes on from them), to find a
    /// token that `buf`'s start cuts.
    before_buf: Vec<u8>,
}

impl Search<'_> {
    /// Searches `file`.
    pub(crate) fn run(&self, file: &File) -> std::io::Result<Found> {
        let (line, after_gap) = count_lines(file, self.from, &self.gap)?;
        let mut scan = Scan {
            search: self,
            buf: Vec::with_capacity(BUF),
            base: self.from,
            base_line_start: self.from,
            counted: 0,
            line,
            line_start: self.from,
            after_gap,
            unshown: self.from,
            carried: Vec::new(),
            owed: 0,
            by_line: false,
            bad_utf8: None,
            unplain: None,
            found: Found::default(),
            text_used: 0,
            keys: std::cell::OnceCell::new(),
            sensitive: std::cell::OnceCell::new(),
            before_buf: Vec::new(),
        };
        // A running job's log grows (and its middle is released) while the records are
        // read: the search goes to the length the file has now.
        let to = self.to.max(file.metadata()?.len());
        scan.found.to = to;
        let mut at = self.from;
        while at < to && scan.found.stopped_by.is_none() {
            let (start, hard_end) = fill(file, at, to, &self.gap, &mut scan.buf)?;
            scan.found.skipped += start.min(to) - at;
            if scan.buf.is_empty() {
                break;
            }
            if start > at {
                scan.crossed_gap(start);
            }
            scan.before_buf.clear();
            if self.redact && start == at && at > 0 {
                // The bytes just before it, after any hole.
                let holes = output::Holes::new(file, self.gap.start, self.gap.end - self.gap.start);
                let from = at.saturating_sub(TOKEN_CONTEXT as u64);
                let from = holes.gaps(from, at).last().map_or(from, |gap| gap.end);
                scan.before_buf.resize((at - from) as usize, 0);
                let read = output::read_full_at(file, &mut scan.before_buf, from)?;
                scan.before_buf.truncate(read);
            }
            scan.begin(start);
            let end = match scan.boundary_before_end() {
                // (Never 0 for a full buffer; whole lines or pieces always fit.)
                end if !hard_end && end > 0 => end,
                _ => scan.buf.len(),
            };
            scan.search_buffer(end);
            at = start + end as u64;
        }
        Ok(scan.found)
    }
}

impl Scan<'_, '_> {
    fn grep_line(&self, segment: Segment, line: u64, around: bool) -> GrepLine {
        let text = self.shown_text(segment);
        let range = match around {
            true => self.search.regex.text.find(&text).map(|m| m.range()),
            false => None,
        };
        GrepLine {
            line,
            offset: self.base + segment.start as u64,
            text: shown(&text, range),
            line_at_least: self.after_gap,
        }
    }

    /// Whether a segment matches, as `read` shows it.
    fn matches(&self, segment: Segment) -> bool {
        self.search.regex.text.is_match(&self.match_text(segment)) && self.still_matches(segment)
    }

    /// Whether a segment that matched still matches once its tokens are masked: a
    /// search must not find (nor tell apart, match by match) what a reader may not see.
    fn still_matches(&self, segment: Segment) -> bool {
        !self.search.redact || self.search.regex.text.is_match(&self.shown_text(segment))
    }

    /// The lines before `buf[i]` (a segment start whose line number is `line`) that
    /// were not shown, at most `context` of them.
    fn before(&self, i: usize, line: u64) -> Vec<GrepLine> {
        let want = self.search.context;
        if want == 0 {
            return Vec::new();
        }
        let floor = match self.unshown.checked_sub(self.base) {
            Some(k) => (k as usize).min(i),
            None => 0,
        };
        // Back over `want` line breaks at most; then forward, segment by segment.
        let mut from = i;
        for _ in 0..want {
            if from <= floor + 1 {
                from = floor;
                break;
            }
            from = match memrchr(b'\n', &self.buf[floor..from - 1]) {
                Some(k) => floor + k + 1,
                None => floor,
            };
        }
        let mut number = line - memchr::memchr_iter(b'\n', &self.buf[from..i]).count() as u64;
        let mut lines = Vec::new();
        let mut at = from;
        while at < i {
            let segment = self.segment_at(at, i);
            lines.push(self.grep_line(segment, number, false));
            if segment.next > segment.end {
                number += 1;
            }
            at = segment.next;
        }
        if lines.len() < want && from == 0 && self.unshown < self.base {
            let more = want - lines.len();
            let carried: Vec<&GrepLine> = self
                .carried
                .iter()
                .filter(|l| l.offset >= self.unshown)
                .collect();
            let skip = carried.len().saturating_sub(more);
            let mut all: Vec<GrepLine> = carried[skip..].iter().map(|&l| l.clone()).collect();
            all.append(&mut lines);
            lines = all;
        }
        let skip = lines.len().saturating_sub(want);
        lines.split_off(skip)
    }

    /// Records a match at `segment`; false when the reply is full (the search stops).
    fn record(&mut self, segment: Segment) -> bool {
        if !self.still_matches(segment) {
            return true;
        }
        self.count_to(segment.start);
        let offset = self.base + segment.start as u64;
        if self.found.matches.len() >= self.search.max_matches {
            return self.stop(offset, "the reply holds its most matches");
        }
        let before = self.before(segment.start, self.line);
        let line = self.grep_line(segment, self.line, true);
        let size = cost(&line) + before.iter().map(cost).sum::<usize>();
        if !self.found.matches.is_empty() && self.text_used + size > self.search.max_text {
            return self.stop(offset, "the reply holds its most text (--max-bytes)");
        }
        self.text_used += size;
        self.found.matches.push(GrepMatch {
            line,
            before,
            after: Vec::new(),
        });
        self.shown_to(segment);
        self.owed = self.search.context;
        true
    }

    fn stop(&mut self, offset: u64, why: &'static str) -> bool {
        self.found.truncated = true;
        self.found.next_from = Some(offset);
        self.found.stopped_by = Some(why);
        false
    }

    fn shown_to(&mut self, segment: Segment) {
        self.unshown = self.base + segment.next as u64;
    }

    /// Looks at one segment by itself: a match, or a context line owed to the last one.
    fn step(&mut self, start: usize, end: usize) -> usize {
        let segment = self.segment_at(start, end);
        if self.matches(segment) {
            self.record(segment);
        } else if self.owed > 0 {
            self.count_to(segment.start);
            let line = self.grep_line(segment, self.line, false);
            self.text_used += cost(&line);
            if let Some(last) = self.found.matches.last_mut() {
                last.after.push(line);
            }
            self.owed -= 1;
            self.shown_to(segment);
        }
        segment.next
    }

    /// The end of the plain stretch that begins at `buf[pos]`: the start of the first
    /// line holding a byte that is not plain text (or `end`).
    fn plain_until(&mut self, pos: usize, end: usize) -> usize {
        let bad_utf8 = match self.bad_utf8 {
            Some(at) if at >= pos => at,
            _ => match std::str::from_utf8(&self.buf[pos..end]) {
                Ok(_) => end,
                Err(e) => pos + e.valid_up_to(),
            },
        };
        let unplain = match self.unplain {
            Some(at) if at >= pos => at,
            _ => first_unplain(&self.buf[pos..end]).map_or(end, |k| pos + k),
        };
        (self.bad_utf8, self.unplain) = (Some(bad_utf8), Some(unplain));
        // Lines that masking may change are searched as shown, not where they lie.
        let sensitive = self.sensitive_after(pos).map_or(end, |(s, _)| s.max(pos));
        let first = bad_utf8.min(unplain).min(sensitive).min(end);
        if first == end {
            return end;
        }
        match memrchr(b'\n', &self.buf[pos..first]) {
            Some(k) => pos + k + 1,
            None => pos,
        }
    }

    /// Searches `buf[..end]`, then keeps its last unshown lines for the next buffer.
    fn search_buffer(&mut self, end: usize) {
        let mut pos = 0;
        while pos < end && self.found.stopped_by.is_none() {
            if self.owed > 0 || self.by_line {
                pos = self.step(pos, end);
                continue;
            }
            let plain_end = self.plain_until(pos, end);
            if plain_end == pos {
                pos = self.search_rendered(pos, end);
                continue;
            }
            pos = self.search_plain(pos, plain_end);
        }
        if self.found.stopped_by.is_none() {
            self.count_to(end);
            if self.search.context > 0 {
                self.carried = self.before(end, self.line);
            }
        }
    }

    /// Searches the lines from `buf[pos]` on (about [`BLOCK`] bytes of them) as `read`
    /// shows them, rendered into one haystack; returns where the search goes on.
    fn search_rendered(&mut self, pos: usize, end: usize) -> usize {
        let mut block = String::with_capacity(BLOCK + MAX_LINE);
        // Where each line begins in `block`, and its segment.
        let mut lines: Vec<(usize, Segment)> = Vec::new();
        let mut at = pos;
        while at < end && block.len() < BLOCK {
            let segment = self.segment_at(at, end);
            lines.push((block.len(), segment));
            match self.is_sensitive(segment.start, segment.end) {
                true => block.push_str(&self.shown_text(segment)),
                false => render_into(&mut block, &self.buf[segment.start..segment.end]),
            }
            block.push('\n');
            at = segment.next;
        }
        // (An empty match after the last line's `\n` is no line's.)
        let Some(found) = self
            .search
            .regex
            .text
            .find(&block)
            .filter(|m| m.start() < block.len())
        else {
            return at;
        };
        let i = lines
            .partition_point(|(start, _)| *start <= found.start())
            .saturating_sub(1);
        let (_, segment) = lines[i];
        let line_end = lines.get(i + 1).map_or(block.len(), |(start, _)| *start) - 1;
        if found.end() > line_end {
            // The match crosses a line break: this pattern is searched line by line.
            self.by_line = true;
            return segment.start;
        }
        self.record(segment);
        segment.next
    }

    /// Searches the plain stretch `buf[pos..end]` as one haystack; returns where the
    /// search goes on.
    fn search_plain(&mut self, pos: usize, end: usize) -> usize {
        // Searched where it lies, so that `^` and `\b` see the byte before `pos`.
        let Some(found) = self.search.regex.bytes.find_at(&self.buf[..end], pos) else {
            return end;
        };
        let (m_start, m_end) = (found.start(), found.end());
        // An empty match at the stretch's end belongs to the line it ends, if one does
        // (after a `\n`, it is the next stretch's business).
        let holder = match m_start < end {
            true => m_start,
            false if self.buf[end - 1] != b'\n' => end - 1,
            false => return end,
        };
        let segment = self.segment_holding(holder, pos, end);
        if m_end > segment.end {
            // The match crosses a line break: this pattern is searched line by line.
            self.by_line = true;
            return segment.start;
        }
        self.record(segment);
        segment.next
    }
}

#[cfg(test)]
mod tests;
