//! A pane's visible screen: a vt100 emulator fed from the pane's log.
//!
//! How it works: a screen is kept while its pane runs (fed only the bytes that arrived
//! since the last read) and dropped when the pane ends; a screen not kept (after a
//! restart, for an ended pane, or evicted to stay within [`CELL_BUDGET`]) is rebuilt
//! from the log's last [`TAIL`] bytes, never from the whole log. When those bytes are
//! plain lines, only the lines that can still be on the screen are fed (see
//! [`plain_cut`]), so a screen costs the same whatever the log's size. The feeding
//! happens off the daemon's lock, on a blocking thread.

use crate::output;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The most of a log a screen is rebuilt from.
pub(super) const TAIL: u64 = 256 << 10;
/// The most screen cells kept for running panes; past it the least recently read
/// screens are dropped (and rebuilt from their log's tail when read again).
const CELL_BUDGET: usize = 500_000;
/// The most screens kept, whatever their size (an emulator costs more than its cells).
const MAX_KEPT: usize = 64;

/// A screen's key: the record's row and its start time, which are never both reused.
type Key = (i64, i64);

/// The screens kept for running panes.
#[derive(Default)]
pub(crate) struct Screens {
    kept: HashMap<Key, Kept>,
    clock: u64,
}

struct Kept {
    screen: Arc<Mutex<Screen>>,
    cells: usize,
    used: u64,
}

impl Screens {
    /// The screen kept for `key` (a new one if none), dropping the least recently read
    /// others while the kept screens or cells pass their bounds.
    pub(super) fn get(&mut self, key: Key, cells: usize) -> Arc<Mutex<Screen>> {
        self.clock += 1;
        let now = self.clock;
        let kept = self.kept.entry(key).or_insert_with(|| Kept {
            screen: Arc::default(),
            cells,
            used: now,
        });
        kept.used = now;
        kept.cells = cells;
        let screen = kept.screen.clone();
        while self.kept.len() > MAX_KEPT
            || self.kept.values().map(|k| k.cells).sum::<usize>() > CELL_BUDGET
        {
            let oldest = self
                .kept
                .iter()
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, kept)| kept.used)
                .map(|(k, _)| *k);
            match oldest {
                Some(oldest) => self.kept.remove(&oldest),
                None => break,
            };
        }
        screen
    }

    /// Drops the screen of a record (its item ended, or its record is gone).
    pub(crate) fn forget(&mut self, row: i64) {
        self.kept.retain(|key, _| key.0 != row);
    }
}

/// A terminal emulator and how far into the log it has been fed.
#[derive(Default)]
pub(crate) struct Screen {
    pub(super) parser: Option<vt100::Parser>,
    fed: u64,
}

/// A pane's size from a log offset on: `(offset, cols, rows)`.
pub(super) type SizeAt = (u64, u16, u16);

/// What a screen is fed from.
pub(super) struct Source {
    pub(super) log: PathBuf,
    pub(super) len: u64,
    pub(super) head: u64,
    pub(super) dropped: u64,
    /// Sizes in log order; the first applies from offset 0.
    pub(super) sizes: Vec<SizeAt>,
}

impl Source {
    /// `(cols, rows)` in effect at a log offset.
    pub(super) fn size_at(&self, offset: u64) -> (u16, u16) {
        let at = self
            .sizes
            .iter()
            .take_while(|(from, _, _)| *from <= offset)
            .last()
            .or(self.sizes.first())
            .unwrap_or(&(0, 120, 40));
        (at.1, at.2)
    }
}

impl Screen {
    /// Feeds the screen up to the log's end and returns its text.
    pub(super) fn catch_up(&mut self, source: &Source) -> String {
        let len = source.len;
        let mut oldest = len.saturating_sub(TAIL);
        let last_gap = output::last_gap_end(&source.log, oldest, len, source.head, source.dropped);
        if let Some(hole_end) = last_gap.filter(|&end| end < len) {
            // Not the log's head and newest bytes as if one followed the other: the
            // newest alone.
            oldest = hole_end;
        }
        if self.parser.is_none() || self.fed < oldest || self.fed > len {
            self.parser = None;
            self.fed = oldest;
        }
        let (mut bytes, _) =
            output::read_range(&source.log, self.fed, len, source.head, source.dropped);
        if bytes.len() as u64 != len - self.fed {
            // The range crossed the dropped middle (or the file is short): start afresh
            // from what is there.
            self.parser = None;
            self.fed = len - bytes.len() as u64;
        }
        // A screen built afresh from plain lines needs them only from where they can
        // still be on the screen (after the last resize). A screen fed before is fed
        // every new byte: it may hold state (a scroll region, say) that a cut would lose.
        let last_resize = source
            .sizes
            .iter()
            .map(|s| s.0)
            .filter(|&at| at > self.fed && at <= len)
            .max()
            .unwrap_or(self.fed);
        let (_, rows) = source.size_at(len);
        let searched = (last_resize - self.fed) as usize;
        let cut = match self.parser {
            None => plain_cut(&bytes, searched, rows).or_else(|| last_clear(&bytes, searched)),
            Some(_) => None,
        };
        if let Some(cut) = cut {
            self.parser = None;
            self.fed += cut as u64;
            bytes.drain(..cut);
        }
        let fed = self.fed;
        let parser = self.parser.get_or_insert_with(|| {
            let (cols, rows) = source.size_at(fed);
            vt100::Parser::new(rows, cols, 0)
        });
        let (cols, rows) = source.size_at(fed);
        if parser.screen().size() != (rows, cols) {
            set_size(parser, rows, cols);
        }
        let mut at = fed;
        let mut rest: &[u8] = &bytes;
        for &(offset, cols, rows) in source.sizes.iter().filter(|s| s.0 > fed && s.0 <= len) {
            let (now, later) = rest.split_at(((offset - at) as usize).min(rest.len()));
            parser.process(now);
            set_size(parser, rows, cols);
            rest = later;
            at = offset;
        }
        parser.process(rest);
        self.fed = len;
        parser.screen().contents()
    }
}

/// Resizes a screen as a terminal does: with fewer rows than the cursor's, the top rows
/// scroll away so that the cursor's row (a prompt, the newest output) stays on screen;
/// vt100 alone would drop the bottom rows.
fn set_size(parser: &mut vt100::Parser, rows: u16, cols: u16) {
    let (row, _) = parser.screen().cursor_position();
    if row >= rows {
        let by = row - rows + 1;
        // Scroll up (SU) and move the cursor up (CUU) with the text.
        parser.process(format!("\x1b[{by}S\x1b[{by}A").as_bytes());
    }
    parser.screen_mut().set_size(rows, cols);
}

/// Where feeding `bytes` can start and give the same screen as feeding them all: just
/// after a `\r\n` (the cursor at a line's start) followed by at least twice `rows` line
/// feeds, so every row on the screen at the end was scrolled in after that point. Only
/// when every byte is plain: printable text, `\r \n \t \b BEL`, and escape sequences that
/// change no more than one line (colours, erasing in the line, titles, modes such as
/// bracketed paste). The cut lies at or after `from`.
fn plain_cut(bytes: &[u8], from: usize, rows: u16) -> Option<usize> {
    let needed = 2 * rows as usize;
    let mut feeds = 0;
    let mut cut = None;
    for i in (from.max(2)..=bytes.len()).rev() {
        if bytes[i - 1] == b'\n' && bytes[i - 2] == b'\r' && feeds >= needed {
            cut = Some(i);
            break;
        }
        if bytes[i - 1] == b'\n' {
            feeds += 1;
        }
    }
    let cut = cut?;
    is_plain(bytes).then_some(cut)
}

/// Where the last sequence that clears the whole screen starts (a reset, erasing the
/// display, entering the alternate screen), at or after `from`: what came before it is
/// off the screen, so a screen built afresh starts there (replaying it).
fn last_clear(bytes: &[u8], from: usize) -> Option<usize> {
    const CLEARS: [&[u8]; 5] = [
        b"\x1bc",
        b"\x1b[2J",
        b"\x1b[?1049h",
        b"\x1b[?1047h",
        b"\x1b[?47h",
    ];
    let region = bytes.get(from..)?;
    let mut at = region.len();
    while let Some(esc) = region[..at].iter().rposition(|&b| b == 0x1b) {
        if CLEARS.iter().any(|clear| region[esc..].starts_with(clear)) {
            return Some(from + esc).filter(|&cut| cut > 0);
        }
        at = esc;
    }
    None
}

/// Whether every byte is printable text, a line control, or a one-line escape sequence.
fn is_plain(bytes: &[u8]) -> bool {
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        i += 1;
        match b {
            b'\r' | b'\n' | b'\t' | 0x08 | 0x07 => {}
            0x1b => match plain_escape(&bytes[i..]) {
                Some(n) => i += n,
                None => return false,
            },
            // Other C0 controls (vertical tab and form feed move down, shifts change
            // the character set).
            0x00..=0x1f | 0x7f => return false,
            // U+0080..U+009F, the C1 controls, encoded in UTF-8.
            0xc2 if bytes.get(i).is_some_and(|c| (0x80..=0x9f).contains(c)) => return false,
            _ => {}
        }
    }
    true
}

/// The length (after the ESC) of an escape sequence that changes at most the cursor's
/// line, or `None`.
fn plain_escape(rest: &[u8]) -> Option<usize> {
    match rest.first()? {
        b'[' => {
            let end = rest[1..].iter().position(|b| !(0x20..=0x3f).contains(b))? + 1;
            let params = &rest[1..end];
            let plain = match rest[end] {
                // Colours and attributes; erasing characters or the line.
                b'm' | b'K' | b'X' => true,
                // Private modes that do not move text: cursor keys, blinking and
                // visible cursor, mouse reports, focus, bracketed paste, synchronised
                // output.
                b'h' | b'l' => params.strip_prefix(b"?").is_some_and(|modes| {
                    modes.split(|&b| b == b';').all(|m| {
                        matches!(
                            m,
                            b"1" | b"12"
                                | b"25"
                                | b"1000"
                                | b"1002"
                                | b"1003"
                                | b"1004"
                                | b"1006"
                                | b"2004"
                                | b"2026"
                        )
                    })
                }),
                _ => false,
            };
            plain.then_some(end + 1)
        }
        // Titles, hyperlinks: up to BEL or ESC \.
        b']' => {
            let end = rest.iter().position(|&b| b == 0x07 || b == 0x1b)?;
            match rest[end] {
                0x07 => Some(end + 1),
                _ if rest.get(end + 1) == Some(&b'\\') => Some(end + 2),
                _ => None,
            }
        }
        // Keypad modes; the ASCII character set.
        b'=' | b'>' => Some(1),
        b'(' if rest.get(1) == Some(&b'B') => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn screen_of(chunks: &[&[u8]], rows: u16, cols: u16) -> String {
        let mut parser = vt100::Parser::new(rows, cols, 0);
        for chunk in chunks {
            parser.process(chunk);
        }
        parser.screen().contents()
    }

    #[test]
    fn a_plain_cut_gives_the_same_screen() {
        let mut log = Vec::new();
        for i in 0..500 {
            log.extend_from_slice(
                format!("\x1b[32mline {i}\x1b[0m {}\r\n", "x".repeat(i % 70)).as_bytes(),
            );
        }
        log.extend_from_slice(b"prompt$ \x1b]0;title\x07half");
        let cut = plain_cut(&log, 0, 10).expect("a cut");
        assert!(cut > log.len() - 2000, "feeds only the last lines");
        assert_eq!(
            screen_of(&[&log[cut..]], 10, 40),
            screen_of(&[&log], 10, 40)
        );
    }

    #[test]
    fn no_cut_through_cursor_movement_or_scroll_regions() {
        let mut log = b"\x1b[2;5r".to_vec();
        for i in 0..100 {
            log.extend_from_slice(format!("line {i}\r\n").as_bytes());
        }
        assert_eq!(plain_cut(&log, 0, 10), None);
        let mut log = b"top\r\n".repeat(100);
        log.extend_from_slice(b"\x1b[5Aover");
        assert_eq!(plain_cut(&log, 0, 10), None);
        // Too few lines to cut anything.
        assert_eq!(plain_cut(&b"a\r\n".repeat(19), 0, 10), None);
    }

    #[test]
    fn a_screen_built_afresh_starts_at_the_last_clear() {
        let mut log = b"\x1b[5;10rold screen\x1b[2J".to_vec();
        let second = log.len() - 4;
        log.extend_from_slice(b"\x1b[Hdrawn\x1b[3;1Hagain");
        assert_eq!(last_clear(&log, 0), Some(second));
        assert_eq!(last_clear(&log, second + 1), None);
        assert_eq!(
            screen_of(&[&log[second..]], 5, 20),
            screen_of(&[&log], 5, 20)
        );
        assert_eq!(last_clear(b"\x1b[2Jat the start", 0), None);
    }

    #[test]
    fn a_tail_rebuild_matches_a_full_feed_for_plain_output() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("output.log");
        let bytes: Vec<u8> = (0..100_000)
            .flat_map(|i| format!("{i} \u{e9}t\u{e9}\r\n").into_bytes())
            .collect();
        std::fs::write(&log, &bytes).unwrap();
        let source = Source {
            log,
            len: bytes.len() as u64,
            head: 1 << 20,
            dropped: 0,
            sizes: vec![(0, 30, 5)],
        };
        let text = Screen::default().catch_up(&source);
        assert_eq!(text, screen_of(&[&bytes], 5, 30));
    }

    #[test]
    fn a_screen_is_never_fed_the_logs_head_and_newest_bytes_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("output.log");
        // A capped log: "HEAD" kept, a dropped middle (a hole reads as zeros), the newest.
        let mut bytes = b"HEAD-LINE\r\n".to_vec();
        bytes.resize(1000, 0);
        bytes.extend_from_slice(b"newest\r\n");
        std::fs::write(&log, &bytes).unwrap();
        let source = Source {
            log,
            len: bytes.len() as u64,
            head: 11,
            dropped: 989,
            sizes: vec![(0, 20, 4)],
        };
        let text = Screen::default().catch_up(&source);
        assert_eq!(text, "newest");
    }

    #[test]
    fn resizes_apply_at_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("output.log");
        let first = format!("{}\r\n", "a".repeat(30));
        let second = format!("{}\r\n", "b".repeat(30));
        std::fs::write(&log, format!("{first}{second}")).unwrap();
        let at = first.len() as u64;
        let source = Source {
            log,
            len: (first.len() + second.len()) as u64,
            head: 1 << 20,
            dropped: 0,
            sizes: vec![(0, 40, 6), (at, 10, 6)],
        };
        let text = Screen::default().catch_up(&source);
        let mut parser = vt100::Parser::new(6, 40, 0);
        parser.process(first.as_bytes());
        parser.screen_mut().set_size(6, 10);
        parser.process(second.as_bytes());
        assert_eq!(text, parser.screen().contents());
    }
}
