//! Where the lines of a search lie: the log read in buffers that pass over the dropped
//! middle and holes and end at a line boundary (`fill`), the line number where the
//! search begins (`count_lines`), and in each buffer the pieces of its lines
//! (`Segment`s of at most [`MAX_LINE`] bytes), their log offsets and their numbers.

use super::{Scan, Segment, BUF, MAX_LINE};
use memchr::{memchr, memrchr};
use std::fs::File;
use std::ops::Range;

/// The line number at `from` (1-based) and whether it lies past a gap, counting the
/// line breaks before it.
pub(super) fn count_lines(
    file: &File,
    from: u64,
    gap: &Range<u64>,
) -> std::io::Result<(u64, bool)> {
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

/// Reads into `buf` up to [`BUF`] bytes of data from `[at, to)`, never across a hole
/// (a dropped middle: `gap` is the one last reported, see [`crate::output::Holes`]). Returns where the bytes begin and
/// whether they end where the data does (the gap, `to` or the file's end), so that
/// the last line in `buf` is whole.
pub(super) fn fill(
    file: &File,
    at: u64,
    to: u64,
    gap: &Range<u64>,
    buf: &mut Vec<u8>,
) -> std::io::Result<(u64, bool)> {
    let holes = crate::output::Holes::new(file, gap.start, gap.end - gap.start);
    let mut start = at;
    loop {
        buf.clear();
        let Some(data) = holes.data_at(start, to) else {
            return Ok((to, true));
        };
        start = data.start;
        let end = data.end.min(start + BUF as u64);
        let hard = end == data.end;
        buf.resize((end - start) as usize, 0);
        let filled = crate::output::read_full_at(file, buf, start)?;
        let short = filled < buf.len();
        buf.truncate(filled);
        // A job writing fast may have released the start of what was just read (its
        // zeros are not its output): that part counts as gone.
        let now = holes.data_at(start, start + buf.len() as u64);
        let released = now.map_or(buf.len() as u64, |now| now.start - start) as usize;
        if released > 0 {
            buf.drain(..released.min(buf.len()));
            start += released as u64;
            if buf.is_empty() {
                // All of it: read on from where the data is now.
                continue;
            }
        }
        return Ok((start, hard || short));
    }
}

impl Scan<'_, '_> {
    /// The next buffer begins at log offset `start` (a segment start).
    pub(super) fn begin(&mut self, start: u64) {
        self.base = start;
        self.base_line_start = self.line_start;
        self.counted = 0;
        self.bad_utf8 = None;
        self.unplain = None;
        self.keys = std::cell::OnceCell::new();
        self.sensitive = std::cell::OnceCell::new();
    }

    /// The data goes on at `start`, past bytes that are gone (the dropped middle, or a
    /// hole punched since the records were read).
    pub(super) fn crossed_gap(&mut self, start: u64) {
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
    pub(super) fn boundary_before_end(&self) -> usize {
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
    pub(super) fn line_start_of(&self, i: usize) -> u64 {
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
    pub(super) fn segment_at(&self, start: usize, end: usize) -> Segment {
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
    pub(super) fn segment_holding(&self, i: usize, floor: usize, end: usize) -> Segment {
        let line_start = self.line_start_of(i);
        let offset = self.base + i as u64;
        let piece = line_start + (offset - line_start) / MAX_LINE as u64 * MAX_LINE as u64;
        let start = ((piece.max(self.base) - self.base) as usize).max(floor);
        self.segment_at(start, end)
    }

    /// Moves the line count to `buf[i]` (forward only).
    pub(super) fn count_to(&mut self, i: usize) {
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
}
