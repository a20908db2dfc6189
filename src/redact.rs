//! Masking secrets: the values a job was given (`--env`, `--secret`), replaced with
//! `[secret NAME]` in its log, and common token shapes replaced in whatever a reader
//! is shown.
//!
//! How it works. [`Secrets`] holds every form of every known value (the value, its
//! base64 at each of the three alignments it can take inside encoded text, in both
//! alphabets, its URL-quoted forms with the two common safe sets, its hex, its
//! JSON-escaped form, the value without surrounding blanks, and for values of several
//! lines each line and the `\r\n` a terminal makes of them) in one Aho-Corasick
//! automaton, searched for every match, overlapping ones included: the union of all
//! matches is masked, overlapping matches merged into one masked span, so two values
//! that share bytes show no part of either. The
//! supervisor feeds it the job's output as it comes ([`StreamMask`]): a value split
//! across two writes is still found, because the bytes at the end of a chunk that could
//! begin a form (at most the longest form's length − 1) are held back until more output
//! comes or the output ends. So the log on disk never holds a known value, and its byte
//! offsets are those of the masked text.
//!
//! [`mask_shapes`] replaces what looks like a token (`sk-…`, `ghp_…`, `AKIA…`,
//! `xoxb-…`, PEM private-key blocks) in text on its way to a reader; this is done at
//! every read, since those tokens are not known in advance.

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine;
use regex::bytes::{Captures, Regex};
use std::borrow::Cow;
use std::sync::OnceLock;

/// A `--secret` value shorter than this (leaving out surrounding blanks) is refused:
/// masking it would mask common text.
pub const MIN_SECRET_LEN: usize = 4;
/// A value longer than this is masked line by line only (a `--secret` one is refused):
/// holding back the start of a form costs up to its length squared on output that
/// repeats it.
pub const MAX_SECRET_LEN: usize = 8 << 10;
/// An `--env` value shorter than this (leaving out surrounding blanks) is not masked
/// (`1`, `true`, `3000`, `debug`).
pub const MIN_ENV_SECRET_LEN: usize = 8;
/// The shortest stable middle of a misaligned base64 form that is masked (a value of
/// 4 bytes after a prefix of 1 or 2 bytes leaves 4 or 5 characters, which ordinary
/// text holds too often).
pub const MIN_BASE64_MIDDLE: usize = 6;

/// The known secret values of one job and every form of them that is masked.
#[derive(Clone)]
pub struct Secrets {
    automaton: AhoCorasick,
    /// For each pattern of the automaton (each form, in sorted order), the index of
    /// the name it masks in `names`.
    owner: Vec<usize>,
    names: Vec<String>,
    /// Every form, sorted, to find the bytes at the end of a chunk that begin one.
    sorted: Vec<Vec<u8>>,
    longest: usize,
}

/// A masked span that ran past what a stream could write yet: the first `len` bytes
/// held back are the rest of it, masked whatever follows (`names`: whose values).
#[derive(Default, Debug, Clone)]
pub struct Carry {
    len: usize,
    names: Vec<usize>,
}

/// One span to mask: `[start, end)` and the values (by name) found in it.
struct Span {
    start: usize,
    end: usize,
    names: Vec<usize>,
}

impl Secrets {
    /// The masking of `(name, value)` pairs; `None` when there is nothing to mask.
    pub fn new(pairs: &[[String; 2]]) -> Option<Secrets> {
        let mut forms: Vec<(Vec<u8>, usize)> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for [name, value] in pairs {
            if value.is_empty() {
                continue;
            }
            names.push(name.clone());
            for form in forms_of(value) {
                forms.push((form, names.len() - 1));
            }
        }
        // One pattern per distinct form (two names with one value: the first name).
        forms.sort_by(|a, b| a.0.cmp(&b.0));
        forms.dedup_by(|a, b| a.0 == b.0);
        if forms.is_empty() {
            return None;
        }
        // A contiguous NFA: a DFA of a long repetitive secret takes minutes to build,
        // and the NFA scanned ordinary output faster (in a debug build; its prefilter
        // does most of the work). Standard semantics, for the overlapping search.
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(forms.iter().map(|(form, _)| form))
            .ok()?;
        let owner = forms.iter().map(|(_, name)| *name).collect();
        let longest = forms.iter().map(|(form, _)| form.len()).max().unwrap_or(0);
        let sorted = forms.into_iter().map(|(form, _)| form).collect();
        Some(Secrets {
            automaton,
            owner,
            names,
            sorted,
            longest,
        })
    }

    /// Every known value in `bytes` replaced (for text that is whole).
    pub fn mask<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        if self.automaton.find(bytes).is_none() {
            return Cow::Borrowed(bytes);
        }
        let mut out = Vec::with_capacity(bytes.len());
        self.mask_into(bytes, &mut out, true, &mut Carry::default());
        Cow::Owned(out)
    }

    /// The marker of a span: `[secret NAME]`, or `[secret A, B]` for a span where the
    /// values of several names overlap.
    fn marker(&self, names: &[usize]) -> Vec<u8> {
        let names: Vec<&str> = names.iter().map(|&n| self.names[n].as_str()).collect();
        format!("[secret {}]", names.join(", ")).into_bytes()
    }

    /// Every match in `bytes`, overlapping ones included, with `first` (a span begun
    /// before `bytes`, or one that more output would complete), merged where they
    /// overlap, in order.
    fn spans(&self, bytes: &[u8], first: Option<Span>) -> Vec<Span> {
        let mut all: Vec<Span> = first.into_iter().collect();
        for found in self.automaton.find_overlapping_iter(bytes) {
            all.push(Span {
                start: found.start(),
                end: found.end(),
                names: vec![self.owner[found.pattern().as_usize()]],
            });
        }
        // A match inside another (a value that holds another, a form's stable middle)
        // adds nothing to mask, nor a name to the marker.
        all.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut reach = 0;
        all.retain(|span| {
            let outside = span.end > reach;
            reach = reach.max(span.end);
            outside
        });
        let mut merged: Vec<Span> = Vec::with_capacity(all.len());
        for span in all {
            match merged.last_mut() {
                Some(last) if span.start < last.end => {
                    last.end = last.end.max(span.end);
                    for name in span.names {
                        if !last.names.contains(&name) {
                            last.names.push(name);
                        }
                    }
                }
                _ => merged.push(span),
            }
        }
        merged
    }

    /// Appends the masked `bytes` to `out` up to where what follows could still begin
    /// a form (unless `whole`); returns that position: the bytes from it on are held.
    /// `carry`: the held bytes' first ones that continue a span already masked (in
    /// and out).
    fn mask_into(&self, bytes: &[u8], out: &mut Vec<u8>, whole: bool, carry: &mut Carry) -> usize {
        let held = self.first_unfinished(bytes, 0, whole);
        let begun = std::mem::take(carry);
        let first = (begun.len > 0).then(|| Span {
            start: 0,
            end: begun.len,
            names: begun.names.clone(),
        });
        // Bytes from here on may be held back (at most the longest form's length − 1).
        let may_hold = bytes.len().saturating_sub(self.longest.saturating_sub(1));
        let mut cursor = 0;
        for span in self.spans(bytes, first) {
            if span.start >= held {
                break;
            }
            if span.end > held && span.start >= may_hold {
                // More output may extend this span: it is held whole, to be one marker.
                out.extend_from_slice(&bytes[cursor..span.start]);
                if span.start == 0 {
                    *carry = begun;
                }
                return span.start;
            }
            out.extend_from_slice(&bytes[cursor..span.start]);
            out.extend_from_slice(&self.marker(&span.names));
            if span.end > held {
                // More output may yet extend this span: its rest is held, masked.
                *carry = Carry {
                    len: span.end - held,
                    names: span.names,
                };
                return held;
            }
            cursor = span.end;
        }
        out.extend_from_slice(&bytes[cursor..held]);
        held
    }

    /// The first position at or after `from`, near the end of `bytes`, from which the
    /// rest is the beginning of a longer form (one that more output could complete);
    /// the end of `bytes` when there is none or `bytes` are `whole`.
    fn first_unfinished(&self, bytes: &[u8], from: usize, whole: bool) -> usize {
        if whole {
            return bytes.len();
        }
        let near_end = bytes.len().saturating_sub(self.longest.saturating_sub(1));
        (from.max(near_end)..bytes.len())
            .find(|&at| self.begins_longer_form(&bytes[at..]))
            .unwrap_or(bytes.len())
    }

    fn begins_longer_form(&self, piece: &[u8]) -> bool {
        self.longer_form_begun_by(piece).is_some()
    }

    /// The index of a form longer than `piece` that begins with it.
    fn longer_form_begun_by(&self, piece: &[u8]) -> Option<usize> {
        let at = self.sorted.partition_point(|form| form.as_slice() < piece);
        // Forms that start with `piece` follow it in order; the first may equal it.
        (at..self.sorted.len().min(at + 2)).find(|&index| {
            let form = &self.sorted[index];
            form.len() > piece.len() && form.starts_with(piece)
        })
    }
}

/// Masks a job's output as it streams, in what each reader finally shows: the bytes,
/// their text and a terminal's line ([`crate::rendered::Shown`]), so a value split by
/// a colour code, a NUL, a `\r` rewrite, a backspace or a cursor move is found, and the
/// whole raw span that produced it is replaced. What may begin a secret (in any of
/// those) is held back until the next chunk shows whether it does.
///
/// The written bytes of the line in progress (up to [`LINE_CONTEXT`]) are kept as
/// context: a `\r` or a backspace still to come may join them with new output. Such a
/// find is masked from the first byte not yet written, so what was written stays (a
/// piece of a value, never the whole, and only what was already shown) and the rest
/// is the marker.
pub struct StreamMask {
    secrets: Secrets,
    /// The written bytes of the line in progress.
    line: Vec<u8>,
    held: Vec<u8>,
}

/// How many written bytes of the line in progress a rewrite is checked against.
pub const LINE_CONTEXT: usize = 16 << 10;
/// The most bytes held back beyond the longest form (escapes between the characters
/// of what may begin a secret).
pub const HOLD_MAX: usize = 64 << 10;

impl StreamMask {
    pub fn new(secrets: Secrets) -> StreamMask {
        StreamMask {
            secrets,
            line: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Masks the next chunk of output: returns what may be written now (`chunk` itself,
    /// or part of it, when it holds no secret and nothing joins it with what came
    /// before; else `out`, cleared first).
    pub fn push<'a>(&mut self, chunk: &'a [u8], out: &'a mut Vec<u8>) -> &'a [u8] {
        out.clear();
        let plain = self.held.is_empty()
            && !crate::rendered::maybe_controls(chunk, true)
            && !crate::rendered::maybe_controls(&self.line, true);
        if plain && self.secrets.automaton.find(chunk).is_none() {
            // Nothing to replace: no copy, only the start of a form kept back.
            // (Nor the start of a character whose rest has not come.)
            let held = self
                .secrets
                .first_unfinished(chunk, 0, false)
                .min(chunk.len() - crate::rendered::unfinished_suffix(chunk));
            self.held.extend_from_slice(&chunk[held..]);
            self.written(&chunk[..held]);
            return &chunk[..held];
        }
        let mut bytes = self.line.clone();
        let context = bytes.len();
        bytes.append(&mut self.held);
        bytes.extend_from_slice(chunk);
        let (mut bytes, hold) = self.masked(bytes, context, false);
        // Nor an escape sequence or a character whose rest has not come, so that a
        // marker never lands inside one.
        let hold = hold.min(bytes.len() - crate::rendered::unfinished_suffix(&bytes[context..]));
        let longest = self.secrets.longest;
        let release = hold
            .max(context)
            .max(bytes.len().saturating_sub(longest + HOLD_MAX));
        out.extend_from_slice(&bytes[context..release]);
        self.held.extend_from_slice(&bytes[release..]);
        bytes.truncate(release);
        bytes.drain(..context);
        self.written(&bytes);
        out
    }

    /// The output ended: whatever was held, masked, into `out` (cleared first).
    /// The start of a secret that the output ended in is masked too, once it is
    /// [`MIN_SECRET_LEN`] bytes long (a job killed in the middle of printing one).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.clear();
        let mut bytes = std::mem::take(&mut self.line);
        let context = bytes.len();
        bytes.append(&mut self.held);
        let shown = crate::rendered::Shown::new(&bytes);
        let begun = |text: &[u8]| {
            self.secrets
                .begun_form(text)
                .map_or(text.len(), |(at, _)| at)
        };
        let mut at = shown.unfinished(&begun);
        let mut marker = None;
        if at < bytes.len() {
            marker = Some(self.begun_marker(&bytes));
            // A find that overlaps the begun form is one span with it (their union).
            let find = |text: &[u8]| self.secrets.found(text);
            for hit in shown.find(&find) {
                if hit.end > at && hit.start < at {
                    at = hit.start;
                }
            }
            bytes.truncate(at.max(context));
        }
        let (mut bytes, _) = self.masked(bytes, context, true);
        if let Some(marker) = marker {
            bytes.extend_from_slice(&marker);
        }
        out.extend_from_slice(&bytes[context..]);
    }

    /// The values masked.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// How many bytes are held back now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// `bytes` (written context, then what is not written yet) with every secret that
    /// they show replaced, from the first byte not yet written, and where what may be
    /// written ends: before what may begin a secret (unless the output is `whole`).
    /// What is shown again after a replacement is looked at again (a few times, then
    /// all of it is masked).
    fn masked(&self, mut bytes: Vec<u8>, context: usize, whole: bool) -> (Vec<u8>, usize) {
        let find = |text: &[u8]| self.secrets.found(text);
        let begins = |text: &[u8]| self.secrets.first_unfinished(text, 0, false);
        let mut done = context;
        for _ in 0..4 {
            let shown = crate::rendered::Shown::new(&bytes);
            let mut limit = match whole {
                true => bytes.len(),
                false => shown.unfinished(&begins).max(done),
            };
            let mut found: Vec<crate::rendered::Found> = shown
                .find(&find)
                .into_iter()
                .filter(|hit| hit.end > context && hit.start < limit)
                .collect();
            // A find that reaches into what may begin a form could grow with more
            // output (the union of overlapping values): it is held whole, to be one
            // marker, while it fits in what may be held.
            let floor = bytes.len().saturating_sub(self.secrets.longest + HOLD_MAX);
            let may_grow = |hit: &crate::rendered::Found| {
                !whole && hit.end > limit && hit.start >= floor.max(done).max(context)
            };
            if let Some(at) = found.iter().position(may_grow) {
                limit = found[at].start;
                found.truncate(at);
            }
            let found: Vec<crate::rendered::Found> = found
                .into_iter()
                .map(|hit| crate::rendered::Found {
                    start: hit.start.max(context),
                    ..hit
                })
                .collect();
            let Some(last) = found.last() else {
                return (bytes, limit);
            };
            let shift: isize = found
                .iter()
                .map(|hit| hit.marker.len() as isize - (hit.end - hit.start) as isize)
                .sum();
            done = (last.end as isize + shift) as usize;
            bytes = crate::rendered::replaced(&bytes, &found).into_owned();
        }
        bytes.truncate(context);
        bytes.extend_from_slice(b"[secret]");
        let end = bytes.len();
        (bytes, end)
    }

    /// The marker of the form that the end of what `bytes` show begins.
    fn begun_marker(&self, bytes: &[u8]) -> Vec<u8> {
        let mut texts = vec![bytes.to_vec()];
        if crate::rendered::maybe_controls(bytes, true) {
            for view in [crate::rendered::View::Text, crate::rendered::View::Line] {
                texts.push(crate::rendered::render(bytes, view).text.into_bytes());
            }
        }
        texts
            .iter()
            .find_map(|text| self.secrets.begun_form(text))
            .map_or_else(
                || b"[secret]".to_vec(),
                |(_, index)| self.secrets.marker(&[self.secrets.owner[index]]),
            )
    }

    /// `bytes` were written: the line in progress goes on with them.
    fn written(&mut self, bytes: &[u8]) {
        match memchr::memrchr(b'\n', bytes) {
            Some(at) => {
                self.line.clear();
                self.line.extend_from_slice(&bytes[at + 1..]);
            }
            None => self.line.extend_from_slice(bytes),
        }
        if self.line.len() > LINE_CONTEXT {
            let cut = self.line.len() - LINE_CONTEXT;
            self.line.drain(..cut);
        }
    }
}

/// The search API that [`StreamMask`] and the report's masking use.
impl Secrets {
    /// Every known value in `bytes`, as spans with their markers.
    pub fn found(&self, bytes: &[u8]) -> Vec<crate::rendered::Found> {
        // Overlapping matches merged: the union of every value's match is one span.
        self.spans(bytes, None)
            .into_iter()
            .map(|span| crate::rendered::Found {
                start: span.start,
                end: span.end,
                marker: self.marker(&span.names),
            })
            .collect()
    }

    /// Every known value replaced in what `bytes` show (for text that is whole: a
    /// report file).
    pub fn mask_shown<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let found = crate::rendered::shown(bytes, &|text| self.found(text));
        crate::rendered::replaced(bytes, &found)
    }

    /// Where the end of `bytes` begins a form, once [`MIN_SECRET_LEN`] bytes of it are
    /// there: that position and the form's index in `sorted`.
    fn begun_form(&self, bytes: &[u8]) -> Option<(usize, usize)> {
        let near_end = bytes.len().saturating_sub(self.longest);
        (near_end..bytes.len().saturating_sub(MIN_SECRET_LEN - 1))
            .find_map(|at| Some(at).zip(self.longer_form_begun_by(&bytes[at..])))
    }
}

/// The lines of a value of several lines that are masked each on its own (trimmed,
/// of 8 bytes or more); none for a value of one line. The one rule for the log's
/// masking and for what a command line may not hold.
pub fn masked_lines(value: &str) -> Vec<&str> {
    let trimmed = value.trim();
    if !trimmed.contains('\n') {
        return Vec::new();
    }
    trimmed
        .lines()
        .map(str::trim)
        .filter(|line| (MIN_ENV_SECRET_LEN..=MAX_SECRET_LEN).contains(&line.len()))
        .collect()
}

/// The forms of one value that are masked, each once: its encodings, those of the
/// value without surrounding blanks (as `echo $VAR` prints it), and each line of a
/// value of several lines (of 8 bytes or more).
pub fn forms_of(value: &str) -> Vec<Vec<u8>> {
    let mut forms = Vec::new();
    let trimmed = value.trim();
    if value.len() <= MAX_SECRET_LEN {
        forms.extend(encodings_of(value));
        if trimmed != value && !trimmed.is_empty() {
            forms.extend(encodings_of(trimmed));
        }
    }
    forms.extend(
        masked_lines(value)
            .into_iter()
            .map(|line| line.as_bytes().to_vec()),
    );
    forms.sort();
    forms.dedup();
    forms
}

/// A value as it is, in base64 (both alphabets, every alignment), URL-quoted (both
/// common safe sets, a space as `%20` or `+`, hex digits in either case), in hex (either
/// case) and JSON-escaped (and with `\r\n` line ends, as a terminal prints it).
fn encodings_of(value: &str) -> Vec<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let bytes = value.as_bytes();
    let mut forms = vec![
        bytes.to_vec(),
        STANDARD.encode(bytes).into_bytes(),
        STANDARD_NO_PAD.encode(bytes).into_bytes(),
        URL_SAFE.encode(bytes).into_bytes(),
        URL_SAFE_NO_PAD.encode(bytes).into_bytes(),
        hex(bytes, false),
        hex(bytes, true),
    ];
    for (engine, padded) in [(STANDARD_NO_PAD, STANDARD), (URL_SAFE_NO_PAD, URL_SAFE)] {
        for offset in 0..3 {
            forms.extend(base64_middle(bytes, offset, &engine));
            // The value at the end of the encoded text: its last characters are its own.
            forms.extend(base64_end(bytes, offset, &engine));
            forms.extend(base64_end(bytes, offset, &padded));
        }
    }
    for safe in [&b""[..], b"/"] {
        for plus in [false, true] {
            for upper in [false, true] {
                forms.push(url_quoted(bytes, safe, plus, upper));
            }
        }
    }
    let json = serde_json::to_string(value).unwrap_or_default();
    if json.len() >= 2 {
        forms.push(json.as_bytes()[1..json.len() - 1].to_vec());
    }
    if value.contains('\n') {
        forms.push(
            value
                .replace("\r\n", "\n")
                .replace('\n', "\r\n")
                .into_bytes(),
        );
    }
    forms.sort();
    forms.dedup();
    forms.retain(|form| !form.is_empty());
    forms
}

/// The characters of the base64 of `bytes`, when they follow `offset` (0, 1 or 2)
/// other bytes in the encoded text, that depend on `bytes` alone: whatever precedes
/// and follows, they are in the encoding (`Basic base64(user:PW)` holds PW's middle
/// for offset 2, whatever `user:` is). `None` when that middle is shorter than
/// [`MIN_BASE64_MIDDLE`].
fn base64_middle(
    bytes: &[u8],
    offset: usize,
    engine: &base64::engine::GeneralPurpose,
) -> Option<Vec<u8>> {
    let (encoded, input_len) = encoded_after(bytes, offset, engine);
    // The first characters mix the prefix's bits in: none at offset 0, the first two
    // at 1 (a group of prefix, v0, v1), the first three at 2 (prefix, prefix, v0).
    let front = [0, 2, 3][offset];
    // The last character mixes in the bytes that follow, unless the value ends a group.
    let back = usize::from(!input_len.is_multiple_of(3));
    let middle = encoded.get(front..encoded.len().checked_sub(back)?)?;
    (middle.len() >= MIN_BASE64_MIDDLE).then(|| middle.to_vec())
}

/// The base64 of `offset` zero bytes and then `bytes`, and the length encoded.
fn encoded_after(
    bytes: &[u8],
    offset: usize,
    engine: &base64::engine::GeneralPurpose,
) -> (Vec<u8>, usize) {
    let mut input = vec![0u8; offset];
    input.extend_from_slice(bytes);
    (engine.encode(&input).into_bytes(), input.len())
}

/// The base64 of `bytes` after `offset` (0, 1 or 2) other bytes, when they end the
/// encoded text: from the first character that depends on `bytes` alone to the end
/// (padding included, with a padding engine).
fn base64_end(
    bytes: &[u8],
    offset: usize,
    engine: &base64::engine::GeneralPurpose,
) -> Option<Vec<u8>> {
    let (encoded, _) = encoded_after(bytes, offset, engine);
    let end = encoded.get([0, 2, 3][offset]..)?;
    (end.len() >= MIN_BASE64_MIDDLE).then(|| end.to_vec())
}

/// `bytes` in hex, two digits a byte (`xxd -p` on one line, `od -An -tx1` without
/// blanks).
fn hex(bytes: &[u8], upper: bool) -> Vec<u8> {
    let digits: &[u8; 16] = match upper {
        true => b"0123456789ABCDEF",
        false => b"0123456789abcdef",
    };
    bytes
        .iter()
        .flat_map(|&b| [digits[usize::from(b >> 4)], digits[usize::from(b & 15)]])
        .collect()
}

/// Percent-encoding of every byte but the unreserved ones (RFC 3986) and `safe`, in
/// upper or lower case hex; with `plus`, a space is `+` (`application/x-www-form-urlencoded`,
/// Python's `quote_plus`), else `%20`.
fn url_quoted(bytes: &[u8], safe: &[u8], plus: bool, upper: bool) -> Vec<u8> {
    let mut out = String::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || safe.contains(&b) {
            out.push(b as char);
        } else if b == b' ' && plus {
            out.push('+');
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out.into_bytes()
}

/// Token shapes (private keys are found apart, by their BEGIN and END lines, in one
/// pass: a gap of any length in a pattern would make some texts cost quadratic time).
const SHAPES: &str = r"(?x-u)
    \b(?P<sk>sk-[A-Za-z0-9_-]{20,})
  | (?P<gh>(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})
  | (?P<aws>(?:AKIA|ASIA)[0-9A-Z]{16})\b
  | (?P<slack>xox[bpaors]-[A-Za-z0-9-]{10,})
";

fn compiled(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}")))
}

fn shapes() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    compiled(&RE, SHAPES)
}

/// Text with every token shape replaced (`[secret ghp_…]`, `[secret private key]`).
pub fn mask_shapes(text: String) -> String {
    match mask_shapes_bytes(text.as_bytes()) {
        Cow::Borrowed(_) => text,
        // Replacements are ASCII and cut only at ASCII bytes, so the text stays UTF-8.
        Cow::Owned(bytes) => String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

/// Bytes with every token shape replaced.
pub fn mask_shapes_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    let masked = shapes().replace_all(bytes, token_marker);
    let keys = private_keys(&masked);
    if keys.is_empty() {
        return masked;
    }
    let mut out = Vec::with_capacity(masked.len());
    let mut at = 0;
    for (start, end) in keys {
        out.extend_from_slice(&masked[at..start]);
        out.extend_from_slice(b"[secret private key]");
        at = end;
    }
    out.extend_from_slice(&masked[at..]);
    Cow::Owned(out)
}

/// The marker of a private key.
pub const PRIVATE_KEY: &str = "[secret private key]";

/// Where private keys lie in `bytes` (as [`mask_shapes_bytes`] finds them), with the
/// token shapes left in place.
pub fn private_key_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    private_keys(bytes)
}

/// Where private keys lie in `bytes`: from a BEGIN line to its END line; one that the
/// end of `bytes` cuts off runs to it, and an END line before any other key line
/// closes one that began before `bytes`.
fn private_keys(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut open = None;
    for (index, line) in key_lines().find_iter(bytes).enumerate() {
        let begins = line.as_bytes().starts_with(b"-----BEGIN");
        match (begins, open) {
            (true, None) => open = Some(line.start()),
            (false, Some(start)) => {
                spans.push((start, line.end()));
                open = None;
            }
            (false, None) if index == 0 => spans.push((0, line.end())),
            _ => {}
        }
    }
    if let Some(start) = open {
        spans.push((start, bytes.len()));
    }
    spans
}

/// The marker of a token that a read's start cut (its first bytes were before it).
pub const CUT_TOKEN: &str = "[secret token]";

/// The token shape that `window` shows across its index `at` (its raw bytes starting
/// before it and ending after it, in the bytes or in what they render), as its start
/// and end in `window`.
pub fn token_across(window: &[u8], at: usize) -> Option<(usize, usize)> {
    crate::rendered::shown(window, &token_finds)
        .into_iter()
        .map(|found| (found.start, found.end))
        .take_while(|&(start, _)| start < at)
        .find(|&(_, end)| at < end)
}

/// Bytes with every token shape and private key that they show replaced: found in the
/// bytes as they are and in what they render ([`crate::rendered::Shown`]), so a token
/// split by a colour code, a NUL or a rewrite is masked whole, from its first raw byte
/// to its last. For the raw bytes a reader is given (`read --raw`, `output_base64`,
/// the strip, `run`'s stream). Looked at a block of about [`SHOWN_BLOCK`] bytes at a
/// time, each ending at a line break where one comes soon after.
pub fn mask_shapes_shown(bytes: &[u8]) -> Cow<'_, [u8]> {
    if bytes.len() <= SHOWN_BLOCK {
        return mask_shapes_shown_block(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let mut end = (at + SHOWN_BLOCK).min(bytes.len());
        let soon = (end + (64 << 10)).min(bytes.len());
        if let Some(newline) = memchr::memchr(b'\n', &bytes[end..soon]) {
            end += newline + 1;
        }
        out.extend_from_slice(&mask_shapes_shown_block(&bytes[at..end]));
        at = end;
    }
    Cow::Owned(out)
}

/// One block of [`mask_shapes_shown`], rendered whole (a block cut at a line break may
/// pass [`SHOWN_BLOCK`] by up to 64 KiB).
fn mask_shapes_shown_block(bytes: &[u8]) -> Cow<'_, [u8]> {
    let found = crate::rendered::shown(bytes, &shape_finds);
    crate::rendered::replaced(bytes, &found)
}

/// The size of the blocks [`mask_shapes_shown`] renders.
pub const SHOWN_BLOCK: usize = 1 << 20;

/// Token shapes in `text`, each with its marker.
fn token_finds(text: &[u8]) -> Vec<crate::rendered::Found> {
    shapes()
        .captures_iter(text)
        .filter_map(|caps| {
            let whole = caps.get(0)?;
            let marker = token_marker(&caps);
            (marker != whole.as_bytes()).then(|| crate::rendered::Found {
                start: whole.start(),
                end: whole.end(),
                marker,
            })
        })
        .collect()
}

/// Token shapes and private keys in `text`, each with its marker.
fn shape_finds(text: &[u8]) -> Vec<crate::rendered::Found> {
    let mut found = token_finds(text);
    found.extend(
        private_keys(text)
            .into_iter()
            .map(|(start, end)| crate::rendered::Found {
                start,
                end,
                marker: PRIVATE_KEY.as_bytes().to_vec(),
            }),
    );
    found
}

fn key_lines() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    compiled(&RE, r"(?-u)-----(?:BEGIN|END)[A-Z0-9 ]*PRIVATE KEY-----")
}

/// Whether `bytes` end inside a private key: its last key line is a BEGIN line.
pub fn private_key_open(bytes: &[u8]) -> bool {
    key_lines()
        .find_iter(bytes)
        .last()
        .is_some_and(|line| line.as_bytes().starts_with(b"-----BEGIN"))
}

/// Whether a private key is open after `bytes`, given whether one was open before
/// them: their last key line is a BEGIN line, or they have none and one was open.
pub fn private_key_open_after(bytes: &[u8], open_before: bool) -> bool {
    match key_lines().find_iter(bytes).last() {
        Some(line) => line.as_bytes().starts_with(b"-----BEGIN"),
        None => open_before,
    }
}

/// Where the first END line of a private key in `bytes` ends.
pub fn private_key_end(bytes: &[u8]) -> Option<usize> {
    key_lines()
        .find_iter(bytes)
        .find(|line| line.as_bytes().starts_with(b"-----END"))
        .map(|line| line.end())
}

/// Where in `bytes` masking may change what a reader is shown: every run that begins
/// like a token shape (whole or cut short) and every private key, as `[start, end)`,
/// in order of their starts. Text outside them is shown as it is.
pub fn sensitive_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let begun = r"(?-u)(?:\bsk-|gh[pousr]_|github_pat_|AKIA|ASIA|xox[bpaors]-)[A-Za-z0-9_-]*";
    let mut spans: Vec<(usize, usize)> = compiled(&RE, begun)
        .find_iter(bytes)
        .map(|found| (found.start(), found.end()))
        .collect();
    spans.extend(private_keys(bytes));
    spans.sort_unstable();
    spans
}

/// Whether [`mask_shapes_bytes`] (or a cut token, or a private key's line) could change
/// anything in `bytes`: false when they hold no start of a token shape and no key line,
/// so that a scan need not look at their lines one by one.
pub fn may_hold_shapes(bytes: &[u8]) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    let starts = r"(?-u)sk-|gh[pousr]_|github_pat_|AKIA|ASIA|xox[bpaors]-|-----(?:BEGIN|END)";
    compiled(&RE, starts).is_match(bytes)
}

/// Where a token shape that more output could complete begins at the end of what
/// `bytes` show (escapes after it included).
pub fn unfinished_token(bytes: &[u8]) -> Option<usize> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let unfinished =
        r"(?-u)(?:\bsk-|gh[pousr]_|github_pat_|AKIA|ASIA|xox[bpaors]-)[A-Za-z0-9_-]*\z";
    let re = compiled(&RE, unfinished);
    let at = crate::rendered::Shown::new(bytes)
        .unfinished(&|text| re.find(text).map_or(text.len(), |found| found.start()));
    (at < bytes.len()).then_some(at)
}

fn token_marker(caps: &Captures) -> Vec<u8> {
    let whole = &caps[0];
    let marker: &[u8] = if caps.name("sk").is_some() {
        // `sk-` words without a digit are names (`sk-learn-...`), not keys.
        if !whole.iter().any(u8::is_ascii_digit) {
            return whole.to_vec();
        }
        b"[secret sk-\xe2\x80\xa6]"
    } else if caps.name("gh").is_some() {
        b"[secret github token]"
    } else if caps.name("aws").is_some() {
        b"[secret AKIA\xe2\x80\xa6]"
    } else {
        b"[secret xox\xe2\x80\xa6]"
    };
    marker.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(pairs: &[(&str, &str)]) -> Secrets {
        let pairs: Vec<[String; 2]> = pairs
            .iter()
            .map(|(n, v)| [n.to_string(), v.to_string()])
            .collect();
        Secrets::new(&pairs).unwrap()
    }

    fn stream(secrets: Secrets, chunks: &[&[u8]]) -> Vec<u8> {
        let mut mask = StreamMask::new(secrets);
        let (mut all, mut out) = (Vec::new(), Vec::new());
        for chunk in chunks {
            all.extend_from_slice(mask.push(chunk, &mut out));
        }
        mask.finish(&mut out);
        all.extend_from_slice(&out);
        all
    }

    #[test]
    fn a_value_split_anywhere_is_masked() {
        let text = b"x=hunter22-secret;y";
        for cut in 0..=text.len() {
            for cut2 in cut..=text.len() {
                let out = stream(
                    secrets(&[("PW", "hunter22-secret")]),
                    &[&text[..cut], &text[cut..cut2], &text[cut2..]],
                );
                assert_eq!(out, b"x=[secret PW];y", "cuts {cut} {cut2}");
            }
        }
    }

    /// What every reader may show of `bytes`: the bytes, their text, a terminal's line.
    fn every_view(bytes: &[u8]) -> Vec<String> {
        use crate::rendered::{render, View};
        vec![
            String::from_utf8_lossy(bytes).into_owned(),
            render(bytes, View::Text).text,
            render(bytes, View::Line).text,
        ]
    }

    #[test]
    fn issue22_2_a_value_joined_by_the_rendering_is_masked_however_it_is_cut() {
        let utf16: Vec<u8> = "pw=hunter22-secret;\n"
            .bytes()
            .flat_map(|b| [b, 0])
            .collect();
        let cases: Vec<Vec<u8>> = vec![
            b"pw=\x1b[01;31m\x1b[Khunter\x1b[m\x1b[K22-secret;\n".to_vec(),
            b"pw=h\x1b[1mu\x1b[0mn\x1b[31mt\x1b[0mer22-se\x1b[4mcret;\n".to_vec(),
            utf16,
            b"pw=XXXXXX22-secret\rpw=hunter\n".to_vec(),
            b"pw=hunterXX\x08\x0822-secret\n".to_vec(),
            b"pw=hunterxxxxx\x1b[5D22-secret\n".to_vec(),
            b"pw=hunter\x1b]0;title\x0722-secret\n".to_vec(),
            "pw=hunter\u{9b}1m22-secret\n".as_bytes().to_vec(),
        ];
        for case in &cases {
            for cut in 0..=case.len() {
                for cut2 in (cut..=case.len()).step_by(3) {
                    let out = stream(
                        secrets(&[("PW", "hunter22-secret")]),
                        &[&case[..cut], &case[cut..cut2], &case[cut2..]],
                    );
                    for view in every_view(&out) {
                        assert!(
                            !view.contains("hunter22-secret") && !view.contains("hunter22-se"),
                            "{:?} cut {cut} {cut2}: {view:?}",
                            String::from_utf8_lossy(case)
                        );
                    }
                    assert!(
                        every_view(&out)[1].contains("[secret PW]"),
                        "{:?} cut {cut} {cut2}: {:?}",
                        String::from_utf8_lossy(case),
                        String::from_utf8_lossy(&out)
                    );
                }
            }
        }
    }

    #[test]
    fn issue22_2_a_rewrite_of_a_written_line_is_masked_from_what_is_new() {
        // The line's first write held nothing that may begin the value; the `\r` that
        // joins it comes later. What was written stays; the joining bytes are masked.
        let mut mask = StreamMask::new(secrets(&[("PW", "hunter22-secret")]));
        let mut out = Vec::new();
        let mut all = mask.push(b"pw=XXXXXX22-secret", &mut out).to_vec();
        assert_eq!(all, b"pw=XXXXXX22-secret");
        all.extend_from_slice(mask.push(b"\rpw=hunter\n", &mut out));
        mask.finish(&mut out);
        all.extend_from_slice(&out);
        for view in every_view(&all) {
            assert!(!view.contains("hunter22"), "{view:?}");
        }
    }

    #[test]
    fn issue22_2_token_shapes_split_by_the_rendering_are_masked_in_raw_bytes() {
        let token = format!("ghp_{}", "a1B2".repeat(9));
        let (head, tail) = token.split_at(10);
        for raw in [
            format!("t={head}\x1b[31m{tail}\x1b[0m\n"),
            format!("t={head}\0{tail}\n"),
            format!("t=XXXXXXXXXX{tail}\rt={head}\n"),
            format!("t={head}xxxx\x1b[4D{tail}\n"),
        ] {
            let masked = mask_shapes_shown(raw.as_bytes());
            for view in every_view(&masked) {
                assert!(!view.contains(&token), "{raw:?}: {view:?}");
            }
            assert!(
                every_view(&masked)[1].contains("[secret github token]"),
                "{raw:?}"
            );
        }
        let raw = format!("t={head}\x1b[31m{tail}\x1b[0m\n");
        let at = raw.find("\x1b[31m").unwrap();
        assert!(token_across(raw.as_bytes(), at).is_some());
        let unfinished = format!("t={head}\x1b[31m");
        assert_eq!(unfinished_token(unfinished.as_bytes()), Some(2));
    }

    #[test]
    fn the_longer_of_two_overlapping_secrets_wins_even_split() {
        let both = || secrets(&[("A", "abcdef"), ("B", "abcdefghij")]);
        assert_eq!(stream(both(), &[b"..abcdef", b"ghij.."]), b"..[secret B]..");
        // The output ended inside B: what of it was printed is masked.
        assert_eq!(stream(both(), &[b"..abcdef", b"gh"]), b"..[secret B]");
        assert_eq!(stream(both(), &[b"..abcdef", b"; "]), b"..[secret A]; ");
        let inner = secrets(&[("A", "cde1"), ("B", "xabcde1x")]);
        assert_eq!(
            stream(inner, &[b"xab", b"cde1x cde1"]),
            b"[secret B] [secret A]"
        );
    }

    #[test]
    fn encoded_forms_are_masked() {
        let s = secrets(&[("T", "p@ss word/42")]);
        let b64 = base64::engine::general_purpose::STANDARD.encode("p@ss word/42");
        let text = format!("{b64} p%40ss%20word%2F42 p%40ss%20word%2f42");
        assert_eq!(
            &*s.mask(text.as_bytes()),
            b"[secret T] [secret T] [secret T]"
        );
    }

    #[test]
    fn issue22_4_overlapping_values_are_masked_as_their_union_however_split() {
        let pairs = [("A", "AAAAAAbbbbbb1234"), ("B", "bbbbbb1234CCCCCC")];
        let text = b"<AAAAAAbbbbbb1234CCCCCC>";
        assert_eq!(&*secrets(&pairs).mask(text), b"<[secret A, B]>");
        // Written a byte at a time, each value is still one marker.
        let bytes: Vec<&[u8]> = b"<AAAAAAbbbbbb1234CCCCCC> AAAAAAbbbbbb1234|"
            .chunks(1)
            .collect();
        assert_eq!(
            stream(secrets(&pairs), &bytes),
            b"<[secret A, B]> [secret A]|"
        );
        for cut in 0..=text.len() {
            for cut2 in cut..=text.len() {
                let out = stream(
                    secrets(&pairs),
                    &[&text[..cut], &text[cut..cut2], &text[cut2..]],
                );
                let shown = String::from_utf8_lossy(&out).into_owned();
                assert!(
                    shown.starts_with("<[secret A"),
                    "cuts {cut} {cut2}: {shown}"
                );
                assert!(shown.ends_with("]>"), "cuts {cut} {cut2}: {shown}");
                for piece in ["AAA", "bbb", "123", "CC"] {
                    assert!(!shown.contains(piece), "cuts {cut} {cut2}: {shown}");
                }
            }
        }
        // A chain of overlaps is one span; a value inside another names the outer one.
        let chain = secrets(&[("X", "abcabcab"), ("Y", "cabcabca")]);
        assert_eq!(&*chain.mask(b"-abcabcabcabcab-"), b"-[secret X, Y]-");
        let inner = secrets(&[("A", "cde1"), ("B", "xabcde1x")]);
        assert_eq!(&*inner.mask(b"xabcde1x"), b"[secret B]");
    }

    #[test]
    fn issue22_3_base64_at_every_alignment_both_alphabets_is_masked() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let value = "p>?s~w0rd/+é";
        let s = secrets(&[("PW", value)]);
        for prefix in ["", "u", "us", "user:", "admin:", "x:"] {
            for suffix in ["", "\n", "@host", "?"] {
                let plain = format!("{prefix}{value}{suffix}");
                for encoded in [STANDARD.encode(&plain), URL_SAFE_NO_PAD.encode(&plain)] {
                    let text = format!("Authorization: Basic {encoded}");
                    let masked = String::from_utf8(s.mask(text.as_bytes()).into_owned()).unwrap();
                    assert!(masked.contains("[secret PW]"), "{plain:?}: {masked}");
                    // At most two characters on each side mix in other bytes.
                    let visible =
                        masked.len() - "Authorization: Basic ".len() - "[secret PW]".len();
                    let other = (prefix.len() + suffix.len()) * 4 / 3 + 6;
                    assert!(visible <= other, "{plain:?}: {masked}");
                }
            }
        }
    }

    #[test]
    fn issue22_3_url_quoting_with_both_safe_sets_and_hex_are_masked() {
        let s = secrets(&[("T", "a b/c+d")]);
        for form in [
            "a%20b%2Fc%2Bd",
            "a%20b/c%2Bd",
            "a+b%2Fc%2Bd",
            "a+b/c%2Bd",
            "a%20b%2fc%2bd",
            "6120622f632b64",
            "6120622F632B64",
        ] {
            assert_eq!(
                &*s.mask(format!("<{form}>").as_bytes()),
                b"<[secret T]>",
                "{form}"
            );
        }
    }

    #[test]
    fn a_value_with_blanks_or_lines_is_masked_as_a_shell_prints_it() {
        let s = secrets(&[("K", "  line-one-abc\nline-two-def\n")]);
        assert_eq!(
            &*s.mask(b"[line-one-abc line-two-def]"),
            b"[[secret K] [secret K]]"
        );
        assert_eq!(&*s.mask(b"line-one-abc\nline-two-def"), b"[secret K]");
    }

    #[test]
    fn regex_characters_and_newlines_are_plain_bytes() {
        let s = secrets(&[("R", ".*(a|b)+\n[x]")]);
        assert_eq!(&*s.mask(b"aaa .*(a|b)+\n[x] bbb"), b"aaa [secret R] bbb");
        assert_eq!(&*s.mask(b".*(a|b)+\r\n[x]"), b"[secret R]");
        assert_eq!(&*s.mask(b"aab\nx"), b"aab\nx");
    }

    #[test]
    fn output_that_ends_in_the_start_of_a_secret_masks_that_start() {
        let s = || secrets(&[("S", "zebra-crossing")]);
        assert_eq!(stream(s(), &[b"a zebra-cr"]), b"a [secret S]");
        assert_eq!(stream(s(), &[b"a zeb"]), b"a zeb");
    }

    #[test]
    fn nothing_is_held_that_cannot_begin_a_secret() {
        let mut mask = StreamMask::new(secrets(&[("S", "zebra-crossing")]));
        let mut out = Vec::new();
        assert_eq!(mask.push(b"hello world", &mut out), b"hello world");
        assert_eq!(mask.push(b"a zebra", &mut out), b"a ");
        assert_eq!(mask.held(), 5);
    }

    #[test]
    fn many_unclosed_keys_cost_linear_time() {
        let text = "-----BEGIN PRIVATE KEY----- sk-abc123abc123abc123abc123 ".repeat(20_000);
        let began = std::time::Instant::now();
        assert_eq!(mask_shapes(text), "[secret private key]");
        assert!(began.elapsed() < std::time::Duration::from_secs(5));
        let text = "x sk-abc123abc123abc123abc123 -----END PRIVATE KEY----- y ".repeat(2);
        assert_eq!(
            mask_shapes(text),
            "[secret private key] y x [secret sk-…] -----END PRIVATE KEY----- y "
        );
    }

    #[test]
    fn token_shapes_are_masked() {
        let gh = format!("token ghp_{} end", "a1B2".repeat(9));
        assert_eq!(mask_shapes(gh), "token [secret github token] end");
        let text = "AKIAABCDEFGHIJKLMNOP sk-proj-abc123def456ghi789jkl xoxb-1234-abcdefghij";
        assert_eq!(
            mask_shapes(text.into()),
            "[secret AKIA…] [secret sk-…] [secret xox…]"
        );
        assert_eq!(
            mask_shapes("pip install sk-learn-extensions-for-all".into()),
            "pip install sk-learn-extensions-for-all"
        );
        let pem = "a\n-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\nb";
        assert_eq!(mask_shapes(pem.into()), "a\n[secret private key]\nb");
        let open = "a\n-----BEGIN PRIVATE KEY-----\nMIIB";
        assert_eq!(mask_shapes(open.into()), "a\n[secret private key]");
        let close = "MIIB\n-----END PRIVATE KEY-----\nb";
        assert_eq!(mask_shapes(close.into()), "[secret private key]\nb");
    }
}
