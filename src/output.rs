//! Reading job logs for people and models: byte ranges, the dropped middle, ANSI
//! stripping, carriage-return collapsing, head+tail clipping and last lines.
//!
//! Everything here works on bytes read by offset (`pread`), so reading the newest
//! megabyte of a 1 GB log costs a megabyte, and memory never grows with a log.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The default size of a read's reply.
pub const DEFAULT_MAX_BYTES: usize = 32 << 10;

/// How much of the end of a log a notice or a wait reply carries.
pub const TAIL_BYTES: u64 = 2 << 10;

pub fn log_path(job_dir: &str) -> PathBuf {
    crate::job_dir::JobDir(Path::new(job_dir)).log()
}

/// The current length of a log (0 when it does not exist yet).
pub fn log_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Opens a log for reading: a regular file only, never through a symbolic link, and
/// never blocking on open (a job that put a FIFO in its own folder cannot hang a reader).
pub fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    crate::paths::open_untrusted(path)
}

/// The bytes of `[from, to)` that a log still holds, passing over every hole of the
/// file (its dropped middles: see [`Holes`]). Returns the bytes and how many were
/// skipped.
pub fn read_range(path: &Path, from: u64, to: u64, head: u64, dropped: u64) -> (Vec<u8>, u64) {
    let Ok(file) = open_log(path) else {
        return (Vec::new(), 0);
    };
    Holes::new(&file, head, dropped).read(from, to)
}

/// The bytes of `[from, to)` as the file holds them (a hole as zeros), up to its end.
pub fn read_span(path: &Path, from: u64, to: u64) -> Vec<u8> {
    let Ok(file) = open_log(path) else {
        return Vec::new();
    };
    let mut bytes = vec![0u8; to.saturating_sub(from) as usize];
    let read = read_full_at(&file, &mut bytes, from);
    bytes.truncate(read.unwrap_or(0));
    bytes
}

/// How many bytes of `[from, to)` of a log are dropped now (lie in its holes).
pub fn dropped_now(path: &Path, from: u64, to: u64, head: u64, dropped: u64) -> u64 {
    match open_log(path) {
        Ok(file) => Holes::new(&file, head, dropped).dropped_in(from, to),
        Err(_) => dropped_in(from, to, head, dropped),
    }
}

/// The first stretch of output of `[from, to)` of a log (see [`Holes::data_at`]).
pub fn data_in(
    path: &Path,
    from: u64,
    to: u64,
    head: u64,
    dropped: u64,
) -> Option<std::ops::Range<u64>> {
    let file = open_log(path).ok()?;
    Holes::new(&file, head, dropped).data_at(from, to)
}

/// Where the last hole of `[from, to)` of a log ends (the newest output follows it),
/// if it has one.
pub fn last_gap_end(path: &Path, from: u64, to: u64, head: u64, dropped: u64) -> Option<u64> {
    let file = open_log(path).ok()?;
    Holes::new(&file, head, dropped)
        .gaps(from, to)
        .last()
        .map(|gap| gap.end)
}

/// Where a log's output lies: the middles its cap dropped are the file's holes, read
/// from the file itself (`SEEK_DATA`/`SEEK_HOLE`), so a reader finds every one of them
/// wherever it lies and however many there are: a local log's (`[head, head +
/// dropped)`, or further when the cap has punched again since its figure came), and a
/// mirror's, whose holes lie where the host's cap and the mirror's pace put them (one
/// for each time the host dropped more than the mirror had read).
///
/// A hole begins at a block boundary; the bytes of its block before it that read as
/// zeros were zeroed by the punch (or an extension of the file) and are the hole's, so
/// no reader is ever given a hole's zeros. A local log's `head`, when it falls among
/// them, is where its hole begins exactly (zeros the job wrote itself before it stay
/// output). On a file system that reports no holes, a local log's reported figure
/// `[head, head + dropped)` is its dropped middle.
#[derive(Clone, Copy)]
pub struct Holes<'a> {
    file: &'a std::fs::File,
    len: u64,
    head: u64,
    dropped: u64,
    /// The file reports no hole though the cap dropped bytes: the figure is used.
    by_figure: bool,
    /// Nothing was dropped and the file's blocks cover its length: it has no hole, and
    /// no `SEEK_DATA`/`SEEK_HOLE` is asked (a chatty job's output is read many times a
    /// second, each look a few bytes at its end).
    whole: bool,
    block: u64,
}

impl<'a> Holes<'a> {
    pub fn new(file: &'a std::fs::File, head: u64, dropped: u64) -> Holes<'a> {
        use nix::unistd::{lseek, Whence};
        use std::os::unix::fs::MetadataExt;
        let (len, block, allocated) = file
            .metadata()
            .map_or((0, 4096, 0), |m| (m.len(), m.blksize(), m.blocks() * 512));
        let by_figure = dropped > 0
            && match lseek(file, 0, Whence::SeekHole) {
                Ok(hole) => hole as u64 >= len,
                Err(_) => true,
            };
        Holes {
            file,
            len,
            head,
            dropped,
            by_figure,
            whole: dropped == 0 && allocated >= len,
            block: block.clamp(512, 1 << 20),
        }
    }

    /// The first stretch of output at or after `at` and before `to`: `[start, end)`,
    /// all data (no hole and none of a hole's zeros), or `None` when `[at, to)` holds
    /// none.
    pub fn data_at(&self, at: u64, to: u64) -> Option<std::ops::Range<u64>> {
        use nix::unistd::{lseek, Whence};
        let mut at = at;
        loop {
            if at >= to {
                return None;
            }
            if self.whole {
                return Some(at..to);
            }
            if self.by_figure {
                return self.data_by_figure(at, to);
            }
            let start = match lseek(self.file, at as i64, Whence::SeekData) {
                Ok(data) => (data as u64).max(at),
                // Only a hole from `at` to the end of the file (or `at` is past it).
                Err(nix::errno::Errno::ENXIO) => return None,
                // No SEEK_DATA here: the bytes are read as they are.
                Err(_) => return Some(at..to),
            };
            if start >= to {
                return None;
            }
            let hole = match lseek(self.file, start as i64, Whence::SeekHole) {
                Ok(hole) => hole as u64,
                Err(_) => return Some(start..to),
            };
            // The end of the file is no hole (it may have grown since it was looked at).
            if hole >= to || hole >= file_len(self.file) {
                return Some(start..to);
            }
            let end = self.zeros_before(start, hole);
            if end > start {
                return Some(start..end);
            }
            // Nothing but a hole's zeros: the data goes on after the hole.
            at = hole;
        }
    }

    /// Where the output before a hole at `hole` ends: before the zeros of the hole's
    /// block that lie before it (from `start` on), or at `head` among them.
    fn zeros_before(&self, start: u64, hole: u64) -> u64 {
        let from = start.max(hole.saturating_sub(self.block));
        let mut bytes = vec![0u8; (hole - from) as usize];
        let read = read_full_at(self.file, &mut bytes, from).unwrap_or(0);
        bytes.truncate(read);
        let kept = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let end = from + kept as u64;
        match self.dropped > 0 && (end..=hole).contains(&self.head) {
            true => self.head,
            false => end,
        }
    }

    /// [`Holes::data_at`] by the reported figure (a file system that shows no holes).
    fn data_by_figure(&self, at: u64, to: u64) -> Option<std::ops::Range<u64>> {
        let gap = self.head..self.head + self.dropped;
        let start = match gap.contains(&at) {
            true => gap.end,
            false => at,
        };
        let end = match start < gap.start {
            true => to.min(gap.start),
            false => to,
        };
        (start < end).then_some(start..end)
    }

    /// The holes of `[from, to)`, up to the file's end, in order.
    pub fn gaps(&self, from: u64, to: u64) -> Vec<std::ops::Range<u64>> {
        if self.whole {
            return Vec::new();
        }
        let to = to.min(self.len.max(file_len(self.file)));
        let mut gaps = Vec::new();
        let mut at = from;
        while at < to {
            let data = self.data_at(at, to).unwrap_or(to..to);
            if data.start > at {
                gaps.push(at..data.start);
            }
            at = data.end.max(at + 1);
        }
        gaps
    }

    /// How many bytes of `[from, to)` lie in holes.
    pub fn dropped_in(&self, from: u64, to: u64) -> u64 {
        self.gaps(from, to)
            .iter()
            .map(|gap| gap.end - gap.start)
            .sum()
    }

    /// The output of `[from, to)` (its holes passed over) and how many bytes of it lay
    /// in holes.
    pub fn read(&self, from: u64, to: u64) -> (Vec<u8>, u64) {
        let mut bytes = Vec::new();
        let mut skipped = 0;
        let mut at = from;
        while at < to {
            let Some(data) = self.data_at(at, to) else {
                skipped += to.min(self.len).saturating_sub(at);
                break;
            };
            skipped += data.start - at;
            let was = bytes.len();
            bytes.resize(was + (data.end - data.start) as usize, 0);
            let read = read_full_at(self.file, &mut bytes[was..], data.start).unwrap_or(0);
            bytes.truncate(was + read);
            skipped += self.take_out_new_holes(data.start, &mut bytes, was);
            if (read as u64) < data.end - data.start {
                // The file is shorter than it was: nothing more in this range.
                break;
            }
            at = data.end;
        }
        (bytes, skipped)
    }
}

impl Holes<'_> {
    /// Takes out of `bytes[was..]` (read from `start`) what lies in a hole now, and
    /// returns how many bytes that was: the cap may punch part of a range while it is
    /// read (those bytes read as zeros), and no reader is given a hole's zeros.
    fn take_out_new_holes(&self, start: u64, bytes: &mut Vec<u8>, was: usize) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let end = start + (bytes.len() - was) as u64;
        let holes = match self.whole {
            // A file with no hole before the read has none after it unless its blocks
            // no longer cover it (the cap's first punch came meanwhile).
            true => match self.file.metadata() {
                Ok(m) if m.blocks() * 512 >= m.len() => return 0,
                _ => Holes {
                    whole: false,
                    ..*self
                },
            },
            false => *self,
        };
        let gaps = holes.gaps(start, end);
        for gap in gaps.iter().rev() {
            let (from, to) = (gap.start - start, gap.end.min(end) - start);
            bytes.drain(was + from as usize..was + to as usize);
        }
        gaps.iter().map(|gap| gap.end.min(end) - gap.start).sum()
    }
}

fn file_len(file: &std::fs::File) -> u64 {
    file.metadata().map_or(0, |m| m.len())
}

/// How far back [`text_end`] looks for the start of an unfinished escape sequence.
const HOLD_BACK_MAX: u64 = 4096;

/// Where readable text of `[from, to)` of a log that is still being written may end:
/// before an unfinished UTF-8 character or escape sequence at its very end, whose rest
/// has not arrived yet. A reader that stops there (and moves its cursor there) reads
/// the character whole next time instead of two halves shown as U+FFFD.
pub fn text_end(path: &Path, from: u64, to: u64, head: u64, dropped: u64) -> u64 {
    let start = to.saturating_sub(HOLD_BACK_MAX).max(from);
    let (bytes, _) = read_range(path, start, to, head, dropped);
    if bytes.len() as u64 != to - start {
        // The range crosses the dropped middle or the file is short: hold nothing back.
        return to;
    }
    to - crate::rendered::unfinished_suffix(&bytes) as u64
}

/// A range of a log, whole or as its head and tail when larger than `max` bytes, so
/// that memory stays bounded whatever the range.
pub struct Excerpt {
    pub head: Vec<u8>,
    /// Bytes left out between head and tail, and the tail.
    pub tail: Option<(u64, Vec<u8>)>,
    /// Bytes of the range that the log cap had dropped.
    pub skipped: u64,
}

pub fn excerpt(path: &Path, from: u64, to: u64, head: u64, dropped: u64, max: usize) -> Excerpt {
    let max = max as u64;
    if to.saturating_sub(from) <= max {
        let (bytes, skipped) = read_range(path, from, to, head, dropped);
        return Excerpt {
            head: bytes,
            tail: None,
            skipped,
        };
    }
    // Neither edge of the elided middle cuts a token shape: the head ends before one,
    // the tail starts after one (its bytes are elided with the middle).
    let view = LogView {
        path,
        len: to,
        head,
        dropped,
    };
    let (_, head_end) = view.token_edges(from, from + max / 2, false);
    let (skip, _) = view.token_edges(to - max / 2, to, false);
    let tail_start = to - max / 2 + skip;
    if head_end >= tail_start {
        let (bytes, skipped) = read_range(path, from, to, head, dropped);
        return Excerpt {
            head: bytes,
            tail: None,
            skipped,
        };
    }
    let (first, skipped_first) = read_range(path, from, head_end, head, dropped);
    let (last, skipped_last) = read_range(path, tail_start, to, head, dropped);
    let elided = tail_start - head_end;
    Excerpt {
        head: first,
        tail: Some((elided, last)),
        skipped: skipped_first + skipped_last,
    }
}

impl Excerpt {
    /// Readable text of the excerpt, with an elision line naming the log; and whether
    /// anything was left out.
    pub fn render(&self, max: usize, log_path: &Path) -> (String, bool) {
        self.render_as(max, log_path, readable)
    }

    /// [`Excerpt::render`] (token shapes masked when `redact`, else [`plain_text`]),
    /// taking the excerpt: a whole range's bytes become its text in place when they
    /// need no rendering.
    pub fn into_text(self, max: usize, log_path: &Path, redact: bool) -> (String, bool) {
        match self.tail {
            None => {
                let text = crate::rendered::text_owned(self.head);
                let text = match redact {
                    true => crate::redact::mask_shapes(text),
                    false => text,
                };
                clip(text, max, log_path)
            }
            Some(_) => self.render_as(max, log_path, if redact { readable } else { plain_text }),
        }
    }

    /// [`Excerpt::render`] with `readable` turning bytes into text.
    pub fn render_as(
        &self,
        max: usize,
        log_path: &Path,
        readable: fn(&[u8]) -> String,
    ) -> (String, bool) {
        match &self.tail {
            None => clip(readable(&self.head), max, log_path),
            Some((elided, tail)) => {
                let text = format!(
                    "{}\n[... {elided} bytes not shown; the whole output is in {} (bgwork read --from BYTE) ...]\n{}",
                    readable(&self.head),
                    log_path.display(),
                    readable(tail)
                );
                (text, true)
            }
        }
    }
}

/// How many bytes of `[from, to)` the log cap dropped (they lie in
/// `[head, head + dropped)`).
pub fn dropped_in(from: u64, to: u64, head: u64, dropped: u64) -> u64 {
    let (start, end) = (from.max(head), to.min(head + dropped));
    end.saturating_sub(start)
}

/// Text for a model: escape sequences stripped, progress-bar rewrites (`\r`) collapsed
/// to each line's final state, invalid UTF-8 replaced, token shapes masked
/// ([`crate::redact::mask_shapes`]).
pub fn readable(bytes: &[u8]) -> String {
    crate::redact::mask_shapes(plain_text(bytes))
}

/// [`readable`] text with token shapes left as they are (for matching, or for the
/// person who asked with `--no-redact`): the one rendering, [`crate::rendered::text`].
pub fn plain_text(bytes: &[u8]) -> String {
    crate::rendered::text(bytes)
}

/// Clips text longer than `max` to its head and tail around an elision line.
pub fn clip(text: String, max: usize, log_path: &Path) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let half = max / 2;
    let head_end = floor_char_boundary(&text, half);
    let tail_start = ceil_char_boundary(&text, text.len() - half);
    let elided = tail_start - head_end;
    let clipped = format!(
        "{}\n[... {elided} bytes not shown; the whole output is in {} (bgwork read --from BYTE) ...]\n{}",
        &text[..head_end],
        log_path.display(),
        &text[tail_start..]
    );
    (clipped, true)
}

/// The last `n` lines of a text.
pub fn last_lines(text: &str, n: usize) -> String {
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let start = trimmed
        .rmatch_indices('\n')
        .nth(n.saturating_sub(1))
        .map(|(i, _)| i + 1)
        .unwrap_or(0);
    if n == 0 {
        return String::new();
    }
    text[start..].to_string()
}

/// The readable last lines of a log (up to [`TAIL_BYTES`]), starting at a line. A
/// token its start would cut is left out, and one its end may cut (a job still writing
/// it) is shown as `[secret token]`, so no part of either is shown.
pub fn tail(path: &Path, head: u64, dropped: u64) -> String {
    let len = log_len(path);
    let view = LogView {
        path,
        len,
        head,
        dropped,
    };
    let from = len.saturating_sub(TAIL_BYTES);
    let (cut, _) = view.token_edges(from, len, false);
    let from = from + cut;
    let (mut bytes, _) = read_range(path, from, len, head, dropped);
    let unfinished = crate::redact::unfinished_token(&bytes);
    if let Some(start) = unfinished {
        bytes.truncate(start);
    }
    let mut text = readable(&bytes);
    if unfinished.is_some() {
        text.push_str(crate::redact::CUT_TOKEN);
    }
    if from == 0 {
        return text;
    }
    match text.find('\n') {
        Some(i) if i + 1 < text.len() => text[i + 1..].to_string(),
        _ => text,
    }
}

/// How far around a read's edges token shapes are looked for.
const TOKEN_CONTEXT: u64 = 2048;
/// How far back a read looks for the start of a private key it may begin inside (an
/// RSA 4096 key takes about 3.3 KB).
const KEY_CONTEXT: u64 = 8 << 10;

/// A log as a read sees it, to look around the edges of its range.
pub struct LogView<'a> {
    pub path: &'a Path,
    /// The log's length (how far there is something to look at).
    pub len: u64,
    pub head: u64,
    pub dropped: u64,
}

impl LogView<'_> {
    /// `[from, to)` of the log, or `None` where the log does not hold all of it (the
    /// dropped middle, a short file).
    fn bytes(&self, from: u64, to: u64) -> Option<Vec<u8>> {
        let (bytes, skipped) = read_range(self.path, from, to, self.head, self.dropped);
        (skipped == 0 && bytes.len() as u64 == to - from).then_some(bytes)
    }

    /// When `from` lies inside a private key (its BEGIN line before, within
    /// [`KEY_CONTEXT`]): how many bytes from `from` on are the rest of it, to its END line
    /// or, with none in sight, to `to`. Else 0.
    fn rest_of_private_key(&self, from: u64, to: u64) -> u64 {
        let around = from.saturating_sub(KEY_CONTEXT);
        let inside = self
            .bytes(around, from)
            .is_some_and(|before| crate::redact::private_key_open(&before));
        if !inside {
            return 0;
        }
        let after = self.bytes(from, (from + KEY_CONTEXT).min(self.len));
        match after.and_then(|after| crate::redact::private_key_end(&after)) {
            Some(end) => end as u64,
            None => to - from,
        }
    }

    /// A read of `[from, to)` moved so that no token shape is cut at its edges: how
    /// many bytes at `from` end a token begun before it (shown as one marker), and the
    /// end moved back before a token that runs past it (or past the token, when the
    /// whole range lies inside one) and, while the item runs, before a token at the
    /// log's end that more output may finish.
    pub fn token_edges(&self, from: u64, to: u64, running: bool) -> (u64, u64) {
        let mut cut = 0;
        let around = from.saturating_sub(TOKEN_CONTEXT);
        if let Some(bytes) = self.bytes(around, (from + TOKEN_CONTEXT).min(self.len)) {
            if let Some((_, end)) = crate::redact::token_across(&bytes, (from - around) as usize) {
                cut = around + end as u64 - from;
            }
        }
        if cut == 0 {
            cut = self.rest_of_private_key(from, to);
        }
        if from + cut >= to {
            return (cut, from + cut);
        }
        let start = to.saturating_sub(TOKEN_CONTEXT).max(from + cut);
        let Some(bytes) = self.bytes(start, (to + TOKEN_CONTEXT).min(self.len)) else {
            return (cut, to);
        };
        let at = (to - start) as usize;
        if let Some((token_start, token_end)) = crate::redact::token_across(&bytes, at) {
            let token_start = start + token_start as u64;
            return match token_start > from + cut {
                true => (cut, token_start),
                false => (cut, start + token_end as u64),
            };
        }
        let more_may_come = running && to >= self.len;
        // A token that more output may finish is held back whole (even when that
        // leaves nothing to show now).
        match crate::redact::unfinished_token(&bytes[..at]).map(|at| start + at as u64) {
            Some(token_start) if more_may_come && token_start >= from + cut => (cut, token_start),
            _ => (cut, to),
        }
    }
}

fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    while index > 0 && !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_char_boundary(text: &str, mut index: usize) -> usize {
    while index < text.len() && !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

/// Holes are punched in steps of this many bytes, so punching is rare.
const PUNCH_STEP: u64 = 1 << 20;

/// Keeps a log of `len` bytes within `cap`: punches a hole (in whole [`PUNCH_STEP`]s)
/// from `punched_to` up to where the newest `cap - head` bytes begin, so the first `head`
/// bytes and the newest stay and no offset moves. Returns how far the log is released.
pub fn release_middle(
    file: &std::fs::File,
    len: u64,
    cap: u64,
    head: u64,
    punched_to: u64,
) -> nix::Result<u64> {
    use nix::fcntl::{fallocate, FallocateFlags};
    if len <= cap {
        return Ok(punched_to);
    }
    let keep_from = len - (cap - head);
    let target = keep_from - keep_from % PUNCH_STEP;
    if target < punched_to + PUNCH_STEP {
        return Ok(punched_to);
    }
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(file, flags, punched_to as i64, (target - punched_to) as i64)?;
    Ok(target)
}

/// Reads into all of `buf` from `offset`, or as much as the file has there: the bytes
/// read (fewer only at the file's end).
pub fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_bar_collapses_to_its_last_frame() {
        let frames: String = (0..=100).map(|p| format!("\r{p:3}%")).collect();
        assert_eq!(
            plain_text(format!("{frames}\ndone\n").as_bytes()),
            "100%\ndone\n"
        );
        assert_eq!(plain_text(b"abcdef\rXY\n"), "XYcdef\n");
        assert_eq!(plain_text(b"crlf\r\n"), "crlf\n");
    }

    #[test]
    fn escapes_are_stripped_and_bad_utf8_replaced() {
        assert_eq!(readable(b"\x1b[31mred\x1b[0m \xff!"), "red \u{fffd}!");
    }

    #[test]
    fn c1_controls_are_stripped_with_their_sequences() {
        // U+009B CSI and U+009D OSC as UTF-8, the 8-bit bytes, and DEL.
        assert_eq!(
            readable("a\u{9b}2Jb\u{9d}0;T\u{7}c\u{85}d\n".as_bytes()),
            "abcd\n"
        );
        assert_eq!(readable(b"a\x9b2Jb\x7f\n"), "a2Jb\n");
        assert_eq!(
            readable("caf\u{e9} \u{a0}ok".as_bytes()),
            "caf\u{e9} \u{a0}ok"
        );
    }

    #[test]
    fn clipping_keeps_head_and_tail_and_names_the_log() {
        let text = format!("{}{}", "a".repeat(1000), "z".repeat(1000));
        let (clipped, was) = clip(text, 100, Path::new("/x/output.log"));
        assert!(was);
        assert!(clipped.starts_with(&"a".repeat(50)));
        assert!(clipped.ends_with(&"z".repeat(50)));
        assert!(clipped.contains("/x/output.log"));
    }

    #[test]
    fn last_lines_counts_from_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 5), "a\nb\nc");
    }
}

#[cfg(test)]
mod holes_tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn issue24_w1_every_hole_of_a_log_is_passed_over_whatever_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        // Output to 100_037, a hole to 3 MiB (set_len, as a mirror leaves one), output,
        // a hole from 5_000_011 to 6 MiB, output.
        file.write_all(&vec![b'a'; 100_037]).unwrap();
        file.set_len(3 << 20).unwrap();
        file.write_all(&vec![b'b'; 5_000_011 - (3 << 20)]).unwrap();
        file.set_len(6 << 20).unwrap();
        file.write_all(b"newest\n").unwrap();
        let file = open_log(&path).unwrap();
        // Whatever head and figure a reader holds (this daemon's, not the host's).
        for (head, dropped) in [(0, 0), (1 << 20, 7 << 20), (65_573, 1000)] {
            let holes = Holes::new(&file, head, dropped);
            let (bytes, skipped) = holes.read(0, 6 << 20 | 7);
            assert!(!bytes.contains(&0), "no zeros with head {head}");
            assert!(bytes.ends_with(b"newest\n"));
            assert_eq!(bytes.len(), 100_037 + 5_000_011 - (3 << 20) + 7);
            assert_eq!(
                skipped,
                (3 << 20) - 100_037 + (6 << 20) - 5_000_011,
                "head {head} {:?}",
                holes.gaps(0, 6 << 20 | 7)
            );
            let gaps = holes.gaps(0, 6 << 20 | 7);
            assert_eq!(gaps, vec![100_037..3 << 20, 5_000_011..6 << 20]);
            assert_eq!(holes.data_at(200_000, 7 << 20), Some(3 << 20..5_000_011));
        }
    }

    #[test]
    fn bytes_the_cap_punches_while_they_are_read_are_passed_over() {
        // A read found data, then the cap punched part of it before the bytes were
        // read: they read as zeros, and a hole now holds them.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        std::fs::write(&path, vec![b'a'; 3 << 20]).unwrap();
        let file = open_log(&path).unwrap();
        let holes = Holes::new(&file, 4096, 0);
        let mut bytes = b"kept".to_vec();
        bytes.extend(read_span(&path, 0, 3 << 20));
        let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        release_middle(&writer, 3 << 20, 1 << 20, 4096, 4096).unwrap();
        let mut zeroed = bytes.clone();
        zeroed[4 + 4096..4 + (2 << 20)].fill(0);
        for mut read in [bytes, zeroed] {
            let skipped = holes.take_out_new_holes(0, &mut read, 4);
            assert_eq!(skipped, (2 << 20) - 4096);
            assert_eq!(read.len(), 4 + (3 << 20) - (skipped as usize));
            assert!(read.starts_with(b"kept") && !read.contains(&0));
        }
    }
}
