//! Panes: a job's visible screen (`read --screen`) and resizing its terminal.
//!
//! How it works: a screen is a vt100 emulator fed from the pane's log. It is kept while
//! its pane runs (fed only the bytes that arrived since the last read) and dropped when
//! the pane ends; a screen not kept (after a restart, for an ended pane, or evicted to
//! stay within [`CELL_BUDGET`]) is rebuilt from the log's last [`TAIL`] bytes, never
//! from the whole log. When those bytes are plain lines, only the lines that can still
//! be on the screen are fed (see [`plain_cut`]), so a screen costs the same whatever
//! the log's size. The feeding happens off the daemon's lock, on a blocking thread.
//!
//! Resizes are recorded in the job's folder (`sizes`: the log offset of each resize and
//! the new size), so a rebuilt screen wraps each byte at the width it was written at.

use crate::daemon::Daemon;
use crate::output;
use crate::wire::control::ToSupervisor;
use crate::wire::{Ack, ErrorCode, Kind, ReadReply, State, WireError};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The largest pane: 500 columns by 200 rows. A screen cell takes 32 bytes in the
/// emulator (twice that once a program uses the alternate screen), so the largest
/// screen is 3.2 MB (6.4 MB), and its text, which a model reads, at most 100 KB.
pub(crate) const MAX_COLS: u16 = 500;
pub(crate) const MAX_ROWS: u16 = 200;
const MIN_SIZE: u16 = 2;

/// The most of a log a screen is rebuilt from.
const TAIL: u64 = 256 << 10;
/// The most screen cells kept for running panes; past it the least recently read
/// screens are dropped (and rebuilt from their log's tail when read again).
const CELL_BUDGET: usize = 500_000;
/// The most screens kept, whatever their size (an emulator costs more than its cells).
const MAX_KEPT: usize = 64;
/// The most of the sizes file (`JobDir::SIZES`) that is read; it is compacted when it grows past this.
const SIZES_MAX: u64 = 64 << 10;

/// Refuses a pane size outside 2..=500 columns and 2..=200 rows.
pub(crate) fn check_size(cols: u16, rows: u16) -> Result<(), WireError> {
    if (MIN_SIZE..=MAX_COLS).contains(&cols) && (MIN_SIZE..=MAX_ROWS).contains(&rows) {
        return Ok(());
    }
    Err(WireError::bad_request(format!(
        "a pane of {cols}x{rows} is refused: --cols takes {MIN_SIZE} to {MAX_COLS} and --rows \
         {MIN_SIZE} to {MAX_ROWS}"
    )))
}

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
    fn get(&mut self, key: Key, cells: usize) -> Arc<Mutex<Screen>> {
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
    parser: Option<vt100::Parser>,
    fed: u64,
}

/// A pane's size from a log offset on: `(offset, cols, rows)`.
type SizeAt = (u64, u16, u16);

/// What a screen is fed from.
struct Source {
    log: PathBuf,
    len: u64,
    head: u64,
    dropped: u64,
    /// Sizes in log order; the first applies from offset 0.
    sizes: Vec<SizeAt>,
}

impl Source {
    /// `(cols, rows)` in effect at a log offset.
    fn size_at(&self, offset: u64) -> (u16, u16) {
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
    fn catch_up(&mut self, source: &Source) -> String {
        let len = source.len;
        let mut oldest = len.saturating_sub(TAIL);
        let hole_end = source.head + source.dropped;
        if source.dropped > 0 && oldest < hole_end && hole_end < len {
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

impl Daemon {
    /// The visible screen of a pane, as text.
    pub(crate) async fn screen(&self, session: &str, id: &str) -> Result<ReadReply, WireError> {
        let (record, dropped, kept) = {
            let mut inner = self.lock();
            let record = Self::find(&inner, session, id)?;
            if record.kind != Kind::Pane {
                return Err(WireError::bad_request(format!(
                    "{id} has no screen: it was started without --pty; `bgwork read {id}` shows its output"
                )));
            }
            let dropped = inner.dropped(&record);
            // Only a running pane's screen is kept; an ended one is rebuilt when read.
            let kept = (record.state != State::Ended).then(|| {
                let cells = record.cols.unwrap_or(0) as usize * record.rows.unwrap_or(0) as usize;
                inner.screens.get((record.row, record.started_at), cells)
            });
            (record, dropped, kept)
        };
        let log = output::log_path(&record.job_dir);
        let size = (record.cols.unwrap_or(120), record.rows.unwrap_or(40));
        let head = self.config.log_head;
        let job_dir = PathBuf::from(&record.job_dir);
        let path = log.clone();
        let (text, len) = tokio::task::spawn_blocking(move || {
            if job_dir.as_os_str().is_empty() {
                return (String::new(), 0);
            }
            let len = output::log_len(&path);
            let source = Source {
                log: path,
                len,
                head,
                dropped,
                sizes: read_sizes(&job_dir, size),
            };
            let screen = kept.unwrap_or_default();
            let mut screen = screen.lock().unwrap_or_else(|poisoned| {
                // A feed that panicked left the emulator half-fed: start it afresh.
                let mut screen = poisoned.into_inner();
                screen.parser = None;
                screen
            });
            (crate::redact::mask_shapes(screen.catch_up(&source)), len)
        })
        .await
        .map_err(|e| WireError::internal(format!("the screen of {id} could not be built: {e}")))?;
        let shown = crate::daemon::items::display_id(session, &record);
        Ok(ReadReply {
            id: shown.clone(),
            running: record.state != State::Ended,
            output: text,
            from: 0,
            to: len,
            dropped_bytes: 0,
            clipped: false,
            log_path: log.display().to_string(),
            folder: log.parent().map(|dir| dir.display().to_string()),
            report: self.item_as(session, &record).report,
            output_base64: None,
            output_bytes: None,
            cost: crate::wire::Cost::recorded(record.cpu_ms, record.peak_rss),
            host_unreachable: None,
        })
    }

    pub(crate) fn resize(
        &self,
        session: &str,
        id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<Ack, WireError> {
        check_size(cols, rows)?;
        let mut inner = self.lock();
        let record = Self::find(&inner, session, id)?;
        if record.kind != Kind::Pane || record.state == State::Ended {
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!("{id} is not a running pane: only panes (--pty) have a size"),
            ));
        }
        let Some(live) = inner.live.get(&record.row) else {
            return Err(WireError::new(
                ErrorCode::NotRunning,
                format!("{id} is not attached yet: try again in a moment"),
            ));
        };
        // The bytes written so far were written at the old size: a screen rebuilt from
        // the log switches size at this offset.
        let dir = Path::new(&record.job_dir);
        let at = output::log_len(&output::log_path(&record.job_dir));
        let old = (record.cols.unwrap_or(120), record.rows.unwrap_or(40));
        record_size(dir, at, old, (cols, rows)).map_err(|e| {
            WireError::internal(format!(
                "could not record the resize of {id} in {}: {e}",
                dir.display()
            ))
        })?;
        crate::daemon::sent(id, live.handle.send(ToSupervisor::Resize { cols, rows }))?;
        inner.store.set_size(record.row, cols, rows)?;
        Ok(Ack {
            ok: true,
            message: format!("{id} resized to {cols}x{rows}"),
        })
    }
}

/// Opens a file of the job folder that the daemon owns: never through a link, never
/// blocking (a job can reach its own folder), a regular file only.
fn open_own(path: &Path, write: bool) -> std::io::Result<std::fs::File> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .append(write)
        .create(write)
        .mode(0o600)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// The sizes a pane had, in log order; `current` alone when it was never resized (or
/// its record of sizes cannot be read).
fn read_sizes(job_dir: &Path, current: (u16, u16)) -> Vec<SizeAt> {
    let only = vec![(0, current.0, current.1)];
    let Ok(mut file) = open_own(&crate::job_dir::JobDir(job_dir).sizes(), false) else {
        return only;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(SIZES_MAX);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err()
        || file.take(SIZES_MAX).read_to_end(&mut bytes).is_err()
    {
        return only;
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if start > 0 {
        // The first line read may be the end of a longer one.
        text = text
            .split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
    }
    let sizes = parse_sizes(&text);
    if sizes.is_empty() {
        only
    } else {
        sizes
    }
}

fn parse_sizes(text: &str) -> Vec<SizeAt> {
    let mut sizes: Vec<SizeAt> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split(' ');
        let parsed = (|| {
            let at = fields.next()?.parse().ok()?;
            let cols = fields.next()?.parse().ok()?;
            let rows = fields.next()?.parse().ok()?;
            check_size(cols, rows).ok()?;
            Some((at, cols, rows))
        })();
        let Some(size) = parsed else {
            continue;
        };
        // Offsets only grow; a later resize at the same offset replaces the earlier.
        match sizes.last_mut() {
            Some(last) if last.0 == size.0 => *last = size,
            Some(last) if last.0 > size.0 => {}
            _ => sizes.push(size),
        }
    }
    sizes
}

/// Appends a resize at log offset `at` (with the size before it, when it is the first).
/// A file grown past [`SIZES_MAX`] is compacted to the sizes a rebuild can still need.
fn record_size(job_dir: &Path, at: u64, old: (u16, u16), new: (u16, u16)) -> std::io::Result<()> {
    let path = crate::job_dir::JobDir(job_dir).sizes();
    let mut file = open_own(&path, true)?;
    let mut lines = String::new();
    if file.metadata()?.len() == 0 {
        lines.push_str(&format!("0 {} {}\n", old.0, old.1));
    }
    lines.push_str(&format!("{at} {} {}\n", new.0, new.1));
    file.write_all(lines.as_bytes())?;
    if file.metadata()?.len() > SIZES_MAX {
        // Only the size in effect where a rebuild may start, and the later ones.
        let sizes = read_sizes(job_dir, new);
        let oldest = at.saturating_sub(TAIL);
        let first = sizes.iter().rposition(|s| s.0 <= oldest).unwrap_or(0);
        let text: String = sizes[first..]
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{} {} {}\n", if i == 0 { 0 } else { s.0 }, s.1, s.2))
            .collect();
        let fresh = job_dir.join(format!("{}.new", crate::job_dir::JobDir::SIZES));
        let _ = std::fs::remove_file(&fresh);
        open_own(&fresh, true)?.write_all(text.as_bytes())?;
        std::fs::rename(&fresh, &path)?;
    }
    Ok(())
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

    #[test]
    fn the_sizes_file_stays_small_and_keeps_what_a_rebuild_needs() {
        let dir = tempfile::tempdir().unwrap();
        record_size(dir.path(), 10, (80, 24), (100, 30)).unwrap();
        assert_eq!(
            read_sizes(dir.path(), (1, 1)),
            vec![(0, 80, 24), (10, 100, 30)]
        );
        for i in 0..20_000u64 {
            let cols = 20 + (i % 400) as u16;
            record_size(dir.path(), 1000 + i * 100, (0, 0), (cols, 40)).unwrap();
        }
        let size = std::fs::metadata(crate::job_dir::JobDir(dir.path()).sizes())
            .unwrap()
            .len();
        assert!(size <= SIZES_MAX + 64, "{size}");
        let sizes = read_sizes(dir.path(), (1, 1));
        let last = 1000 + 19_999 * 100;
        assert_eq!(
            *sizes.last().unwrap(),
            (last, 20 + (19_999 % 400) as u16, 40)
        );
        // A rebuild starts at most TAIL bytes back: the size there is the true one.
        let source = Source {
            log: PathBuf::new(),
            len: last,
            head: 0,
            dropped: 0,
            sizes,
        };
        for at in [last - TAIL, last - TAIL / 2, last] {
            let i = (at - 1000) / 100;
            assert_eq!(source.size_at(at), (20 + (i % 400) as u16, 40), "at {at}");
        }
    }

    #[test]
    fn sizes_parse_in_order_and_later_ones_replace_earlier_at_one_offset() {
        let sizes =
            parse_sizes("0 80 24\n10 100 30\n10 90 20\nbad line\n5 1 1\n20 2000 5\n30 50 10\n");
        assert_eq!(sizes, vec![(0, 80, 24), (10, 90, 20), (30, 50, 10)]);
    }
}
