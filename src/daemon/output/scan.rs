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

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};
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
}

impl LineScan {
    pub fn at(offset: u64) -> LineScan {
        LineScan {
            offset,
            line_start: offset,
            ..LineScan::default()
        }
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
                        each(Seen::Line, &text(&rest[..k]))
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
        each(Seen::Partial, &text(&self.partial))
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

    fn hand_out(&mut self, seen: Seen, each: &mut impl FnMut(Seen, &str) -> bool) -> bool {
        let mut line = text(&self.partial);
        if self.cut {
            line.to_mut().push_str(CUT_MARK);
        }
        let stop = each(seen, &line);
        self.partial.clear();
        self.partial_offered = false;
        self.cut = false;
        stop
    }
}

/// A line as text for matching: escapes stripped, invalid UTF-8 replaced; plain text
/// (the usual case) is borrowed, not copied.
fn text(bytes: &[u8]) -> Cow<'_, str> {
    let plain = !bytes.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f);
    if plain {
        String::from_utf8_lossy(bytes)
    } else {
        Cow::Owned(crate::output::plain_text(bytes))
    }
}

/// Reads into `buf` up to [`CHUNK`] bytes of data that `file` holds in `[from, to)`,
/// passing over `gap` (a log's dropped middle) and holes. Returns the offset where the
/// bytes read begin; with `buf` left empty, `[from, to)` held no more data.
pub(crate) fn read_data(
    file: &File,
    from: u64,
    to: u64,
    gap: Range<u64>,
    buf: &mut Vec<u8>,
) -> std::io::Result<u64> {
    buf.clear();
    let mut start = from;
    if gap.contains(&start) {
        start = gap.end;
    }
    if start >= to {
        return Ok(to);
    }
    match lseek(file, start as i64, Whence::SeekData) {
        Ok(data) => start = start.max(data as u64),
        // Nothing but a hole from `start` to the end of the file.
        Err(Errno::ENXIO) => return Ok(to),
        // A file system without SEEK_DATA: read the zeros.
        Err(_) => {}
    }
    if start >= to {
        return Ok(to);
    }
    let mut end = to.min(start + CHUNK);
    if !gap.is_empty() && start < gap.start {
        end = end.min(gap.start);
    }
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
