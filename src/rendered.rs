//! What log bytes show, with the raw bytes behind every character: the one renderer
//! that readers use to turn a log into text, and that masking uses to find a value
//! that the rendering joins (a colour code, a NUL, a `\r` rewrite or a backspace
//! between its characters).
//!
//! How it works. The bytes are fed to the terminal parser (vte) one at a time, so each
//! character it prints is known by the bytes that produced it (a run of printable
//! ASCII, or a whole CSI sequence, met in the parser's ground state is fed at once:
//! its characters and its one action are known without that). Escape sequences and
//! controls other than line breaks, tabs, `\r` and backspace show nothing; each line is
//! a row of cells that `\r` and backspace move back over, as a terminal does
//! ([`View::Text`], what `read` shows). [`View::Line`] also follows the cursor moves
//! within a line (`ESC[nD`, `ESC[nC`, `ESC[nG`), as a terminal or a pane's screen
//! shows a line. [`shown`] looks for something in the bytes as they are and in both
//! views, and gives each find as the raw span from the first to the last byte that
//! produced it, so that replacing that span removes it from every view.
//! [`maybe_controls`] and [`unfinished_suffix`] are the renderer's rules that readers and
//! masking share: which bytes render as themselves, and where a rendering may end.

use std::borrow::Cow;

/// How a line is rendered.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum View {
    /// Escapes dropped, `\r` and backspace rewrite the line (what `read` shows).
    #[default]
    Text,
    /// [`View::Text`] with the cursor moves within a line (a terminal's line).
    Line,
}

/// Text rendered from bytes, with where each of its bytes came from.
pub struct Rendered {
    pub text: String,
    /// For each byte of `text`, the raw span `[start, end)` of its character (empty,
    /// `start == end`, for a blank a cursor move left).
    spans: Vec<(u32, u32)>,
}

impl Rendered {
    /// The raw span of the bytes that produced `text[start..end]`.
    pub fn raw_span(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let spans = self.spans[start..end].iter().filter(|(s, e)| s < e);
        let first = spans.clone().map(|&(s, _)| s).min()?;
        let last = spans.map(|&(_, e)| e).max()?;
        Some((first as usize, last as usize))
    }

    /// The raw position where the character at `text[at]` begins (the end of the raw
    /// bytes for `at == text.len()`): the least start of it and every byte after it.
    pub fn raw_from(&self, at: usize, raw_len: usize) -> usize {
        self.spans[at..]
            .iter()
            .filter(|(s, e)| s < e)
            .map(|&(s, _)| s as usize)
            .min()
            .unwrap_or(raw_len)
    }
}

/// Renders `bytes` as `view` shows them.
pub fn render(bytes: &[u8], view: View) -> Rendered {
    render_as(bytes, view, true)
}

/// Renders `bytes`, with the map from text to raw bytes when `mapped` (else `spans`
/// stays empty: a 16 MiB read's text needs no 128 MiB map).
fn render_as(bytes: &[u8], view: View, mapped: bool) -> Rendered {
    let mut cells = Cells {
        view,
        mapped,
        ground: true,
        appended: true,
        ..Cells::default()
    };
    let mut parser = vte::Parser::new();
    let converted;
    let bytes = match bytes.windows(2).any(is_c1) {
        true => {
            converted = seven_bit(bytes);
            &converted[..]
        }
        false => bytes,
    };
    let mut at = 0;
    while at < bytes.len() {
        // In the ground state a run of printable ASCII is one character a byte, in
        // order: fed at once (most of a log), each character's position counted.
        let run = match cells.ground {
            true => bytes[at..]
                .iter()
                .position(|&b| !(0x20..0x7f).contains(&b))
                .unwrap_or(bytes.len() - at),
            false => 0,
        };
        if run > 1 {
            cells.at = at as u32;
            cells.bulk = true;
            parser.advance(&mut cells, &bytes[at..at + run]);
            cells.bulk = false;
            at += run;
            continue;
        }
        // So is a whole CSI sequence (a colour): its one action comes at its last byte.
        if let Some(len) = cells.ground.then(|| csi_len(&bytes[at..])).flatten() {
            cells.at = (at + len - 1) as u32;
            cells.ground = false;
            parser.advance(&mut cells, &bytes[at..at + len]);
            at += len;
            continue;
        }
        cells.at = at as u32;
        cells.ground = false;
        parser.advance(&mut cells, &bytes[at..at + 1]);
        at += 1;
    }
    // CAN ends what the bytes left unfinished: a character cut short shows as U+FFFD
    // (as it always was), an escape sequence nothing.
    cells.at = bytes.len() as u32;
    parser.advance(&mut cells, &[0x18]);
    cells.end_line();
    Rendered {
        text: cells.text,
        spans: cells.spans,
    }
}

/// Readable text of `bytes` ([`View::Text`]): escapes stripped, `\r` and backspace
/// applied, invalid UTF-8 replaced.
pub fn text(bytes: &[u8]) -> String {
    if !maybe_controls(bytes, true) {
        return match std::str::from_utf8(bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        };
    }
    render_as(bytes, View::Text, false).text
}

/// [`text`] of bytes the caller gives up: plain output (no byte that acts on a
/// terminal, valid UTF-8), most of what jobs write, becomes the text without a copy.
pub fn text_owned(bytes: Vec<u8>) -> String {
    if !maybe_controls(&bytes, true) {
        return String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    }
    render_as(&bytes, View::Text, false).text
}

/// Whether `bytes` may hold a character that acts on a terminal: a C0 control (but a
/// line break or tab when `keep_lines`), DEL, or the lead byte of a C1 control (0xC2)
/// or of a line or direction mark (0xE2). False means surely none; true means look
/// closer. One branch-free pass, which the compiler vectorizes: most output is plain,
/// and a megabyte of it is cleared in well under a millisecond.
pub fn maybe_controls(bytes: &[u8], keep_lines: bool) -> bool {
    bytes.chunks(4096).any(|chunk| {
        chunk.iter().fold(false, |found, &b| {
            let kept = keep_lines & ((b == b'\n') | (b == b'\t'));
            found | ((b < 0x20) & !kept) | (b == 0x7f) | (b == 0xc2) | (b == 0xe2)
        })
    })
}

/// How many bytes at the end of `bytes` begin something unfinished: a UTF-8 character
/// missing its last bytes, or an escape sequence missing its final byte or terminator.
pub fn unfinished_suffix(bytes: &[u8]) -> usize {
    let utf8 = unfinished_utf8(bytes);
    if utf8 > 0 {
        return utf8;
    }
    let Some(esc) = bytes.iter().rposition(|&b| b == 0x1b) else {
        return 0;
    };
    if escape_complete(&bytes[esc..]) {
        0
    } else {
        bytes.len() - esc
    }
}

/// The length of a UTF-8 character cut short at the end of `bytes` (0 when none).
fn unfinished_utf8(bytes: &[u8]) -> usize {
    for k in 1..=3.min(bytes.len()) {
        let suffix = &bytes[bytes.len() - k..];
        match suffix[0] {
            // A continuation byte: the character may start further back.
            0x80..=0xbf => continue,
            0xc2..=0xf4 => {
                return match std::str::from_utf8(suffix) {
                    // Valid so far and cut short: `error_len` is None only then.
                    Err(e) if e.valid_up_to() == 0 && e.error_len().is_none() => k,
                    _ => 0,
                };
            }
            _ => return 0,
        }
    }
    0
}

/// Whether an escape sequence (starting with ESC) has all its bytes.
fn escape_complete(seq: &[u8]) -> bool {
    let Some(&kind) = seq.get(1) else {
        return false;
    };
    let rest = &seq[2..];
    match kind {
        // CSI: parameters and intermediates, then one final byte.
        b'[' => rest.iter().any(|&b| !(0x20..=0x3f).contains(&b)),
        // Strings (OSC, DCS, SOS, PM, APC) end with BEL or ESC \ (whose ESC would be
        // the last one, so only BEL is seen here); another control byte also ends them
        // as far as a terminal is concerned.
        b']' | b'P' | b'X' | b'^' | b'_' => rest.iter().any(|&b| b < 0x20),
        // Intermediates, then a final byte.
        0x20..=0x2f => rest.iter().any(|&b| !(0x20..=0x2f).contains(&b)),
        _ => true,
    }
}

/// Something found: its raw span and what replaces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub start: usize,
    pub end: usize,
    pub marker: Vec<u8>,
}

/// What some bytes show: the bytes as they are and, when they hold a control or an
/// escape, their [`View::Text`] and [`View::Line`], each rendered once.
pub struct Shown<'a> {
    bytes: &'a [u8],
    views: Vec<Rendered>,
}

impl<'a> Shown<'a> {
    pub fn new(bytes: &'a [u8]) -> Shown<'a> {
        let views = match maybe_controls(bytes, true) {
            // The line view differs from the text only where the cursor moves.
            true => match moves_cursor(bytes) {
                true => vec![render(bytes, View::Text), render(bytes, View::Line)],
                false => vec![render(bytes, View::Text)],
            },
            false => Vec::new(),
        };
        Shown { bytes, views }
    }

    /// Every place where `find` finds something in what the bytes show, as raw spans,
    /// sorted and merged where they overlap (a merged span keeps the first marker).
    pub fn find(&self, find: &dyn Fn(&[u8]) -> Vec<Found>) -> Vec<Found> {
        let mut found = find(self.bytes);
        for rendered in &self.views {
            for hit in find(rendered.text.as_bytes()) {
                if let Some((start, end)) = rendered.raw_span(hit.start, hit.end) {
                    found.push(Found {
                        start,
                        end,
                        marker: hit.marker,
                    });
                }
            }
        }
        merged(found)
    }

    /// Where, at the end of what the bytes show, something begins that more bytes
    /// could complete: the least raw position that `begins` gives in the bytes and in
    /// each view (`begins` answers for a text where its unfinished part starts, or its
    /// length when nothing there is unfinished).
    pub fn unfinished(&self, begins: &dyn Fn(&[u8]) -> usize) -> usize {
        let mut least = begins(self.bytes);
        for rendered in &self.views {
            let at = begins(rendered.text.as_bytes());
            if at < rendered.text.len() {
                least = least.min(rendered.raw_from(at, self.bytes.len()));
            }
        }
        least
    }
}

/// Every place where `find` finds something in what `bytes` show ([`Shown::find`]).
pub fn shown(bytes: &[u8], find: &dyn Fn(&[u8]) -> Vec<Found>) -> Vec<Found> {
    Shown::new(bytes).find(find)
}

/// The length of the CSI sequence `bytes` begin with (`ESC [`, parameters and
/// intermediates, a final byte), when it is whole and holds no control byte.
fn csi_len(bytes: &[u8]) -> Option<usize> {
    if bytes.len() < 3 || bytes[0] != 0x1b || bytes[1] != b'[' {
        return None;
    }
    let body = bytes[2..].iter().position(|b| !(0x20..=0x3f).contains(b))?;
    let last = bytes[2 + body];
    (0x40..=0x7e).contains(&last).then_some(body + 3)
}

/// Whether `bytes` may move a line's cursor as [`View::Line`] follows and
/// [`View::Text`] does not: a tab, or a CSI (7-bit or C1) ending in `C`, `D` or `G`.
fn moves_cursor(bytes: &[u8]) -> bool {
    static RE: std::sync::OnceLock<regex::bytes::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::bytes::Regex::new(r"(?-u)\t|(?:\x1b\[|\xc2\x9b)[0-9;:?]*[ -/]*[CDG]")
            .expect("a valid pattern")
    });
    re.is_match(bytes)
}

/// `bytes` with each span replaced by its marker (spans sorted, apart).
pub fn replaced<'a>(bytes: &'a [u8], found: &[Found]) -> Cow<'a, [u8]> {
    if found.is_empty() {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    for hit in found {
        out.extend_from_slice(&bytes[at..hit.start]);
        out.extend_from_slice(&hit.marker);
        at = hit.end;
    }
    out.extend_from_slice(&bytes[at..]);
    Cow::Owned(out)
}

/// Spans sorted by start, those that overlap merged into one.
fn merged(mut found: Vec<Found>) -> Vec<Found> {
    found.sort_by_key(|hit| (hit.start, std::cmp::Reverse(hit.end)));
    let mut out: Vec<Found> = Vec::with_capacity(found.len());
    for hit in found {
        match out.last_mut() {
            Some(last) if hit.start < last.end => last.end = last.end.max(hit.end),
            _ => out.push(hit),
        }
    }
    out
}

/// Whether two bytes are a C1 control (U+0080–U+009F) written as UTF-8.
pub fn is_c1(pair: &[u8]) -> bool {
    pair[0] == 0xc2 && (0x80..=0x9f).contains(&pair[1])
}

/// The bytes with each C1 control written as UTF-8 turned into its 7-bit form (ESC and
/// a letter: U+009B CSI is `ESC [`, U+009D OSC is `ESC ]`), so the parser drops the
/// whole sequence it starts, parameters included, as it does for the 7-bit form. The
/// length stays the same, so every position still names its raw byte.
fn seven_bit(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if index + 1 < bytes.len() && is_c1(&bytes[index..index + 2]) {
            out.extend_from_slice(&[0x1b, bytes[index + 1] - 0x40]);
            index += 2;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    out
}

/// No raw byte: a blank that a cursor move left.
const BLANK: (u32, u32) = (0, 0);

/// The parser's output: finished lines, and the cells of the line in progress.
#[derive(Default)]
struct Cells {
    view: View,
    mapped: bool,
    /// Whether the parser is surely in its ground state (the last byte printed a
    /// character or ended a sequence).
    ground: bool,
    /// Whether a run of printable ASCII is being fed: `at` moves with each character.
    bulk: bool,
    /// The raw position of the byte being fed.
    at: u32,
    /// Where the last character or action ended, for a character without bytes of its
    /// own (U+FFFD for bytes that were not UTF-8).
    settled: u32,
    text: String,
    spans: Vec<(u32, u32)>,
    /// The cells of the line in progress, once something was written over it.
    line: Vec<(char, (u32, u32))>,
    cursor: usize,
    /// The column a terminal saved (`ESC 7`, `ESC[s`) for a restore (`ESC 8`, `ESC[u`).
    saved: usize,
    /// Whether the line in progress is still `text[line_start..]`, only ever appended
    /// to (most lines: each character costs one push), with `line_len` characters.
    appended: bool,
    line_start: usize,
    line_len: usize,
}

impl Cells {
    fn put(&mut self, c: char, span: (u32, u32)) {
        if self.appended {
            if self.cursor >= self.line_len {
                while self.line_len < self.cursor {
                    self.append(' ', BLANK);
                }
                self.append(c, span);
                self.cursor += 1;
                return;
            }
            self.unpack_line();
        }
        if self.cursor < self.line.len() {
            self.line[self.cursor] = (c, span);
        } else {
            while self.line.len() < self.cursor {
                self.line.push((' ', BLANK));
            }
            self.line.push((c, span));
        }
        self.cursor += 1;
    }

    fn append(&mut self, c: char, span: (u32, u32)) {
        self.text.push(c);
        if self.mapped {
            self.spans.extend(std::iter::repeat_n(span, c.len_utf8()));
        }
        self.line_len += 1;
    }

    /// The line in progress, to be written over: from the text into cells.
    fn unpack_line(&mut self) {
        let tail = self.text.split_off(self.line_start);
        let spans = match self.mapped {
            true => self.spans.split_off(self.line_start),
            false => Vec::new(),
        };
        let mut offset = 0;
        for c in tail.chars() {
            self.line
                .push((c, spans.get(offset).copied().unwrap_or(BLANK)));
            offset += c.len_utf8();
        }
        self.appended = false;
    }

    fn end_line(&mut self) {
        self.cursor = 0;
        self.line_len = 0;
        if std::mem::replace(&mut self.appended, true) {
            return;
        }
        for (c, span) in self.line.drain(..) {
            let mut utf8 = [0u8; 4];
            let encoded = c.encode_utf8(&mut utf8);
            self.text.push_str(encoded);
            if self.mapped {
                self.spans.extend(std::iter::repeat_n(span, encoded.len()));
            }
        }
        self.cursor = 0;
    }
}

impl vte::Perform for Cells {
    fn print(&mut self, c: char) {
        self.ground = true;
        if self.bulk {
            let span = (self.at, self.at + 1);
            self.at += 1;
            self.settled = span.1;
            return self.put(c, span);
        }
        let end = self.at + 1;
        let span = match c {
            '\u{fffd}' => (self.settled, self.at.max(self.settled + 1)),
            _ => (end.saturating_sub(c.len_utf8() as u32), end),
        };
        self.settled = span.1;
        // A terminal shows nothing for bytes that are not UTF-8; the text view marks them.
        let dropped = c == '\u{fffd}' && self.view == View::Line;
        if c != '\u{7f}' && !dropped {
            self.put(c, span);
        }
    }

    fn execute(&mut self, byte: u8) {
        self.settled = self.at + 1;
        match byte {
            b'\n' => {
                self.end_line();
                self.text.push('\n');
                if self.mapped {
                    self.spans.push((self.at, self.at + 1));
                }
                self.line_start = self.text.len();
            }
            b'\r' => self.cursor = 0,
            0x08 => self.cursor = self.cursor.saturating_sub(1),
            // A terminal moves to the next tab stop, over what the line holds there.
            b'\t' if self.view == View::Line => {
                self.cursor = ((self.cursor / 8 + 1) * 8).min(LINE_CELLS)
            }
            b'\t' => self.put('\t', (self.at, self.at + 1)),
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, params: &vte::Params, intermediates: &[u8], _: bool, action: char) {
        self.settled = self.at + 1;
        self.ground = true;
        if self.view != View::Line || !intermediates.is_empty() {
            return;
        }
        let first = params.iter().next().and_then(|p| p.first().copied());
        let n = first.filter(|&n| n > 0).unwrap_or(1) as usize;
        match action {
            'D' => self.cursor = self.cursor.saturating_sub(n),
            'C' => self.cursor = self.cursor.saturating_add(n).min(LINE_CELLS),
            'G' => self.cursor = (n - 1).min(LINE_CELLS),
            's' => self.saved = self.cursor,
            'u' => self.cursor = self.saved,
            _ => {}
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], _: bool, byte: u8) {
        self.settled = self.at + 1;
        self.ground = true;
        if self.view == View::Line && intermediates.is_empty() {
            match byte {
                b'7' => self.saved = self.cursor,
                b'8' => self.cursor = self.saved,
                _ => {}
            }
        }
    }

    fn osc_dispatch(&mut self, _: &[&[u8]], _: bool) {
        self.settled = self.at + 1;
    }
}

/// The widest a line's cursor moves take it (so `ESC[99999999C` costs no memory).
const LINE_CELLS: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_characters_and_escapes_are_held_back() {
        assert_eq!(unfinished_suffix(b"caf\xc3"), 1);
        assert_eq!(unfinished_suffix(b"caf\xc3\xa9"), 0);
        assert_eq!(unfinished_suffix(b"x \xe2\x9c"), 2);
        assert_eq!(unfinished_suffix(b"x \xf0\x9f\x98"), 3);
        assert_eq!(unfinished_suffix(b"bad \xff"), 0);
        assert_eq!(unfinished_suffix(b"bad \xc3A"), 0);
        assert_eq!(unfinished_suffix(b"lone \x9c"), 0);
        assert_eq!(unfinished_suffix(b"red \x1b[3"), 3);
        assert_eq!(unfinished_suffix(b"red \x1b[31m"), 0);
        assert_eq!(unfinished_suffix(b"esc \x1b"), 1);
        assert_eq!(unfinished_suffix(b"\x1b]0;title"), 9);
        assert_eq!(unfinished_suffix(b"\x1b]0;title\x07ok"), 0);
        assert_eq!(unfinished_suffix(b"\x1b]0;title\x1b\\"), 0);
        assert_eq!(unfinished_suffix(b"\x1b(B plain"), 0);
        assert_eq!(unfinished_suffix(b"\x1b("), 2);
        assert_eq!(unfinished_suffix(b"plain"), 0);
    }

    #[test]
    fn the_quick_scan_never_misses_a_control() {
        for text in ["plain\n\ttext", "caf\u{e9}"] {
            assert!(!maybe_controls(text.as_bytes(), true), "{text:?}");
        }
        for text in [
            "a\rb",
            "\u{1b}[31m",
            "\u{7f}",
            "\u{9b}2J",
            "\u{2028}",
            "\u{202e}x",
        ] {
            assert!(maybe_controls(text.as_bytes(), true), "{text:?}");
        }
        assert!(maybe_controls(b"a\nb", false));
        assert!(!maybe_controls(b"a\nb", true));
    }

    fn find_word(word: &'static str) -> impl Fn(&[u8]) -> Vec<Found> {
        move |text: &[u8]| {
            memchr::memmem::find_iter(text, word.as_bytes())
                .map(|at| Found {
                    start: at,
                    end: at + word.len(),
                    marker: b"[X]".to_vec(),
                })
                .collect()
        }
    }

    fn masked(bytes: &[u8]) -> Vec<u8> {
        let found = shown(bytes, &find_word("hunter22"));
        replaced(bytes, &found).into_owned()
    }

    #[test]
    fn a_value_split_by_what_the_rendering_drops_is_found_whole() {
        let cases: &[&[u8]] = &[
            b"pw=hun\x1b[31mter22\x1b[0m.",
            b"pw=h\0u\0n\0t\0e\0r\x002\x002\0.",
            b"pw=xxxter22\rpw=hun\n",
            b"pw=hunXer22\x08\x08\x08\x08\x08ter22.",
            b"pw=hunxxxxx\x1b[5Dter22\n",
            b"XXXXXXter22\rpw=hun\t\n",
            "pw=hun\u{9b}1mter22.".as_bytes(),
        ];
        for case in cases {
            let out = masked(case);
            assert!(
                !text(&out).contains("hunter22")
                    && !render(&out, View::Line).text.contains("hunter22"),
                "{:?} -> {:?}",
                String::from_utf8_lossy(case),
                String::from_utf8_lossy(&out)
            );
            assert!(
                text(&out).contains("[X]"),
                "{:?}",
                String::from_utf8_lossy(&out)
            );
        }
    }

    #[test]
    fn the_text_view_is_what_readers_were_shown() {
        assert_eq!(text(b"\x1b[31mred\x1b[0m \xff!"), "red \u{fffd}!");
        assert_eq!(text(b"abcdef\rXY\n"), "XYcdef\n");
        assert_eq!(text(b"caf\xc3A"), "caf\u{fffd}A");
        assert_eq!(
            text("a\u{9b}2Jb\u{9d}0;T\u{7}c\u{85}d\n".as_bytes()),
            "abcd\n"
        );
        let rendered = render(b"ab\x1b[1mcd", View::Text);
        assert_eq!(rendered.raw_span(1, 3), Some((1, 7)));
        let colours = render(b"a\x1b[1;31mb\x1b[0m\x1b[5Dc\x1b[", View::Line);
        assert_eq!(colours.text, "cb");
        assert_eq!(colours.raw_span(0, 1), Some((17, 18)));
        assert_eq!(render(b"ab\x1b[1Dc", View::Line).text, "ac");
        let bad = render(b"x\xc3Ay", View::Text);
        assert_eq!(bad.text, "x\u{fffd}Ay");
        assert_eq!(bad.raw_span(1, 5), Some((1, 3)));
        assert_eq!(text(b"cut \xe2\x9c"), "cut \u{fffd}");
        assert_eq!(
            render(b"cut \xe2\x9c", View::Text).raw_span(4, 7),
            Some((4, 6))
        );
        assert_eq!(text(b"red \x1b[3"), "red ");
    }
}
