//! What the fields shown of an item (its `--after` output patterns, its `--name`) spell
//! of a value between them: runs of their text, and runs of regex pieces that match the
//! value's characters and not those of every other text of its shape, counted against
//! one [`Budget`] of work per start.

use regex_syntax::hir::{Class, Hir, HirKind};

/// How a text of a value is looked for in the shown fields.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Reading {
    /// Runs of its text (as it is and read loosely) and runs of regex pieces.
    Both,
    /// Runs of its text only: a long value (a key, a JSON credential) is no pattern's
    /// spelling in regex syntax, and its lines are read on their own.
    Text,
    /// Runs of regex pieces only (an encoded form: as text it is found whole).
    Pieces,
}

/// The longest text read for runs of regex pieces.
pub(super) const MAX_REGEX_CHARS: usize = 256;

/// Which of the shown fields spell two thirds of a value; or the patterns took more
/// than the budget to be told from it.
pub(super) struct Spelled {
    pub(super) by_name: bool,
    pub(super) by_patterns: bool,
    pub(super) intricate: bool,
}

/// How many regexes the patterns of one start may build to be checked against its
/// values, and run: a count of work, the same on a busy machine as on an idle one.
const MAX_TRIES: usize = 20_000;
const MAX_SEARCHES: usize = 200_000;
/// A backstop only: the counts above end any check well before it on any machine.
const MAX_CHECK_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// What is left of the checking of one start's patterns.
pub(super) struct Budget {
    tries: usize,
    searches: usize,
    until: std::time::Instant,
    /// Each regex built once for the whole check (None: it would not build).
    built: std::collections::HashMap<String, Option<regex::Regex>>,
}

impl Budget {
    /// The whole budget of one start.
    pub(super) fn new() -> Budget {
        Budget {
            tries: MAX_TRIES,
            searches: MAX_SEARCHES,
            until: std::time::Instant::now() + MAX_CHECK_TIME,
            built: Default::default(),
        }
    }

    /// One more regex, or None once the budget is spent.
    fn take(&mut self) -> Option<()> {
        if std::time::Instant::now() > self.until {
            return None;
        }
        self.tries = self.tries.checked_sub(1)?;
        Some(())
    }

    /// The regex of `pattern`, built once (a build counts as a try).
    fn regex(&mut self, pattern: String) -> Option<Option<regex::Regex>> {
        if let Some(built) = self.built.get(&pattern) {
            return Some(built.clone());
        }
        self.take()?;
        let built = regex::RegexBuilder::new(&pattern)
            .size_limit(1 << 22)
            .nest_limit(4 * MAX_RUN as u32)
            .build()
            .ok();
        self.built.insert(pattern, built.clone());
        Some(built)
    }

    /// One more search with a regex built, or None once the budget is spent.
    fn search(&mut self) -> Option<()> {
        if self.searches.is_multiple_of(256) && std::time::Instant::now() > self.until {
            return None;
        }
        self.searches = self.searches.checked_sub(1)?;
        Some(())
    }
}

/// The fewest characters of a value a piece of the shown fields must spell in a row to
/// count: shorter runs are everyday text (`er`, `on`).
const MIN_RUN: usize = 3;
/// The same for a text read loosely (letters and digits only): everyday words share
/// more short runs once their blanks and punctuation are left out.
const MIN_LOOSE_RUN: usize = 4;

/// The most pieces one run of a pattern may have (pieces that may match nothing, `z?`,
/// count too: a value spelled between them is still spelled).
const MAX_RUN: usize = 240;

/// Whether `patterns` and `name` between them spell two thirds of `value`'s characters (at
/// least 4, all of a shorter value), and which of them do.
pub(super) fn spelled_between(
    value: &str,
    reading: Reading,
    patterns: &[&str],
    name: Option<&str>,
    budget: &mut Budget,
) -> Option<Spelled> {
    let mut value = Value::new(value);
    let mut by_name = false;
    let intricate = Some(Spelled {
        by_name: false,
        by_patterns: true,
        intricate: true,
    });
    let text_runs = reading != Reading::Pieces;
    // The name as it is and with its escapes decoded, as text (of an encoded form too).
    if let Some(name) = name {
        for text in [name.to_string(), decoded(name)] {
            for loose in [false, true] {
                match value.cover_runs(&text, loose, budget) {
                    Some(spelled) => by_name |= spelled,
                    None => return intricate,
                }
            }
        }
    }
    let mut by_patterns = false;
    for pattern in patterns {
        // As deep as the pattern's own compile allows (`after::compile`).
        let parsed = regex_syntax::ParserBuilder::new()
            .nest_limit(250)
            .build()
            .parse(pattern);
        let whole = pattern.contains(value.text) || unescaped(pattern).contains(value.text);
        // Its text as given and, read loosely (letters and digits only, any case), the
        // characters it spells in order (`h.u.n.t.e.r` shows `hunter` to a reader);
        // and what runs of its pieces match of the value.
        // Also the pattern's raw text read loosely (its comments, group names and counts
        // are shown too) and its escapes decoded.
        let mut text = false;
        if text_runs {
            let mut readings = vec![
                (unescaped(pattern), false),
                (decoded(pattern), false),
                (pattern.to_string(), true),
                (decoded(pattern), true),
            ];
            if let Ok(hir) = &parsed {
                readings.push((shown(hir), true));
            }
            for (reading, loose) in readings {
                match value.cover_runs(&reading, loose, budget) {
                    Some(spelled) => text |= spelled,
                    None => return intricate,
                }
            }
        }
        let spelled = match (whole, &parsed) {
            (true, _) => Some(true),
            (false, Ok(hir)) if reading != Reading::Text => {
                value.cover_regex(hir, budget).map(|runs| runs | text)
            }
            _ => Some(text),
        };
        // Too intricate to be looked at whole: refused, never passed.
        let Some(spelled) = spelled else {
            return intricate;
        };
        if whole {
            value.covered.fill(true);
        }
        by_patterns |= spelled;
    }
    value.enough().then_some(Spelled {
        intricate: false,
        by_name,
        by_patterns,
    })
}

/// A value, the characters of it the fields spell so far, and texts of its shape.
struct Value<'a> {
    text: &'a str,
    /// The byte offset of each character, and the text's length last.
    offsets: Vec<usize>,
    covered: Vec<bool>,
    others: Vec<Vec<char>>,
    /// A value of hex digits alone: hex is its shape.
    hex: bool,
}

impl<'a> Value<'a> {
    fn new(text: &'a str) -> Value<'a> {
        let mut offsets: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
        offsets.push(text.len());
        Value {
            text,
            covered: vec![false; offsets.len() - 1],
            offsets,
            hex: text.chars().all(|c| c.is_ascii_hexdigit()),
            others: others_of_its_shape(text)
                .into_iter()
                .map(|other| other.chars().collect())
                .collect(),
        }
    }

    fn chars(&self) -> usize {
        self.covered.len()
    }

    /// Whether two thirds of the value's characters (at least 4, all of a shorter one) are
    /// spelled.
    fn enough(&self) -> bool {
        let chars = self.chars();
        let spelled = self.covered.iter().filter(|&&c| c).count();
        spelled >= chars.min((2 * chars).div_ceil(3).max(4))
    }

    /// Marks each run of `MIN_RUN` (`MIN_LOOSE_RUN`) characters or more of the value that `text` holds,
    /// both as they are or both read loosely ([`loosely`]); whether
    /// there was one.
    fn cover_runs(&mut self, text: &str, loose: bool, budget: &Budget) -> Option<bool> {
        let (project, least): (fn(char) -> Option<char>, usize) = match loose {
            false => (as_it_is, MIN_RUN),
            true => (loosely, MIN_LOOSE_RUN),
        };
        let text: String = text.chars().filter_map(project).collect();
        let value: Vec<(usize, char)> = self
            .text
            .chars()
            .enumerate()
            .filter_map(|(at, c)| project(c).map(|c| (at, c)))
            .collect();
        let mut any = false;
        // The run that begins one character later holds at least as far.
        let mut to = 0;
        let mut run = String::new();
        for from in 0..value.len() {
            if from % 256 == 0 && std::time::Instant::now() > budget.until {
                return None;
            }
            to = to.max(from);
            loop {
                run.clear();
                run.extend(value[from..to].iter().map(|&(_, c)| c));
                if to < value.len() {
                    run.push(value[to].1);
                }
                if to == value.len() || !text.contains(run.as_str()) {
                    break;
                }
                to += 1;
            }
            if to - from >= least {
                for &(at, _) in &value[from..to] {
                    self.covered[at] = true;
                }
                any = true;
            }
        }
        Some(any)
    }

    /// Marks what runs of consecutive pieces of `hir` (a literal taken a character at a
    /// time), or of a group in it, spell of the value and not of every other text of its
    /// shape; whether they spelled any. One regex per first piece that spells, tried at
    /// each character of the value where it may begin. None once the budget is spent.
    fn cover_regex(&mut self, hir: &Hir, budget: &mut Budget) -> Option<bool> {
        let pieces: Vec<Hir> = match hir.kind() {
            HirKind::Capture(capture) => return self.cover_regex(&capture.sub, budget),
            HirKind::Alternation(branches) => {
                let mut any = false;
                for branch in branches {
                    any |= self.cover_regex(branch, budget)?;
                }
                return Some(any);
            }
            HirKind::Concat(parts) => parts.iter().flat_map(one_char_each).collect(),
            _ => one_char_each(hir),
        };
        let len = self.text.len();
        let mut any = false;
        for first in 0..pieces.len() {
            // A run that begins with a piece that tells nothing tells no more than the
            // one that begins at its first piece that may.
            if most_told(&pieces[first]) == 0 {
                continue;
            }
            let starts: Vec<usize> = (0..self.chars())
                .filter(|&at| may_begin(&pieces[first..], &self.text[self.offsets[at]..]))
                .collect();
            if starts.is_empty() {
                continue;
            }
            // As far as a run can go and still match no more than the value.
            let mut last = first;
            let mut least = 0usize;
            while last < pieces.len() && last - first < MAX_RUN {
                least = least.saturating_add(
                    pieces[last]
                        .properties()
                        .minimum_len()
                        .unwrap_or(usize::MAX),
                );
                if least > len {
                    break;
                }
                last += 1;
            }
            if last == first {
                continue;
            }
            // `(?P<p0>a)(?:(?P<p1>b)(?:(?P<p2>c))?)?`: the pieces a match took, each where.
            let mut nested = String::new();
            for (at, piece) in pieces[first..last].iter().enumerate().rev() {
                nested = match nested.is_empty() {
                    true => format!("(?P<p{at}>{})", lazy(piece)),
                    false => format!("(?P<p{at}>{})(?:{nested})?", lazy(piece)),
                };
            }
            let Some(runs) = budget.regex(format!("^(?:{nested})"))? else {
                continue;
            };
            for from in starts {
                budget.search()?;
                let Some(found) = runs.captures(&self.text[self.offsets[from]..]) else {
                    continue;
                };
                let taken = (0..last - first)
                    .take_while(|at| found.name(&format!("p{at}")).is_some())
                    .count();
                // What each piece of the run tells of the characters it took.
                let mut marks = Vec::new();
                for (at, piece) in pieces[first..first + taken].iter().enumerate() {
                    let Some(span) = found.name(&format!("p{at}")) else {
                        continue;
                    };
                    let begin = self.char_at(self.offsets[from] + span.start());
                    let end = self.char_at(self.offsets[from] + span.end());
                    let told = self.tells(piece, begin, end, budget)?;
                    if told > 0 {
                        marks.push((begin, told));
                    }
                }
                if marks.iter().map(|&(_, told)| told).sum::<usize>() < MIN_RUN {
                    continue;
                }
                for (begin, told) in marks {
                    self.covered[begin..begin + told].fill(true);
                }
                any = true;
            }
        }
        // A group inside the pattern, on its own.
        for piece in &pieces {
            let inner = match piece.kind() {
                HirKind::Capture(_) | HirKind::Alternation(_) => Some(piece),
                HirKind::Repetition(repetition) => Some(&*repetition.sub),
                _ => None,
            };
            if let Some(inner) = inner.filter(|inner| most_told(inner) >= MIN_RUN) {
                any |= self.cover_regex(inner, budget)?;
            }
        }
        Some(any)
    }

    /// How many of the value's characters `begin..end`, which `piece` matched, it tells:
    /// a literal all; a class its one when it does not match that character of some
    /// other text of the value's shape (`[hX-Z]` tells `h`, `[a-z]` nothing); any other
    /// piece as many as it may tell at most, when it does not match those characters of
    /// every other text of the value's shape (`(?:hu|x)` tells 2, `(\w+)` none).
    fn tells(&self, piece: &Hir, begin: usize, end: usize, budget: &mut Budget) -> Option<usize> {
        let chars = end - begin;
        Some(match piece.kind() {
            HirKind::Literal(_) => chars,
            HirKind::Class(_) if chars == 1 => usize::from(self.class_tells(piece, begin)),
            // A class repeated tells, at each character, what the class tells there.
            HirKind::Repetition(repetition)
                if matches!(repetition.sub.kind(), HirKind::Class(_)) =>
            {
                (begin..end)
                    .filter(|&at| self.class_tells(&repetition.sub, at))
                    .count()
            }
            _ => {
                let most = most_told(piece).min(chars);
                if most == 0 {
                    return Some(0);
                }
                match self.specific(piece, begin, end, budget)? {
                    true => most,
                    false => 0,
                }
            }
        })
    }

    /// Whether a class tells the value's character `at`: it leaves out another character
    /// of that character's kind (a lower-case ASCII letter, an upper-case one, a digit; a
    /// hex digit's kind in a value of hex digits), or, for any other character, one of
    /// the same character of the other texts of its shape.
    fn class_tells(&self, class: &Hir, at: usize) -> bool {
        let Some(c) = self.text.chars().nth(at) else {
            return false;
        };
        let kind: Option<Vec<char>> = match c {
            c if self.hex && c.is_ascii_hexdigit() && c.is_ascii_lowercase() => {
                Some(('a'..='f').chain('0'..='9').collect())
            }
            c if self.hex && c.is_ascii_hexdigit() && c.is_ascii_uppercase() => {
                Some(('A'..='F').chain('0'..='9').collect())
            }
            c if self.hex && c.is_ascii_digit() => Some(('0'..='9').collect()),
            c if c.is_ascii_lowercase() => Some(('a'..='z').collect()),
            c if c.is_ascii_uppercase() => Some(('A'..='Z').collect()),
            c if c.is_ascii_digit() => Some(('0'..='9').collect()),
            _ => None,
        };
        match kind {
            Some(kind) => kind.into_iter().any(|k| class_has(class, k) == Some(false)),
            None => self.others.iter().any(|other| {
                other
                    .get(at)
                    .is_some_and(|&o| class_has(class, o) == Some(false))
            }),
        }
    }

    /// The character index at byte `offset` of the value.
    fn char_at(&self, offset: usize) -> usize {
        self.offsets.partition_point(|&at| at < offset)
    }

    /// Whether `piece` (which matched the value's characters `from..to`) does not match
    /// the same characters of every other text of its shape.
    fn specific(&self, piece: &Hir, from: usize, to: usize, budget: &mut Budget) -> Option<bool> {
        let Some(whole) = budget.regex(format!("^(?:{piece})$"))? else {
            return Some(false);
        };
        Some(!self.others.iter().all(|other| {
            let window: String = other[from.min(other.len())..to.min(other.len())]
                .iter()
                .collect();
            whole.is_match(&window)
        }))
    }
}

/// A character as it is.
fn as_it_is(c: char) -> Option<char> {
    Some(c)
}

/// A letter or digit in lower case; any other character left out.
fn loosely(c: char) -> Option<char> {
    c.is_alphanumeric()
        .then(|| c.to_lowercase().next().unwrap_or(c))
}

/// The characters a pattern shows a reader, in order: its literals' characters and, for
/// a class of at most three (`[Hh]`), its first.
fn shown(hir: &Hir) -> String {
    fn walk(hir: &Hir, out: &mut String) {
        match hir.kind() {
            HirKind::Literal(literal) => out.push_str(&String::from_utf8_lossy(&literal.0)),
            HirKind::Class(Class::Unicode(class)) => {
                let size: u32 = class
                    .ranges()
                    .iter()
                    .map(|r| r.end() as u32 - r.start() as u32 + 1)
                    .sum();
                if let Some(first) = class.ranges().first().filter(|_| size <= 3) {
                    out.push(first.start());
                }
            }
            HirKind::Class(Class::Bytes(class)) => {
                let size: u32 = class
                    .ranges()
                    .iter()
                    .map(|r| u32::from(r.end()) - u32::from(r.start()) + 1)
                    .sum();
                if let Some(first) = class.ranges().first().filter(|_| size <= 3) {
                    out.push(char::from(first.start()));
                }
            }
            HirKind::Repetition(repetition) => walk(&repetition.sub, out),
            HirKind::Capture(capture) => walk(&capture.sub, out),
            HirKind::Concat(parts) | HirKind::Alternation(parts) => {
                parts.iter().for_each(|part| walk(part, out))
            }
            _ => {}
        }
    }
    let mut out = String::new();
    walk(hir, &mut out);
    out
}

/// Whether a run of `pieces` from the first may match the start of `text`, as far as
/// the pieces of one character each (a literal's character, a class) tell, without
/// building a regex: false once one of them cannot match its character.
fn may_begin(pieces: &[Hir], text: &str) -> bool {
    for (piece, c) in pieces.iter().zip(text.chars()) {
        match class_has(piece, c) {
            Some(true) => {}
            Some(false) => return false,
            // Any other piece may match more or fewer characters: no more is told.
            None => return true,
        }
    }
    true
}

/// Whether a piece of one character (a literal's, a class) matches `c`; None for any
/// other piece.
fn class_has(piece: &Hir, c: char) -> Option<bool> {
    Some(match piece.kind() {
        HirKind::Literal(literal) => {
            let mut buffer = [0u8; 4];
            *literal.0 == *c.encode_utf8(&mut buffer).as_bytes()
        }
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .any(|r| r.start() <= c && c <= r.end()),
        HirKind::Class(Class::Bytes(class)) => u8::try_from(c).is_ok_and(|b| {
            class
                .ranges()
                .iter()
                .any(|r| r.start() <= b && b <= r.end())
        }),
        _ => return None,
    })
}

/// A piece with its repetitions lazy: in a run, a filler (`.*`) then takes as little as
/// it can, and the pieces after it what they match of the value.
fn lazy(piece: &Hir) -> Hir {
    match piece.kind() {
        HirKind::Repetition(repetition) => Hir::repetition(regex_syntax::hir::Repetition {
            greedy: false,
            sub: Box::new(lazy(&repetition.sub)),
            ..repetition.clone()
        }),
        // Without its name: a run's own groups are named, and may not meet another.
        HirKind::Capture(capture) => Hir::capture(regex_syntax::hir::Capture {
            sub: Box::new(lazy(&capture.sub)),
            name: None,
            ..capture.clone()
        }),
        HirKind::Concat(parts) => Hir::concat(parts.iter().map(lazy).collect()),
        HirKind::Alternation(branches) => Hir::alternation(branches.iter().map(lazy).collect()),
        _ => piece.clone(),
    }
}

/// A literal as its characters, one piece each; any other piece as it is.
fn one_char_each(hir: &Hir) -> Vec<Hir> {
    match hir.kind() {
        HirKind::Literal(literal) => match std::str::from_utf8(&literal.0) {
            Ok(text) => text
                .chars()
                .map(|c| Hir::literal(c.to_string().into_bytes()))
                .collect(),
            Err(_) => vec![hir.clone()],
        },
        // An assertion, or a piece that matches nothing but the empty text (`()`,
        // `x{0}`), shows nothing of a value: the pattern is read without it.
        HirKind::Look(_) => Vec::new(),
        _ if hir.properties().maximum_len() == Some(0) => Vec::new(),
        _ => vec![hir.clone()],
    }
}

/// How many characters of a value a piece may tell at most: a literal's characters,
/// a class one, a group or a repetition what it holds, an alternation its most
/// ([`Value::tells`] asks whether it tells them): `hunt.r2` 7, `(hunter2)secret` 13.
fn most_told(piece: &Hir) -> usize {
    match piece.kind() {
        HirKind::Literal(literal) => {
            std::str::from_utf8(&literal.0).map_or(literal.0.len(), |text| text.chars().count())
        }
        HirKind::Class(_) => 1,
        HirKind::Repetition(repetition) => {
            most_told(&repetition.sub).saturating_mul(repetition.min.max(1) as usize)
        }
        HirKind::Capture(capture) => most_told(&capture.sub),
        HirKind::Concat(parts) => parts.iter().map(most_told).sum(),
        HirKind::Alternation(branches) => branches.iter().map(most_told).max().unwrap_or(0),
        _ => 0,
    }
}

/// A regex pattern with each escaped punctuation character as the character itself.
fn unescaped(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\\', Some(&next)) if next.is_ascii_punctuation() => {
                out.push(next);
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// Texts of `value`'s shape: each letter and digit changed to others of its kind (case
/// kept; any script's letters to Latin ones), spaces and separators kept (the
/// punctuation of a value of punctuation alone changed too). A pattern of the shape
/// alone (`\w+`, `[[:alpha:]]+`) matches them all; one that spells the value, even with a
/// class of two or three characters for each, fails on one. Each has as many
/// characters as the value.
fn others_of_its_shape(value: &str) -> Vec<String> {
    const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const DIGITS: &[u8] = b"0123456789";
    const PUNCT: &[u8] = b"!#%&*+,-./:;=?@^_~";
    let shift = |set: &[u8], c: char, by: usize| -> char {
        let at = set.iter().position(|&b| char::from(b) == c).unwrap_or(0);
        char::from(set[(at + by) % set.len()])
    };
    let all_punctuation = !value.chars().any(char::is_alphanumeric);
    // A value of hex digits alone (a digest, a hex form) keeps that shape: its letters
    // become other hex letters (`[0-9a-f]{40}` is its shape, and tells nothing).
    let hex = value.chars().all(|c| c.is_ascii_hexdigit());
    const HEX: &[u8] = b"abcdef";
    [1, 7, 13, 19]
        .iter()
        .map(|&by| {
            value
                .chars()
                .map(|c| match c {
                    c if c.is_ascii_digit() => shift(DIGITS, c, by % 10 + 1),
                    c if hex && c.is_ascii_lowercase() => shift(HEX, c, by % 5 + 1),
                    c if hex => shift(HEX, c.to_ascii_lowercase(), by % 5 + 1).to_ascii_uppercase(),
                    c if c.is_ascii_lowercase() => shift(LOWER, c, by),
                    c if c.is_ascii_uppercase() => {
                        shift(LOWER, c.to_ascii_lowercase(), by).to_ascii_uppercase()
                    }
                    // Another letter of its script where one is near (its block of 32).
                    c if c.is_alphabetic() && in_block(c, by).is_some() => {
                        in_block(c, by).unwrap_or(c)
                    }
                    c if c.is_uppercase() => shift(LOWER, 'a', by).to_ascii_uppercase(),
                    c if c.is_alphabetic() => shift(LOWER, 'a', by),
                    c if c.is_numeric() => shift(DIGITS, '0', by),
                    // Separators are the shape of a value with letters or digits
                    // (`\w+-\w+`); a value of punctuation alone has no other shape.
                    c if c.is_whitespace() || !all_punctuation => c,
                    c => match PUNCT.contains(&(c as u32 as u8)) && c.is_ascii() {
                        true => shift(PUNCT, c, by),
                        false => shift(PUNCT, '!', by),
                    },
                })
                .collect()
        })
        .collect()
}

/// Another letter `by` places on in `c`'s block of 32 code points, of the same case, or
/// None when that is not one.
fn in_block(c: char, by: usize) -> Option<char> {
    let code = c as u32;
    let other = (code & !31) | ((code + by as u32) & 31);
    char::from_u32(other).filter(|o| {
        *o != c && o.is_alphabetic() && o.is_uppercase() == c.is_uppercase() && !o.is_ascii()
    })
}

/// `text` with each `\uXXXX`, `\u{X…}`, `\xHH` and `%HH` escape as the character it
/// stands for (bytes that are no UTF-8 left out).
pub(super) fn decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let hex = |slice: &[u8]| {
        std::str::from_utf8(slice)
            .ok()
            .and_then(|digits| u32::from_str_radix(digits, 16).ok())
    };
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let (code, used) = match rest {
            [b'\\', b'u', b'{', ..] => match rest.iter().position(|&b| b == b'}') {
                Some(end) if end <= 9 => (hex(&rest[3..end]), end + 1),
                _ => (None, 1),
            },
            [b'\\', b'u', ..] if rest.len() >= 6 => (hex(&rest[2..6]), 6),
            [b'\\', b'x', ..] if rest.len() >= 4 => (hex(&rest[2..4]).map(|b| b | 0x100), 4),
            [b'%', ..] if rest.len() >= 3 => (hex(&rest[1..3]).map(|b| b | 0x100), 3),
            _ => (None, 1),
        };
        match code {
            // A byte (`\xHH`, `%HH`): as it is, so that bytes of UTF-8 join again.
            Some(byte) if byte >= 0x100 => out.push((byte & 0xff) as u8),
            Some(code) => {
                let c = char::from_u32(code).unwrap_or('\u{fffd}');
                out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes());
            }
            None => {
                out.push(bytes[at]);
                at += 1;
                continue;
            }
        }
        at += used;
    }
    String::from_utf8_lossy(&out).into_owned()
}
