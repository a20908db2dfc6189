//! Masking secrets: the values a job was given (`--env`, `--secret`), replaced with
//! `[secret NAME]` in its log, and common token shapes replaced in whatever a reader
//! is shown.
//!
//! How it works. [`Secrets`] holds every form of every known value (the value, its
//! base64 with and without padding, its URL-encoded and JSON-escaped forms, the value
//! without surrounding blanks, and for values of several lines each line and the
//! `\r\n` a terminal makes of them) in one Aho-Corasick automaton (leftmost-longest,
//! so a secret that contains another wins). The
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

/// The known secret values of one job and every form of them that is masked.
pub struct Secrets {
    automaton: AhoCorasick,
    /// For each pattern of the automaton, its replacement (`[secret NAME]`).
    markers: Vec<Vec<u8>>,
    /// Every form, sorted, to find the bytes at the end of a chunk that begin one.
    sorted: Vec<Vec<u8>>,
    longest: usize,
}

impl Secrets {
    /// The masking of `(name, value)` pairs; `None` when there is nothing to mask.
    pub fn new(pairs: &[[String; 2]]) -> Option<Secrets> {
        let mut forms: Vec<(Vec<u8>, usize)> = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        for [name, value] in pairs {
            if value.is_empty() {
                continue;
            }
            names.push(name);
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
        // does most of the work).
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(forms.iter().map(|(form, _)| form))
            .ok()?;
        let markers = forms
            .iter()
            .map(|(_, name)| format!("[secret {}]", names[*name]).into_bytes())
            .collect();
        let longest = forms.iter().map(|(form, _)| form.len()).max().unwrap_or(0);
        let sorted = forms.into_iter().map(|(form, _)| form).collect();
        Some(Secrets {
            automaton,
            markers,
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
        self.mask_into(bytes, &mut out, true);
        Cow::Owned(out)
    }

    /// Appends the masked `bytes` to `out` up to where what follows could still begin
    /// a form (unless `whole`); returns that position: the bytes from it on are held.
    fn mask_into(&self, bytes: &[u8], out: &mut Vec<u8>, whole: bool) -> usize {
        // `held`: the first position at or after `cursor` from which the rest may begin
        // a form, found afresh only when a match moved the cursor past it.
        let mut cursor = 0;
        let mut held = self.first_unfinished(bytes, 0, whole);
        for found in self.automaton.find_iter(bytes) {
            if held < cursor {
                held = self.first_unfinished(bytes, cursor, whole);
            }
            if found.start() >= held {
                break;
            }
            out.extend_from_slice(&bytes[cursor..found.start()]);
            out.extend_from_slice(&self.markers[found.pattern().as_usize()]);
            cursor = found.end();
        }
        if held < cursor {
            held = self.first_unfinished(bytes, cursor, whole);
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

/// Masks a job's output as it streams: what may begin a secret is held back until the
/// next chunk shows whether it does.
pub struct StreamMask {
    secrets: Secrets,
    held: Vec<u8>,
}

impl StreamMask {
    pub fn new(secrets: Secrets) -> StreamMask {
        StreamMask {
            secrets,
            held: Vec::new(),
        }
    }

    /// Masks the next chunk of output: returns what may be written now (`chunk` itself,
    /// or part of it, when it holds no secret; else `out`, cleared first). At most the
    /// longest form's length − 1 bytes are kept back.
    pub fn push<'a>(&mut self, chunk: &'a [u8], out: &'a mut Vec<u8>) -> &'a [u8] {
        out.clear();
        if self.held.is_empty() {
            if self.secrets.automaton.find(chunk).is_none() {
                // Nothing to replace: no copy, only the start of a form kept back.
                let held = self.secrets.first_unfinished(chunk, 0, false);
                self.held.extend_from_slice(&chunk[held..]);
                return &chunk[..held];
            }
            let held = self.secrets.mask_into(chunk, out, false);
            self.held.extend_from_slice(&chunk[held..]);
        } else {
            let mut bytes = std::mem::take(&mut self.held);
            bytes.extend_from_slice(chunk);
            let held = self.secrets.mask_into(&bytes, out, false);
            bytes.drain(..held);
            self.held = bytes;
        }
        out
    }

    /// The output ended: whatever was held, masked, into `out` (cleared first).
    /// The start of a secret that the output ended in is masked too, once it is
    /// [`MIN_SECRET_LEN`] bytes long (a job killed in the middle of printing one).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.clear();
        let bytes = std::mem::take(&mut self.held);
        let secrets = &self.secrets;
        let mut cursor = 0;
        for found in secrets.automaton.find_iter(&bytes) {
            out.extend_from_slice(&bytes[cursor..found.start()]);
            out.extend_from_slice(&secrets.markers[found.pattern().as_usize()]);
            cursor = found.end();
        }
        let rest = &bytes[cursor..];
        let begun = (0..rest.len().saturating_sub(MIN_SECRET_LEN - 1))
            .find_map(|at| Some(at).zip(secrets.longer_form_begun_by(&rest[at..])));
        match begun {
            Some((at, index)) => {
                out.extend_from_slice(&rest[..at]);
                out.extend_from_slice(&secrets.markers[index]);
            }
            None => out.extend_from_slice(rest),
        }
    }

    /// The values masked.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// How many bytes are held back now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// The forms of one value that are masked, each once: its encodings, those of the
/// value without surrounding blanks (as `echo $VAR` prints it), and each line of a
/// value of several lines (of 8 bytes or more).
fn forms_of(value: &str) -> Vec<Vec<u8>> {
    let mut forms = Vec::new();
    let trimmed = value.trim();
    if value.len() <= MAX_SECRET_LEN {
        forms.extend(encodings_of(value));
        if trimmed != value && !trimmed.is_empty() {
            forms.extend(encodings_of(trimmed));
        }
    }
    if trimmed.contains('\n') {
        let lines = trimmed.lines().map(str::trim);
        let lines =
            lines.filter(|line| (MIN_ENV_SECRET_LEN..=MAX_SECRET_LEN).contains(&line.len()));
        forms.extend(lines.map(|line| line.as_bytes().to_vec()));
    }
    forms.sort();
    forms.dedup();
    forms
}

/// A value as it is, base64, URL-encoded and JSON-escaped (and with `\r\n` line ends,
/// as a terminal prints it).
fn encodings_of(value: &str) -> Vec<Vec<u8>> {
    let bytes = value.as_bytes();
    let padded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut forms = vec![
        bytes.to_vec(),
        padded.trim_end_matches('=').as_bytes().to_vec(),
        padded.clone().into_bytes(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(bytes)
            .into_bytes(),
        url_encoded(bytes, true),
        url_encoded(bytes, false),
    ];
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

/// Percent-encoding of every byte but the unreserved ones (RFC 3986), in upper or
/// lower case hex.
fn url_encoded(bytes: &[u8], upper: bool) -> Vec<u8> {
    let mut out = String::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
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
  | \b(?P<gh>(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})
  | \b(?P<aws>(?:AKIA|ASIA)[0-9A-Z]{16})\b
  | \b(?P<slack>xox[bpaors]-[A-Za-z0-9-]{10,})
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

/// The token shape that `window` holds across its index `at` (starting before it and
/// ending after it), as its start and end in `window`.
pub fn token_across(window: &[u8], at: usize) -> Option<(usize, usize)> {
    shapes()
        .find_iter(window)
        .map(|found| (found.start(), found.end()))
        .take_while(|&(start, _)| start < at)
        .find(|&(_, end)| at < end)
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

/// Where the first END line of a private key in `bytes` ends.
pub fn private_key_end(bytes: &[u8]) -> Option<usize> {
    key_lines()
        .find_iter(bytes)
        .find(|line| line.as_bytes().starts_with(b"-----END"))
        .map(|line| line.end())
}

/// Where a token shape that more output could complete begins at the end of `bytes`.
pub fn unfinished_token(bytes: &[u8]) -> Option<usize> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let unfinished =
        r"(?-u)\b(?:sk-|gh[pousr]_|github_pat_|AKIA|ASIA|xox[bpaors]-)[A-Za-z0-9_-]*\z";
    compiled(&RE, unfinished)
        .find(bytes)
        .map(|found| found.start())
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

    #[test]
    fn the_longer_of_two_overlapping_secrets_wins_even_split() {
        let both = || secrets(&[("A", "abcdef"), ("B", "abcdefghij")]);
        assert_eq!(stream(both(), &[b"..abcdef", b"ghij.."]), b"..[secret B]..");
        assert_eq!(stream(both(), &[b"..abcdef", b"gh"]), b"..[secret A]gh");
        assert_eq!(stream(both(), &[b"..abcdef"]), b"..[secret A]");
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
