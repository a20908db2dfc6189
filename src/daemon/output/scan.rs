//! Scanning growing logs and files for lines, shared by `wait --until` and monitors.
//!
//! How it works: a [`LineScan`] keeps how far it has read and the line in progress, so
//! each new byte is looked at once, however often its reader is woken. A line ends at
//! `\n`; a `\r` ends a *frame* (what a progress bar shows before it rewrites the line),
//! and the text after it starts the line over, as on a terminal. Waits match lines,
//! frames and the unterminated last line (a prompt); watches record whole lines.
//! [`read_data`] reads one bounded chunk, passing over a log's dropped middle and the
//! holes of a sparse file (`SEEK_DATA`), so a file that grew by 20 GB of holes costs
//! nothing to pass. Callers read off the daemon's lock: a little fresh output on the
//! daemon's own thread, more on a blocking one ([`read_off_lock`]).

use std::borrow::Cow;
use std::fs::File;
use std::ops::Range;

/// The most one read takes in.
pub(crate) const CHUNK: u64 = 256 << 10;
/// The most one step of a scan reads before its task yields.
pub(crate) const STEP: u64 = 4 << 20;
/// Lines are matched on their first this many bytes; the rest of a longer line is passed.
pub(crate) const MAX_LINE: usize = 64 << 10;

/// New output up to this size is read on the daemon's own thread (see [`read_off_lock`]).
pub(crate) const INLINE_READ: u64 = 64 << 10;

/// Runs `work`, which reads `bytes` of a log's new output: here when they are few (they
/// were just written and are in the page cache, so reading them costs less than the
/// hand-over to a blocking thread and back, which a watcher of a chatty job would pay
/// many times a second), else on a blocking thread. `None` if that thread failed.
pub(crate) async fn read_off_lock<T: Send + 'static>(
    bytes: u64,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    if bytes <= INLINE_READ {
        return Some(work());
    }
    tokio::task::spawn_blocking(work).await.ok()
}

/// Ends a line that was longer than [`MAX_LINE`].
const CUT_MARK: &str = " [... line cut at 64 KiB]";

/// What a piece of text handed to a scan's caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A line ended by `\n` (or the last line of a source that ended).
    Line,
    /// The text before a `\r`: shown, then rewritten.
    Frame,
    /// The unterminated text at the end of what was written so far.
    Partial,
}

/// Where a scan of one log or file stands.
#[derive(Debug, Default)]
pub(crate) struct LineScan {
    /// The file offset of the next byte to read.
    pub offset: u64,
    /// Where the line in progress began: a scan resumed from here sees no line twice.
    pub line_start: u64,
    /// The line in progress (its first [`MAX_LINE`] bytes).
    partial: Vec<u8>,
    /// The line in progress was ended by a `\r`: a `\n` next makes it a line, anything
    /// else a frame.
    carriage_return: bool,
    /// The line in progress was handed out as [`Seen::Partial`] as it is now.
    partial_offered: bool,
    /// The line in progress is longer than [`MAX_LINE`]: its rest was left out.
    cut: bool,
    /// A private key began on an earlier line and has not ended: its lines are not
    /// handed out (a reader is shown the whole key as one marker).
    in_key: bool,
    key_checked: bool,
    /// The chunk being fed holds nothing that masking could change (no start of a
    /// token shape, no key line, none across its junction with the line in progress).
    clean_chunk: bool,
    /// The line in progress took bytes from a chunk that was not clean.
    partial_dirty: bool,
}

impl LineScan {
    pub fn at(offset: u64) -> LineScan {
        LineScan {
            offset,
            line_start: offset,
            ..LineScan::default()
        }
    }

    /// Whether the scan starts past the source's beginning and has not been told yet
    /// whether a private key is open there ([`Self::set_in_key`], [`key_open_at`]).
    pub fn needs_key_check(&self) -> bool {
        !self.key_checked && self.offset > 0
    }

    /// A private key is (or is not) open where the scan starts.
    pub fn set_in_key(&mut self, open: bool) {
        self.key_checked = true;
        self.in_key = open;
    }

    /// Starts again at `offset` (a truncated or replaced file), forgetting the line in
    /// progress.
    pub fn restart(&mut self, offset: u64) {
        *self = LineScan::at(offset);
    }

    /// Takes in `bytes` found at file offset `at` (at or past [`Self::offset`]: what
    /// lies between held no data) and hands each finished line and frame to `each`,
    /// which returns true to stop; returns whether it stopped.
    pub fn feed(
        &mut self,
        at: u64,
        bytes: &[u8],
        each: &mut impl FnMut(Seen, &str) -> bool,
    ) -> bool {
        self.clean_chunk = !crate::redact::may_hold_shapes(bytes) && {
            // A token's start across the junction of the line in progress and `bytes`.
            let mut junction = self.partial[self.partial.len().saturating_sub(16)..].to_vec();
            junction.extend_from_slice(&bytes[..bytes.len().min(16)]);
            !crate::redact::may_hold_shapes(&junction)
        };
        let stop = self.feed_lines(at, bytes, each);
        self.clean_chunk = false;
        stop
    }

    fn feed_lines(
        &mut self,
        at: u64,
        bytes: &[u8],
        each: &mut impl FnMut(Seen, &str) -> bool,
    ) -> bool {
        let mut i = 0;
        while i < bytes.len() {
            if self.carriage_return {
                self.carriage_return = false;
                let seen = if bytes[i] == b'\n' {
                    i += 1;
                    Seen::Line
                } else {
                    Seen::Frame
                };
                self.line_start = at + i as u64;
                if self.hand_out(seen, each) {
                    self.offset = at + i as u64;
                    return true;
                }
                continue;
            }
            let rest = &bytes[i..];
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    self.keep(rest);
                    i = bytes.len();
                }
                Some(k) if rest[k] == b'\r' => {
                    self.keep(&rest[..k]);
                    self.carriage_return = true;
                    i += k + 1;
                }
                Some(k) => {
                    i += k + 1;
                    self.line_start = at + i as u64;
                    let whole = self.partial.is_empty() && k <= MAX_LINE;
                    let stop = if whole && !rest[..k].contains(&0) {
                        // The whole line is in this chunk: no copy.
                        self.hand_out_line(&rest[..k], each)
                    } else {
                        self.keep(&rest[..k]);
                        self.hand_out(Seen::Line, each)
                    };
                    if stop {
                        self.offset = at + i as u64;
                        return true;
                    }
                }
            }
        }
        self.offset = at + bytes.len() as u64;
        false
    }

    /// Hands the unterminated line in progress to `each` once in each state it takes.
    pub fn offer_partial(&mut self, each: &mut impl FnMut(Seen, &str) -> bool) -> bool {
        if self.partial.is_empty() || self.partial_offered {
            return false;
        }
        self.partial_offered = true;
        if !self.partial_dirty && !self.in_key {
            return each(Seen::Partial, &clean_text(&self.partial));
        }
        match reader_text(&self.partial, Edge::Open, self.in_key) {
            Some(text) => each(Seen::Partial, &text),
            None => false,
        }
    }

    /// The source ended: its unterminated last line is a line.
    pub fn finish(&mut self, each: &mut impl FnMut(Seen, &str) -> bool) -> bool {
        self.carriage_return = false;
        if self.partial.is_empty() {
            return false;
        }
        self.line_start = self.offset;
        self.hand_out(Seen::Line, each)
    }

    /// Passes over bytes that hold no data (a hole up to `offset`).
    pub fn skip_to(&mut self, offset: u64) {
        self.offset = self.offset.max(offset);
    }

    /// Adds bytes to the line in progress. NUL bytes are left out: text for matching
    /// drops them anyway, and a hole read as zeros must not fill a line.
    fn keep(&mut self, bytes: &[u8]) {
        let before = self.partial.len();
        self.partial_dirty |= !self.clean_chunk;
        let room = MAX_LINE.saturating_sub(before);
        let all_kept = if bytes.contains(&0) {
            let mut data = bytes.iter().filter(|&&b| b != 0);
            self.partial.extend(data.by_ref().take(room));
            data.next().is_none()
        } else {
            self.partial
                .extend_from_slice(&bytes[..bytes.len().min(room)]);
            bytes.len() <= room
        };
        self.cut |= !all_kept;
        if self.partial.len() != before {
            self.partial_offered = false;
        }
    }

    /// Hands out a whole line that lies in the chunk being fed.
    fn hand_out_line(&mut self, bytes: &[u8], each: &mut impl FnMut(Seen, &str) -> bool) -> bool {
        if self.clean_chunk && !self.in_key {
            return each(Seen::Line, &clean_text(bytes));
        }
        let in_key = self.in_key;
        self.in_key = crate::redact::private_key_open_after(bytes, in_key);
        match reader_text(bytes, Edge::Whole, in_key) {
            Some(text) => each(Seen::Line, &text),
            None => false,
        }
    }

    fn hand_out(&mut self, seen: Seen, each: &mut impl FnMut(Seen, &str) -> bool) -> bool {
        let in_key = self.in_key;
        let edge = match self.cut {
            true => Edge::Cut,
            false => Edge::Whole,
        };
        let text = match self.partial_dirty || in_key {
            true => {
                self.in_key = crate::redact::private_key_open_after(&self.partial, in_key);
                reader_text(&self.partial, edge, in_key)
            }
            false => Some(clean_text(&self.partial)),
        };
        let stop = match text {
            Some(mut line) => {
                if self.cut {
                    line.to_mut().push_str(CUT_MARK);
                }
                each(seen, &line)
            }
            None => false,
        };
        self.partial.clear();
        self.partial_dirty = false;
        self.partial_offered = false;
        self.cut = false;
        stop
    }
}

/// How a piece of a line handed to a matcher ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Edge {
    /// At a line break, a `\r`, or the end of a source that ended.
    Whole,
    /// At the end of what was written so far: more may come.
    Open,
    /// At the cut of a line longer than [`MAX_LINE`].
    Cut,
}

/// The text a reader is shown of one line of a log (or file), which is what every
/// matcher (`wait --until`, monitors, the port-in-use scan) must look at, so that no
/// pattern finds what a reader may not see: [`output::readable`]'s text (escapes
/// stripped, invalid UTF-8 replaced, token shapes masked), with a token that the
/// piece's end cuts held back (`Open`: as a read of a running job holds it) or shown
/// as `[secret token]` (`Cut`), and a line inside a private key (`in_key`: one began
/// on an earlier line) not shown at all (`None`), as a read shows the whole key as one
/// marker. Plain text with no token (the usual case) is borrowed, not copied.
pub(crate) fn reader_text(bytes: &[u8], edge: Edge, in_key: bool) -> Option<Cow<'_, str>> {
    if in_key {
        let end = crate::redact::private_key_end(bytes)?;
        let rest = reader_text(&bytes[end..], edge, false)?;
        return Some(Cow::Owned(format!("{}{rest}", crate::redact::PRIVATE_KEY)));
    }
    let mut shown = bytes;
    let mut cut_token = false;
    if edge != Edge::Whole {
        if let Some(start) = crate::redact::unfinished_token(bytes) {
            shown = &bytes[..start];
            cut_token = edge == Edge::Cut;
        }
    }
    let plain = !shown.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f);
    let mut text = match crate::redact::mask_shapes_bytes(shown) {
        Cow::Borrowed(_) if plain => String::from_utf8_lossy(shown),
        _ => Cow::Owned(crate::output::readable(shown)),
    };
    if cut_token {
        text.to_mut().push_str(crate::redact::CUT_TOKEN);
    }
    Some(text)
}

/// [`reader_text`] of a line known to hold nothing that masking changes.
fn clean_text(bytes: &[u8]) -> Cow<'_, str> {
    let plain = !bytes.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f);
    match plain {
        true => String::from_utf8_lossy(bytes),
        false => Cow::Owned(crate::output::readable(bytes)),
    }
}

/// Whether a private key is open at `offset` of a log: its BEGIN line within the 8 KiB
/// before it, with no END line after (so a scan that starts or resumes there shows
/// none of the key's lines).
pub(crate) fn key_open_at(path: &std::path::Path, offset: u64, head: u64, dropped: u64) -> bool {
    let from = offset.saturating_sub(8 << 10);
    let (before, _) = crate::output::read_range(path, from, offset, head, dropped);
    crate::redact::private_key_open(&before)
}

/// Reads into `buf` up to [`CHUNK`] bytes of data that `file` holds in `[from, to)`,
/// passing over its holes (its dropped middles: `gap` is the one last reported, see
/// [`crate::output::Holes`]). Returns the offset where the
/// bytes read begin; with `buf` left empty, `[from, to)` held no more data.
pub(crate) fn read_data(
    file: &File,
    from: u64,
    to: u64,
    gap: Range<u64>,
    buf: &mut Vec<u8>,
) -> std::io::Result<u64> {
    buf.clear();
    let holes = crate::output::Holes::new(file, gap.start, gap.end - gap.start);
    let Some(data) = holes.data_at(from, to) else {
        return Ok(to);
    };
    let (start, end) = (data.start, data.end.min(data.start + CHUNK));
    buf.resize((end - start) as usize, 0);
    let filled = crate::output::read_full_at(file, buf, start)?;
    buf.truncate(filled);
    if filled == 0 {
        // The file is shorter than it was: nothing more to read in this range.
        return Ok(to);
    }
    Ok(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> Vec<(Seen, String)> {
        let mut seen = Vec::new();
        let mut scan = LineScan::default();
        let mut each = |s: Seen, t: &str| {
            seen.push((s, t.to_string()));
            false
        };
        for chunk in chunks {
            let at = scan.offset;
            scan.feed(at, chunk, &mut each);
            scan.offer_partial(&mut each);
        }
        scan.finish(&mut each);
        seen
    }

    #[test]
    fn lines_frames_and_the_unterminated_last_line() {
        use Seen::*;
        assert_eq!(
            scan(&[b"one\ntw", b"o\r\n10%\r20%\rREA", b"DY"]),
            vec![
                (Line, "one".into()),
                (Partial, "tw".into()),
                (Line, "two".into()),
                (Frame, "10%".into()),
                (Frame, "20%".into()),
                (Partial, "REA".into()),
                (Partial, "READY".into()),
                (Line, "READY".into()),
            ]
        );
    }

    #[test]
    fn a_long_line_is_matched_on_its_start_and_says_it_was_cut() {
        let long = vec![b'a'; MAX_LINE * 3];
        let seen = scan(&[&long, b"\nshort\n"]);
        assert_eq!(seen.len(), 3, "a partial, the cut line, the short one");
        assert_eq!(seen[1].1.len(), MAX_LINE + CUT_MARK.len());
        assert!(seen[1].1.ends_with(CUT_MARK));
        assert_eq!(seen[2], (Seen::Line, "short".to_string()));
    }

    #[test]
    fn a_resumed_scan_starts_at_the_line_in_progress() {
        let mut scan = LineScan::default();
        scan.feed(0, b"ab\ncd", &mut |_, _| false);
        assert_eq!((scan.offset, scan.line_start), (5, 3));
        scan.feed(5, b"\r", &mut |_, _| false);
        assert_eq!(scan.line_start, 3, "a frame is known only at the next byte");
        scan.feed(6, b"x", &mut |_, _| false);
        assert_eq!(scan.line_start, 6);
    }

    #[test]
    fn holes_are_passed_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        file.set_len(10 << 30).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"end\n", 10 << 30).unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = Vec::new();
        let at = read_data(&file, 0, (10 << 30) + 4, 0..0, &mut buf).unwrap();
        assert_eq!(&buf[buf.len() - 4..], b"end\n");
        assert!(at >= (10 << 30) - CHUNK, "{at}");
    }
}
