//! The one place of the rule that no value masked in a job's output is in what bgwork
//! records and shows of an item: its command line, its `--name` and its `--after`
//! output patterns (contract §8, §14).
//!
//! The command line and the name may not hold a value, as given, with its blanks
//! folded, or in a form the output masks. The patterns and the name, which are shown
//! together wherever the item is listed (`waiting_for`, `after.json`), may not spell
//! two thirds of a value between them, as text or in regex syntax (`hunt.r2`, `(?i)HUNTER`,
//! `h*u*n*`, a value split into several patterns): every run of three characters or
//! more of a value that a piece of them spells, and not every other text of the value's
//! shape, counts.

mod spelling;

use crate::redact;
use crate::wire::{StartArgs, WireError};
use spelling::{decoded, spelled_between, Budget, Reading, Spelled, MAX_REGEX_CHARS};

/// Whose values a check is about, which decides its words.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The new item's own values: its command line, folder, `--env` names, host, name.
    Start,
    /// An awaited item's values, against the new item's `--after` output patterns and
    /// name.
    Awaited,
    /// A watched item's values, against a monitor's `--regex` and name (the `args` a
    /// monitor's: its pattern as one output condition, no command).
    Monitor,
}

/// Refuses a start whose command line, folder, `--env` names, host, `--name` or
/// `--after` output patterns show a value that is masked in the output (`pairs`:
/// `[name, value]`; `secret_names`: those given with `--secret`). `start` checks the new
/// item's values; a start with `--after` also the caller's values of the awaited items'
/// secrets; a monitor the caller's values of the watched item's.
pub(crate) fn check_held_values(
    args: &StartArgs,
    pairs: &[[String; 2]],
    secret_names: &[String],
    checked: Checked,
) -> Result<(), WireError> {
    // No value to show: nothing to read (and no folder to resolve on every start).
    if pairs.is_empty() {
        return Ok(());
    }
    let awaited = checked != Checked::Start;
    let patterns_are = match checked {
        Checked::Monitor => ("monitor's --regex", "monitor's --regex"),
        _ => ("--after output pattern", "--after output patterns"),
    };
    // What else a start records and shows as given: its folder, its `--env` names, its
    // host (a monitor has none of them).
    let env_names = args.env.keys().cloned().collect::<Vec<_>>().join(" ");
    // The folder as the record and the run history keep it: a symbolic link resolved.
    let canonical = args
        .cwd
        .as_deref()
        .filter(|_| args.ssh.is_none())
        .and_then(|cwd| std::fs::canonicalize(cwd).ok())
        .map(|path| path.display().to_string());
    let kept: Vec<(&str, &str)> = match checked {
        Checked::Start => [
            ("folder (--cwd)", args.cwd.as_deref()),
            ("folder (--cwd)", canonical.as_deref()),
            ("--env names", Some(env_names.as_str())),
            ("ssh host", args.ssh.as_deref()),
        ]
        .into_iter()
        .filter_map(|(place, text)| Some((place, text?)))
        .collect(),
        _ => Vec::new(),
    };
    let command = crate::history::normalise(&args.command);
    let patterns: Vec<&str> = args
        .after
        .iter()
        .filter_map(|a| match &a.until {
            crate::wire::after::Until::Output { regex } => Some(regex.as_str()),
            _ => None,
        })
        // A longer one is refused for its length (`after::compile`).
        .filter(|p| p.len() <= crate::wire::after::MAX_PATTERN)
        .collect();
    // Shared by every pattern and value of this start: patterns too intricate to check
    // in time are refused, never passed.
    let mut budget = Budget::new();
    for [name, whole] in pairs {
        // The value, and each line of a value of several lines (masked on its own, §8).
        let mut values = vec![whole.trim()];
        values.extend(redact::masked_lines(whole));
        values.retain(|value| !value.is_empty());
        // An encoded form the log masks too (base64, URL quoting, hex, JSON): a reader
        // is shown it masked, so a listing may not show it in clear either.
        let forms = redact::forms_of(whole);
        let encoded = |text: &str| {
            forms
                .iter()
                .any(|form| memchr::memmem::find(text.as_bytes(), form).is_some())
        };
        // Also once every escape a shell's `printf`, JSON or URL quoting reads is decoded
        // (`\u0068`, `\x68`, `%68`, for each character).
        let command_decoded = decoded(&args.command);
        let held = encoded(&args.command)
            || values.iter().any(|value| {
                let folded = crate::history::normalise(value);
                args.command.contains(value)
                    || command_decoded.contains(value)
                    || (!folded.is_empty() && command.contains(&folded))
            });
        let named = args.name.as_deref().is_some_and(|n| {
            let n_decoded = decoded(n);
            encoded(n)
                || values
                    .iter()
                    .any(|value| n.contains(value) || n_decoded.contains(value))
        });
        let what = match secret_names.contains(name) {
            true => format!("secret {name}"),
            false => format!(
                "--env {name} (values of {} bytes or more are masked as secrets)",
                redact::MIN_ENV_SECRET_LEN
            ),
        };
        let kept_in = kept
            .iter()
            .find(|(_, text)| encoded(text) || values.iter().any(|value| text.contains(value)));
        if let Some((place, _)) = kept_in.filter(|_| !held && !named) {
            return Err(WireError::bad_request(format!(
                "the {place} holds the value of {what} (or a form of it the output masks), \
                 and would show it wherever the item is listed and in the run history: \
                 nothing was started; use a {place} that does not hold it"
            )));
        }
        if held || named {
            let place = if named { "--name" } else { "command line" };
            return Err(WireError::bad_request(format!(
                "the {place} holds the value of {what} (or a form of it the output masks: \
                 base64, URL quoting, hex), and would show it wherever \
                 the item is listed: nothing was started; refer to it by name instead \
                 (e.g. '... \"${name}\" ...' in single quotes, so the shell does not expand it)"
            )));
        }
        // The value and its lines (one over 8 KiB is masked line by line), read for runs
        // of text and, up to `MAX_REGEX_CHARS`, for runs of regex pieces too; its ASCII
        // encoded forms for runs of regex pieces (a form as text is found whole above).
        // (A long value's forms are long: found whole, or not at all.)
        let short = whole.chars().count() <= MAX_REGEX_CHARS;
        let forms_as_text: Vec<(&str, Reading)> = forms
            .iter()
            .filter(|_| short)
            .filter_map(|form| std::str::from_utf8(form).ok())
            .map(|form| (form, Reading::Pieces))
            .collect();
        let spelled = match patterns.iter().any(|p| encoded(p)) {
            true => Some(Spelled {
                by_name: false,
                by_patterns: true,
                intricate: false,
            }),
            false => values
                .iter()
                .copied()
                .filter(|value| value.len() <= redact::MAX_SECRET_LEN)
                .map(|value| match value.chars().count() <= MAX_REGEX_CHARS {
                    true => (value, Reading::Both),
                    false => (value, Reading::Text),
                })
                .chain(forms_as_text)
                .find_map(|(value, reading)| {
                    spelled_between(value, reading, &patterns, args.name.as_deref(), &mut budget)
                }),
        };
        let Some(spelled) = spelled else {
            continue;
        };
        if spelled.intricate {
            return Err(WireError::bad_request(format!(
                "the {} are too intricate to be told apart from the \
                 value of {what} in the work this check may take (one start's patterns \
                 against its values): nothing was started; give shorter or plainer patterns",
                patterns_are.1
            )));
        }
        let fields = match (spelled.by_patterns, spelled.by_name) {
            (true, true) => format!("the {} and the --name together spell", patterns_are.1),
            (true, false) => format!("the {} spells", patterns_are.0),
            _ => "the --name spells".to_string(),
        };
        // The awaited item's output shows its secrets masked; the new item's own values
        // are masked in its own output only.
        let why = match awaited {
            true => format!(
                "which every reader of the {} item's output is shown masked as \
                 [secret {name}], so a pattern could never match it, and the item's listing \
                 would show it: nothing was started; match the text around it, or the mask \
                 itself (e.g. 'token is \\[secret {name}\\]')",
                match checked {
                    Checked::Monitor => "watched",
                    _ => "awaited",
                }
            ),
            false => format!(
                "and the item's listing would show it (its own output shows it masked as \
                 [secret {name}]): nothing was started; match less of it, or the text \
                 around it"
            ),
        };
        return Err(WireError::bad_request(format!(
            "{fields} two thirds or more of the value of {what} (as text, in an encoded form, \
             or in regex syntax), {why}"
        )));
    }
    Ok(())
}
