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
/// Lines are handed out whole up to this many bytes; a longer line is handed out cut
/// there, and all of it in pieces of this size ([`Seen::Piece`]).
pub(crate) const MAX_LINE: usize = 64 << 10;
/// How much of a long line each piece repeats of the piece before it: a match up to
/// this long is found wherever it lies in the line.
pub(crate) const OVERLAP: usize = 4 << 10;
/// How much of what comes before and after a piece's start is looked at for a token
/// that the start cuts: as for a read that starts there, the piece then begins after
/// that token with one marker (see `Holes::token_edges`).
const PIECE_CONTEXT: usize = 2 << 10;

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
pub(crate) const CUT_MARK: &str = " [... line cut at 64 KiB]";

/// What a piece of text handed to a scan's caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A line ended by `\n` (or the last line of a source that ended).
    Line,
    /// The text before a `\r`: shown, then rewritten.
    Frame,
    /// The unterminated text at the end of what was written so far.
    Partial,
    /// A piece of a line longer than [`MAX_LINE`] (matched with [`hit`], shown with
    /// [`shown`]): a match is found wherever it lies in the line, and one up to
    /// [`OVERLAP`] long across the pieces' edges too. The line itself is handed out
    /// cut, after its pieces. Its text begins with one character of what precedes it
    /// and, when more of the line follows (`more`), ends with one character of that:
    /// context for `\b` and `$`, never part of a match.
    Piece { more: bool },
    /// A line longer than [`MAX_LINE`], its first [`MAX_LINE`] bytes (handed out after
    /// its pieces): its text ends with one character of what follows, context only as
    /// in a piece. Shown (and recorded) followed by [`CUT_MARK`].
    Head,
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
    /// The line in progress is longer than [`MAX_LINE`]: its rest was left out of
    /// `partial`, and goes to `long`.
    cut: bool,
    /// The character just after the cut of a line longer than [`MAX_LINE`].
    after_cut: char,
    /// The run of token characters that `long` begins with (if it does) is a token
    /// begun before it, however long ago.
    run_token: bool,
    /// A line longer than [`MAX_LINE`]: its bytes from where its next piece begins
    /// (`long_from`), after up to [`PIECE_CONTEXT`] bytes before them.
    long: Vec<u8>,
    long_from: usize,
    /// `long` holds bytes no piece has been handed out with.
    long_fresh: bool,
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
                    if self.hand_out_pieces(each) {
                        self.offset = at + i as u64;
                        return true;
                    }
                }
                Some(k) if rest[k] == b'\r' => {
                    self.keep(&rest[..k]);
                    self.carriage_return = true;
                    i += k + 1;
                    if self.hand_out_pieces(each) {
                        self.offset = at + i as u64;
                        return true;
                    }
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
                        self.hand_out_pieces(each) || self.hand_out(Seen::Line, each)
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
        if self.cut {
            // A long line not ended yet: the rest of it no whole piece held, as written
            // so far (as a prompt is: `$` matches at its end).
            return self.long_fresh && self.hand_out_piece(self.long.len(), Edge::Open, each);
        }
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
        let room = match self.cut {
            true => 0,
            false => MAX_LINE.saturating_sub(before),
        };
        let data: Cow<'_, [u8]> = match bytes.contains(&0) {
            true => Cow::Owned(bytes.iter().copied().filter(|&b| b != 0).collect()),
            false => Cow::Borrowed(bytes),
        };
        // The cut comes before a character, never inside one.
        let split = match room < data.len() {
            true => cut_before_escape(&data, char_start(&data, room)),
            false => data.len(),
        };
        let (kept, rest) = data.split_at(split);
        self.partial.extend_from_slice(kept);
        if !rest.is_empty() {
            if !self.cut {
                self.after_cut = shown_after(rest, 0);
                // The first piece begins `OVERLAP` before the cut, after its context.
                let from = self.partial.len().saturating_sub(OVERLAP + PIECE_CONTEXT);
                self.run_token = run_is_token(&self.partial[..from], false);
                self.long = self.partial[from..].to_vec();
                self.long_from = self.long.len().saturating_sub(OVERLAP);
            }
            self.cut = true;
            self.long.extend_from_slice(rest);
            self.long_fresh = true;
            self.partial_offered = false;
        }
        if self.partial.len() != before {
            self.partial_offered = false;
        }
    }

    /// Hands out each piece of a long line that is full ([`MAX_LINE`] bytes).
    fn hand_out_pieces(&mut self, each: &mut impl FnMut(Seen, &str) -> bool) -> bool {
        // A piece is handed out once a byte after it is there: its context.
        while self.long.len() - self.long_from > MAX_LINE {
            let end = self.long_from + MAX_LINE;
            let stop = self.hand_out_piece(end, Edge::Cut, each);
            // The next piece repeats this one's last `OVERLAP` bytes.
            let keep_from = end - OVERLAP - PIECE_CONTEXT.min(end - OVERLAP);
            self.run_token = run_is_token(&self.long[..keep_from], self.run_token);
            self.long.drain(..keep_from);
            self.long_from = end - OVERLAP - keep_from;
            self.long_fresh = self.long.len() > self.long_from + OVERLAP;
            if stop {
                return true;
            }
        }
        false
    }

    /// Hands out `long[long_from..end]` as a [`Seen::Piece`]: its text as a reader
    /// that read just that range is shown it (a token its start cuts is one marker and
    /// the piece begins after it; a token its end cuts, one marker; neither edge
    /// inside a character or an escape), between one character of context on each
    /// side (none after the line's last piece, `Edge::Whole`).
    fn hand_out_piece(
        &self,
        end: usize,
        edge: Edge,
        each: &mut impl FnMut(Seen, &str) -> bool,
    ) -> bool {
        if self.in_key {
            return false;
        }
        let long = &self.long;
        let mut start = piece_start(long, self.long_from);
        let around = start.saturating_sub(PIECE_CONTEXT);
        let window = &long[around..(start + PIECE_CONTEXT).min(long.len())];
        let mut cut_token = crate::redact::token_across(window, start - around).map(|t| t.1);
        // A token longer than the window: its start is further back (in `long`, or
        // before it as `run_token` says).
        if cut_token.is_none() && long.get(start).is_some_and(|&b| is_token_byte(b)) {
            let run = long[..start]
                .iter()
                .rposition(|&b| !is_token_byte(b))
                .map_or(0, |i| i + 1);
            let begun = crate::redact::unfinished_token(&long[..start]).is_some()
                || (run == 0 && self.run_token);
            if begun {
                let rest = long[start..].iter().position(|&b| !is_token_byte(b));
                cut_token = Some(rest.map_or(long.len(), |i| start + i) - around);
            }
        }
        if let Some(token_end) = cut_token.filter(|&e| e >= window.len()) {
            // The window ended inside it: it goes on to the end of its run.
            let at = around + token_end;
            let rest = long[at..].iter().position(|&b| !is_token_byte(b));
            cut_token = Some(rest.map_or(long.len(), |i| at + i) - around);
        }
        if let Some(token_end) = cut_token {
            start = (around + token_end).min(end);
        }
        let more = edge == Edge::Cut;
        let end = match more {
            true => cut_before_escape(long, char_start(long, end)),
            false => char_start(long, end),
        }
        .max(start);
        let before = match cut_token {
            Some(_) => ' ',
            None => shown_before(long, start),
        };
        let Some(text) = reader_text(&long[start..end], edge, false) else {
            return false;
        };
        let mut shown = String::with_capacity(text.len() + 24);
        shown.push(before);
        if cut_token.is_some() {
            shown.push_str(crate::redact::CUT_TOKEN);
        }
        shown.push_str(&text);
        if more {
            shown.push(shown_after(long, end));
        }
        each(Seen::Piece { more }, &shown)
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
        // A long line's last piece first: the rest of it that no piece held yet.
        let last_piece = self.cut && self.long_fresh;
        if last_piece && self.hand_out_piece(self.long.len(), Edge::Whole, each) {
            self.clear_line();
            return true;
        }
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
            Some(mut line) if self.cut && seen == Seen::Line => {
                line.to_mut().push(self.after_cut);
                each(Seen::Head, &line)
            }
            Some(mut line) => {
                if self.cut {
                    line.to_mut().push_str(CUT_MARK);
                }
                each(seen, &line)
            }
            None => false,
        };
        self.clear_line();
        stop
    }

    /// Forgets the line in progress (it was handed out).
    fn clear_line(&mut self) {
        self.partial.clear();
        self.partial_dirty = false;
        self.partial_offered = false;
        self.cut = false;
        self.long.clear();
        self.long_from = 0;
        self.long_fresh = false;
        self.run_token = false;
    }
}

/// Whether `regex` matches what a scan handed out. A [`Seen::Piece`]'s context
/// characters are never part of a match: no `^` matches at the piece's start, no `$`
/// at its end when more of the line follows, and `\b` sees the real neighbours.
pub(crate) fn hit(regex: &regex::Regex, seen: Seen, text: &str) -> bool {
    match seen {
        Seen::Piece { more } => {
            let (from, to) = piece_body(text, more);
            // The earliest end of any match: one that ends within the piece exists
            // exactly when it is there.
            regex
                .shortest_match_at(text, from)
                .is_some_and(|end| end <= to)
        }
        Seen::Head => regex
            .shortest_match_at(text, 0)
            .is_some_and(|end| end <= piece_body(text, true).1),
        _ => regex.is_match(text),
    }
}

/// What a scan handed out, as it is shown: a [`Seen::Piece`] or [`Seen::Head`]
/// without its context.
pub(crate) fn shown(seen: Seen, text: &str) -> &str {
    match seen {
        Seen::Piece { more } => {
            let (from, to) = piece_body(text, more);
            &text[from..to.max(from)]
        }
        Seen::Head => &text[..piece_body(text, true).1],
        _ => text,
    }
}

/// A piece's text without its context characters, as a range of it.
fn piece_body(text: &str, more: bool) -> (usize, usize) {
    let from = text.chars().next().map_or(0, char::len_utf8);
    let to = match more {
        true => text.len() - text.chars().next_back().map_or(0, char::len_utf8),
        false => text.len(),
    };
    (from, to.max(from))
}

/// Where a piece that would begin at `at` of a line begins: not inside a UTF-8
/// character or an escape sequence that began before it.
fn piece_start(line: &[u8], at: usize) -> usize {
    let mut start = at;
    // Past the rest of an escape sequence begun in the 32 bytes before (a CSI: ESC [,
    // parameters, one final byte from @ to ~).
    let back = at.saturating_sub(32);
    if let Some(esc) = line[back..at]
        .iter()
        .rposition(|&b| b == 0x1b)
        .map(|i| back + i)
    {
        let ends = line[esc + 1..]
            .iter()
            .enumerate()
            .skip(1)
            .take(64)
            .find(|(_, &b)| (0x40..=0x7e).contains(&b))
            .map(|(i, _)| esc + 1 + i + 1);
        if line.get(esc + 1) == Some(&b'[') {
            if let Some(after) = ends.filter(|&after| after > at) {
                start = after;
            }
        } else if esc + 2 > at {
            start = esc + 2;
        }
    }
    char_start_after(line, start.min(line.len()))
}

/// `at`, or the start of an escape sequence that `at` would cut (begun in the 32
/// bytes before it and not ended there).
fn cut_before_escape(bytes: &[u8], at: usize) -> usize {
    let back = at.saturating_sub(32);
    let Some(esc) = bytes[back..at].iter().rposition(|&b| b == 0x1b) else {
        return at;
    };
    let esc = back + esc;
    let ended = match bytes[..at].get(esc + 1) {
        Some(b'[') => bytes[esc + 2..at].iter().any(|b| (0x40..=0x7e).contains(b)),
        Some(_) => true,
        None => false,
    };
    match ended {
        true => at,
        false => esc,
    }
}

/// A byte a token shape may hold past its prefix (see `redact::unfinished_token`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Whether the run of token bytes that ends `bytes` (and goes on after them) is a
/// token: one begun in them, or, when they are all token bytes, `before` (the run
/// before them was one).
fn run_is_token(bytes: &[u8], before: bool) -> bool {
    if bytes.last().is_none_or(|&b| !is_token_byte(b)) {
        return bytes.is_empty() && before;
    }
    crate::redact::unfinished_token(bytes).is_some()
        || (before && bytes.iter().all(|&b| is_token_byte(b)))
}

/// `at`, or the start of the next character when `at` is inside one.
fn char_start_after(line: &[u8], mut at: usize) -> usize {
    while at < line.len() && (line[at] & 0xc0) == 0x80 {
        at += 1;
    }
    at
}

/// `at`, or the start of the character it is inside (at the end of `line`: before a
/// last character not yet whole).
fn char_start(line: &[u8], mut at: usize) -> usize {
    if at >= line.len() {
        let end = line.len();
        let last = (end.saturating_sub(4)..end)
            .rev()
            .find(|&i| (line[i] & 0xc0) != 0x80);
        return match last {
            Some(i) if i + utf8_len(line[i]) > end => i,
            _ => end,
        };
    }
    let floor = at.saturating_sub(3);
    while at > floor && (line[at] & 0xc0) == 0x80 {
        at -= 1;
    }
    at
}

/// The length of the UTF-8 character that `first` begins (1 for a byte that begins
/// none).
fn utf8_len(first: u8) -> usize {
    match first {
        b if b >= 0xf0 => 4,
        b if b >= 0xe0 => 3,
        b if b >= 0xc0 => 2,
        _ => 1,
    }
}

/// How far around a piece's edge its neighbour is looked for (escapes are passed).
const NEIGHBOUR: usize = 64;

/// The last character a reader is shown before `at`: a match's real neighbour (a
/// space when there is none).
fn shown_before(line: &[u8], at: usize) -> char {
    let from = char_start(line, at.saturating_sub(NEIGHBOUR));
    reader_text(&line[from..at], Edge::Whole, false)
        .and_then(|text| text.chars().next_back())
        .filter(|c| !c.is_control())
        .unwrap_or(' ')
}

/// The first character a reader is shown from `at` (a space when none is there yet).
fn shown_after(line: &[u8], at: usize) -> char {
    let end = char_start(line, (at + NEIGHBOUR).min(line.len()));
    reader_text(&line[at..end.max(at)], Edge::Whole, false)
        .and_then(|text| text.chars().next())
        .filter(|c| !c.is_control())
        .unwrap_or(' ')
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
    fn a_long_line_is_handed_out_in_pieces_then_cut() {
        let long = vec![b'a'; MAX_LINE * 3];
        let seen = scan(&[&long, b"\nshort\n"]);
        let pieces: Vec<&(Seen, String)> = seen
            .iter()
            .filter(|s| matches!(s.0, Seen::Piece { more: true }))
            .collect();
        // Pieces from `OVERLAP` before the cut, each repeating `OVERLAP` of the last;
        // the last is handed out as the rest of the line (offered as written so far,
        // then at its end).
        let step = MAX_LINE - OVERLAP;
        let rests = seen
            .iter()
            .filter(|s| s.0 == Seen::Piece { more: false })
            .count();
        assert_eq!(rests, 2);
        assert_eq!(
            pieces.len() + 1,
            (2 * MAX_LINE + OVERLAP).div_ceil(step),
            "{}",
            pieces.len()
        );
        assert!(pieces.iter().all(|p| p.1.len() <= MAX_LINE + 2));
        let head = seen.iter().find(|s| s.0 == Seen::Head).unwrap();
        assert_eq!(shown(head.0, &head.1).len(), MAX_LINE);
        assert_eq!(
            head.1.len(),
            MAX_LINE + 1,
            "and the character after the cut"
        );
        assert_eq!(seen.last().unwrap(), &(Seen::Line, "short".to_string()));
    }

    /// What `regex` finds in the lines and pieces of `chunks`, as a wait does.
    fn finds(chunks: &[&[u8]], regex: &str) -> Option<String> {
        let regex = regex::Regex::new(regex).unwrap();
        let mut scan = LineScan::default();
        let mut found = None;
        let mut each = |seen: Seen, text: &str| {
            let matched = hit(&regex, seen, text);
            if matched {
                found = Some(shown(seen, text).to_string());
            }
            matched
        };
        for chunk in chunks {
            let at = scan.offset;
            if scan.feed(at, chunk, &mut each) {
                return found;
            }
        }
        scan.finish(&mut each);
        found
    }

    #[test]
    fn a_match_anywhere_in_a_long_line_is_found() {
        for before in [70_000, 131_070, 2_000_000] {
            let mut line = vec![b'y'; before];
            line.extend_from_slice(b"MARK\n");
            assert!(
                finds(&[&line], "MARK").is_some(),
                "MARK after {before} bytes"
            );
            // In chunks of every size a log is read in.
            let chunks: Vec<&[u8]> = line.chunks(4093).collect();
            assert!(
                finds(&chunks, "MARK").is_some(),
                "in chunks, after {before}"
            );
            assert!(finds(&[&line], "yMARK$").is_some());
        }
        // A match across a piece's edge (within `OVERLAP`), and one not there.
        let mut line = vec![b'y'; MAX_LINE - 10];
        line.extend_from_slice(b"ACROSS-THE-EDGE");
        line.extend(vec![b'z'; MAX_LINE]);
        line.push(b'\n');
        assert!(finds(&[&line], "ACROSS-THE-EDGE").is_some());
        assert!(finds(&[&line], "NEVER").is_none());
    }

    #[test]
    fn a_piece_s_start_is_not_a_line_s_start() {
        let mut line = vec![b'y'; 200_000];
        line.push(b'\n');
        assert!(finds(&[&line], "^y").is_some(), "the line's own start");
        let mut line = b"start".to_vec();
        line.extend(vec![b'y'; 200_000]);
        line.push(b'\n');
        assert!(
            finds(&[&line], "^y").is_none(),
            "a piece began with y: not the line's start"
        );
        assert!(
            finds(&[&line], r"\byyy").is_none(),
            "no word begins inside the run"
        );
        assert!(
            finds(&[&line], r"y\b").is_some(),
            "the word ends at the line's end"
        );
    }

    #[test]
    fn a_token_a_piece_s_start_cuts_is_shown_masked() {
        // A token placed so that the second piece begins inside it.
        let token = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
        let at = 2 * MAX_LINE - 2 * OVERLAP - 10;
        let mut line = vec![b'y'; at];
        line.push(b' ');
        line.extend_from_slice(token.as_bytes());
        line.extend_from_slice(b" tail");
        line.extend(vec![b'z'; MAX_LINE]);
        line.push(b'\n');
        let seen = scan(&[&line]);
        for (_, text) in &seen {
            assert!(
                !text.contains("abcdefghijklmnop"),
                "a token's tail shown: {}",
                &text[..80]
            );
        }
        assert!(finds(&[&line], "tail").is_some());
    }

    /// A line of `len` bytes of `y` with each text placed at its offset.
    fn placed(len: usize, texts: &[(usize, &str)]) -> Vec<u8> {
        let mut line = vec![b'y'; len];
        for (at, text) in texts {
            line[*at..*at + text.len()].copy_from_slice(text.as_bytes());
        }
        line.push(b'\n');
        line
    }

    #[test]
    fn a_token_cut_by_any_piece_start_is_never_shown_or_matched() {
        let step = MAX_LINE - OVERLAP;
        let tokens = [
            "ghp_Abcdefghij0123456789KLMNOPQRSTuvwxyz4242",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123",
            "sk-proj0123456789abcdefghijklmnop",
            "AKIAABCDEFGHIJ012345",
            "xoxb-0123456789-abcdefghijklmnop",
        ];
        for token in tokens {
            // Each piece start falls inside the token at every offset of it.
            for into in 1..token.len() {
                let at = MAX_LINE - OVERLAP + step - into;
                let line = placed(
                    300_000,
                    &[
                        (at - 1, " "),
                        (at, token),
                        (at + token.len(), " "),
                        (140_000, "MARK"),
                    ],
                );
                let found = finds(&[&line], "MARK").expect("MARK is found");
                let tail = &token[token.len() / 2..];
                assert!(!found.contains(tail), "{token} cut {into} in: shown");
                for pattern in [&token[1..], &token[into..], tail] {
                    let pattern = regex::escape(pattern);
                    assert!(
                        finds(&[&line], &pattern).is_none(),
                        "{token} cut {into} in: {pattern} matched"
                    );
                }
            }
        }
    }

    #[test]
    fn a_piece_s_end_is_not_a_line_s_end_or_a_word_s() {
        // The line ends "yZ": no piece end counts as its end.
        let line = placed(300_000, &[(0, "start"), (299_999, "Z")]);
        assert!(finds(&[&line], "y$").is_none());
        assert!(finds(&[&line], r"y\z").is_none());
        assert!(finds(&[&line], r"yyy\b").is_none());
        assert!(finds(&[&line], "Z$").is_some());
        // A word cut by a piece's end is still the whole word.
        let step = MAX_LINE - OVERLAP;
        for at in (MAX_LINE - OVERLAP + step - 10)..(MAX_LINE - OVERLAP + step + 2) {
            let line = placed(300_000, &[(at - 1, " "), (at, "ERRORS_AND_MORE ")]);
            assert!(finds(&[&line], r"\bERROR\b").is_none(), "{at}");
            assert!(finds(&[&line], "ERROR$").is_none(), "{at}");
            assert!(finds(&[&line], r"\bERRORS_AND_MORE\b").is_some(), "{at}");
        }
        // An unbounded pattern is found where the line goes on.
        assert!(finds(&[&placed(300_000, &[(150_000, "MARK")])], "MARK.*").is_some());
        assert!(finds(&[&placed(300_000, &[])], "y+").is_some());
    }

    #[test]
    fn a_piece_s_edges_cut_no_character_or_escape() {
        let mut line = b"xx".to_vec();
        for _ in 0..150_000 {
            line.extend_from_slice("é".as_bytes());
        }
        line.push(b'\n');
        assert!(finds(&[&line], "\u{FFFD}").is_none());
        assert!(finds(&[&line], "[^xé]").is_none());
        assert!(finds(&[&line], r"\béé").is_none());
        let mut line = Vec::new();
        while line.len() < 300_000 {
            line.extend_from_slice(b"\x1b[31mred\x1b[0m ");
        }
        line.push(b'\n');
        assert!(finds(&[&line], r"\[3|1m|\[0").is_none());
        assert!(finds(&[&line], "red red").is_some());
    }

    #[test]
    fn a_token_longer_than_the_context_is_masked_wherever_a_piece_cuts_it() {
        let token = format!("ghp_{}TAILSEQ{}", "Q".repeat(2000), "R".repeat(2990));
        for into in [10, 1500, 2100, 2500, 4000] {
            let at = MAX_LINE - OVERLAP - into;
            let line = placed(
                300_000,
                &[
                    (at - 1, " "),
                    (at, &token),
                    (at + token.len(), " "),
                    (81_440, "MARK"),
                ],
            );
            let found = finds(&[&line], "MARK").expect("MARK is found");
            assert!(!found.contains("RRRRRRRR"), "{into}: the tail shown");
            assert!(
                finds(&[&line], "RRRRRRRR").is_none(),
                "{into}: the tail matched"
            );
        }
    }

    #[test]
    fn an_unended_long_line_is_offered_whole_as_written_so_far() {
        let regex = regex::Regex::new("LAST$").unwrap();
        for len in [70_000, 130_000, 1 << 20] {
            let mut line = vec![b'z'; len];
            line.extend_from_slice(b"LAST");
            let mut scan = LineScan::default();
            let mut found = false;
            let mut each = |seen: Seen, text: &str| {
                found |= hit(&regex, seen, text);
                found
            };
            scan.feed(0, &line, &mut each);
            scan.offer_partial(&mut each);
            assert!(found, "{len}");
        }
    }

    #[test]
    fn a_piece_s_neighbour_is_the_character_shown_not_an_escape_byte() {
        for at in MAX_LINE - OVERLAP - 4..MAX_LINE - OVERLAP + 3 {
            let mut line = vec![b'-'; 300_000];
            line[at..at + 4].copy_from_slice(b"\x1b[1m");
            line.push(b'\n');
            assert!(finds(&[&line], r"\b-|-\b").is_none(), "{at}");
        }
        for at in [MAX_LINE - 1, MAX_LINE, 2 * MAX_LINE - OVERLAP - 1] {
            let mut line = vec![b'y'; 300_000];
            line[at..at + 4].copy_from_slice(b"\x1b[0m");
            *line.last_mut().unwrap() = b'Z';
            line.push(b'\n');
            assert!(finds(&[&line], r"y\b").is_none(), "{at}");
        }
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
