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

use super::shown::{cost, first_unplain, render, render_into, shown};
use super::Pattern;
use crate::output;
use crate::wire::{GrepLine, GrepMatch};
use memchr::{memchr, memrchr};
use nix::errno::Errno;
use nix::unistd::{lseek, Whence};
use std::borrow::Cow;
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
                let from = at.saturating_sub(TOKEN_CONTEXT as u64).max(
                    match self.gap.contains(&(at - 1)) {
                        true => at,
                        false => 0,
                    },
                );
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

/// The line number at `from` (1-based) and whether it lies past a gap, counting the
/// line breaks before it.
fn count_lines(file: &File, from: u64, gap: &Range<u64>) -> std::io::Result<(u64, bool)> {
    let mut line = 1;
    let mut after_gap = false;
    let mut at = 0;
    let mut buf = Vec::with_capacity(BUF.min(from as usize));
    let mut last = b'\n';
    while at < from {
        let (start, _) = fill(file, at, from, gap, &mut buf)?;
        if buf.is_empty() {
            break;
        }
        if start > at {
            after_gap = true;
            if last != b'\n' {
                line += 1;
            }
        }
        line += memchr::memchr_iter(b'\n', &buf).count() as u64;
        last = buf[buf.len() - 1];
        at = start + buf.len() as u64;
    }
    Ok((line, after_gap))
}

/// Reads into `buf` up to [`BUF`] bytes of data from `[at, to)`, never across `gap`
/// (the dropped middle) and passing over holes. Returns where the bytes begin and
/// whether they end where the data does (the gap, `to` or the file's end), so that
/// the last line in `buf` is whole.
fn fill(
    file: &File,
    at: u64,
    to: u64,
    gap: &Range<u64>,
    buf: &mut Vec<u8>,
) -> std::io::Result<(u64, bool)> {
    let mut start = at;
    loop {
        buf.clear();
        if gap.contains(&start) {
            start = gap.end;
        }
        match lseek(file, start as i64, Whence::SeekData) {
            Ok(data) => start = start.max(data as u64),
            // Nothing but a hole to the end of the file.
            Err(Errno::ENXIO) => return Ok((to, true)),
            // A file system without SEEK_DATA: the bytes are read as they are.
            Err(_) => {}
        }
        if start >= to {
            return Ok((to, true));
        }
        let mut end = to.min(start + BUF as u64);
        if !gap.is_empty() && start < gap.start {
            end = end.min(gap.start);
        }
        let hard = end == to || end == gap.start;
        buf.resize((end - start) as usize, 0);
        let filled = crate::output::read_full_at(file, buf, start)?;
        let short = filled < buf.len();
        buf.truncate(filled);
        // A job writing fast may have released the start of what was just read (its
        // zeros are not its output): that part counts as gone.
        if let Ok(data) = lseek(file, start as i64, Whence::SeekData) {
            let released = (data as u64).saturating_sub(start).min(buf.len() as u64) as usize;
            if released > 0 {
                buf.drain(..released);
                start += released as u64;
                if buf.is_empty() {
                    // All of it: read on from where the data is now.
                    continue;
                }
            }
        }
        return Ok((start, hard || short));
    }
}

impl Scan<'_, '_> {
    /// The next buffer begins at log offset `start` (a segment start).
    fn begin(&mut self, start: u64) {
        self.base = start;
        self.base_line_start = self.line_start;
        self.counted = 0;
        self.bad_utf8 = None;
        self.unplain = None;
        self.keys = std::cell::OnceCell::new();
        self.sensitive = std::cell::OnceCell::new();
    }

    /// Where masking may change what `read` shows of `buf` (none without `redact`).
    fn sensitive(&self) -> &[(usize, usize)] {
        self.sensitive.get_or_init(|| {
            if !self.search.redact {
                return Vec::new();
            }
            let mut spans = crate::redact::sensitive_spans(&self.buf);
            if let Some((_, end)) = self.token_across(0) {
                spans.insert(0, (0, end));
            }
            // Merged where they overlap: disjoint, in order, so ends are in order too.
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
            for (start, end) in spans {
                match merged.last_mut() {
                    Some(last) if start < last.1 => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            merged
        })
    }

    /// The first span of [`Self::sensitive`] that ends after `pos`.
    fn sensitive_after(&self, pos: usize) -> Option<(usize, usize)> {
        let spans = self.sensitive();
        spans
            .get(spans.partition_point(|&(_, e)| e <= pos))
            .copied()
    }

    /// Whether masking may change what `read` shows of `buf[start..end]`.
    fn is_sensitive(&self, start: usize, end: usize) -> bool {
        let end = end.max(start + 1);
        self.sensitive_after(start).is_some_and(|(s, _)| s < end)
    }

    /// The text a match is looked for in: the line as `read` shows it.
    fn match_text(&self, segment: Segment) -> Cow<'_, str> {
        match self.is_sensitive(segment.start, segment.end) {
            true => self.shown_text(segment),
            false => render(&self.buf[segment.start..segment.end]),
        }
    }

    /// The data goes on at `start`, past bytes that are gone (the dropped middle, or a
    /// hole punched since the records were read).
    fn crossed_gap(&mut self, start: u64) {
        if self.line_start != self.base + self.counted as u64 {
            // The line in progress was cut: what follows counts as a new one.
            self.line += 1;
        }
        self.line_start = start;
        self.after_gap = true;
        self.carried.clear();
        self.owed = 0;
        self.unshown = start;
    }

    /// Where the last whole segment of a full buffer ends: after its last `\n`, or at
    /// the last piece boundary of a line longer than [`MAX_LINE`].
    fn boundary_before_end(&self) -> usize {
        let len = self.buf.len();
        let line_start = match memrchr(b'\n', &self.buf) {
            Some(i) => {
                if len - (i + 1) < MAX_LINE {
                    return i + 1;
                }
                self.base + i as u64 + 1
            }
            None => self.base_line_start,
        };
        let end = self.base + len as u64;
        let pieces = (end - line_start) / MAX_LINE as u64;
        let boundary = line_start + pieces * MAX_LINE as u64;
        (boundary.max(self.base) - self.base) as usize
    }

    /// The log offset where the line holding `buf[i]` begins.
    fn line_start_of(&self, i: usize) -> u64 {
        if i >= self.counted {
            // Known at `counted`: look back only that far (a line of 100 MB is not
            // looked through again for each of its matches).
            return match memrchr(b'\n', &self.buf[self.counted..i]) {
                Some(k) => self.base + (self.counted + k) as u64 + 1,
                None => self.line_start,
            };
        }
        match memrchr(b'\n', &self.buf[..i]) {
            Some(k) => self.base + k as u64 + 1,
            None => self.base_line_start,
        }
    }

    /// The segment that begins at `start` (a segment start), within `buf[..end]`.
    fn segment_at(&self, start: usize, end: usize) -> Segment {
        let line_start = self.line_start_of(start);
        let offset = self.base + start as u64;
        let piece_end =
            line_start + ((offset - line_start) / MAX_LINE as u64 + 1) * MAX_LINE as u64;
        let limit = end.min((piece_end - self.base) as usize);
        match memchr(b'\n', &self.buf[start..limit]) {
            Some(k) => Segment {
                start,
                end: start + k,
                next: start + k + 1,
            },
            None => Segment {
                start,
                end: limit,
                next: limit,
            },
        }
    }

    /// The segment that holds `buf[i]`.
    fn segment_holding(&self, i: usize, floor: usize, end: usize) -> Segment {
        let line_start = self.line_start_of(i);
        let offset = self.base + i as u64;
        let piece = line_start + (offset - line_start) / MAX_LINE as u64 * MAX_LINE as u64;
        let start = ((piece.max(self.base) - self.base) as usize).max(floor);
        self.segment_at(start, end)
    }

    /// Moves the line count to `buf[i]` (forward only).
    fn count_to(&mut self, i: usize) {
        if i <= self.counted {
            return;
        }
        let span = &self.buf[self.counted..i];
        let breaks = memchr::memchr_iter(b'\n', span).count() as u64;
        if breaks > 0 {
            self.line += breaks;
            let last = memrchr(b'\n', span).unwrap_or(0);
            self.line_start = self.base + (self.counted + last + 1) as u64;
        }
        self.counted = i;
    }

    /// The text of a segment as `read` shows it, token shapes and private keys masked
    /// (unless `no_redact`).
    fn shown_text(&self, segment: Segment) -> Cow<'_, str> {
        if !self.search.redact {
            return render(&self.buf[segment.start..segment.end]);
        }
        let keys = self
            .keys
            .get_or_init(|| crate::redact::private_key_spans(&self.buf));
        let end = segment.end.max(segment.start + 1);
        if keys.iter().any(|&(s, e)| s < end && segment.start < e) {
            return Cow::Borrowed(crate::redact::PRIVATE_KEY);
        }
        // A token that the segment's start or end cuts (`--from` inside one, a piece of
        // a long line, a running job's unfinished last line) is shown as a marker.
        let (mut start, mut end) = (segment.start, segment.end);
        let mut cut_before = false;
        // No token crosses a line break: a segment that starts a line cuts none.
        let starts_line = start > 0 && self.buf[start - 1] == b'\n';
        let across = match starts_line {
            true => None,
            false => self.token_across(start),
        };
        if let Some((_, token_end)) = across {
            start = token_end.min(end);
            cut_before = true;
        }
        let mut cut_after = false;
        if self.buf.get(end) != Some(&b'\n') {
            if let Some((token_start, _)) = self.token_across(end) {
                end = token_start.max(start);
                cut_after = true;
            } else if let Some(k) = crate::redact::unfinished_token(&self.buf[start..end]) {
                end = start + k;
                cut_after = true;
            }
        }
        let text = render(&self.buf[start..end]);
        let masked = crate::redact::mask_shapes_bytes(text.as_bytes());
        if !cut_before && !cut_after {
            return match masked {
                Cow::Borrowed(_) => text,
                Cow::Owned(masked) => Cow::Owned(String::from_utf8_lossy(&masked).into_owned()),
            };
        }
        let mut out = String::new();
        if cut_before {
            out.push_str(crate::redact::CUT_TOKEN);
        }
        out.push_str(&String::from_utf8_lossy(&masked));
        if cut_after {
            out.push_str(crate::redact::CUT_TOKEN);
        }
        Cow::Owned(out)
    }

    /// The token shape that begins before `buf[at]` and ends after it, as indexes of
    /// `buf` (its start 0 when it began before `buf`).
    fn token_across(&self, at: usize) -> Option<(usize, usize)> {
        let hi = (at + TOKEN_CONTEXT).min(self.buf.len());
        if at >= TOKEN_CONTEXT {
            let lo = at - TOKEN_CONTEXT;
            return crate::redact::token_across(&self.buf[lo..hi], at - lo)
                .map(|(s, e)| (lo + s, lo + e));
        }
        let keep = self.before_buf.len().min(TOKEN_CONTEXT - at);
        let mut window = self.before_buf[self.before_buf.len() - keep..].to_vec();
        window.extend_from_slice(&self.buf[..hi]);
        crate::redact::token_across(&window, keep + at)
            .map(|(s, e)| (s.saturating_sub(keep), e - keep))
    }

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
mod tests {
    use super::*;
    use crate::daemon::output::grep::compile;
    use crate::daemon::output::grep::shown::{strip_colors, SHOWN};
    use std::io::Write;

    fn search_in(bytes: &[u8], pattern: &str, context: usize, gap: Range<u64>) -> Found {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        let regex = compile(pattern).unwrap();
        let search = Search {
            regex: &regex,
            from: 0,
            to: bytes.len() as u64,
            gap,
            context,
            max_matches: 1000,
            max_text: 1 << 20,
            redact: true,
        };
        search.run(&file).unwrap()
    }

    fn lines(found: &Found) -> Vec<(u64, u64, String)> {
        found
            .matches
            .iter()
            .map(|m| (m.line.line, m.line.offset, m.line.text.clone()))
            .collect()
    }

    #[test]
    fn lines_offsets_and_numbers() {
        let found = search_in(b"alpha\nbeta\ngamma beta\n\nbeta", "beta", 0, 0..0);
        assert_eq!(
            lines(&found),
            vec![
                (2, 6, "beta".into()),
                (3, 11, "gamma beta".into()),
                (5, 23, "beta".into())
            ]
        );
    }

    #[test]
    fn context_lines_are_shown_once() {
        let text: String = (1..=20).map(|n| format!("l{n}\n")).collect();
        let found = search_in(text.as_bytes(), "^l(5|7|15)$", 2, 0..0);
        let m = &found.matches;
        assert_eq!(m.len(), 3);
        let texts = |v: &Vec<GrepLine>| v.iter().map(|l| l.text.clone()).collect::<Vec<_>>();
        assert_eq!(texts(&m[0].before), ["l3", "l4"]);
        assert_eq!(texts(&m[0].after), ["l6"]);
        assert!(m[1].before.is_empty());
        assert_eq!(texts(&m[1].after), ["l8", "l9"]);
        assert_eq!(texts(&m[2].before), ["l13", "l14"]);
        assert_eq!(m[2].before[0].line, 13);
        assert_eq!(texts(&m[2].after), ["l16", "l17"]);
    }

    #[test]
    fn escapes_carriage_returns_and_binary() {
        let found = search_in(
            b"\x1b[31mERROR\x1b[0m: red\nok\n10%\r100% done\r\n\xff\xfe\x00bin ERROR\n",
            "ERROR|done",
            0,
            0..0,
        );
        assert_eq!(
            lines(&found),
            vec![
                (1, 0, "ERROR: red".into()),
                (3, 23, "100% done".into()),
                (4, 38, "\u{fffd}\u{fffd}bin ERROR".into())
            ]
        );
    }

    #[test]
    fn colors_are_stripped_as_read_strips_them() {
        for line in [
            &b"\x1b[31mERROR\x1b[0m: red"[..],
            b"\x1b[1;38;5;208mbold\x1b[m\ttab \x1b[2K",
            b"caf\xc3\xa9 \x1b[?25l\x1b[?25h",
            b"\x1b[ q spaced intermediates",
        ] {
            assert_eq!(
                strip_colors(line).as_deref(),
                Some(output::readable(line).as_str()),
                "{line:?}"
            );
        }
        for other in [
            &b"\x1b]0;title\x07x"[..],
            b"10%\r20%",
            b"\x1b(B",
            b"\x1b[31",
            b"bad \xff \x1b[0m",
            b"\x1b[0m\x08",
        ] {
            assert_eq!(strip_colors(other), None, "{other:?}");
        }
    }

    #[test]
    fn empty_matches_find_each_line_once() {
        let text = b"one\n\x1b[1mtwo\x1b[0m\nthree\n\nfive";
        for pattern in ["", "^", "$", "x*"] {
            let found = search_in(text, pattern, 0, 0..0);
            let offsets: Vec<u64> = found.matches.iter().map(|m| m.line.offset).collect();
            assert_eq!(offsets, [0, 4, 16, 22, 23], "{pattern:?}");
        }
        let found = search_in(text, "^$", 0, 0..0);
        assert_eq!(lines(&found), vec![(4, 22, String::new())]);
    }

    #[test]
    fn a_pattern_across_lines_goes_line_by_line() {
        let found = search_in(b"a\nb\nab\n", r"a\s*b", 0, 0..0);
        assert_eq!(lines(&found), vec![(3, 4, "ab".into())]);
    }

    #[test]
    fn a_long_line_is_searched_in_pieces() {
        let mut bytes = vec![b'x'; 3 * MAX_LINE];
        bytes[MAX_LINE + 10..MAX_LINE + 16].copy_from_slice(b"NEEDLE");
        bytes.extend_from_slice(b"\nNEEDLE\n");
        let found = search_in(&bytes, "NEEDLE", 0, 0..0);
        let got = lines(&found);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1), (1, MAX_LINE as u64));
        assert!(got[0].2.contains("NEEDLE") && got[0].2.len() < 2 * SHOWN);
        assert_eq!((got[1].0, got[1].1), (2, 3 * MAX_LINE as u64 + 1));
    }

    #[test]
    fn buffers_join_without_losing_lines_or_context() {
        let line = "0123456789abcdef".repeat(4) + "\n";
        let mut text = line.repeat(BUF / line.len() - 1);
        text.push_str("before\nmatch here\nafter\n");
        text.push_str(&line.repeat(BUF / line.len()));
        text.push_str("match again\n");
        let found = search_in(text.as_bytes(), "match", 1, 0..0);
        let m = &found.matches;
        assert_eq!(m.len(), 2);
        let first = BUF / line.len();
        assert_eq!(m[0].line.line as usize, first + 1);
        assert_eq!(m[0].before[0].text, "before");
        assert_eq!(m[0].after[0].text, "after");
        assert_eq!(m[1].line.line as usize, first + 3 + BUF / line.len());
        assert_eq!(
            m[1].line.offset as usize,
            text.len() - "match again\n".len()
        );
        assert_eq!(m[1].before[0].text, line.trim_end());
    }

    #[test]
    fn past_the_gap_numbers_are_lower_bounds() {
        let mut bytes = b"head match\nhe".to_vec();
        bytes.extend(vec![0u8; 100]);
        bytes.extend_from_slice(b"ad\ntail match\n");
        let found = search_in(&bytes, "match", 0, 13..113);
        let m = &found.matches;
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].line.line, m[0].line.line_at_least), (1, false));
        assert_eq!((m[1].line.line, m[1].line.offset), (4, 116));
        assert!(m[1].line.line_at_least);
    }

    #[test]
    fn a_search_stops_at_its_most_matches_and_says_where_to_go_on() {
        let text = "hit\n".repeat(10);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        let regex = compile("hit").unwrap();
        let search = Search {
            regex: &regex,
            from: 0,
            to: text.len() as u64,
            gap: 0..0,
            context: 0,
            max_matches: 3,
            max_text: 1 << 20,
            redact: true,
        };
        let found = search.run(&file).unwrap();
        assert_eq!(found.matches.len(), 3);
        assert!(found.truncated);
        assert_eq!(found.next_from, Some(12));
    }

    #[test]
    fn huge_patterns_are_refused_quickly() {
        let began = std::time::Instant::now();
        assert!(compile(r"\w{1000}\w{1000}\w{1000}").is_err());
        assert!(compile("(a").is_err());
        assert!(began.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_hole_past_the_known_gap_is_passed() {
        let mut file = tempfile::tempfile().unwrap();
        let line = "full speed line with some words ERROR maybe\n";
        file.write_all(line.repeat((1 << 20) / line.len()).as_bytes())
            .unwrap();
        let tail = line.repeat((10 << 20) / line.len());
        std::os::unix::fs::FileExt::write_all_at(&file, tail.as_bytes(), 100 << 20).unwrap();
        let to = (100 << 20) + tail.len() as u64;
        let regex = compile("ERROR").unwrap();
        let search = Search {
            regex: &regex,
            from: 3_000_000,
            to,
            gap: (1 << 20)..(2 << 20),
            context: 0,
            max_matches: 2,
            max_text: 1 << 20,
            redact: true,
        };
        let found = search.run(&file).unwrap();
        assert_eq!(found.matches.len(), 2, "{found:?}");
        assert_eq!(found.matches[0].line.offset, 100 << 20);
        assert!(found.matches[0].line.line_at_least);
    }
}
