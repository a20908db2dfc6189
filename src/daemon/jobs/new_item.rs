//! What every start makes of its arguments, a start now and a waiting item's start
//! alike (`requests/start.rs`, `jobs/after.rs`): the checks of its arguments (no value
//! that is masked may be in what is recorded and shown), where it runs (its folder, a
//! pane's size), its record, its folder, its description (`job.json`) and its
//! environment.

use crate::environ::{self, CallerEnv};
use crate::paths::now_ms;
use crate::redact;
use crate::store::{NewRecord, Record};
use crate::wire::control::{self, JobRecord, PaneSize};
use crate::wire::{Kind, StartArgs, WireError};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A pane's terminal size when the caller gives none.
const DEFAULT_COLS: u16 = 120;
const DEFAULT_ROWS: u16 = 40;

/// Makes a job's folder with a plain `mkdir`, which fails on any existing path (a
/// folder left by an earlier job, or a symbolic link planted to send the job's files
/// elsewhere): a job only ever starts in a folder made for it.
pub(crate) fn make_job_dir(jobs: &Path, job_dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(jobs);
    match std::fs::DirBuilder::new().mode(0o700).create(job_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(format!(
            "its folder {} already exists (a job starts only in a folder made for it): \
             remove it if no job of yours uses it",
            job_dir.display()
        )),
        Err(e) => Err(format!("could not make {}: {e}", job_dir.display())),
    }
}

/// Writes the job's own description into its folder, so that a daemon whose database
/// was lost can take the job back (`JobDir::RECORD`).
/// The environment a job is given before bgwork adds its own variables: the caller's
/// (as text, and as base64 pairs what is not UTF-8), with the `--env` variables over it.
pub(crate) fn job_env(args: &StartArgs) -> (BTreeMap<String, String>, Vec<[String; 2]>) {
    let (mut env, env_bytes) = match &args.inherit_env {
        // A job on an ssh host gets the host's login environment, not this one's.
        _ if args.ssh.is_some() => Default::default(),
        Some(env) => (env.clone(), args.inherit_env_bytes.clone()),
        None => {
            let own = CallerEnv::of_this_process();
            let mut text = own.text;
            // The daemon's own settings (a host's daemon is started with them), not the job's.
            text.remove("BGWORK_EXIT_WHEN_IDLE_MS");
            text.remove("BGWORK_PORTS");
            (text, own.bytes)
        }
    };
    env.extend(args.env.clone());
    let env_bytes = environ::without_names(&env_bytes, &env);
    (env, env_bytes)
}

pub(crate) fn write_job_record(
    job_dir: &Path,
    record: &Record,
    args: &StartArgs,
) -> Result<(), String> {
    let (env, env_bytes) = job_env(args);
    let description = JobRecord {
        session: record.session.clone(),
        id: record.id.clone(),
        kind: record.kind,
        name: record.name.clone(),
        command: record.command.clone(),
        cwd: record.cwd.clone(),
        notify: record.notify,
        env_names: record.env_names.clone(),
        started_at: record.started_at,
        cols: record.cols,
        rows: record.rows,
        secret_names: args.secrets.clone(),
        keep_raw_log: args.keep_raw_log,
        env_digest: Some(environ::digest(&env, &env_bytes)),
        restart: record.restart.as_ref().map(|state| control::RestartRule {
            max_restarts: state.max_restarts,
            backoff_min_ms: state.backoff_min_ms,
            backoff_max_ms: state.backoff_max_ms,
        }),
    };
    std::fs::write(
        crate::job_dir::JobDir(job_dir).record(),
        control::encode(&description),
    )
    .map_err(|e| format!("could not write in {}: {e}", job_dir.display()))
}

pub(crate) fn check_start(args: &StartArgs) -> Result<(), WireError> {
    if args.command.trim().is_empty() {
        return Err(WireError::bad_request(
            "no command: give one after `--`, e.g. `bgwork start -- make test`",
        ));
    }
    let texts = [Some(&args.command), args.cwd.as_ref(), args.name.as_ref()];
    let env = args.env.iter().flat_map(|(k, v)| [k, v]);
    if texts
        .into_iter()
        .flatten()
        .chain(env)
        .any(|t| t.contains('\0'))
    {
        return Err(WireError::bad_request(
            "an argument holds a NUL byte, which no command can receive: remove it",
        ));
    }
    if args.env.keys().any(|k| k.is_empty() || k.contains('=')) {
        return Err(WireError::bad_request(
            "--env takes NAME=VALUE with a non-empty NAME",
        ));
    }
    environ::decode_pairs(&args.inherit_env_bytes).map_err(WireError::bad_request)?;
    check_secrets(args)?;
    crate::executor::ssh::check(args)?;
    Ok(())
}

/// `--quiet-after` and `--max-runtime` in milliseconds, checked: a quiet spell of 1 s
/// to a week (shorter ones would make a notice of every pause), a run time of 1 ms to
/// a year.
pub(crate) fn limits_of(args: &StartArgs) -> Result<(Option<u64>, Option<u64>), WireError> {
    let check = |flag: &str, value: Option<f64>, min: f64, max_days: f64| match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= min && s <= max_days * 86_400.0 => {
            Ok(Some((s * 1000.0) as u64))
        }
        Some(s) => Err(WireError::bad_request(format!(
            "{flag} takes a duration from {} to {max_days} days, not {s} s: e.g. 30s, 10m, 2h",
            humantime::format_duration(Duration::from_secs_f64(min)),
        ))),
    };
    Ok((
        check("--quiet-after", args.quiet_after_s, 1.0, 7.0)?,
        check("--max-runtime", args.max_runtime_s, 0.001, 365.0)?,
    ))
}

/// The most values one job's log is masked for.
const MAX_SECRETS: usize = 10_000;

fn check_secrets(args: &StartArgs) -> Result<(), WireError> {
    let masked = secret_pairs(args).len();
    if masked > MAX_SECRETS {
        return Err(WireError::bad_request(format!(
            "{masked} values to mask (--secret, and --env values of {} bytes or more): at \
             most {MAX_SECRETS} can be masked for one job",
            redact::MIN_ENV_SECRET_LEN
        )));
    }
    for name in &args.secrets {
        let value = args.env.get(name).ok_or_else(|| {
            WireError::bad_request(format!(
                "secret {name} has no value: give it with --env {name}=VALUE or set it in \
                 the caller's environment"
            ))
        })?;
        if value.len() > redact::MAX_SECRET_LEN {
            return Err(WireError::bad_request(format!(
                "secret {name} is {} bytes long: bgwork masks values of up to {} bytes \
                 (pass a long one with --env: it is masked line by line)",
                value.len(),
                redact::MAX_SECRET_LEN
            )));
        }
        if value.trim().len() < redact::MIN_SECRET_LEN {
            return Err(WireError::bad_request(format!(
                "secret {name} is {} bytes long (without surrounding blanks): values shorter \
                 than {} bytes are refused, \
                 since masking them would mask ordinary text; pass it with --env instead \
                 (short --env values are not masked)",
                value.trim().len(),
                redact::MIN_SECRET_LEN
            )));
        }
    }
    check_held_values(args, &secret_pairs(args), &args.secrets)
}

/// Refuses a start whose command line, `--name` or `--after` output pattern holds a
/// value that is masked in the output (`pairs`: `[name, value]`; `secret_names`: those
/// given with `--secret`). The command and the name are recorded and shown as they are
/// (in every list, in `job.json`, in the store and, normalised, in the run history), a
/// pattern is recorded in `after.json` and shown in `waiting_for` and could never match
/// what readers are shown (the value is masked there): no such value may be in them,
/// neither as given nor, in the command, once blanks are folded. The one place this
/// rule lives: `start` checks the new item's values, a start with `--after` also the
/// caller's values of the awaited items' secrets.
pub(crate) fn check_held_values(
    args: &StartArgs,
    pairs: &[[String; 2]],
    secret_names: &[String],
) -> Result<(), WireError> {
    let command = crate::history::normalise(&args.command);
    let patterns: Vec<&str> = args
        .after
        .iter()
        .filter_map(|a| match &a.until {
            crate::wire::after::Until::Output { regex } => Some(regex.as_str()),
            _ => None,
        })
        .collect();
    // Shared by every pattern and value of this start: one too intricate to check in
    // time is refused, never passed.
    let mut budget = Budget {
        tries: MAX_TRIES,
        until: std::time::Instant::now() + MAX_CHECK_TIME,
    };
    for [name, whole] in pairs {
        // The value, and each line of a value of several lines (masked on its own, §8).
        let mut values = vec![whole.trim()];
        values.extend(redact::masked_lines(whole));
        let found = values
            .into_iter()
            .filter(|value| !value.is_empty())
            .find_map(|value| {
                let folded = crate::history::normalise(value);
                let named = args.name.as_deref().is_some_and(|n| n.contains(value));
                let held = args.command.contains(value)
                    || (!folded.is_empty() && command.contains(&folded));
                let pattern = patterns
                    .iter()
                    .any(|p| pattern_holds(p, value, &mut budget));
                (held || named || pattern).then_some((held, named, pattern))
            });
        // Else an encoded form the log masks too (base64, URL quoting, hex, JSON): a
        // reader is shown it masked, so a listing may not show it in clear either.
        let encoded = || {
            let forms = redact::forms_of(whole);
            let holds = |text: &str| {
                forms
                    .iter()
                    .any(|form| memchr::memmem::find(text.as_bytes(), form).is_some())
            };
            let named = args.name.as_deref().is_some_and(holds);
            let held = holds(&args.command);
            let pattern = patterns.iter().any(|p| holds(p));
            (held || named || pattern).then_some((held, named, pattern))
        };
        let Some((held, named, pattern)) = found.or_else(encoded) else {
            continue;
        };
        let what = match secret_names.contains(name) {
            true => format!("secret {name}"),
            false => format!(
                "--env {name} (values of {} bytes or more are masked as secrets)",
                redact::MIN_ENV_SECRET_LEN
            ),
        };
        if pattern && !held && !named {
            return Err(WireError::bad_request(format!(
                "the --after output pattern holds the value of {what} (or an encoded form of \
                 it, or spells it in regex syntax, or is too intricate to be told from one), \
                 which every reader is \
                 shown masked as [secret {name}], so the pattern could never match (and would \
                 show the value wherever the item is listed): nothing was started; match the \
                 text around it, or the mask itself (e.g. 'token is \\[secret {name}\\]')"
            )));
        }
        let place = if named { "--name" } else { "command line" };
        return Err(WireError::bad_request(format!(
            "the {place} holds the value of {what} (or a form of it the output masks: \
             base64, URL quoting, hex), and would show it wherever \
             the item is listed: nothing was started; refer to it by name instead \
             (e.g. '... \"${name}\" ...' in single quotes, so the shell does not expand it)"
        )));
    }
    Ok(())
}

/// Whether an output pattern holds `value`: as given, once its regex escapes are taken
/// away (`p@ss\.w0rd`), or in regex syntax, anywhere in it, that matches the value and
/// not every other text of its shape (`token hunt.r2`, `hunter[0-9]`, `(?i)HUNTER2`,
/// `h*u*n*t*e*r*2*`; `\w+` matches any word and holds nothing).
fn pattern_holds(pattern: &str, value: &str, budget: &mut Budget) -> bool {
    if pattern.contains(value) || unescaped(pattern).contains(value) {
        return true;
    }
    let parsed = regex_syntax::ParserBuilder::new()
        .nest_limit(64)
        .build()
        .parse(pattern);
    let Ok(hir) = parsed else {
        return false;
    };
    let others = others_of_its_shape(value);
    // A pattern too intricate to be looked at whole is taken as holding the value.
    holds_in(&hir, value, &others, budget).unwrap_or(true)
}

/// How many regexes the patterns of one start may take to be checked against its
/// values, and for how long.
const MAX_TRIES: usize = 20_000;
const MAX_CHECK_TIME: std::time::Duration = std::time::Duration::from_millis(500);

/// What is left of the checking of one start's patterns.
struct Budget {
    tries: usize,
    until: std::time::Instant,
}

/// The most pieces one run of a pattern may have (pieces that may match nothing, `z?`,
/// count too: a value spelled between them is still spelled).
const MAX_RUN: usize = 240;

/// Whether a run of consecutive pieces of `hir` (a literal taken a character at a
/// time), or of a group in it, matches all of `value` and not all of `others`. One
/// regex per first piece finds whether any run that begins there matches the value
/// (`^(?:a(?:b(?:c)?)?)$`); only then is each of those runs looked at alone. None when
/// that took more than `tries` regexes.
fn holds_in(
    hir: &regex_syntax::hir::Hir,
    value: &str,
    others: &[String],
    tries: &mut Budget,
) -> Option<bool> {
    use regex_syntax::hir::{Hir, HirKind};
    let pieces: Vec<Hir> = match hir.kind() {
        HirKind::Capture(capture) => return holds_in(&capture.sub, value, others, tries),
        HirKind::Alternation(branches) => {
            for branch in branches {
                if holds_in(branch, value, others, tries)? {
                    return Some(true);
                }
            }
            return Some(false);
        }
        HirKind::Concat(parts) => parts.iter().flat_map(one_char_each).collect(),
        _ => one_char_each(hir),
    };
    let len = value.len();
    let mut take = || {
        if std::time::Instant::now() > tries.until {
            return None;
        }
        tries.tries = tries.tries.checked_sub(1)?;
        Some(())
    };
    for first in 0..pieces.len() {
        if !may_begin(&pieces[first..], value) {
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
        let mut nested = String::new();
        for piece in pieces[first..last].iter().rev() {
            nested = match nested.is_empty() {
                true => format!("(?:{piece})"),
                false => format!("(?:{piece})(?:{nested})?"),
            };
        }
        take()?;
        let built = regex::RegexBuilder::new(&format!("^(?:{nested})$"))
            .size_limit(1 << 22)
            .nest_limit(4 * MAX_RUN as u32)
            .build();
        let Ok(runs) = built else {
            continue;
        };
        if !runs.is_match(value) {
            continue;
        }
        // Some run from here matches the value: is one of them that specific?
        let (mut least, mut most) = (0usize, Some(0usize));
        for end in first..last {
            let properties = pieces[end].properties();
            least = least.saturating_add(properties.minimum_len().unwrap_or(usize::MAX));
            most = most.zip(properties.maximum_len()).map(|(a, b)| a + b);
            if least > len {
                break;
            }
            if most.is_some_and(|most| most < len) {
                continue;
            }
            if !spells_enough(&pieces[first..=end], value) {
                continue;
            }
            take()?;
            if whole_match(&Hir::concat(pieces[first..=end].to_vec()), value, others) {
                return Some(true);
            }
        }
    }
    // A group inside the pattern, on its own.
    for piece in &pieces {
        let group = matches!(piece.kind(), HirKind::Capture(_) | HirKind::Alternation(_));
        if group && holds_in(piece, value, others, tries)? {
            return Some(true);
        }
    }
    Some(false)
}

/// Whether a run of `pieces` from the first may match all of `value`, as far as the
/// pieces of one character each (a literal's character, a class) tell, without building
/// a regex: false once one of them cannot match its character of the value.
fn may_begin(pieces: &[regex_syntax::hir::Hir], value: &str) -> bool {
    use regex_syntax::hir::{Class, HirKind};
    for (piece, c) in pieces.iter().zip(value.chars()) {
        let fits = match piece.kind() {
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
            // Any other piece may match more or fewer characters: no more is told.
            _ => return true,
        };
        if !fits {
            return false;
        }
    }
    true
}

/// A literal as its characters, one piece each; any other piece as it is.
fn one_char_each(hir: &regex_syntax::hir::Hir) -> Vec<regex_syntax::hir::Hir> {
    use regex_syntax::hir::{Hir, HirKind};
    match hir.kind() {
        HirKind::Literal(literal) => match std::str::from_utf8(&literal.0) {
            Ok(text) => text
                .chars()
                .map(|c| Hir::literal(c.to_string().into_bytes()))
                .collect(),
            Err(_) => vec![hir.clone()],
        },
        // An assertion shows nothing of a value: the pattern is read without it.
        HirKind::Look(_) => Vec::new(),
        _ => vec![hir.clone()],
    }
}

/// How many characters of a value the pieces of a run spell: a literal's characters, a
/// class of at most three for one, a group or a repetition what it holds (an
/// alternation its most): `hunt.r2` spells 6, `(hunter2)secret` 13, `h\w+` 1.
fn spelled(pieces: &[regex_syntax::hir::Hir]) -> usize {
    use regex_syntax::hir::{Class, HirKind};
    fn class_size<T: Into<u32> + Copy>(ranges: impl Iterator<Item = (T, T)>) -> u32 {
        ranges.map(|(a, b)| b.into() - a.into() + 1).sum()
    }
    fn of(piece: &regex_syntax::hir::Hir) -> usize {
        match piece.kind() {
            HirKind::Literal(literal) => {
                std::str::from_utf8(&literal.0).map_or(literal.0.len(), |text| text.chars().count())
            }
            HirKind::Class(Class::Unicode(class)) => {
                let size = class_size(class.ranges().iter().map(|r| (r.start(), r.end())));
                usize::from(size <= 3)
            }
            HirKind::Class(Class::Bytes(class)) => {
                let size = class_size(class.ranges().iter().map(|r| (r.start(), r.end())));
                usize::from(size <= 3)
            }
            HirKind::Repetition(repetition) => {
                of(&repetition.sub).saturating_mul(repetition.min.max(1) as usize)
            }
            HirKind::Capture(capture) => of(&capture.sub),
            HirKind::Concat(parts) => parts.iter().map(of).sum(),
            HirKind::Alternation(branches) => branches.iter().map(of).max().unwrap_or(0),
            _ => 0,
        }
    }
    pieces.iter().map(of).sum()
}

/// Whether a run spells enough of `value` to show it: half its characters, at least 4
/// (all of a shorter one).
fn spells_enough(pieces: &[regex_syntax::hir::Hir], value: &str) -> bool {
    let chars = value.chars().count();
    spelled(pieces) >= chars.min(chars.div_ceil(2).max(4))
}

/// Whether `hir` matches all of `value` and not all of every other text of its shape.
fn whole_match(hir: &regex_syntax::hir::Hir, value: &str, others: &[String]) -> bool {
    let built = regex::RegexBuilder::new(&format!("^(?:{hir})$"))
        .size_limit(1 << 22)
        .build();
    built.is_ok_and(|whole| {
        whole.is_match(value) && !others.iter().all(|other| whole.is_match(other))
    })
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
/// punctuation of a value of punctuation alone changed too). A
/// pattern of the shape alone (`\w+`, `[[:alpha:]]+`) matches them all; one that spells
/// the value, even with a class of two or three characters for each, fails on one.
fn others_of_its_shape(value: &str) -> Vec<String> {
    const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const DIGITS: &[u8] = b"0123456789";
    const PUNCT: &[u8] = b"!#%&*+,-./:;=?@^_~";
    let shift = |set: &[u8], c: char, by: usize| -> char {
        let at = set.iter().position(|&b| char::from(b) == c).unwrap_or(0);
        char::from(set[(at + by) % set.len()])
    };
    let all_punctuation = !value.chars().any(char::is_alphanumeric);
    [1, 7, 13, 19]
        .iter()
        .map(|&by| {
            value
                .chars()
                .map(|c| match c {
                    c if c.is_ascii_digit() => shift(DIGITS, c, by % 10 + 1),
                    c if c.is_ascii_lowercase() => shift(LOWER, c, by),
                    c if c.is_ascii_uppercase() => {
                        shift(LOWER, c.to_ascii_lowercase(), by).to_ascii_uppercase()
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

/// `[name, value]` of each value the job's log is masked for: the `--secret` ones and
/// every `--env` value long enough to be one.
pub(crate) fn secret_pairs(args: &StartArgs) -> Vec<[String; 2]> {
    let named: std::collections::BTreeSet<&String> = args.secrets.iter().collect();
    args.env
        .iter()
        .filter(|(name, value)| {
            let len = value.trim().len();
            len >= redact::MIN_ENV_SECRET_LEN
                || (named.contains(name) && len >= redact::MIN_SECRET_LEN)
        })
        .map(|(name, value)| [name.clone(), value.clone()])
        .collect()
}

/// The record of a new job, pane or sub-agent, as `start` (and a waiting start) keeps it.
pub(crate) fn new_record(
    session: &str,
    kind: Kind,
    args: &StartArgs,
    cwd: &str,
    pane: Option<PaneSize>,
) -> NewRecord {
    NewRecord {
        session: session.to_string(),
        kind,
        name: args.name.clone(),
        command: args.command.clone(),
        cwd: cwd.to_string(),
        notify: args.notify,
        env_names: args.env.keys().cloned().collect(),
        started_at: now_ms(),
        cols: pane.map(|p| p.cols),
        rows: pane.map(|p| p.rows),
    }
}

/// Where a job runs: its working directory (a request with none runs in the daemon
/// user's home, never in the daemon's own folder; a relative one is refused, never
/// interpreted) and, for a pane, its terminal's size.
pub(crate) fn place(args: &StartArgs) -> Result<(String, Option<PaneSize>), WireError> {
    let cwd = match (&args.cwd, &args.ssh) {
        // On an ssh host: the remote user's home.
        (None, Some(_)) => "~".to_string(),
        (cwd, _) => cwd
            .clone()
            .unwrap_or_else(|| std::env::var("HOME").unwrap_or_else(|_| "/".to_string())),
    };
    if cwd != "~" || args.ssh.is_none() {
        crate::paths::require_absolute(&cwd, "cwd")?;
    }
    let pane = match args.pty {
        true => {
            let cols = args.cols.unwrap_or(DEFAULT_COLS);
            let rows = args.rows.unwrap_or(DEFAULT_ROWS);
            crate::daemon::output::pane::check_size(cols, rows)?;
            Some(PaneSize { cols, rows })
        }
        false => None,
    };
    Ok((cwd, pane))
}

/// The options of a job that only its description (`job.json`) keeps: which variables
/// were secrets, and whether its unmasked output was kept. Outside input (the job may
/// have rewritten it): what cannot be read means none.
pub(crate) fn described_options(job_dir: &str) -> (Vec<String>, bool) {
    use std::io::Read;
    let path = crate::job_dir::JobDir(std::path::Path::new(job_dir)).record();
    let mut text = Vec::new();
    let read = crate::paths::open_untrusted(&path)
        .and_then(|file| file.take(1 << 20).read_to_end(&mut text));
    match read
        .ok()
        .and_then(|_| control::decode::<JobRecord>(&text).ok())
    {
        Some(described) => (described.secret_names, described.keep_raw_log),
        None => (Vec::new(), false),
    }
}
